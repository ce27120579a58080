//! What a resource kind brings to the generic registry: its rules.

pub use crate::info::{ALL_VERBS, ResourceInfo, Scope};

use async_trait::async_trait;
use capstan_machinery::field::FieldErrors;
use capstan_machinery::table::Column;
use capstan_machinery::{ApiError, meta};
use capstan_storage::{Compare, Op, Storage};
use k8s_openapi::Metadata;
use serde_json::Value;

use crate::Subresource;
use crate::cache::{Project, Selectable, SelectableFrom, SelectableMeta};
use crate::current::Current;
use crate::decode::for_rules;
use crate::members::{always_present, copy_member, keep_all_but_status};
pub use crate::object::Object;
use crate::object::from_typed;
use crate::typed::{mutate, read};
pub use crate::under_write::UnderWrite;

/// Storage work a strategy adds to a write: extra compares and ops in the same transaction
/// (allocations), so an object and what it holds are written atomically.
#[derive(Debug, Default)]
pub struct WriteExtras {
    /// Conditions, e.g. "this IP is not allocated".
    pub compares: Vec<Compare>,
    /// Mutations, e.g. "record this IP as allocated".
    pub ops: Vec<Op>,
}

/// What admitting a write found ([`DynStrategy::admit`]).
#[derive(Debug, Default)]
pub struct Admitted {
    /// The storage work its allocations add.
    pub extras: WriteExtras,
    /// What validation found wrong.
    pub errors: FieldErrors,
    /// A create's warnings ([`Strategy::create_warnings`] of the object as admitted).
    pub warnings: Vec<String>,
}

