//! core/v1 Service.

mod allocator;
mod bitmap;
mod cluster_ips;
mod defaults;
mod node_ports;
mod printer;
mod range;
mod repair;
mod spec;
mod transitions;
mod validation;

use async_trait::async_trait;
use capstan_machinery::ApiError;
use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::Column;
use capstan_registry::{ResourceInfo, Strategy, WriteExtras};
use capstan_storage::{Compare, Op, Storage};
use k8s_openapi::api::core::v1::Service;
use serde_json::Value;

use allocator::Picker;
pub use allocator::{Allocations, ServiceAllocator};
pub use range::{IpRange, PortRange};

/// Service's identity.
pub static SERVICE_INFO: ResourceInfo =
    ResourceInfo::of::<Service>(&super::V1, "io.k8s.api.core.v1.Service")
        .short_names(&["svc"])
        .categories(&["all"])
        .with_status()
        .storage_version_hash("0/CO1lhkEBI=")
        .storage_prefix("services/specs")
        .create_on_update()
        .unconditional_update()
        .delete_returns_object()
        // ServiceStatus.loadBalancer is a struct: Go always has it.
        .zero(r#"{"metadata":{"creationTimestamp":null},"spec":{},"status":{"loadBalancer":{}}}"#);

/// The Service strategy.
pub struct ServiceStrategy {
    allocator: ServiceAllocator,
}

impl ServiceStrategy {
    /// A strategy allocating from these ranges.
    pub fn new(allocator: ServiceAllocator) -> Self {
        ServiceStrategy { allocator }
    }

    /// The allocator (the `kubernetes` Service needs the first address).
    pub fn allocator(&self) -> &ServiceAllocator {
        &self.allocator
    }
}

#[async_trait]
impl Strategy for ServiceStrategy {
    type Object = Service;

    fn info(&self) -> &ResourceInfo {
        &SERVICE_INFO
    }

    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        capstan_machinery::validation::dns1123_label
    }

    fn default(&self, service: &mut Service) {
        defaults::apply(service);
    }

    fn prepare_for_create(&self, service: &mut Service) {
        service.status = Some(transitions::empty_status());
        cluster_ips::normalize(service, None);
        transitions::hide_internal_traffic_policy(service);
    }

    fn prepare_for_update(&self, new: &mut Service, old: &Service) {
        node_ports::keep_allocated_values(new, old);
        cluster_ips::normalize(new, Some(old));
        transitions::drop_type_dependent_fields(new, old);
        transitions::hide_internal_traffic_policy(new);
    }

    fn validate_create(&self, service: &Service) -> FieldErrors {
        validation::validate(service, None)
    }

    fn validate_update(&self, new: &Service, old: &Service) -> FieldErrors {
        let mut errors = validation::validate_update(new, old);
        errors.extend(validation::validate(new, Some(old)));
        errors
    }

    fn validate_status_update(&self, new: &Service, old: &Service) -> FieldErrors {
        validation::validate_status(new, old)
    }

    const ALLOCATES: bool = true;

    async fn allocate(
        &self,
        storage: &dyn Storage,
        service: &mut Service,
        old: Option<&Service>,
        dry_run: bool,
    ) -> Result<WriteExtras, ApiError> {
        // Cluster IPs and node ports are picked through the allocator's in-memory view; the
        // storage work that records them commits in the Service's own transaction.
        let owner = ServiceAllocator::owner(service);
        if service.spec.as_ref().map(spec::kind) != Some("ExternalName") {
            let picker = Picker {
                allocator: &self.allocator,
                storage,
                owner: &owner,
                dry_run,
            };
            cluster_ips::allocate(&picker, service, old).await?;
            node_ports::allocate(&picker, service, old.is_none()).await?;
        }
        let before = old.map(Allocations::of).unwrap_or_default().keys();
        let after = Allocations::of(service).keys();
        let mut extras = WriteExtras::default();
        for key in after.iter().filter(|k| !before.contains(k)) {
            extras.compares.push(Compare::Absent(key.clone()));
            extras.ops.push(Op::Put(key.clone(), owner.clone().into()));
        }
        for key in before.into_iter().filter(|k| !after.contains(k)) {
            extras.ops.push(Op::Delete(key));
        }
        Ok(extras)
    }

    fn release(&self, service: &Service) -> WriteExtras {
        // Deleting a Service deletes the Endpoints of the same name (upstream does it right
        // after; here it is the same transaction).
        let mut extras = WriteExtras {
            compares: Vec::new(),
            ops: Allocations::of(service)
                .keys()
                .into_iter()
                .map(Op::Delete)
                .collect(),
        };
        extras
            .ops
            .push(capstan_storage::Op::Delete(crate::core::endpoints::key(
                service.metadata.namespace.as_deref().unwrap_or_default(),
                service.metadata.name.as_deref().unwrap_or_default(),
            )));
        extras
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.clusterIP", "spec.type"]
    }

    fn field_value(&self, service: &Service, field: &str) -> Option<String> {
        let spec = service.spec.as_ref();
        match field {
            "spec.clusterIP" => Some(spec.map(spec::cluster_ip).unwrap_or_default().to_string()),
            "spec.type" => Some(spec.map(spec::kind).unwrap_or_default().to_string()),
            _ => None,
        }
    }

    /// Only what [`ServiceStrategy::field_value`] reads: the watch cache decodes every Service
    /// written, and its ports, selector and the rest of its spec are most of it.
    fn selectable_object(
        &self,
        from: capstan_registry::cache::SelectableFrom<'_>,
    ) -> Option<Service> {
        use k8s_openapi::api::core::v1::ServiceSpec;
        #[derive(serde::Deserialize)]
        struct Read {
            metadata: Option<capstan_registry::cache::SelectableMeta>,
            spec: Option<Spec>,
        }
        #[derive(serde::Deserialize)]
        struct Spec {
            #[serde(rename = "clusterIP")]
            cluster_ip: Option<String>,
            #[serde(rename = "type")]
            type_: Option<String>,
        }
        let read: Read = from.decode()?;
        Some(Service {
            metadata: read.metadata.unwrap_or_default().into_object_meta(),
            spec: read.spec.map(|s| ServiceSpec {
                cluster_ip: s.cluster_ip,
                type_: s.type_,
                ..ServiceSpec::default()
            }),
            status: None,
        })
    }

    fn warnings(&self, service: &Service) -> Vec<String> {
        validation::warnings(service)
    }

    fn unsupported_field_message(&self, field: &str) -> String {
        format!("field label not supported: {field}")
    }

    fn columns(&self) -> Vec<Column> {
        printer::columns()
    }

    fn cells(&self, service: &Service) -> Vec<Value> {
        printer::cells(service)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn the_cache_reads_every_selectable_field_as_the_whole_service_gives_it() {
        let strategy = crate::test_services();
        let full = json!({"kind": "Service", "apiVersion": "v1",
            "metadata": {"name": "web", "namespace": "ns", "labels": {"app": "web"}, "uid": "u1",
                "annotations": {"a": "b"}},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"],
                "selector": {"app": "web"},
                "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]},
            "status": {"loadBalancer": {}}});
        let headless = json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None"}});
        let bare = json!({"metadata": {"name": "q"}});
        let nulls = json!({"metadata": null, "spec": null, "status": null});
        crate::assert_selects_as_whole(&strategy, [full, headless, bare, nulls]);
    }
}
