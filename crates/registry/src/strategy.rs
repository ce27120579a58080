//! What a resource kind brings to the generic registry: its identity and its rules.

use async_trait::async_trait;
use capstan_machinery::field::FieldErrors;
use capstan_machinery::status::GroupResource;
use capstan_machinery::table::Column;
use capstan_machinery::{ApiError, meta};
use capstan_storage::{Compare, Op, Storage};
use serde_json::Value;

/// A kind's identity as discovery, URLs, storage and error messages name it.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    /// API group; empty for core.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind (`Service`).
    pub kind: &'static str,
    /// List kind (`ServiceList`).
    pub list_kind: &'static str,
    /// Plural resource (`services`).
    pub plural: &'static str,
    /// Singular resource (`service`).
    pub singular: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Categories (`all`).
    pub categories: &'static [&'static str],
    /// Verbs served on the main resource, sorted.
    pub verbs: &'static [&'static str],
    /// Whether a `/status` subresource exists.
    pub has_status: bool,
    /// Discovery's `storageVersionHash`.
    pub storage_version_hash: &'static str,
    /// Storage key prefix, without a trailing slash (`services/specs`).
    pub storage_prefix: &'static str,
    /// PUT on a missing object creates it.
    pub allow_create_on_update: bool,
    /// PUT without `metadata.resourceVersion` is accepted (last write wins).
    pub allow_unconditional_update: bool,
    /// DELETE answers with the object (Services) instead of a Success `Status`.
    pub delete_returns_object: bool,
}

impl ResourceInfo {
    /// `group/version`, or `version` for core.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource as error messages name it.
    pub fn group_resource(&self) -> GroupResource<'static> {
        GroupResource {
            group: self.group,
            resource: self.plural,
        }
    }

    /// `Kind` or `Kind.group`, as `Invalid` messages name it.
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// The storage key of one object.
    pub fn key(&self, namespace: &str, name: &str) -> String {
        if self.namespaced {
            format!("{}/{namespace}/{name}", self.storage_prefix)
        } else {
            format!("{}/{name}", self.storage_prefix)
        }
    }

    /// The storage prefix of a list: one namespace, or everything when `namespace` is empty.
    pub fn list_prefix(&self, namespace: &str) -> String {
        if self.namespaced && !namespace.is_empty() {
            format!("{}/{namespace}/", self.storage_prefix)
        } else {
            format!("{}/", self.storage_prefix)
        }
    }
}

/// Storage work a strategy adds to a write: extra compares and ops in the same transaction
/// (allocations), so an object and what it holds are written atomically.
#[derive(Debug, Default)]
pub struct WriteExtras {
    /// Conditions, e.g. "this IP is not allocated".
    pub compares: Vec<Compare>,
    /// Mutations, e.g. "record this IP as allocated".
    pub ops: Vec<Op>,
}

