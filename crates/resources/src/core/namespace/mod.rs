//! core/v1 Namespace: the four built-in namespaces, and the lifecycle upstream's namespace
//! storage gives it. A new namespace carries the `kubernetes` finalizer in `spec.finalizers`
//! and is `Active`; its first DELETE only marks it `Terminating` (the namespace controller then
//! removes its content and the finalizer, through `/finalize`, and deletes it again); a DELETE
//! while the finalizer is there waits (409).

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_registry::{Deleting, ResourceInfo, Strategy};
use k8s_openapi::api::core::v1::{Namespace, NamespaceSpec, NamespaceStatus};
use serde_json::{Value, json};

/// The namespaces every cluster starts with.
pub const BUILT_IN: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Namespace's identity.
pub static NAMESPACE_INFO: ResourceInfo =
    ResourceInfo::of::<Namespace>(&super::V1, "io.k8s.api.core.v1.Namespace")
        .short_names(&["ns"])
        .verbs(&[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ])
        .with_status()
        .with_finalize()
        .storage_version_hash("Q3oi5N2YM8M=")
        .unconditional_update()
        .zero(r#"{"metadata":{"creationTimestamp":null},"spec":{},"status":{}}"#);

/// The storage prefix namespaced kinds check for their namespace.
pub const NAMESPACE_PREFIX: &str = "namespaces/";

/// The finalizer that holds a namespace until its content is gone.
pub const FINALIZER: &str = "kubernetes";

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

    /// Upstream's `SetDefaults_Namespace`: the name label. (The finalizer is not a default:
    /// it may be removed over the namespace's life.)
    fn default(&self, namespace: &mut Namespace) {
        let name = namespace.metadata.name.clone().unwrap_or_default();
        let labels = namespace
            .metadata
            .labels
            .get_or_insert_with(Default::default);
        if !name.is_empty() {
            labels.insert(NAME_LABEL.to_string(), name);
        }
    }

    /// Active, and held by the `kubernetes` finalizer (appended to any the request names).
    fn prepare_for_create(&self, namespace: &mut Namespace) {
        namespace.status = Some(NamespaceStatus {
            phase: Some("Active".to_string()),
            ..NamespaceStatus::default()
        });
        let spec = namespace.spec.get_or_insert_with(NamespaceSpec::default);
        let finalizers = spec.finalizers.get_or_insert_default();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            finalizers.push(FINALIZER.to_string());
        }
    }

    /// Only `/finalize` changes `spec.finalizers` (status is kept by the registry).
    fn prepare_for_update(&self, new: &mut Namespace, old: &Namespace) {
        let finalizers = old.spec.as_ref().and_then(|s| s.finalizers.clone());
        new.spec.get_or_insert_default().finalizers = finalizers;
    }

    fn deleting(&self, namespace: &mut Namespace) -> Deleting {
        if namespace.metadata.deletion_timestamp.is_none() {
            namespace.status.get_or_insert_default().phase = Some("Terminating".into());
            return Deleting::Mark;
        }
        let finalizers = namespace.spec.as_ref().and_then(|s| s.finalizers.as_ref());
        if finalizers.is_some_and(|f| !f.is_empty()) {
            return Deleting::Wait;
        }
        Deleting::Proceed
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

    /// Upstream's ValidateNamespace: each `spec.finalizers` entry a qualified name, and one
    /// without a `/` a standard finalizer (at the list's path).
    fn validate_create(&self, namespace: &Namespace) -> FieldErrors {
        finalizer_names(namespace, |_| "spec.finalizers".to_string())
    }

    /// Upstream's ValidateNamespaceFinalizeUpdate: the same rules, at each entry's index.
    fn validate_finalize_update(&self, new: &Namespace, _old: &Namespace) -> FieldErrors {
        finalizer_names(new, |i| format!("spec.finalizers[{i}]"))
    }

    /// Upstream's ValidateNamespaceStatusUpdate: the phase says whether it is being deleted.
    fn validate_status_update(&self, new: &Namespace, _old: &Namespace) -> FieldErrors {
        let mut errors = FieldErrors::new();
        let phase = new
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("");
        let (wanted, message) = match new.metadata.deletion_timestamp {
            None => (
                "Active",
                "may only be 'Active' if `deletionTimestamp` is empty",
            ),
            Some(_) => (
                "Terminating",
                "may only be 'Terminating' if `deletionTimestamp` is not empty",
            ),
        };
        if phase != wanted {
            errors.push(FieldError::invalid("status.Phase", &json!(phase), message));
        }
        errors
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

/// `validateFinalizerName` for each of `spec.finalizers`, at the path `path` gives.
fn finalizer_names(namespace: &Namespace, path: impl Fn(usize) -> String) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let finalizers = namespace.spec.as_ref().and_then(|s| s.finalizers.as_ref());
    for (i, finalizer) in finalizers.into_iter().flatten().enumerate() {
        let value = json!(finalizer);
        let messages = capstan_machinery::validation::qualified_name(finalizer)
            .into_iter()
            .chain(capstan_machinery::validation::kube_finalizer_name(
                finalizer,
            ));
        for message in messages {
            errors.push(FieldError::invalid(path(i), &value, message));
        }
    }
    errors
}