/// The rules of one kind (upstream's `RESTCreateStrategy`/`RESTUpdateStrategy`/table printer),
/// on the kind's typed object. The registry calls them through [`DynStrategy`], which every
/// `Strategy` is: it decodes the stored JSON into [`Strategy::Object`], runs the rule, and
/// writes back what the rule changed.
#[async_trait]
pub trait Strategy: Send + Sync + 'static {
    /// The kind's object (`k8s_openapi::api::core::v1::Service`).
    type Object: Object;

    /// Identity.
    fn info(&self) -> &ResourceInfo;

    /// The rule names of this kind follow: a DNS-1123 subdomain unless the kind says otherwise
    /// (Services and Namespaces use a DNS-1123 label).
    fn name_rule(&self) -> fn(&str) -> Vec<String> {
        capstan_machinery::validation::dns1123_subdomain
    }

    /// What is wrong with `name` given the object's own fields, asked once the name rule
    /// passes (the rest of the name function upstream passes to ValidateObjectMeta; an
    /// APIService must be named `version.group`).
    fn name_against_object(&self, _object: &Value, _name: &str) -> Option<String> {
        None
    }

    /// `Warning` header texts sent with every request on this kind (deprecations).
    fn request_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// `Warning` header texts for a written object (upstream's WarningsOnCreate/Update).
    fn warnings(&self, _object: &Self::Object) -> Vec<String> {
        Vec::new()
    }

    /// `Warning` header texts for a created object, where a kind warns about more on create
    /// (upstream's WarningsOnCreate); [`Strategy::warnings`] unless overridden.
    fn create_warnings(&self, object: &Self::Object) -> Vec<String> {
        self.warnings(object)
    }

    /// Defaults applied when an object is decoded (what upstream's scheme defaulting does).
    fn default(&self, _object: &mut Self::Object) {}

    /// What a create may not set, cleared before validation (status is already gone).
    fn prepare_for_create(&self, _object: &mut Self::Object) {}

    /// What an update of the main resource may not change, kept (status is already kept).
    fn prepare_for_update(&self, _new: &mut Self::Object, _old: &Self::Object) {}

    /// What a `/status` update may not change besides spec (which is already kept).
    fn prepare_for_status_update(&self, _new: &mut Self::Object, _old: &Self::Object) {}

    /// Kind-specific validation of a new object.
    fn validate_create(&self, object: &Self::Object) -> FieldErrors;

    /// Kind-specific validation of an update.
    fn validate_update(&self, new: &Self::Object, old: &Self::Object) -> FieldErrors;

    /// Kind-specific validation of a `/status` update.
    fn validate_status_update(&self, _new: &Self::Object, _old: &Self::Object) -> FieldErrors {
        FieldErrors::new()
    }

    /// Kind-specific validation of a `/finalize` update (Namespaces).
    fn validate_finalize_update(&self, new: &Self::Object, old: &Self::Object) -> FieldErrors {
        self.validate_update(new, old)
    }

    /// Whether [`Strategy::allocate`] changes objects: a create that fails is then tried again
    /// from the object as it came, not from the one that failed (which, for the rest, is it).
    const ALLOCATES: bool = false;

    /// Allocations for a write (called before validation, as upstream's BeginCreate and
    /// BeginUpdate; nothing is reserved until the transaction). `old` is the stored object on
    /// update; a dry run only checks and fills placeholders. The default allocates nothing.
    async fn allocate(
        &self,
        _storage: &dyn Storage,
        _object: &mut Self::Object,
        _old: Option<&Self::Object>,
        _dry_run: bool,
    ) -> Result<WriteExtras, ApiError> {
        Ok(WriteExtras::default())
    }

    /// Graceful deletion: the grace period a DELETE of `object` gets (`requested` is the
    /// request's `gracePeriodSeconds`), or `None`/`Some(0)` for an immediate delete. Only Pods
    /// delete gracefully.
    fn grace_period(&self, _object: &Self::Object, _requested: Option<i64>) -> Option<i64> {
        None
    }

    /// Why this object may never be deleted (upstream's admission refuses it with 403
    /// `<resource> "<name>" is forbidden: <why>`), if it may not.
    fn undeletable(&self, _name: &str) -> Option<&'static str> {
        None
    }

    /// Whether an update judges the metadata again as a create does, after the update rules
    /// (upstream's Endpoints and APIService validation call ValidateObjectMeta on update too).
    fn validates_metadata_on_update(&self) -> bool {
        false
    }

    /// What to release when an object is removed.
    fn release(&self, _object: &Self::Object) -> WriteExtras {
        WriteExtras::default()
    }

    /// What a DELETE of the stored `object` does for this kind, before finalizers and graceful
    /// deletion are considered. Upstream's Namespace storage: the first DELETE only marks the
    /// namespace (phase `Terminating`); a later one waits until its finalizers are gone.
    fn deleting(&self, _object: &mut Self::Object) -> Deleting {
        Deleting::Proceed
    }

    /// The fields, besides `metadata.name` and `metadata.namespace`, that field selectors
    /// select this kind by; [`Strategy::field_value`] answers each, from `spec` or `status`
    /// (the watch cache decodes only those and `metadata`'s name, namespace and labels).
    fn selectable_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// The value of one of [`Strategy::selectable_fields`] (the object may hold only its
    /// metadata's name, namespace and labels, its spec and its status).
    fn field_value(&self, _object: &Self::Object, _field: &str) -> Option<String> {
        None
    }

    /// The object [`Strategy::field_value`] reads, decoded for the watch cache from the
    /// object's JSON (without managedFields) or the object: the whole object by default. A
    /// kind whose selectable fields are a small part of its objects decodes only that part
    /// (and `metadata`'s name, namespace and labels); its tests check that every selectable
    /// field reads the same from it as from the whole object, both ways.
    fn selectable_object(&self, from: SelectableFrom<'_>) -> Option<Self::Object> {
        match from {
            SelectableFrom::Object(object) => for_rules(object).ok(),
            json => json.decode(),
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
    fn cells(&self, object: &Self::Object) -> Vec<Value> {
        let meta = object.metadata();
        vec![
            Value::String(meta.name.clone().unwrap_or_default()),
            meta.creation_timestamp
                .as_ref()
                .and_then(|t| serde_json::to_value(t).ok())
                .unwrap_or(Value::Null),
        ]
    }
}

/// What a kind makes of a DELETE ([`Strategy::deleting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleting {
    /// As every kind: finalizers, graceful deletion, removal.
    Proceed,
    /// Keep the object, marked with `deletionTimestamp` (now) and what the rule changed.
    Mark,
    /// Not yet: answer with the object as stored, unchanged (upstream's Namespace storage
    /// answers a DELETE of a namespace still finalizing with the namespace, 200).
    Wait,
}