/// The rules of one kind (upstream's `RESTCreateStrategy`/`RESTUpdateStrategy`/table printer).
#[async_trait]
pub trait Strategy: Send + Sync + 'static {
    /// Identity.
    fn info(&self) -> &ResourceInfo;

    /// Checks `metadata.name` (or a `generateName` prefix when `prefix` is true); returns
    /// the messages for `Invalid value: "<name>": <message>`.
    fn validate_name(&self, name: &str, prefix: bool) -> Vec<String> {
        let name = if prefix {
            name.trim_end_matches('-')
        } else {
            name
        };
        if prefix && name.is_empty() {
            return Vec::new();
        }
        (self.name_rule())(name)
    }

    /// The rule names of this kind follow: a DNS-1123 subdomain unless the kind says otherwise
    /// (Services and Namespaces use a DNS-1123 label).
    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        capstan_machinery::validation::dns1123_subdomain
    }

    /// Decodes a request body into the kind's schema: unknown fields dropped, wrong types
    /// refused (the error text follows "cannot be handled as a <Kind>: ").
    fn decode(&self, object: Value) -> Result<Value, String> {
        Ok(object)
    }

    /// The kind's OpenAPI definition (drives managedFields and `fieldValidation`): for core/v1
    /// kinds, `io.k8s.api.core.v1.<Kind>`.
    fn schema(&self) -> Option<&'static Value> {
        let info = self.info();
        if info.group.is_empty() && info.version == "v1" {
            capstan_machinery::schema::core_schema(&format!("io.k8s.api.core.v1.{}", info.kind))
        } else {
            None
        }
    }

    /// `unknown field "spec.foo"` problems of a request body (with `kind`/`apiVersion`),
    /// judged against the kind's OpenAPI schema.
    fn unknown_fields(&self, object: &Value) -> Vec<String> {
        self.schema()
            .map(|schema| capstan_machinery::schema::unknown_fields(schema, object))
            .unwrap_or_default()
    }

    /// `Warning` header texts sent with every request on this kind (deprecations).
    fn request_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// `Warning` header texts for a written object (upstream's WarningsOnCreate/Update).
    fn warnings(&self, _object: &Value) -> Vec<String> {
        Vec::new()
    }

    /// Defaults applied when an object is decoded (what upstream's scheme defaulting does).
    fn default(&self, _object: &mut Value) {}

    /// Clears what a create may not set (status) before validation.
    fn prepare_for_create(&self, object: &mut Value) {
        if let Value::Object(map) = object
            && self.info().has_status
        {
            map.shift_remove("status");
        }
    }

    /// Keeps what an update of the main resource may not change (status).
    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        if self.info().has_status {
            copy_field(new, old, "status");
        }
    }

    /// Keeps what a `/status` update may not change (everything but status and metadata).
    fn prepare_for_status_update(&self, new: &mut Value, old: &Value) {
        let keys: Vec<String> = old
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for key in keys {
            if key != "status" && key != "metadata" {
                copy_field(new, old, &key);
            }
        }
        if let Value::Object(map) = new {
            map.retain(|k, _| k == "status" || k == "metadata" || old.get(k.as_str()).is_some());
        }
    }

    /// Kind-specific validation of a new object.
    fn validate_create(&self, object: &Value) -> FieldErrors;

    /// Kind-specific validation of an update.
    fn validate_update(&self, new: &Value, old: &Value) -> FieldErrors;

    /// Kind-specific validation of a `/status` update.
    fn validate_status_update(&self, _new: &Value, _old: &Value) -> FieldErrors {
        FieldErrors::new()
    }

    /// Allocations for a write (called before validation, as upstream's BeginCreate and
    /// BeginUpdate; nothing is reserved until the transaction). `old` is the stored object on
    /// update; a dry run only checks and fills placeholders. The default allocates nothing.
    async fn allocate(
        &self,
        _storage: &dyn Storage,
        _object: &mut Value,
        _old: Option<&Value>,
        _dry_run: bool,
    ) -> Result<WriteExtras, ApiError> {
        Ok(WriteExtras::default())
    }

    /// Graceful deletion: the grace period a DELETE of `object` gets (`requested` is the
    /// request's `gracePeriodSeconds`), or `None`/`Some(0)` for an immediate delete. Only Pods
    /// delete gracefully.
    fn grace_period(&self, _object: &Value, _requested: Option<i64>) -> Option<i64> {
        None
    }

    /// Why this object may never be deleted (upstream's admission refuses it with 403
    /// `<resource> "<name>" is forbidden: <why>`), if it may not.
    fn undeletable(&self, _name: &str) -> Option<&'static str> {
        None
    }

    /// What to release when an object is removed.
    fn release(&self, _object: &Value) -> WriteExtras {
        WriteExtras::default()
    }

    /// The fields, besides `metadata.name` and `metadata.namespace`, that field selectors
    /// select this kind by; [`Strategy::field_value`] answers each, from `spec` or `status`
    /// (the watch cache decodes only those and `metadata`'s name, namespace and labels).
    fn selectable_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// What label and field selectors read of an object: the watch cache keeps only this
    /// beside the object's JSON.
    fn selectable(&self, object: &Value) -> crate::cache::Selectable {
        crate::cache::Selectable::new(
            object,
            self.selectable_fields()
                .iter()
                .map(|field| (*field, self.field_value(object, field).unwrap_or_default())),
        )
    }

    /// The value of a field for field selectors; `None` when the field is not supported.
    fn field_value(&self, object: &Value, field: &str) -> Option<String> {
        match field {
            "metadata.name" => Some(meta::name(object).to_string()),
            "metadata.namespace" => Some(meta::namespace(object).to_string()),
            _ => None,
        }
    }

    /// The 400 message for an unsupported field selector field.
    fn unsupported_field_message(&self, field: &str) -> String {
        format!(
            "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )
    }

    /// Table columns (`Name` first).
    fn columns(&self) -> Vec<Column> {
        vec![
            capstan_machinery::table::NAME_COLUMN,
            capstan_machinery::table::Column {
                name: "Created At",
                kind: "date",
                format: "",
                description: capstan_machinery::table::AGE_DESCRIPTION,
                priority: 0,
            },
        ]
    }

    /// One Table row's cells, matching [`Strategy::columns`].
    fn cells(&self, object: &Value) -> Vec<Value> {
        vec![
            Value::String(meta::name(object).to_string()),
            Value::String(meta::meta_str(object, "creationTimestamp").to_string()),
        ]
    }
}

/// Copies `field` from `from` to `to` (removing it from `to` when `from` lacks it).
pub fn copy_field(to: &mut Value, from: &Value, field: &str) {
    if let Value::Object(map) = to {
        match from.get(field) {
            Some(value) => {
                map.insert(field.to_string(), value.clone());
            }
            None => {
                map.shift_remove(field);
            }
        }
    }
}
