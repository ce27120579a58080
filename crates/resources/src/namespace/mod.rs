//! core/v1 Namespace, as much as namespaced kinds need: the four built-in namespaces,
//! create/get/list/watch/delete, and the check that a namespace exists before content is
//! created in it.

use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_registry::{ResourceInfo, Strategy};
use k8s_openapi::api::core::v1::{Namespace, NamespaceSpec, NamespaceStatus};
use serde_json::{Value, json};

/// The namespaces every cluster starts with.
pub const BUILT_IN: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Namespace's identity.
pub static NAMESPACE_INFO: ResourceInfo = ResourceInfo::of::<Namespace>()
    .short_names(&["ns"])
    .verbs(&[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ])
    .with_status()
    .storage_version_hash("Q3oi5N2YM8M=")
    .unconditional_update()
    .openapi(
        "io.k8s.api.core.v1.Namespace",
        "api/v1",
        capstan_machinery::schema::CORE_V1_OPENAPI,
    );

/// The storage prefix namespaced kinds check for their namespace.
pub const NAMESPACE_PREFIX: &str = "namespaces/";

/// The label upstream puts on every namespace, naming it (for namespace selectors).
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The Namespace strategy.
pub struct NamespaceStrategy;

impl Strategy for NamespaceStrategy {
    type Object = Namespace;

    fn info(&self) -> &ResourceInfo {
        &NAMESPACE_INFO
    }

    /// The namespace lifecycle admission plugin's immortal namespaces.
    fn undeletable(&self, name: &str) -> Option<&'static str> {
        matches!(name, "default" | "kube-system" | "kube-public")
            .then_some("this namespace may not be deleted")
    }

    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        capstan_machinery::validation::dns1123_label
    }

    fn default(&self, namespace: &mut Namespace) {
        let spec = namespace.spec.get_or_insert_with(NamespaceSpec::default);
        spec.finalizers
            .get_or_insert_with(|| vec!["kubernetes".to_string()]);
        let name = namespace.metadata.name.clone().unwrap_or_default();
        let labels = namespace
            .metadata
            .labels
            .get_or_insert_with(Default::default);
        if !name.is_empty() {
            labels.insert(NAME_LABEL.to_string(), name);
        }
    }

    fn prepare_for_create(&self, namespace: &mut Namespace) {
        namespace.status = Some(NamespaceStatus {
            phase: Some("Active".to_string()),
            ..NamespaceStatus::default()
        });
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.phase"]
    }

    fn field_value(&self, namespace: &Namespace, field: &str) -> Option<String> {
        (field == "status.phase").then(|| {
            namespace
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default()
        })
    }

    fn unsupported_field_message(&self, field: &str) -> String {
        format!("field label not supported: {field}")
    }

    fn validate_create(&self, _namespace: &Namespace) -> FieldErrors {
        FieldErrors::new()
    }

    fn validate_update(&self, _new: &Namespace, _old: &Namespace) -> FieldErrors {
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

    fn cells(&self, namespace: &Namespace) -> Vec<Value> {
        let phase = namespace.status.as_ref().and_then(|s| s.phase.clone());
        vec![
            json!(namespace.metadata.name.as_deref().unwrap_or_default()),
            json!(phase.unwrap_or_default()),
            json!(age(&crate::created(&namespace.metadata))),
        ]
    }
}