/// A kind's rules as the registry calls them: on stored JSON, object-safe. Implemented for
/// every [`Strategy`]; the generic work (metadata, status, managedFields, selectors) stays on
/// JSON, and each rule sees the typed object.
#[async_trait]
pub trait DynStrategy: Project + Send + Sync + 'static {
    /// Identity.
    fn info(&self) -> &ResourceInfo;

    /// Checks `metadata.name` (or a `generateName` prefix when `prefix` is true); returns
    /// the messages for `Invalid value: "<name>": <message>`.
    fn validate_name(&self, object: &Value, name: &str, prefix: bool) -> Vec<String>;

    /// Decodes a request body into the kind's schema: unknown fields dropped, wrong types
    /// refused (the error text follows "cannot be handled as a <Kind>: ").
    fn decode(&self, object: Value) -> Result<Value, String>;

    /// [`DynStrategy::decode`], as an object under write whose rules take the decoded typed
    /// object rather than decode its JSON again.
    fn decode_for_write(&self, object: Value) -> Result<UnderWrite, String>;

    /// The kind's OpenAPI definition (drives managedFields and `fieldValidation`).
    fn schema(&self) -> Option<&'static Value>;

    /// `unknown field "spec.foo"` problems of a request body (with `kind`/`apiVersion`),
    /// judged against the kind's OpenAPI schema.
    fn unknown_fields(&self, object: &Value) -> Vec<String> {
        self.schema()
            .map(|schema| capstan_machinery::schema::unknown_fields(schema, object))
            .unwrap_or_default()
    }

    /// See [`Strategy::request_warnings`].
    fn request_warnings(&self) -> Vec<String>;
    /// See [`Strategy::warnings`].
    fn warnings(&self, object: &Value) -> Vec<String>;
    /// Warnings for a created object.
    fn create_warnings(&self, object: &Value) -> Vec<String>;
    /// See [`Strategy::default`].
    fn default(&self, object: &mut Value);
    /// [`DynStrategy::default`] of an object under write: on the rules' view of it when it is
    /// in its type's form (decoded from a body or built from the type; the JSON takes only
    /// what defaulting changed), else on its JSON, which it normalizes.
    fn default_under_write(&self, object: &mut UnderWrite);
    /// Clears status (where the kind has one), then [`Strategy::prepare_for_create`].
    fn prepare_for_create(&self, object: &mut UnderWrite);
    /// The typed half of a write, after defaulting and managedFields (`old` is the stored
    /// object on update): for a create, [`Strategy::allocate`] then
    /// [`Strategy::validate_create`]; for an update of the main resource, status kept (where
    /// the kind has one), [`Strategy::prepare_for_update`], allocation and
    /// [`Strategy::validate_update`]; for a `/status` update, everything but status and
    /// metadata kept, [`Strategy::prepare_for_status_update`] and
    /// [`Strategy::validate_status_update`]. The new object is the rules' view of `object`
    /// (decoded by an earlier rule of the same write, or now), `old` is decoded once, and the
    /// rules are done afterwards ([`UnderWrite::finish`]).
    async fn admit(
        &self,
        storage: &dyn Storage,
        object: &mut UnderWrite,
        old: Option<&Current<'_>>,
        subresource: Subresource,
        dry_run: bool,
    ) -> Result<Admitted, ApiError>;
    /// See [`Strategy::ALLOCATES`].
    fn allocates(&self) -> bool;
    /// See [`Strategy::grace_period`].
    fn grace_period(&self, object: &Value, requested: Option<i64>) -> Option<i64>;
    /// See [`Strategy::undeletable`].
    fn undeletable(&self, name: &str) -> Option<&'static str>;
    /// See [`Strategy::validates_metadata_on_update`].
    fn validates_metadata_on_update(&self) -> bool;
    /// See [`Strategy::release`].
    fn release(&self, object: &Value) -> WriteExtras;
    /// See [`Strategy::deleting`] (`object` is changed as the rule changes it).
    fn deleting(&self, object: &mut Value) -> Deleting;
    /// See [`Strategy::selectable_fields`].
    fn selectable_fields(&self) -> &'static [&'static str];
    /// The value of a field for field selectors; `None` when the field is not supported.
    fn field_value(&self, object: &Value, field: &str) -> Option<String>;
    /// See [`Strategy::unsupported_field_message`].
    fn unsupported_field_message(&self, field: &str) -> String;
    /// See [`Strategy::columns`].
    fn columns(&self) -> Vec<Column>;
    /// See [`Strategy::cells`].
    fn cells(&self, object: &Value) -> Vec<Value>;
    /// [`Strategy::cells`] of an object's JSON, decoded straight into the kind's type.
    fn cells_json(&self, json: &[u8]) -> Vec<Value>;
}

