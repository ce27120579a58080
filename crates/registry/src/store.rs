//! `Registry`: the verbs (get, list, watch, create, update, patch, delete) for one kind, generic
//! over its [`Strategy`], on top of storage and the watch cache.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capstan_machinery::continue_token::ContinueToken;
use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::fields::FieldSelector;
use capstan_machinery::labels::LabelSelector;
use capstan_machinery::{ApiError, meta, validation};
use capstan_storage::{
    Compare, KeyValue, Op, RangeRequest, Revision, Storage, StorageError, Txn, TxnOutcome,
};
use serde_json::{Value, json};

use crate::cache::{CachedObject, WatchCache};
use crate::strategy::{DynStrategy, WriteExtras};

/// How long a read waits for the cache to reach a requested revision.
const RESOURCE_VERSION_WAIT: Duration = Duration::from_secs(3);
/// How often a write re-runs after losing a race it can safely retry.
const WRITE_ATTEMPTS: usize = 16;
/// generateName attempts before giving up.
const GENERATE_NAME_ATTEMPTS: usize = 8;
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Options of create, update and patch.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: run everything, persist nothing.
    pub dry_run: bool,
    /// The `fieldManager` (or the one derived from the User-Agent).
    pub field_manager: String,
    /// The object's managedFields were computed by server-side apply: record no `Update`.
    pub applied: bool,
}

/// What a delete does to an object that exists.
enum Marking {
    /// Removed now.
    Remove,
    /// Already marked, and this delete shortens nothing: kept as it is.
    Keep,
    /// Kept, marked with this deletion time and grace period.
    Mark(String, i64),
}

/// Options of delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `propagationPolicy` (`Orphan`, `Background`, `Foreground`).
    pub propagation: Option<String>,
    /// `gracePeriodSeconds` (negative values are treated as 1, as upstream does).
    pub grace_period_seconds: Option<i64>,
}

/// How a read may be served (`resourceVersion` + `resourceVersionMatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAt {
    /// Unset: the latest state.
    #[default]
    Latest,
    /// `"0"`: any recent state.
    Any,
    /// Not older than this revision.
    NotOlderThan(Revision),
    /// Exactly this revision.
    Exact(Revision),
}

/// Options of list (and deletecollection).
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `limit` (0: everything).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<ContinueToken>,
    /// `resourceVersion` + `resourceVersionMatch`.
    pub read_at: ReadAt,
}

/// A page of a list.
#[derive(Debug)]
pub struct ListResult {
    /// Matching objects, in key order.
    pub items: Vec<Arc<CachedObject>>,
    /// The revision the list was read at.
    pub revision: Revision,
    /// The token for the next page.
    pub continue_token: Option<String>,
    /// How many objects follow (only without selectors).
    pub remaining: Option<i64>,
}

/// What a delete did.
#[derive(Debug)]
pub struct DeleteResult {
    /// The object: its final state, or its state while finalizers keep it.
    pub object: Value,
    /// Whether it is gone.
    pub removed: bool,
}

/// The largest object the store takes by default: etcd's `--max-request-bytes` (1.5 MiB).
pub const MAX_OBJECT_BYTES: usize = 1_572_864;

/// The verbs of one kind.
pub struct Registry {
    strategy: Arc<dyn DynStrategy>,
    storage: Arc<dyn Storage>,
    cache: Arc<WatchCache>,
    namespace_prefix: Option<String>,
    max_object_bytes: usize,
}

fn storage_error(error: StorageError) -> ApiError {
    ApiError::internal(error)
}

impl Registry {
    /// A registry for `strategy` over `storage`, serving reads from `cache`. Creates of
    /// namespaced objects check that the namespace exists under `namespace_prefix`.
    pub fn new(
        strategy: Arc<dyn DynStrategy>,
        storage: Arc<dyn Storage>,
        cache: Arc<WatchCache>,
        namespace_prefix: Option<String>,
    ) -> Self {
        Registry {
            strategy,
            storage,
            cache,
            namespace_prefix,
            max_object_bytes: MAX_OBJECT_BYTES,
        }
    }

    /// The same registry refusing stored objects larger than `bytes`.
    pub fn with_max_object_bytes(mut self, bytes: usize) -> Self {
        self.max_object_bytes = bytes;
        self
    }

    /// The kind's strategy.
    pub fn strategy(&self) -> &Arc<dyn DynStrategy> {
        &self.strategy
    }

    /// The kind's watch cache.
    pub fn cache(&self) -> &Arc<WatchCache> {
        &self.cache
    }

