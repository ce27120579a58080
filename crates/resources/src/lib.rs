//! Capstan's resource kinds: one folder per kind, each a [`capstan_registry::Strategy`] on its
//! `k8s_openapi` type, and [`registered`], the list of what Capstan serves.
//!
//! Start with [`service::ServiceStrategy`] (defaults, validation, ClusterIP/NodePort
//! allocation, table printer); [`namespace::NamespaceStrategy`] is the minimal Namespace kind
//! that namespaced objects need.
//!
//! Adding a kind: a folder here with its strategy (identity from `ResourceInfo::of`, its
//! OpenAPI definition and document, rules, printer), and its line in [`registered`].
//! Discovery, OpenAPI, storage, the watch cache, Tables, selectors and the conformance clean-up
//! all follow from the registration.

pub mod apiregistration;
pub mod coordination;
pub mod core;
pub mod discovery;

#[cfg(test)]
mod generated_tests;

use std::sync::Arc;

use capstan_registry::DynStrategy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Every kind Capstan serves, in the order discovery lists them per group. The Service kind
/// is built by the caller, which also runs its allocator's repair.
pub fn registered(services: Arc<core::service::ServiceStrategy>) -> Vec<Arc<dyn DynStrategy>> {
    vec![
        Arc::new(core::namespace::NamespaceStrategy),
        services,
        Arc::new(core::endpoints::EndpointsStrategy),
        Arc::new(core::pod::PodStrategy),
        Arc::new(core::node::NodeStrategy),
        Arc::new(discovery::endpointslice::EndpointSliceStrategy),
        Arc::new(coordination::lease::LeaseStrategy),
        Arc::new(apiregistration::apiservice::ApiServiceStrategy),
    ]
}

/// The port default every kind shares: an empty or missing `protocol` is `TCP`.
pub(crate) fn default_protocol(protocol: &mut Option<String>) {
    if protocol.as_deref().is_none_or(str::is_empty) {
        *protocol = Some("TCP".to_string());
    }
}

/// A port's name in a Service or Endpoints port list: required when the list has several
/// ports, and a DNS label when set.
pub(crate) fn validate_port_name(
    errors: &mut capstan_machinery::field::FieldErrors,
    path: &str,
    name: &str,
    required: bool,
) {
    use capstan_machinery::field::FieldError;
    if name.is_empty() {
        if required {
            errors.push(FieldError::required(format!("{path}.name"), ""));
        }
        return;
    }
    errors.check(
        format!("{path}.name"),
        name,
        capstan_machinery::validation::dns1123_label,
    );
}

/// A port's protocol in a Service or Endpoints port list: required (defaulting sets it), and
/// one of SCTP, TCP, UDP.
pub(crate) fn validate_protocol(
    errors: &mut capstan_machinery::field::FieldErrors,
    path: &str,
    protocol: Option<&str>,
) {
    use capstan_machinery::field::FieldError;
    let path = format!("{path}.protocol");
    match protocol.unwrap_or_default() {
        "" => errors.push(FieldError::required(path, "")),
        "SCTP" | "TCP" | "UDP" => {}
        other => errors.push(FieldError::not_supported(
            path,
            &serde_json::json!(other),
            &["SCTP", "TCP", "UDP"],
        )),
    }
}

/// `metadata.creationTimestamp` as the API writes it (`""` when unset), for Age columns.
pub(crate) fn created(meta: &ObjectMeta) -> String {
    meta.creation_timestamp
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok())
        .and_then(|v| match v {
            serde_json::Value::String(text) => Some(text),
            _ => None,
        })
        .unwrap_or_default()
}

/// Checks that a kind's `selectable_object` (what the watch cache decodes of each object)
/// gives every selectable field, and the name, namespace and labels, as the whole object does.
#[cfg(test)]
pub(crate) fn assert_selects_as_whole<S: capstan_registry::Strategy>(
    strategy: &S,
    objects: impl IntoIterator<Item = serde_json::Value>,
) {
    use k8s_openapi::Metadata;
    for object in objects {
        let json = serde_json::to_vec(&object).expect("json");
        let whole: S::Object = serde_json::from_slice(&json).expect("the whole object");
        use capstan_registry::cache::SelectableFrom;
        for from in [SelectableFrom::Json(&json), SelectableFrom::Object(&object)] {
            let read = strategy.selectable_object(from).expect("read");
            let (m, w) = (read.metadata(), whole.metadata());
            assert_eq!(
                (&m.name, &m.namespace, &m.labels),
                (&w.name, &w.namespace, &w.labels)
            );
            for field in strategy.selectable_fields() {
                assert_eq!(
                    strategy.field_value(&read, field),
                    strategy.field_value(&whole, field),
                    "{field}"
                );
            }
        }
    }
}

