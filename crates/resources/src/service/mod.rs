//! core/v1 Service.

mod allocator;
mod bitmap;
mod defaults;
mod printer;
mod spec;
mod transitions;
mod validation;

use async_trait::async_trait;
use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::Column;
use capstan_machinery::{ApiError, meta};
use capstan_registry::{ResourceInfo, Strategy, WriteExtras};
use capstan_storage::Storage;
use serde_json::Value;

pub use allocator::{Allocations, IpRange, PortRange, ServiceAllocator};

/// Service's identity.
pub static SERVICE_INFO: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    kind: "Service",
    list_kind: "ServiceList",
    plural: "services",
    singular: "service",
    namespaced: true,
    short_names: &["svc"],
    categories: &["all"],
    verbs: crate::NAMESPACED_VERBS,
    has_status: true,
    storage_version_hash: "0/CO1lhkEBI=",
    storage_prefix: "services/specs",
    allow_create_on_update: true,
    allow_unconditional_update: true,
    delete_returns_object: true,
};

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
    fn info(&self) -> &ResourceInfo {
        &SERVICE_INFO
    }

    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        capstan_machinery::validation::dns1123_label
    }

    fn decode(&self, object: Value) -> Result<Value, String> {
        crate::typed::<k8s_openapi::api::core::v1::Service>(object)
    }

    fn default(&self, object: &mut Value) {
        defaults::apply(object);
    }

    fn prepare_for_create(&self, object: &mut Value) {
        if let Value::Object(map) = object {
            map.insert("status".into(), serde_json::json!({"loadBalancer": {}}));
        }
        allocator::normalize_cluster_ips(object);
    }

    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        capstan_registry::strategy::copy_field(new, old, "status");
        allocator::keep_allocated_values(new, old);
        allocator::normalize_cluster_ips(new);
        transitions::drop_type_dependent_fields(new, old);
    }

    fn validate_create(&self, object: &Value) -> FieldErrors {
        validation::validate(object, &self.allocator)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> FieldErrors {
        let mut errors = validation::validate_update(new, old);
        errors.extend(validation::validate(new, &self.allocator));
        errors
    }

    fn validate_status_update(&self, new: &Value, _old: &Value) -> FieldErrors {
        validation::validate_status(new)
    }

    async fn allocate(
        &self,
        storage: &dyn Storage,
        object: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
    ) -> Result<WriteExtras, ApiError> {
        self.allocator.allocate(storage, object, old, dry_run).await
    }

    fn release(&self, object: &Value) -> WriteExtras {
        // Deleting a Service deletes the Endpoints of the same name (upstream does it right
        // after; here it is the same transaction).
        let mut extras = self.allocator.release(object);
        extras
            .ops
            .push(capstan_storage::Op::Delete(crate::endpoints::key(
                meta::namespace(object),
                meta::name(object),
            )));
        extras
    }

    fn field_value(&self, object: &Value, field: &str) -> Option<String> {
        let spec = |f: &str| {
            object
                .get("spec")
                .and_then(|s| s.get(f))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        match field {
            "metadata.name" => Some(meta::name(object).to_string()),
            "metadata.namespace" => Some(meta::namespace(object).to_string()),
            "spec.clusterIP" => Some(spec("clusterIP")),
            "spec.type" => Some(spec("type")),
            _ => None,
        }
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.clusterIP", "spec.type"]
    }

    fn warnings(&self, object: &Value) -> Vec<String> {
        validation::warnings(object)
    }

    fn unsupported_field_message(&self, field: &str) -> String {
        format!("field label not supported: {field}")
    }

    fn columns(&self) -> Vec<Column> {
        printer::columns()
    }

    fn cells(&self, object: &Value) -> Vec<Value> {
        printer::cells(object)
    }
}