    /// Whether the storage under the registry can serve and take writes (readiness).
    pub async fn storage_health(&self) -> Result<(), String> {
        self.storage.health().await.map_err(|e| e.to_string())
    }

    fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(self.strategy.info().group_resource(), name)
    }

    fn decode(&self, kv: &KeyValue) -> Result<Value, ApiError> {
        let mut object: Value = serde_json::from_slice(&kv.value)
            .map_err(|_| ApiError::internal(format!("undecodable object at {}", kv.key)))?;
        meta::strip_type_meta(&mut object);
        meta::set_meta_str(&mut object, "resourceVersion", &kv.mod_revision.to_string());
        Ok(object)
    }

    fn encode(&self, object: &Value) -> Bytes {
        let info = self.strategy.info();
        Bytes::from(meta::typed_json_bytes(
            object,
            &info.api_version(),
            info.kind,
            true,
        ))
    }

    /// Encodes an object for storage within the size bound. As upstream, an object too large
    /// with its managedFields is stored without them, unless they were just applied (server-side
    /// apply owns what it records); one too large even so is refused with etcd's error.
    fn encode_bounded(&self, object: &mut Value, applied: bool) -> Result<Bytes, ApiError> {
        let encoded = self.encode(object);
        if encoded.len() <= self.max_object_bytes {
            return Ok(encoded);
        }
        if !applied
            && meta::metadata_mut(object)
                .shift_remove("managedFields")
                .is_some()
        {
            let encoded = self.encode(object);
            if encoded.len() <= self.max_object_bytes {
                return Ok(encoded);
            }
        }
        Err(ApiError::request_too_large_for_storage())
    }

    async fn wait_for_cache(&self, revision: Revision) -> Result<(), ApiError> {
        if self.cache.revision() >= revision
            || self.cache.wait_for(revision, RESOURCE_VERSION_WAIT).await
        {
            return Ok(());
        }
        Err(ApiError::too_large_resource_version(
            revision,
            self.cache.revision(),
        ))
    }

    /// GET one object.
    pub async fn get(&self, namespace: &str, name: &str, at: ReadAt) -> Result<Value, ApiError> {
        let key = self.strategy.info().key(namespace, name);
        match at {
            ReadAt::Latest | ReadAt::Exact(_) => {
                let response = self.storage.get(&key, None).await.map_err(storage_error)?;
                match response.kv {
                    Some(kv) => self.decode(&kv),
                    None => Err(self.not_found(name)),
                }
            }
            ReadAt::Any | ReadAt::NotOlderThan(_) => {
                if let ReadAt::NotOlderThan(revision) = at {
                    self.wait_for_cache(revision).await?;
                }
                self.cache
                    .get(&key)
                    .map(|o| o.object())
                    .ok_or_else(|| self.not_found(name))
            }
        }
    }

    /// Checks that every field selector field is supported.
    pub fn check_field_selector(&self, selector: &FieldSelector) -> Result<(), ApiError> {
        let probe = json!({"metadata": {}});
        for requirement in &selector.requirements {
            if self
                .strategy
                .field_value(&probe, &requirement.field)
                .is_none()
            {
                return Err(ApiError::bad_request(
                    self.strategy.unsupported_field_message(&requirement.field),
                ));
            }
        }
        Ok(())
    }

    /// LIST.
    pub async fn list(
        &self,
        namespace: &str,
        options: &ListOptions,
    ) -> Result<ListResult, ApiError> {
        let prefix = self.strategy.info().list_prefix(namespace);
        if let Some(token) = &options.continue_token {
            let revision = (token.revision > 0).then_some(token.revision);
            let start = format!("{prefix}{}", token.resume_after());
            return self
                .list_from_storage(&prefix, Some(start), revision, options)
                .await;
        }
        match options.read_at {
            ReadAt::Exact(revision) => {
                self.list_from_storage(&prefix, None, Some(revision), options)
                    .await
            }
            ReadAt::NotOlderThan(revision) if options.limit > 0 => {
                // The legacy rule: a resourceVersion with a limit is an exact read.
                self.list_from_storage(&prefix, None, Some(revision), options)
                    .await
            }
            ReadAt::Latest => {
                let current = self
                    .storage
                    .current_revision()
                    .await
                    .map_err(storage_error)?;
                self.wait_for_cache(current).await?;
                Ok(self.list_from_cache(&prefix, options, options.limit))
            }
            ReadAt::NotOlderThan(revision) => {
                self.wait_for_cache(revision).await?;
                Ok(self.list_from_cache(&prefix, options, 0))
            }
            ReadAt::Any => Ok(self.list_from_cache(&prefix, options, 0)),
        }
    }

    fn list_from_cache(&self, prefix: &str, options: &ListOptions, limit: usize) -> ListResult {
        let mut items = Vec::new();
        let mut last_key: Option<Arc<str>> = None;
        let mut more = false;
        let mut remaining = 0i64;
        let revision = self.cache.scan(prefix, None, |object| {
            if limit > 0 && items.len() >= limit {
                more = true;
                remaining += 1;
                return true;
            }
            if object
                .selectable
                .selected_by(&options.labels, &options.fields)
            {
                last_key = Some(object.key.clone());
                items.push(object.clone());
            }
            true
        });
        let unfiltered = options.labels.is_empty() && options.fields.is_empty();
        let continue_token = match (&last_key, more) {
            (Some(key), true) => Some(
                ContinueToken::after(revision, key.strip_prefix(prefix).unwrap_or(key)).encode(),
            ),
            _ => None,
        };
        ListResult {
            items,
            revision,
            remaining: (continue_token.is_some() && unfiltered).then_some(remaining),
            continue_token,
        }
    }

    async fn list_from_storage(
        &self,
        prefix: &str,
        mut start_after: Option<String>,
        at_revision: Option<Revision>,
        options: &ListOptions,
    ) -> Result<ListResult, ApiError> {
        let limit = options.limit;
        let mut items = Vec::new();
        let mut revision = at_revision;
        let mut remaining: Option<i64>;
        let mut last_key: Option<Arc<str>> = None;
        loop {
            let batch = if limit > 0 {
                (limit - items.len()).max(1)
            } else {
                0
            };
            let response = self
                .storage
                .range(RangeRequest {
                    prefix: prefix.to_string(),
                    start_after: start_after.clone(),
                    limit: batch,
                    at_revision: revision,
                })
                .await
                .map_err(|e| self.list_error(e, options))?;
            revision = Some(response.revision);
            for kv in &response.kvs {
                last_key = Some(kv.key.clone());
                if let Some(object) = CachedObject::decode(
                    kv.key.clone(),
                    &kv.value,
                    kv.mod_revision,
                    self.cache.projection(),
                ) && object
                    .selectable
                    .selected_by(&options.labels, &options.fields)
                {
                    items.push(Arc::new(object));
                }
            }
            if !response.more {
                remaining = None;
                last_key = None;
                break;
            }
            remaining = Some(response.remaining as i64);
            if limit > 0 && items.len() >= limit {
                break;
            }
            start_after = last_key.as_ref().map(|k| k.to_string());
        }
        let revision = revision.unwrap_or_default();
        let unfiltered = options.labels.is_empty() && options.fields.is_empty();
        let continue_token = last_key.map(|key| {
            ContinueToken::after(revision, key.strip_prefix(prefix).unwrap_or(&key)).encode()
        });
        Ok(ListResult {
            items,
            revision,
            remaining: remaining.filter(|_| unfiltered && continue_token.is_some()),
            continue_token,
        })
    }

    fn list_error(&self, error: StorageError, options: &ListOptions) -> ApiError {
        match error {
            StorageError::Compacted { .. } => match &options.continue_token {
                Some(token) => {
                    let mut err = ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    );
                    err.continue_token = Some(
                        ContinueToken {
                            revision: -1,
                            start: token.start.clone(),
                        }
                        .encode(),
                    );
                    err
                }
                None => ApiError::expired("The resourceVersion for the provided list is too old."),
            },
            StorageError::FutureRevision { requested, current } => {
                ApiError::too_large_resource_version(requested, current)
            }
            other => storage_error(other),
        }
    }

    async fn check_namespace(&self, namespace: &str) -> Result<(), ApiError> {
        let Some(prefix) = &self.namespace_prefix else {
            return Ok(());
        };
        let key = format!("{prefix}{namespace}");
        let response = self.storage.get(&key, None).await.map_err(storage_error)?;
        let Some(kv) = response.kv else {
            return Err(ApiError::not_found(
                capstan_machinery::status::GroupResource {
                    group: "",
                    resource: "namespaces",
                },
                namespace,
            ));
        };
        let ns = self.decode(&kv)?;
        if !meta::meta_str(&ns, "deletionTimestamp").is_empty()
            || ns.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating")
        {
            return Err(ApiError::new(
                403,
                capstan_machinery::Reason::Forbidden,
                format!(
                    "{} {} is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                    self.strategy.info().group_resource(),
                    capstan_machinery::status::quote(meta::name(&ns)),
                ),
            ));
        }
        Ok(())
    }

    fn invalid(&self, name: &str, errors: &FieldErrors) -> ApiError {
        let info = self.strategy.info();
        ApiError::invalid(info.group, &info.group_kind(), name, errors)
    }

    fn validate_meta_create(&self, object: &Value, errors: &mut FieldErrors) {
        let info = self.strategy.info();
        let name = meta::name(object);
        let generate_name = meta::meta_str(object, "generateName");
        if name.is_empty() {
            if generate_name.is_empty() {
                errors.push(FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                ));
            }
        } else {
            for message in self.strategy.validate_name(name, false) {
                errors.push(FieldError::invalid("metadata.name", &json!(name), message));
            }
        }
        if !generate_name.is_empty() {
            for message in self.strategy.validate_name(generate_name, true) {
                errors.push(FieldError::invalid(
                    "metadata.generateName",
                    &json!(generate_name),
                    message,
                ));
            }
        }
        let namespace = meta::namespace(object);
        if info.namespaced {
            if namespace.is_empty() {
                errors.push(FieldError::required("metadata.namespace", ""));
            } else {
                for message in validation::dns1123_label(namespace) {
                    errors.push(FieldError::invalid(
                        "metadata.namespace",
                        &json!(namespace),
                        message,
                    ));
                }
            }
        } else if !namespace.is_empty() {
            errors.push(FieldError::forbidden(
                "metadata.namespace",
                "not allowed on this type",
            ));
        }
        if let Some(meta) = meta::metadata(object) {
            errors.extend(validation::validate_object_meta(meta));
        }
    }

    fn validate_meta_update(&self, new: &Value, old: &Value, errors: &mut FieldErrors) {
        if let Some(meta) = meta::metadata(new) {
            errors.extend(validation::validate_object_meta(meta));
        }
        for field in ["name", "namespace", "uid", "creationTimestamp"] {
            let now = meta::meta_str(new, field);
            if now != meta::meta_str(old, field) {
                errors.push(FieldError::invalid(
                    format!("metadata.{field}"),
                    &json!(now),
                    "field is immutable",
                ));
            }
        }
        if !meta::meta_str(old, "deletionTimestamp").is_empty() {
            let before = meta::finalizers(old);
            let added: Vec<String> = meta::finalizers(new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                errors.push(FieldError::forbidden(
                    "metadata.finalizers",
                    format!(
                        "no new finalizers can be added if the object is being deleted, found new finalizers {}",
                        capstan_machinery::field::render(&json!(added))
                    ),
                ));
            }
        }
    }

    /// CREATE. `object` is the decoded body with the namespace already settled.
    pub async fn create(
        &self,
        namespace: &str,
        mut object: Value,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let info = self.strategy.info();
        {
            let meta = meta::metadata_mut(&mut object);
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
                "resourceVersion",
                "generation",
            ] {
                meta.shift_remove(field);
            }
            if info.namespaced {
                meta.insert("namespace".into(), json!(namespace));
            } else {
                meta.shift_remove("namespace");
            }
        }
        self.strategy.default(&mut object);
        if !options.applied {
            crate::managed::record_update(
                &mut object,
                None,
                &options.field_manager,
                &info.api_version(),
                None,
                self.strategy.schema(),
            );
        }
        meta::set_meta_str(&mut object, "uid", &uuid::Uuid::new_v4().to_string());
        meta::set_meta_str(&mut object, "creationTimestamp", &meta::now_rfc3339());
        self.strategy.prepare_for_create(&mut object);
        if info.namespaced {
            self.check_namespace(namespace).await?;
        }
        let prefix = meta::meta_str(&object, "generateName").to_string();
        let generate = meta::name(&object).is_empty() && !prefix.is_empty();
        let attempts = if generate { GENERATE_NAME_ATTEMPTS } else { 1 };
        for attempt in 0..attempts.max(WRITE_ATTEMPTS) {
            let mut candidate = object.clone();
            if generate {
                let name = generate_name(&prefix);
                meta::set_meta_str(&mut candidate, "name", &name);
            }
            let name = meta::name(&candidate).to_string();
            let key = info.key(namespace, &name);
            // Allocation first, as upstream's BeginCreate: its errors pre-empt validation's,
            // and validation sees the allocated values.
            let extras = self
                .strategy
                .allocate(self.storage.as_ref(), &mut candidate, None, options.dry_run)
                .await?;
            let mut errors = FieldErrors::new();
            self.validate_meta_create(&candidate, &mut errors);
            errors.extend(self.strategy.validate_create(&candidate));
            if !errors.is_empty() {
                return Err(self.invalid(meta::name(&candidate), &errors));
            }
            if options.dry_run {
                let existing = self.storage.get(&key, None).await.map_err(storage_error)?;
                if existing.kv.is_some() {
                    return Err(ApiError::already_exists(info.group_resource(), &name));
                }
                meta::metadata_mut(&mut candidate).shift_remove("resourceVersion");
                return Ok(candidate);
            }
            let mut txn = Txn::new().when(Compare::Absent(key.clone()));
            txn.compares.extend(extras.compares);
            let encoded = self.encode_bounded(&mut candidate, options.applied)?;
            txn = txn.then(Op::Put(key.clone(), encoded));
            txn.ops.extend(extras.ops);
            match self.storage.txn(txn).await.map_err(storage_error)? {
                TxnOutcome::Committed { revision, .. } => {
                    meta::set_meta_str(&mut candidate, "resourceVersion", &revision.to_string());
                    return Ok(candidate);
                }
                TxnOutcome::Failed { current, .. } => {
                    let taken = current.first().is_some_and(Option::is_some);
                    if !taken {
                        continue; // an allocation raced another write: allocate again
                    }
                    if generate && attempt + 1 < attempts {
                        continue;
                    }
                    if generate {
                        return Err(ApiError::generate_name_exhausted(
                            info.group_resource(),
                            &name,
                        ));
                    }
                    let existing = current
                        .first()
                        .and_then(|kv| kv.as_ref())
                        .and_then(|kv| self.decode(kv).ok());
                    let mut err = ApiError::already_exists(info.group_resource(), &name);
                    if existing.is_some_and(|e| !meta::meta_str(&e, "deletionTimestamp").is_empty())
                    {
                        err.message = format!("object is being deleted: {}", err.message);
                    }
                    return Err(err);
                }
            }
        }
        Err(ApiError::new(
            500,
            capstan_machinery::Reason::ServerTimeout,
            format!(
                "The create operation against {} could not be completed at this time, please try again.",
                info.group_resource()
            ),
        ))
    }

    /// UPDATE (PUT) of the main resource (`status: false`) or of `/status`. Returns the
    /// stored object and whether it was created.
    pub async fn update(
        &self,
        namespace: &str,
        name: &str,
        new: Value,
        options: &WriteOptions,
        status: bool,
    ) -> Result<(Value, bool), ApiError> {
        let info = self.strategy.info();
        let pinned = meta::resource_version(&new).to_string();
        if pinned.is_empty() && !info.allow_unconditional_update {
            let mut errors = FieldErrors::new();
            // Upstream prints the missing version as Go's `%#v` of a uint64.
            errors.push(FieldError {
                kind: capstan_machinery::field::ErrorType::Invalid,
                field: "metadata.resourceVersion".into(),
                value: "0x0".into(),
                detail: "must be specified for an update".into(),
            });
            return Err(ApiError::invalid(
                info.group,
                &info.group_resource().to_string(),
                name,
                &errors,
            ));
        }
        self.write_loop(
            namespace,
            name,
            options,
            status,
            |_current| Ok(new.clone()),
            !pinned.is_empty(),
        )
        .await
    }

    /// PATCH: `apply` computes the new object from the current one (with `kind`/`apiVersion`).
    pub async fn patch(
        &self,
        namespace: &str,
        name: &str,
        options: &WriteOptions,
        status: bool,
        apply: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let info = self.strategy.info();
        let api_version = info.api_version();
        let (object, _) = self
            .write_loop(
                namespace,
                name,
                options,
                status,
                |current| {
                    let Some(current) = current else {
                        return Err(self.not_found(name));
                    };
                    let typed = meta::with_type_meta(current, &api_version, info.kind);
                    let mut patched = apply(&typed)?;
                    if meta::resource_version(&patched).is_empty() {
                        meta::set_meta_str(
                            &mut patched,
                            "resourceVersion",
                            meta::resource_version(current),
                        );
                    }
                    Ok(patched)
                },
                false,
            )
            .await?;
        Ok(object)
    }

    /// Server-side apply of `config` (kind and apiVersion already checked and removed) as
    /// `options.field_manager`: creates the object when absent (`true`), else merges it into
    /// the stored one (`spec/api-machinery.md` §10.5); 409 on conflicts unless `force`.
    pub async fn apply(
        &self,
        namespace: &str,
        name: &str,
        config: Value,
        options: &WriteOptions,
        status: bool,
        force: bool,
    ) -> Result<(Value, bool), ApiError> {
        let info = self.strategy.info();
        let api_version = info.api_version();
        let options = WriteOptions {
            applied: true,
            ..options.clone()
        };
        let subresource = status.then_some("status");
        let conflicts = |conflicts: Vec<crate::managed::Conflict>| {
            let message = if let [one] = conflicts.as_slice() {
                format!(
                    "Apply failed with 1 conflict: conflict with {}: {}",
                    one.manager, one.field
                )
            } else {
                let mut groups: Vec<String> = Vec::new();
                let mut last: Option<&str> = None;
                for c in &conflicts {
                    if last != Some(c.manager.as_str()) {
                        groups.push(format!("conflicts with {}:", c.manager));
                        last = Some(c.manager.as_str());
                    }
                    if let Some(group) = groups.last_mut() {
                        group.push_str(&format!("\n- {}", c.field));
                    }
                }
                format!(
                    "Apply failed with {} conflicts: {}",
                    conflicts.len(),
                    groups.join("\n")
                )
            };
            let mut error = ApiError::conflict(info.group_resource(), name, "");
            error.message = message;
            if let Some(details) = error.details.as_mut() {
                details.causes = conflicts
                    .iter()
                    .map(|c| capstan_machinery::status::Cause {
                        reason: "FieldManagerConflict".into(),
                        message: format!("conflict with {}", c.manager),
                        field: c.field.clone(),
                    })
                    .collect();
            }
            error
        };
        let merge = |live: Option<&Value>| {
            let mut object = crate::managed::apply(
                live,
                &config,
                &options.field_manager,
                &api_version,
                subresource,
                self.strategy.schema(),
                force,
            )
            .map_err(conflicts)?;
            if live.is_some() && meta::resource_version(&config).is_empty() {
                // Apply never carries an optimistic lock unless the config names a version.
                meta::metadata_mut(&mut object).shift_remove("resourceVersion");
            }
            Ok(object)
        };
        self.write_loop(namespace, name, &options, status, merge, false)
            .await
    }

    async fn write_loop(
        &self,
        namespace: &str,
        name: &str,
        options: &WriteOptions,
        status: bool,
        compute: impl Fn(Option<&Value>) -> Result<Value, ApiError>,
        conflict_is_final: bool,
    ) -> Result<(Value, bool), ApiError> {
        let info = self.strategy.info();
        let key = info.key(namespace, name);
        for _ in 0..WRITE_ATTEMPTS {
            let response = self.storage.get(&key, None).await.map_err(storage_error)?;
            let Some(kv) = response.kv else {
                let new = compute(None)?;
                if status || !(info.allow_create_on_update || options.applied) {
                    return Err(self.not_found(name));
                }
                let uid = meta::meta_str(&new, "uid");
                if !uid.is_empty() {
                    return Err(ApiError::conflict(
                        info.group_resource(),
                        name,
                        &format!(
                            "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                        ),
                    ));
                }
                return Ok((self.create(namespace, new, options).await?, true));
            };
            let old = self.decode(&kv)?;
            let mut new = compute(Some(&old))?;
            if !new.is_object() {
                return Err(ApiError::bad_request(
                    "the object provided is not a JSON object",
                ));
            }
            let sent_rv = meta::resource_version(&new).to_string();
            if !sent_rv.is_empty() && sent_rv != kv.mod_revision.to_string() {
                return Err(ApiError::modified(info.group_resource(), name));
            }
            let sent_uid = meta::meta_str(&new, "uid").to_string();
            let old_uid = meta::meta_str(&old, "uid").to_string();
            if !sent_uid.is_empty() && sent_uid != old_uid {
                return Err(ApiError::conflict(
                    info.group_resource(),
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {sent_uid}, UID in object meta: {old_uid}"
                    ),
                ));
            }
            if info.namespaced {
                meta::set_meta_str(&mut new, "namespace", namespace);
            }
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ] {
                match meta::metadata(&old).and_then(|m| m.get(field)).cloned() {
                    Some(value) => {
                        meta::metadata_mut(&mut new).insert(field.into(), value);
                    }
                    None => {
                        meta::metadata_mut(&mut new).shift_remove(field);
                    }
                }
            }
            meta::metadata_mut(&mut new).shift_remove("generation");
            meta::metadata_mut(&mut new).shift_remove("selfLink");
            self.strategy.default(&mut new);
            if !options.applied {
                crate::managed::record_update(
                    &mut new,
                    Some(&old),
                    &options.field_manager,
                    &info.api_version(),
                    status.then_some("status"),
                    self.strategy.schema(),
                );
            }
            if status {
                self.strategy.prepare_for_status_update(&mut new, &old);
            } else {
                self.strategy.prepare_for_update(&mut new, &old);
            }
            let extras = if status {
                WriteExtras::default()
            } else {
                self.strategy
                    .allocate(self.storage.as_ref(), &mut new, Some(&old), options.dry_run)
                    .await?
            };
            let mut errors = FieldErrors::new();
            self.validate_meta_update(&new, &old, &mut errors);
            errors.extend(if status {
                self.strategy.validate_status_update(&new, &old)
            } else {
                self.strategy.validate_update(&new, &old)
            });
            if !errors.is_empty() {
                return Err(self.invalid(name, &errors));
            }
            meta::set_meta_str(&mut new, "resourceVersion", &kv.mod_revision.to_string());
            if crate::managed::same_ignoring_times(&new, &old) {
                return Ok((old, false));
            }
            let finalized = !meta::meta_str(&new, "deletionTimestamp").is_empty()
                && meta::finalizers(&new).is_empty();
            if options.dry_run {
                return Ok((new, false));
            }
            let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), kv.mod_revision));
            txn.compares.extend(extras.compares);
            if finalized {
                txn = txn.then(Op::Delete(key.clone()));
                let released = self.strategy.release(&old);
                txn.compares.extend(released.compares);
                txn.ops.extend(released.ops);
            } else {
                let encoded = self.encode_bounded(&mut new, options.applied)?;
                txn = txn.then(Op::Put(key.clone(), encoded));
                txn.ops.extend(extras.ops);
            }
            match self.storage.txn(txn).await.map_err(storage_error)? {
                TxnOutcome::Committed { revision, .. } => {
                    meta::set_meta_str(&mut new, "resourceVersion", &revision.to_string());
                    return Ok((new, false));
                }
                TxnOutcome::Failed { current, .. } => {
                    let object_moved = current.first().is_some_and(|c| {
                        c.as_ref().map(|kv| kv.mod_revision) != Some(kv.mod_revision)
                    });
                    if object_moved && conflict_is_final {
                        return Err(ApiError::modified(info.group_resource(), name));
                    }
                    continue;
                }
            }
        }
        Err(ApiError::modified(info.group_resource(), name))
    }

    /// DELETE one object.
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<DeleteResult, ApiError> {
        let info = self.strategy.info();
        let key = info.key(namespace, name);
        if let Some(why) = self.strategy.undeletable(name) {
            let gr = info.group_resource();
            return Err(ApiError::new(
                403,
                capstan_machinery::Reason::Forbidden,
                format!(
                    "{gr} {} is forbidden: {why}",
                    capstan_machinery::status::quote(name)
                ),
            )
            .with_details(capstan_machinery::Details {
                name: name.to_string(),
                group: gr.group.to_string(),
                kind: gr.resource.to_string(),
                ..Default::default()
            }));
        }
        for _ in 0..WRITE_ATTEMPTS {
            let response = self.storage.get(&key, None).await.map_err(storage_error)?;
            let Some(kv) = response.kv else {
                return Err(self.not_found(name));
            };
            let old = self.decode(&kv)?;
            let kind_conflict = |why: String| {
                let mut err = ApiError::conflict(info.group_resource(), name, &why);
                err.message = format!(
                    "Operation cannot be fulfilled on {} {}: {why}",
                    info.kind,
                    capstan_machinery::status::quote(name)
                );
                if let Some(details) = err.details.as_mut() {
                    details.kind = info.kind.to_string();
                }
                err
            };
            if let Some(uid) = &options.uid {
                let stored = meta::meta_str(&old, "uid");
                if uid != stored {
                    return Err(kind_conflict(format!(
                        "the UID in the precondition ({uid}) does not match the UID in record ({stored}). The object might have been deleted and then recreated"
                    )));
                }
            }
            if let Some(rv) = &options.resource_version {
                let stored = kv.mod_revision.to_string();
                if *rv != stored {
                    return Err(kind_conflict(format!(
                        "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({stored}). The object might have been modified"
                    )));
                }
            }
            // An object that stays is marked instead: graceful deletion (Pods) with a deadline
            // and grace period until deleted again with a shorter (zero) one; finalizers with
            // the time now and grace 0, once.
            let terminating = !meta::meta_str(&old, "deletionTimestamp").is_empty();
            let requested = options
                .grace_period_seconds
                .map(|g| if g < 0 { 1 } else { g });
            let mark = match self
                .strategy
                .grace_period(&old, requested)
                .filter(|g| *g > 0)
            {
                Some(grace) => {
                    let current = meta::metadata(&old)
                        .and_then(|m| m.get("deletionGracePeriodSeconds"))
                        .and_then(Value::as_i64);
                    // A shorter grace period moves the existing deadline closer by the
                    // difference, as upstream does; a first graceful delete counts from now.
                    match current.filter(|_| terminating) {
                        Some(current) if current <= grace => Marking::Keep,
                        Some(current) => Marking::Mark(
                            meta::shift_rfc3339(
                                meta::meta_str(&old, "deletionTimestamp"),
                                grace - current,
                            )
                            .unwrap_or_else(|| meta::rfc3339_in(grace)),
                            grace,
                        ),
                        None => Marking::Mark(meta::rfc3339_in(grace), grace),
                    }
                }
                None if !meta::finalizers(&old).is_empty() => {
                    if terminating {
                        Marking::Keep
                    } else {
                        Marking::Mark(meta::now_rfc3339(), 0)
                    }
                }
                None => Marking::Remove,
            };
            if let Marking::Keep = mark {
                return Ok(DeleteResult {
                    object: old,
                    removed: false,
                });
            }
            if let Marking::Mark(deadline, grace) = mark {
                let mut marked = old.clone();
                meta::set_meta_str(&mut marked, "deletionTimestamp", &deadline);
                meta::metadata_mut(&mut marked)
                    .insert("deletionGracePeriodSeconds".into(), json!(grace));
                if options.dry_run {
                    return Ok(DeleteResult {
                        object: marked,
                        removed: false,
                    });
                }
                let txn = Txn::new()
                    .when(Compare::ModRevision(key.clone(), kv.mod_revision))
                    .then(Op::Put(
                        key.clone(),
                        self.encode_bounded(&mut marked, true)?,
                    ));
                match self.storage.txn(txn).await.map_err(storage_error)? {
                    TxnOutcome::Committed { revision, .. } => {
                        meta::set_meta_str(&mut marked, "resourceVersion", &revision.to_string());
                        return Ok(DeleteResult {
                            object: marked,
                            removed: false,
                        });
                    }
                    TxnOutcome::Failed { .. } => continue,
                }
            }
            if options.dry_run {
                return Ok(DeleteResult {
                    object: old,
                    removed: true,
                });
            }
            let WriteExtras { compares, ops } = self.strategy.release(&old);
            let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), kv.mod_revision));
            txn.compares.extend(compares);
            txn = txn.then(Op::Delete(key.clone()));
            txn.ops.extend(ops);
            match self.storage.txn(txn).await.map_err(storage_error)? {
                TxnOutcome::Committed { revision, .. } => {
                    let mut object = old;
                    meta::set_meta_str(&mut object, "resourceVersion", &revision.to_string());
                    return Ok(DeleteResult {
                        object,
                        removed: true,
                    });
                }
                TxnOutcome::Failed { .. } => continue,
            }
        }
        Err(ApiError::modified(info.group_resource(), name))
    }

    /// DELETE on a collection: deletes what the list selects; returns the objects as listed.
    pub async fn delete_collection(
        &self,
        namespace: &str,
        list: &ListOptions,
        options: &DeleteOptions,
    ) -> Result<ListResult, ApiError> {
        let mut listed = self.list(namespace, list).await?;
        for object in &listed.items {
            let ns = object.selectable.namespace().to_string();
            let name = object.selectable.name().to_string();
            match self.delete(&ns, &name, options).await {
                Ok(_) => {}
                Err(err) if err.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
        listed.continue_token = None;
        listed.remaining = None;
        Ok(listed)
    }
}

fn generate_name(prefix: &str) -> String {
    let mut cut = prefix.len().min(58);
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut name = prefix[..cut].to_string();
    for _ in 0..5 {
        name.push(NAME_ALPHABET[fastrand::usize(..NAME_ALPHABET.len())] as char);
    }
    name
}

#[cfg(test)]
mod tests {
    use super::generate_name;

    #[test]
    fn generated_names_use_upstreams_alphabet() {
        let name = generate_name("gen-");
        assert_eq!(name.len(), 9);
        assert!(name[4..].bytes().all(|c| super::NAME_ALPHABET.contains(&c)));
        assert_eq!(generate_name(&"a".repeat(70)).len(), 63);
    }
}
