//! apiregistration.k8s.io/v1 APIService (`spec/apiservice.md` §1–§6): defaults, validation,
//! the status rules of the strategy, the Table, and the `Available` condition helpers the
//! availability controller and the aggregation proxy share.

mod validation;

use capstan_machinery::field::FieldErrors;
use capstan_machinery::meta;
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_registry::{ResourceInfo, Strategy};
use serde_json::{Value, json};

/// APIService's identity.
pub static APISERVICE_INFO: ResourceInfo = ResourceInfo {
    group: "apiregistration.k8s.io",
    version: "v1",
    kind: "APIService",
    list_kind: "APIServiceList",
    plural: "apiservices",
    singular: "apiservice",
    namespaced: false,
    short_names: &[],
    categories: &["api-extensions"],
    verbs: crate::NAMESPACED_VERBS,
    has_status: true,
    storage_version_hash: "InPBPD7+PqM=",
    storage_prefix: "apiregistration.k8s.io/apiservices",
    allow_create_on_update: false,
    allow_unconditional_update: false,
    delete_returns_object: false,
};

/// The label of APIServices the server registers for the groups it serves itself.
pub const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

/// The message of the `Local` condition.
pub const LOCAL_MESSAGE: &str = "Local APIServices are always available";

/// The APIService strategy.
pub struct ApiServiceStrategy;

/// Whether an APIService is served by the server itself (no `spec.service`).
pub fn is_local(object: &Value) -> bool {
    object.pointer("/spec/service").is_none_or(Value::is_null)
}

/// The `Available` condition, if any.
pub fn available(object: &Value) -> Option<&Value> {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"))
}

/// Whether the `Available` condition is `True`.
pub fn is_available(object: &Value) -> bool {
    available(object)
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        == Some("True")
}

/// Sets the `Available` condition as upstream's helper does: reason and message replaced,
/// `lastTransitionTime` changed only when the status changes. Returns whether anything changed.
pub fn set_available(object: &mut Value, status: &str, reason: &str, message: &str) -> bool {
    let now = meta::now_rfc3339();
    let Value::Object(map) = object else {
        return false;
    };
    let status_stanza = map.entry("status").or_insert_with(|| json!({}));
    if !status_stanza.is_object() {
        *status_stanza = json!({});
    }
    let conditions = status_stanza
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    let Some(Value::Array(conditions)) = conditions else {
        return false;
    };
    match conditions
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"))
    {
        Some(condition) => {
            let same = condition.get("status").and_then(Value::as_str) == Some(status)
                && condition.get("reason").and_then(Value::as_str) == Some(reason)
                && condition.get("message").and_then(Value::as_str) == Some(message);
            if same {
                return false;
            }
            if condition.get("status").and_then(Value::as_str) != Some(status) {
                condition["lastTransitionTime"] = json!(now);
            }
            condition["status"] = json!(status);
            condition["reason"] = json!(reason);
            condition["message"] = json!(message);
            true
        }
        None => {
            conditions.push(json!({"type": "Available", "status": status,
                "lastTransitionTime": now, "reason": reason, "message": message}));
            true
        }
    }
}

impl Strategy for ApiServiceStrategy {
    fn info(&self) -> &ResourceInfo {
        &APISERVICE_INFO
    }

    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        validation::path_segment_name
    }

    fn schema(&self) -> Option<&'static Value> {
        capstan_machinery::schema::core_schema(
            "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIService",
        )
    }

    fn decode(&self, object: Value) -> Result<Value, String> {
        crate::typed::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>(
            object,
        )
    }

    fn default(&self, object: &mut Value) {
        if let Some(service) = object
            .pointer_mut("/spec/service")
            .and_then(Value::as_object_mut)
            && service.get("port").is_none_or(Value::is_null)
        {
            service.insert("port".into(), json!(443));
        }
    }

    fn prepare_for_create(&self, object: &mut Value) {
        if let Value::Object(map) = object {
            map.shift_remove("status");
        }
        if is_local(object) {
            set_available(object, "True", "Local", LOCAL_MESSAGE);
        }
    }

    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        capstan_registry::strategy::copy_field(new, old, "status");
    }

    fn prepare_for_status_update(&self, new: &mut Value, old: &Value) {
        capstan_registry::strategy::copy_field(new, old, "spec");
        for field in ["labels", "annotations", "finalizers", "ownerReferences"] {
            match meta::metadata(old).and_then(|m| m.get(field)).cloned() {
                Some(value) => {
                    meta::metadata_mut(new).insert(field.into(), value);
                }
                None => {
                    meta::metadata_mut(new).shift_remove(field);
                }
            }
        }
    }

    fn validate_create(&self, object: &Value) -> FieldErrors {
        validation::validate(object)
    }

    fn validate_update(&self, new: &Value, _old: &Value) -> FieldErrors {
        validation::validate(new)
    }

    fn validate_status_update(&self, new: &Value, _old: &Value) -> FieldErrors {
        validation::validate_status(new)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column {
                name: "Service",
                kind: "string",
                format: "",
                description: "The reference to the service that hosts this API endpoint.",
                priority: 0,
            },
            Column {
                name: "Available",
                kind: "string",
                format: "",
                description: "Whether this service is available.",
                priority: 0,
            },
            AGE_COLUMN,
        ]
    }

    fn cells(&self, object: &Value) -> Vec<Value> {
        let service = match object.pointer("/spec/service").filter(|s| !s.is_null()) {
            None => "Local".to_string(),
            Some(s) => format!(
                "{}/{}",
                s.get("namespace").and_then(Value::as_str).unwrap_or(""),
                s.get("name").and_then(Value::as_str).unwrap_or("")
            ),
        };
        let available = match available(object) {
            None => "Unknown".to_string(),
            Some(c) => {
                let status = c.get("status").and_then(Value::as_str).unwrap_or("");
                let reason = c.get("reason").and_then(Value::as_str).unwrap_or("");
                if status == "True" || reason.is_empty() {
                    status.to_string()
                } else {
                    format!("{status} ({reason})")
                }
            }
        };
        vec![
            json!(meta::name(object)),
            json!(service),
            json!(available),
            json!(age(meta::meta_str(object, "creationTimestamp"))),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_show_local_and_reasons() {
        let strategy = ApiServiceStrategy;
        let mut local = json!({"metadata": {"name": "v1."}, "spec": {"version": "v1"}});
        strategy.prepare_for_create(&mut local);
        assert_eq!(
            strategy.cells(&local)[1..3],
            [json!("Local"), json!("True")]
        );
        let mut remote = json!({"metadata": {"name": "v1alpha1.example.com"},
            "spec": {"service": {"namespace": "ext", "name": "api"}}});
        strategy.prepare_for_create(&mut remote);
        assert_eq!(
            strategy.cells(&remote)[1..3],
            [json!("ext/api"), json!("Unknown")]
        );
        assert!(set_available(&mut remote, "False", "MissingEndpoints", "m"));
        assert!(!set_available(
            &mut remote,
            "False",
            "MissingEndpoints",
            "m"
        ));
        assert_eq!(
            strategy.cells(&remote)[2],
            json!("False (MissingEndpoints)")
        );
        strategy.default(&mut remote);
        assert_eq!(remote["spec"]["service"]["port"], 443);
    }
}