/// The Service strategy over a test's ranges (10.96.0.0/16, ports 30000-32767).
#[cfg(test)]
pub(crate) fn test_services() -> core::service::ServiceStrategy {
    use core::service::{IpRange, PortRange, ServiceAllocator, ServiceStrategy};
    let ranges = vec![IpRange::parse("10.96.0.0/16").expect("range")];
    let ports = PortRange::parse("30000-32767").expect("ports");
    ServiceStrategy::new(ServiceAllocator::new(ranges, ports))
}

/// A kind's object from a test's JSON.
#[cfg(test)]
pub(crate) fn typed<T: serde::de::DeserializeOwned>(object: serde_json::Value) -> T {
    serde_json::from_value(object).expect("the test's JSON decodes")
}

#[cfg(test)]
mod projection_tests {
    use std::sync::Arc;

    use serde_json::json;

    /// The watch cache projects stored JSON straight into the kind's type; what it finds must
    /// be what the projection of the decoded object finds, for every kind.
    #[test]
    fn every_kind_projects_its_json_as_its_object() {
        let services = Arc::new(crate::test_services());
        let metadata = json!({"name": "a", "namespace": "ns", "labels": {"z": "1", "app": "web"}});
        let samples = [
            json!({"metadata": metadata, "spec": {"finalizers": ["kubernetes"]},
                   "status": {"phase": "Active"}}),
            json!({"metadata": metadata, "spec": {"clusterIP": "10.96.0.9", "type": "NodePort",
                   "ports": [{"port": 80, "protocol": "TCP"}]}}),
            json!({"metadata": metadata, "subsets": [{"addresses": [{"ip": "10.0.0.1"}]}]}),
            json!({"metadata": metadata, "spec": {"nodeName": "n1", "restartPolicy": "Always",
                   "schedulerName": "default-scheduler", "serviceAccountName": "sa",
                   "hostNetwork": true, "containers": []},
                   "status": {"phase": "Running", "podIP": "10.0.0.1"}}),
            json!({"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"}},
                   "spec": {"unschedulable": true}}),
            json!({"metadata": metadata, "addressType": "IPv4",
                   "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}],
                   "ports": [{"name": "", "port": 80, "protocol": "TCP"}]}),
            json!({"metadata": metadata, "spec": {"holderIdentity": "a",
                   "renewTime": "2026-11-26T12:00:00.123456Z"}}),
            json!({"metadata": {"name": "v1.example.com", "labels": {"a": "b"}},
                   "spec": {"group": "example.com", "version": "v1",
                   "groupPriorityMinimum": 100, "versionPriority": 10}}),
        ];
        let kinds = crate::registered(services);
        assert_eq!(kinds.len(), samples.len());
        for (kind, object) in kinds.iter().zip(samples) {
            let bytes = serde_json::to_vec(&object).expect("encode");
            let metadata = serde_json::to_vec(&object["metadata"]).expect("encode");
            let from_json = kind
                .selectable_json(&metadata, &|| bytes.clone())
                .expect("the sample decodes");
            assert_eq!(from_json, kind.selectable(&object), "{}", kind.info().kind);
            assert_eq!(from_json.name(), object["metadata"]["name"]);
        }
        // A label the type refuses: no typed projection (the decoded object's is used).
        let odd_metadata = json!({"name": "a", "labels": {"n": 1}});
        let odd = serde_json::to_vec(&json!({"metadata": odd_metadata})).expect("encode");
        let odd_metadata = serde_json::to_vec(&odd_metadata).expect("encode");
        for kind in &kinds {
            assert!(
                kind.selectable_json(&odd_metadata, &|| odd.clone())
                    .is_none()
            );
        }
    }
}

#[cfg(test)]
mod protobuf_tests {
    use std::sync::Arc;

    use serde_json::json;

    /// A client that asks for protobuf gets it for every kind: each one's object and list
    /// encode with its group's messages and read back as they were.
    #[test]
    fn every_kind_encodes_as_protobuf() {
        for strategy in crate::registered(Arc::new(crate::test_services())) {
            let info = strategy.info();
            let messages = info.data.messages();
            let object = json!({"kind": info.kind, "apiVersion": info.api_version(),
                "metadata": {"name": "a", "creationTimestamp": "2026-12-08T00:00:00Z"}});
            let bytes = capstan_machinery::protobuf::encode(&object, messages)
                .unwrap_or_else(|e| panic!("{}: {e}", info.kind));
            let (_, _, read) = capstan_machinery::protobuf::decode(&bytes, messages)
                .unwrap_or_else(|e| panic!("{}: {e}", info.kind));
            assert_eq!(read, object, "{}", info.kind);
            let list = json!({"kind": info.list_kind(), "apiVersion": info.api_version(),
                "metadata": {"resourceVersion": "7"}, "items": [{"metadata": object["metadata"].clone()}]});
            capstan_machinery::protobuf::encode(&list, messages)
                .unwrap_or_else(|e| panic!("{}: {e}", info.list_kind()));
        }
    }
}
