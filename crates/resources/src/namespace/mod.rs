//! core/v1 Namespace, as much as namespaced kinds need: the four built-in namespaces,
//! create/get/list/watch/delete, and the check that a namespace exists before content is
//! created in it.

use capstan_machinery::field::FieldErrors;
use capstan_machinery::meta;
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_registry::{ResourceInfo, Strategy};
use serde_json::{Value, json};

/// The namespaces every cluster starts with.
pub const BUILT_IN: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Namespace's identity.
pub static NAMESPACE_INFO: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    kind: "Namespace",
    list_kind: "NamespaceList",
    plural: "namespaces",
    singular: "namespace",
    namespaced: false,
    short_names: &["ns"],
    categories: &[],
    verbs: &[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ],
    has_status: true,
    storage_version_hash: "Q3oi5N2YM8M=",
    storage_prefix: "namespaces",
    allow_create_on_update: false,
    allow_unconditional_update: true,
    delete_returns_object: false,
};

/// The storage prefix namespaced kinds check for their namespace.
pub const NAMESPACE_PREFIX: &str = "namespaces/";

/// The Namespace strategy.
pub struct NamespaceStrategy;

impl Strategy for NamespaceStrategy {
    /// The namespace lifecycle admission plugin's immortal namespaces.
    fn undeletable(&self, name: &str) -> Option<&'static str> {
        matches!(name, "default" | "kube-system" | "kube-public")
            .then_some("this namespace may not be deleted")
    }

    fn info(&self) -> &ResourceInfo {
        &NAMESPACE_INFO
    }

    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        capstan_machinery::validation::dns1123_label
    }

    fn decode(&self, object: Value) -> Result<Value, String> {
        crate::typed::<k8s_openapi::api::core::v1::Namespace>(object)
    }

    fn default(&self, object: &mut Value) {
        if let Value::Object(map) = object {
            let spec = map.entry("spec").or_insert_with(|| json!({}));
            if spec.get("finalizers").is_none() {
                spec["finalizers"] = json!(["kubernetes"]);
            }
        }
        meta::metadata_mut(object)
            .entry("labels")
            .or_insert_with(|| json!({}));
        let name = meta::name(object).to_string();
        if let Some(labels) = object
            .pointer_mut("/metadata/labels")
            .and_then(Value::as_object_mut)
            && !name.is_empty()
        {
            labels.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }

    fn prepare_for_create(&self, object: &mut Value) {
        if let Value::Object(map) = object {
            map.insert("status".into(), json!({"phase": "Active"}));
        }
    }

    fn validate_create(&self, _object: &Value) -> FieldErrors {
        FieldErrors::new()
    }

    fn validate_update(&self, _new: &Value, _old: &Value) -> FieldErrors {
        FieldErrors::new()
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column {
                name: "Status",
                kind: "string",
                format: "",
                description: "The status of the namespace",
                priority: 0,
            },
            AGE_COLUMN,
        ]
    }

    fn cells(&self, object: &Value) -> Vec<Value> {
        vec![
            json!(meta::name(object)),
            json!(
                object
                    .pointer("/status/phase")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            ),
            json!(age(meta::meta_str(object, "creationTimestamp"))),
        ]
    }
}
