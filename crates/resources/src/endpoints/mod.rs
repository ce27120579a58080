//! core/v1 Endpoints: the API (validation, defaults, printer). The endpoints controller that
//! maintains them for selector-based Services comes with its own issue.

mod printer;
mod validation;

use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::Column;
use capstan_registry::{ResourceInfo, Strategy};
use serde_json::Value;

/// Endpoints' identity.
pub static ENDPOINTS_INFO: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    kind: "Endpoints",
    list_kind: "EndpointsList",
    plural: "endpoints",
    singular: "endpoints",
    namespaced: true,
    short_names: &["ep"],
    categories: &[],
    verbs: crate::NAMESPACED_VERBS,
    has_status: false,
    storage_version_hash: "fWeeMqaN/OA=",
    storage_prefix: "services/endpoints",
    allow_create_on_update: true,
    allow_unconditional_update: true,
    delete_returns_object: false,
};

/// The storage key of the Endpoints named like a Service: deleting a Service deletes them in
/// the same transaction.
pub fn key(namespace: &str, name: &str) -> String {
    ENDPOINTS_INFO.key(namespace, name)
}

/// The warning kube-apiserver ≥ 1.33 sends with every request on v1 Endpoints.
pub const DEPRECATION_WARNING: &str =
    "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice";

/// The Endpoints strategy.
pub struct EndpointsStrategy;

impl Strategy for EndpointsStrategy {
    fn info(&self) -> &ResourceInfo {
        &ENDPOINTS_INFO
    }

    fn decode(&self, object: Value) -> Result<Value, String> {
        crate::typed::<k8s_openapi::api::core::v1::Endpoints>(object)
    }

    fn default(&self, object: &mut Value) {
        if let Some(subsets) = object.get_mut("subsets").and_then(Value::as_array_mut) {
            for subset in subsets {
                if let Some(ports) = subset.get_mut("ports").and_then(Value::as_array_mut) {
                    ports
                        .iter_mut()
                        .filter_map(Value::as_object_mut)
                        .for_each(crate::default_protocol);
                }
            }
        }
    }

    fn prepare_for_create(&self, _object: &mut Value) {}

    fn prepare_for_update(&self, _new: &mut Value, _old: &Value) {}

    fn validate_create(&self, object: &Value) -> FieldErrors {
        validation::validate(object)
    }

    fn validate_update(&self, new: &Value, _old: &Value) -> FieldErrors {
        validation::validate(new)
    }

    fn request_warnings(&self) -> Vec<String> {
        vec![DEPRECATION_WARNING.to_string()]
    }

    fn columns(&self) -> Vec<Column> {
        printer::columns()
    }

    fn cells(&self, object: &Value) -> Vec<Value> {
        printer::cells(object)
    }
}
