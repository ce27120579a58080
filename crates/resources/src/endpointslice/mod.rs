//! discovery.k8s.io/v1 EndpointSlice: the API (defaults, validation, Table). The controllers
//! that write slices for Services live in `capstan-controllers`.

mod validation;

use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_registry::{ResourceInfo, Strategy};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use serde_json::{Value, json};

/// EndpointSlice's identity.
pub static ENDPOINTSLICE_INFO: ResourceInfo = ResourceInfo::of::<EndpointSlice>()
    .storage_version_hash("qgS0xkrxYAI=")
    .storage_prefix("endpointslices")
    .unconditional_update()
    .openapi(
        "io.k8s.api.discovery.v1.EndpointSlice",
        "apis/discovery.k8s.io/v1",
        capstan_machinery::schema::DISCOVERY_V1_OPENAPI,
    )
    .protobuf(capstan_machinery::protobuf::DISCOVERY_V1)
    .priority(16200, 15)
    // EndpointSlice's endpoints and ports have no omitempty.
    .always_present(&["endpoints", "ports"])
    .zero(
        r#"{"metadata":{"creationTimestamp":null},"addressType":"","endpoints":null,"ports":null}"#,
    )
    // pkg/api/legacyscheme: every built-in group decodes through the one scheme.
    .scheme(
        "pkg/api/legacyscheme/scheme.go:30",
        &["discovery.k8s.io/v1", "discovery.k8s.io/v1beta1"],
    );

/// The label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages a slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The EndpointSlice controller's `managed-by` value.
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The mirroring controller's `managed-by` value.
pub const MIRRORING_CONTROLLER_NAME: &str = "endpointslicemirroring-controller.k8s.io";

/// The EndpointSlice strategy.
pub struct EndpointSliceStrategy;

/// The slices of a Service (labelled with its name), as the watch cache holds them; only
/// those are decoded.
pub fn of_service(
    slices: &capstan_registry::Registry,
    namespace: &str,
    service: &str,
) -> Vec<EndpointSlice> {
    slices.cached_where(namespace, |s| s.label(SERVICE_NAME_LABEL) == Some(service))
}

/// `dropTopologyOnV1`: `deprecatedTopology` is a v1beta1 field v1 writes never keep.
fn drop_topology(slice: &mut EndpointSlice) {
    for endpoint in slice.endpoints.iter_mut().flatten() {
        endpoint.deprecated_topology = None;
    }
}

/// Whether anything but metadata changed (the generation counts those changes).
fn spec_changed(new: &EndpointSlice, old: &EndpointSlice) -> bool {
    new.address_type != old.address_type || new.endpoints != old.endpoints || new.ports != old.ports
}

/// The ports cell (`formatDiscoveryPorts`): each port's number, else its name; at most three
/// shown, then `+ N more...`; `<unset>` for none.
fn ports_cell(slice: &EndpointSlice) -> String {
    let ports = slice.ports.as_deref().unwrap_or_default();
    if ports.is_empty() {
        return "<unset>".to_string();
    }
    let shown: Vec<String> = ports
        .iter()
        .map(|p| match (p.port, p.name.as_deref()) {
            (Some(n), _) => n.to_string(),
            (None, Some(name)) => name.to_string(),
            (None, None) => "*".to_string(),
        })
        .collect();
    truncated(&shown)
}

/// The endpoints cell: every address, at most three, then `+ N more...`; `<unset>` for none.
fn endpoints_cell(slice: &EndpointSlice) -> String {
    let addresses: Vec<String> = slice
        .endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    if addresses.is_empty() {
        return "<unset>".to_string();
    }
    truncated(&addresses)
}