/// A request body decoded into the kind's type (its `kind` and `apiVersion` are the type's).
fn decode_typed<T: Object>(mut object: Value) -> Result<T, String> {
    if let Value::Object(map) = &mut object {
        map.insert("apiVersion".into(), T::API_VERSION.into());
        map.insert("kind".into(), T::KIND.into());
    }
    // Go's reading of `null` and of missing fields when the strict reading fails.
    crate::object::to_typed(&object)
}

/// A decode failure as validation reports it (stored or patched JSON that the kind's types
/// refuse: it cannot be validated, so it cannot be written).
fn undecodable(error: &str) -> FieldErrors {
    let mut errors = FieldErrors::new();
    errors.push(capstan_machinery::field::FieldError::internal("", error));
    errors
}

#[async_trait]
impl<S: Strategy> DynStrategy for S {
    fn info(&self) -> &ResourceInfo {
        Strategy::info(self)
    }

    fn validate_name(&self, object: &Value, name: &str, prefix: bool) -> Vec<String> {
        // A prefix is judged as upstream's maskTrailingDash leaves it: a trailing dash (of a
        // prefix longer than one character) and the character before it become one `a`.
        let masked;
        let name = match name.get(..name.len().saturating_sub(2)) {
            Some(head) if prefix && name.len() > 1 && name.ends_with('-') => {
                masked = format!("{head}a");
                masked.as_str()
            }
            _ => name,
        };
        let problems = (self.name_rule())(name);
        if !problems.is_empty() {
            return problems;
        }
        Strategy::name_against_object(self, object, name)
            .into_iter()
            .collect()
    }

    fn decode(&self, object: Value) -> Result<Value, String> {
        let mut json = from_typed(&decode_typed::<S::Object>(object)?);
        omit_zeros(Strategy::info(self), &mut json);
        Ok(json)
    }

    fn decode_for_write(&self, object: Value) -> Result<UnderWrite, String> {
        let mut json = from_typed(&decode_typed::<S::Object>(object)?);
        omit_zeros(Strategy::info(self), &mut json);
        // The rules see the object as the JSON has it (empty lists left out, times at the
        // JSON's precision), as they would had they decoded it themselves.
        let typed: S::Object = for_rules(&json)?;
        Ok(UnderWrite::typed(typed, json))
    }

