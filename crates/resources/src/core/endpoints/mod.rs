//! core/v1 Endpoints: the API (validation, defaults, printer). The endpoints controller that
//! maintains them for selector-based Services comes with its own issue.

mod printer;
mod validation;

use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::Column;
use capstan_registry::{ResourceInfo, Strategy};
use k8s_openapi::api::core::v1::Endpoints;
use serde_json::Value;

/// Endpoints' identity.
pub static ENDPOINTS_INFO: ResourceInfo =
    ResourceInfo::of::<Endpoints>(&super::V1, "io.k8s.api.core.v1.Endpoints")
        .short_names(&["ep"])
        .storage_version_hash("fWeeMqaN/OA=")
        .storage_prefix("services/endpoints")
        .create_on_update()
        .unconditional_update();

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
    type Object = Endpoints;

    fn info(&self) -> &ResourceInfo {
        &ENDPOINTS_INFO
    }

    fn default(&self, endpoints: &mut Endpoints) {
        for subset in endpoints.subsets.iter_mut().flatten() {
            for port in subset.ports.iter_mut().flatten() {
                crate::default_protocol(&mut port.protocol);
            }
        }
    }

    fn validate_create(&self, endpoints: &Endpoints) -> FieldErrors {
        validation::validate(endpoints)
    }

    fn validates_metadata_on_update(&self) -> bool {
        true
    }

    /// Upstream's ValidateEndpointsUpdate: subsets left as they were are not judged again
    /// (so an object stored under older rules can still have its labels changed).
    fn validate_update(&self, new: &Endpoints, old: &Endpoints) -> FieldErrors {
        let mut errors = validation::validate(new);
        if new.subsets == old.subsets {
            errors.0.retain(|e| !e.field.starts_with("subsets"));
        }
        errors
    }

    fn request_warnings(&self) -> Vec<String> {
        vec![DEPRECATION_WARNING.to_string()]
    }

    /// `endpointsWarnings`: non-canonical or legacy addresses, except in what the endpoints
    /// controller writes (it canonicalises them).
    fn warnings(&self, endpoints: &Endpoints) -> Vec<String> {
        let managed_by = endpoints
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("endpoints.kubernetes.io/managed-by"));
        if managed_by.is_some_and(|m| m == "endpoint-controller") {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, subset) in endpoints.subsets.iter().flatten().enumerate() {
            for (list, addresses) in [
                ("addresses", &subset.addresses),
                ("notReadyAddresses", &subset.not_ready_addresses),
            ] {
                for (j, address) in addresses.iter().flatten().enumerate() {
                    let path = format!("subsets[{i}].{list}[{j}].ip");
                    out.extend(capstan_machinery::ip::ip_warnings(&path, &address.ip));
                }
            }
        }
        out
    }

    fn columns(&self) -> Vec<Column> {
        printer::columns()
    }

    fn cells(&self, endpoints: &Endpoints) -> Vec<Value> {
        printer::cells(endpoints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subsets_left_as_stored_are_not_judged_again_on_update() {
        // Stored under older rules (a leading zero), then relabelled: accepted, as upstream.
        let old: Endpoints = serde_json::from_value(
            json!({"subsets": [{"addresses": [{"ip": "010.1.1.1"}], "ports": [{"port": 80}]}]}),
        )
        .expect("endpoints");
        let mut new = old.clone();
        new.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(EndpointsStrategy.validate_update(&new, &old).0.is_empty());
        // A changed subset list is judged whole.
        new.subsets.as_mut().expect("subsets")[0].ports = None;
        assert!(!EndpointsStrategy.validate_update(&new, &old).0.is_empty());
    }
}