/// Upstream's `formatEndpointSlices`/`formatDiscoveryPorts` rendering: three entries, then
/// how many more.
fn truncated(items: &[String]) -> String {
    const MAX: usize = 3;
    let mut out = items
        .iter()
        .take(MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    if items.len() > MAX {
        out.push_str(&format!(" + {} more...", items.len() - MAX));
    } else if out.is_empty() {
        out = "<unset>".to_string();
    }
    out
}

const ADDRESS_TYPE: &str = "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type. This field is immutable after creation. The following address types are currently supported: * IPv4: Represents an IPv4 Address. * IPv6: Represents an IPv6 Address. * FQDN: Represents a Fully Qualified Domain Name. (Deprecated) The EndpointSlice controller only generates, and kube-proxy only processes, slices of addressType \"IPv4\" and \"IPv6\". No semantics are defined for the \"FQDN\" type.";
const PORTS: &str = "ports specifies the list of network ports exposed by each endpoint in this slice. Each port must have a unique name. Each slice may include a maximum of 100 ports. Services always have at least 1 port, so EndpointSlices generated by the EndpointSlice controller will likewise always have at least 1 port. EndpointSlices used for other purposes may have an empty ports list.";
const ENDPOINTS: &str = "endpoints is a list of unique endpoints in this slice. Each slice may include a maximum of 1000 endpoints.";

impl Strategy for EndpointSliceStrategy {
    type Object = EndpointSlice;

    fn info(&self) -> &ResourceInfo {
        &ENDPOINTSLICE_INFO
    }

    /// `SetDefaults_EndpointPort`, and the struct Go always writes (`conditions`).
    fn default(&self, slice: &mut EndpointSlice) {
        for port in slice.ports.iter_mut().flatten() {
            port.name.get_or_insert_with(String::new);
            crate::default_protocol(&mut port.protocol);
        }
        for endpoint in slice.endpoints.iter_mut().flatten() {
            endpoint
                .conditions
                .get_or_insert_with(EndpointConditions::default);
        }
    }

    /// `endpointSliceStrategy.PrepareForCreate`: generation 1; `deprecatedTopology` is not
    /// kept by v1 writes.
    fn prepare_for_create(&self, slice: &mut EndpointSlice) {
        slice.metadata.generation = Some(1);
        drop_topology(slice);
    }

    /// `PrepareForUpdate`: the generation moves when anything but metadata, or the labels,
    /// change.
    fn prepare_for_update(&self, new: &mut EndpointSlice, old: &EndpointSlice) {
        let generation = old.metadata.generation.unwrap_or(0);
        let moved = spec_changed(new, old) || new.metadata.labels != old.metadata.labels;
        new.metadata.generation = Some(if moved { generation + 1 } else { generation });
        if new.endpoints != old.endpoints {
            drop_topology(new);
        }
    }

    fn validate_create(&self, slice: &EndpointSlice) -> FieldErrors {
        validation::validate(slice, None)
    }

    fn validates_metadata_on_update(&self) -> bool {
        true
    }

    fn validate_update(&self, new: &EndpointSlice, old: &EndpointSlice) -> FieldErrors {
        validation::validate(new, Some(old))
    }

    fn warnings(&self, slice: &EndpointSlice) -> Vec<String> {
        validation::warnings(slice, false)
    }

    /// A create also hears that FQDN slices are deprecated.
    fn create_warnings(&self, slice: &EndpointSlice) -> Vec<String> {
        validation::warnings(slice, true)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::text("AddressType", ADDRESS_TYPE, 0),
            Column::text("Ports", PORTS, 0),
            Column::text("Endpoints", ENDPOINTS, 0),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, slice: &EndpointSlice) -> Vec<Value> {
        vec![
            json!(slice.metadata.name.as_deref().unwrap_or_default()),
            json!(slice.address_type),
            json!(ports_cell(slice)),
            json!(endpoints_cell(slice)),
            json!(age(&crate::created(&slice.metadata))),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed;

    #[test]
    fn cells_read_like_upstream() {
        let slice: EndpointSlice = typed(json!({"addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]},
                          {"addresses": ["10.0.0.3"]}, {"addresses": ["10.0.0.4"]}],
            "ports": [{"port": 8080}, {"name": "b"}]}));
        let cells = EndpointSliceStrategy.cells(&slice);
        assert_eq!(cells[2], "8080,b");
        assert_eq!(cells[3], "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...");
        let empty: EndpointSlice = typed(json!({"addressType": "IPv4"}));
        let cells = EndpointSliceStrategy.cells(&empty);
        assert_eq!(
            (&cells[2], &cells[3]),
            (&json!("<unset>"), &json!("<unset>"))
        );
    }

    #[test]
    fn defaults_name_ports_and_write_conditions() {
        let mut slice: EndpointSlice = typed(json!({"addressType": "IPv4",
            "endpoints": [{"addresses": ["192.0.2.10"]}], "ports": [{"port": 5432}]}));
        EndpointSliceStrategy.default(&mut slice);
        let value = capstan_registry::strategy::from_typed(&slice);
        assert_eq!(
            value["ports"],
            json!([{"name": "", "protocol": "TCP", "port": 5432}])
        );
        assert_eq!(value["endpoints"][0]["conditions"], json!({}));
    }

    #[test]
    fn the_generation_moves_with_the_contents_and_labels_only() {
        let old: EndpointSlice =
            typed(json!({"metadata": {"generation": 3}, "addressType": "IPv4"}));
        let mut annotated = old.clone();
        annotated.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        EndpointSliceStrategy.prepare_for_update(&mut annotated, &old);
        assert_eq!(annotated.metadata.generation, Some(3));
        // Labels count, as upstream's strategy has it.
        let mut relabelled = old.clone();
        relabelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        EndpointSliceStrategy.prepare_for_update(&mut relabelled, &old);
        assert_eq!(relabelled.metadata.generation, Some(4));
        let mut changed = old.clone();
        changed.ports = Some(vec![Default::default()]);
        EndpointSliceStrategy.prepare_for_update(&mut changed, &old);
        assert_eq!(changed.metadata.generation, Some(4));
    }
}