    fn schema(&self) -> Option<&'static Value> {
        Strategy::info(self).schema()
    }

    fn request_warnings(&self) -> Vec<String> {
        Strategy::request_warnings(self)
    }

    fn warnings(&self, object: &Value) -> Vec<String> {
        read(object, |o| Strategy::warnings(self, o)).unwrap_or_default()
    }

    fn create_warnings(&self, object: &Value) -> Vec<String> {
        read(object, |o| Strategy::create_warnings(self, o)).unwrap_or_default()
    }

    fn default(&self, object: &mut Value) {
        mutate(object, |o| Strategy::default(self, o));
    }

    fn default_under_write(&self, object: &mut UnderWrite) {
        if !object.is_normal() {
            object.edit_json(|json| {
                DynStrategy::default(self, json);
                ((), true)
            });
            object.normalized();
        } else if let Ok(typed) = object.rules::<S::Object>() {
            Strategy::default(self, typed);
        }
    }

    fn prepare_for_create(&self, object: &mut UnderWrite) {
        let info = Strategy::info(self);
        if info.has_status && !info.status_on_create {
            object.edit_json(|object| {
                let removed = object.as_object_mut().map(|map| map.shift_remove("status"));
                ((), removed.flatten().is_some())
            });
        }
        if let Ok(typed) = object.rules::<S::Object>() {
            Strategy::prepare_for_create(self, typed);
        }
    }

    async fn admit(
        &self,
        storage: &dyn Storage,
        object: &mut UnderWrite,
        old: Option<&Current<'_>>,
        subresource: Subresource,
        dry_run: bool,
    ) -> Result<Admitted, ApiError> {
        // The stored object as the write read it typed, if it did.
        let stored = object.take_stored::<S::Object>();
        // What the stored object gives the new one, outside the rules: the view is decoded
        // again when it changed anything.
        if let Some(old) = old {
            object.edit_json(|object| {
                let given = match subresource {
                    Subresource::Status => old.whole().map(|whole| {
                        keep_all_but_status(object, whole);
                        true
                    }),
                    Subresource::Main | Subresource::Finalize
                        if Strategy::info(self).has_status =>
                    {
                        copy_member(object, old, ("status", DynStrategy::schema(self)))
                    }
                    _ => Ok(false),
                };
                let changed = matches!(given, Ok(true));
                (given, changed)
            })?;
        }
        // An object the kind's types refuse cannot be admitted: a 500 where allocation would
        // run, an invalid `/status` update otherwise.
        let undecoded = |error: String| match subresource {
            Subresource::Main => Err(ApiError::internal(error)),
            Subresource::Status | Subresource::Finalize => Ok(Admitted {
                errors: undecodable(&error),
                ..Admitted::default()
            }),
        };
        let old = match (stored, old) {
            (Some(stored), Some(_)) => Some(stored),
            (_, old) => match old.map(Current::typed::<S::Object>).transpose() {
                Ok(old) => old,
                Err(error) => return undecoded(error),
            },
        };
        let new = match object.rules::<S::Object>() {
            Ok(new) => new,
            Err(error) => return undecoded(error),
        };
        let mut warnings = Vec::new();
        let (extras, errors) = match (&old, subresource) {
            (None, _) => {
                let extras = Strategy::allocate(self, storage, new, None, dry_run).await?;
                let errors = Strategy::validate_create(self, new);
                // Read here, from the object as admitted, not decoded again once written.
                warnings = Strategy::create_warnings(self, new);
                (extras, errors)
            }
            (Some(old), Subresource::Main) => {
                Strategy::prepare_for_update(self, new, old);
                // Upstream's BeforeUpdate records them before BeginUpdate allocates: a refused
                // allocation, or a failed write, goes out with them.
                warnings = Strategy::warnings(self, new);
                let extras = Strategy::allocate(self, storage, new, Some(old), dry_run)
                    .await
                    .map_err(|error| error.after_warnings(&warnings))?;
                (extras, Strategy::validate_update(self, new, old))
            }
            (Some(old), Subresource::Status) => {
                Strategy::prepare_for_status_update(self, new, old);
                let errors = Strategy::validate_status_update(self, new, old);
                (WriteExtras::default(), errors)
            }
            (Some(old), Subresource::Finalize) => (
                WriteExtras::default(),
                Strategy::validate_finalize_update(self, new, old),
            ),
        };
        match subresource {
            // A status update's object was put together from the stored one and the body's
            // status, in no particular order: it is written back whole, in its type's order.
            Subresource::Status => object.finish_whole(),
            // Otherwise it is in its type's form already (decoded from a body, encoded from a
            // typed object, or normalized by defaulting), with status kept in place or last.
            Subresource::Main | Subresource::Finalize => object.finish(),
        }
        object.edit_json(|json| {
            always_present(json, Strategy::info(self).always_present);
            // The rules are done: there is no view to keep.
            ((), true)
        });
        Ok(Admitted {
            extras,
            errors,
            warnings,
        })
    }

    fn allocates(&self) -> bool {
        S::ALLOCATES
    }

    fn grace_period(&self, object: &Value, requested: Option<i64>) -> Option<i64> {
        read(object, |o| Strategy::grace_period(self, o, requested)).flatten()
    }

    fn undeletable(&self, name: &str) -> Option<&'static str> {
        Strategy::undeletable(self, name)
    }

    fn validates_metadata_on_update(&self) -> bool {
        Strategy::validates_metadata_on_update(self)
    }

    fn release(&self, object: &Value) -> WriteExtras {
        read(object, |o| Strategy::release(self, o)).unwrap_or_default()
    }

    fn deleting(&self, object: &mut Value) -> Deleting {
        mutate(object, |o| Strategy::deleting(self, o)).unwrap_or(Deleting::Proceed)
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        Strategy::selectable_fields(self)
    }

    fn field_value(&self, object: &Value, field: &str) -> Option<String> {
        match field {
            "metadata.name" => Some(meta::name(object).to_string()),
            "metadata.namespace" => Some(meta::namespace(object).to_string()),
            _ if Strategy::selectable_fields(self).contains(&field) => Some(
                read(object, |o| Strategy::field_value(self, o, field))
                    .flatten()
                    .unwrap_or_default(),
            ),
            _ => None,
        }
    }

    fn unsupported_field_message(&self, field: &str) -> String {
        Strategy::unsupported_field_message(self, field)
    }

    fn columns(&self) -> Vec<Column> {
        Strategy::columns(self)
    }

    fn cells(&self, object: &Value) -> Vec<Value> {
        read(object, |o| Strategy::cells(self, o)).unwrap_or_default()
    }

    fn cells_json(&self, json: &[u8]) -> Vec<Value> {
        crate::decode::from_json_without_managed_fields::<S::Object>(json)
            .map(|o| Strategy::cells(self, &o))
            .unwrap_or_default()
    }
}

/// What the watch cache reads of a kind's objects: what its selectors read.
impl<S: Strategy> Project for S {
    fn storage_prefix(&self) -> String {
        Strategy::info(self).list_prefix("")
    }

    fn encoding_schema(&self) -> Option<&'static Value> {
        Strategy::info(self).schema()
    }

    fn selectable(&self, object: &Value) -> Selectable {
        let fields = Strategy::selectable_fields(self);
        let typed: Option<S::Object> = if fields.is_empty() {
            None
        } else {
            Strategy::selectable_object(self, SelectableFrom::Object(object))
        };
        Selectable::new(
            object,
            fields.iter().map(|field| {
                let value = typed
                    .as_ref()
                    .and_then(|o| Strategy::field_value(self, o, field));
                (*field, value.unwrap_or_default())
            }),
        )
    }

    fn selectable_json(&self, metadata: &[u8], whole: &dyn Fn() -> Vec<u8>) -> Option<Selectable> {
        let fields = Strategy::selectable_fields(self);
        if fields.is_empty() {
            // Only the metadata is read: the rest of the object is not even scanned.
            let m: SelectableMeta = serde_json::from_slice(metadata).ok()?;
            return Some(Selectable::from_parts(
                m.name.as_deref().unwrap_or_default(),
                m.namespace.as_deref().unwrap_or_default(),
                m.labels.unwrap_or_default(),
                [],
            ));
        }
        let typed = Strategy::selectable_object(self, SelectableFrom::Json(&whole()))?;
        let m = typed.metadata();
        Some(Selectable::from_parts(
            m.name.as_deref().unwrap_or_default(),
            m.namespace.as_deref().unwrap_or_default(),
            m.labels.clone().unwrap_or_default(),
            fields.iter().map(|field| {
                let value = Strategy::field_value(self, &typed, field);
                (*field, value.unwrap_or_default())
            }),
        ))
    }
}

/// What Go's `omitempty` leaves out of an object decoded into its type (`"clusterIP": ""`,
/// a port's `"nodePort": 0`) is left out here too: such a value and no value are one to Go.
fn omit_zeros(info: &ResourceInfo, json: &mut Value) {
    if info.schema().is_some() {
        capstan_machinery::go_order::drop_omitted_zeros(json, info.definition);
    }
}
