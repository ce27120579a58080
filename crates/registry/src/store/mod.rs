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
use crate::strategy::{Admitted, Deleting, DynStrategy, WriteExtras};

mod delete;
mod namespace;
mod write;
pub use write::{Created, FieldValidation, Patch};

/// How long a read waits for the cache to reach a requested revision.
const RESOURCE_VERSION_WAIT: Duration = Duration::from_secs(3);
/// How often a write re-runs after losing a race it can safely retry.
const WRITE_ATTEMPTS: usize = 16;
/// generateName attempts before giving up.
const GENERATE_NAME_ATTEMPTS: usize = 8;
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Which part of an object a write addresses: the object, its `/status`, or (Namespaces) its
/// `/finalize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// The main resource (status is kept as stored).
    Main,
    /// The `/status` subresource (everything but status is kept as stored).
    Status,
    /// The `/finalize` subresource: as the main resource, but the kind's update rules do not
    /// run (a Namespace's `spec.finalizers` can change only here), and status is kept.
    Finalize,
}

impl Subresource {
    /// The name managedFields entries record (`None` for the main resource).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Subresource::Main => None,
            Subresource::Status => Some("status"),
            Subresource::Finalize => Some("finalize"),
        }
    }
}

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
    /// Kept, marked with this deletion time and grace period (none where the kind marks the
    /// object itself, as a Namespace's first DELETE).
    Mark(String, Option<i64>),
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
    /// The legacy `orphanDependents` (never set together with `propagation`).
    pub orphan_dependents: Option<bool>,
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
    /// Whether each namespace read is being terminated, by its revision.
    lifecycles: crate::cache::ByRevision<bool>,
    max_object_bytes: usize,
    counts: PageCounts,
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
            lifecycles: crate::cache::ByRevision::new(namespace::KEPT_LIFECYCLES),
            max_object_bytes: MAX_OBJECT_BYTES,
            counts: PageCounts::default(),
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
        crate::current::decode(kv)
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

    /// GET decoded straight from the stored bytes into the kind's object (for controllers:
    /// no JSON tree in between), with its `resourceVersion`.
    pub async fn get_typed<T: crate::Object>(
        &self,
        namespace: &str,
        name: &str,
        at: ReadAt,
    ) -> Result<T, ApiError> {
        let key = self.strategy.info().key(namespace, name);
        let undecodable = |_| ApiError::internal(format!("undecodable object at {key}"));
        let (mut object, revision): (T, _) = match at {
            ReadAt::Latest | ReadAt::Exact(_) => {
                let response = self.storage.get(&key, None).await.map_err(storage_error)?;
                let kv = response.kv.ok_or_else(|| self.not_found(name))?;
                (
                    serde_json::from_slice(&kv.value).map_err(undecodable)?,
                    kv.mod_revision,
                )
            }
            ReadAt::Any | ReadAt::NotOlderThan(_) => {
                if let ReadAt::NotOlderThan(revision) = at {
                    self.wait_for_cache(revision).await?;
                }
                let cached = self.cache.get(&key).ok_or_else(|| self.not_found(name))?;
                (
                    serde_json::from_slice(cached.raw_json()).map_err(undecodable)?,
                    cached.revision,
                )
            }
        };
        object.metadata_mut().resource_version = Some(revision.to_string());
        Ok(object)
    }

    /// Every object of `namespace` (`""`: all) in the watch cache, decoded into `T`: a part of
    /// the kind's object is welcome (what is not read is skipped, not decoded). Objects that
    /// do not decode are left out.
    pub fn cached<T: serde::de::DeserializeOwned>(&self, namespace: &str) -> Vec<T> {
        self.cached_where(namespace, |_| true)
    }

    /// [`Registry::cached`] for the objects whose labels and fields `wanted` accepts (only
    /// those are decoded).
    pub fn cached_where<T: serde::de::DeserializeOwned>(
        &self,
        namespace: &str,
        wanted: impl Fn(&crate::cache::Selectable) -> bool,
    ) -> Vec<T> {
        let prefix = self.strategy.info().list_prefix(namespace);
        let mut objects = Vec::new();
        self.cache.scan(&prefix, None, |object| {
            if wanted(&object.selectable) {
                objects.push(object.clone());
            }
            true
        });
        objects
            .iter()
            .filter_map(|o| serde_json::from_slice(o.raw_json()).ok())
            .collect()
    }

    /// [`Registry::cached`] once the watch cache has caught up with storage (as a list
    /// without a `resourceVersion` reads it), so a client sees what it has just written;
    /// what the cache holds when storage cannot be asked or the cache stays behind.
    pub async fn cached_current<T: serde::de::DeserializeOwned>(&self, namespace: &str) -> Vec<T> {
        if let Ok(current) = self.storage.current_revision().await {
            let _ = self.wait_for_cache(current).await;
        }
        self.cached(namespace)
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

    /// LIST. Pages after the first, and lists at an exact revision, come from the watch
    /// cache's history while it reaches back to their revision; from storage after that.
    pub async fn list(
        &self,
        namespace: &str,
        options: &ListOptions,
    ) -> Result<ListResult, ApiError> {
        let prefix = self.strategy.info().list_prefix(namespace);
        if let Some(token) = &options.continue_token {
            let start = format!("{prefix}{}", token.resume_after());
            let revision = (token.revision > 0).then_some(token.revision);
            if let Some(revision) = revision
                && self.still_readable_at(&prefix, revision, options).await?
                && let Some(page) =
                    self.list_from_cache_at(&prefix, Some(&start), revision, options)
            {
                return Ok(page);
            }
            return self
                .list_from_storage(&prefix, Some(start), revision, options)
                .await;
        }
        match options.read_at {
            ReadAt::Exact(revision) => self.list_exact(&prefix, revision, options).await,
            // The legacy rule: a resourceVersion with a limit is an exact read.
            ReadAt::NotOlderThan(revision) if options.limit > 0 => {
                self.list_exact(&prefix, revision, options).await
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

    /// The objects at `revision`: from the cache's history while it reaches back that far.
    async fn list_exact(
        &self,
        prefix: &str,
        revision: Revision,
        options: &ListOptions,
    ) -> Result<ListResult, ApiError> {
        if self.still_readable_at(prefix, revision, options).await?
            && let Some(page) = self.list_from_cache_at(prefix, None, revision, options)
        {
            return Ok(page);
        }
        self.list_from_storage(prefix, None, Some(revision), options)
            .await
    }

    /// Whether storage still serves `revision`: a revision compacted away is 410 from the
    /// cache too (upstream drops its cache snapshots at compaction), so the answer does not
    /// depend on how long the cache's history happens to be. One key read, at that revision.
    /// `false` (read from storage, which answers the error) for a revision it has not reached.
    async fn still_readable_at(
        &self,
        prefix: &str,
        revision: Revision,
        options: &ListOptions,
    ) -> Result<bool, ApiError> {
        match self.storage.get(prefix, Some(revision)).await {
            Ok(_) => Ok(true),
            Err(StorageError::FutureRevision { .. }) => Ok(false),
            Err(error) => Err(self.list_error(error, options)),
        }
    }

    /// The current objects, one page of `limit` (0: all).
    fn list_from_cache(&self, prefix: &str, options: &ListOptions, limit: usize) -> ListResult {
        let mut pager = Pager::new(options, limit, None);
        let revision = self.cache.scan(prefix, None, |object| pager.visit(object));
        pager.finish(prefix, revision, &self.counts)
    }

    /// A page of the objects as they were at `revision`, if the cache's history reaches it.
    fn list_from_cache_at(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        revision: Revision,
        options: &ListOptions,
    ) -> Option<ListResult> {
        let known = start_after.and_then(|start| self.counts.after(prefix, revision, start));
        let mut pager = Pager::new(options, options.limit, known);
        self.cache
            .scan_at(prefix, start_after, revision, |object| pager.visit(object))
            .then(|| pager.finish(prefix, revision, &self.counts))
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
}

/// Collects one page of a list from a scan: the selected objects up to the limit, then (for
/// an unfiltered list, whose `remainingItemCount` is reported) a count of the rest, unless the
/// previous page already counted it.
struct Pager<'a> {
    options: &'a ListOptions,
    limit: usize,
    /// How many objects the scan holds after its start, when a previous page counted them.
    known: Option<i64>,
    items: Vec<Arc<CachedObject>>,
    last_key: Option<Arc<str>>,
    more: bool,
    remaining: i64,
}

impl<'a> Pager<'a> {
    fn new(options: &'a ListOptions, limit: usize, known: Option<i64>) -> Self {
        Pager {
            options,
            limit,
            known,
            items: Vec::new(),
            last_key: None,
            more: false,
            remaining: 0,
        }
    }

    fn unfiltered(&self) -> bool {
        self.options.labels.is_empty() && self.options.fields.is_empty()
    }

    /// Takes one scanned object; `false` once nothing more is needed.
    fn visit(&mut self, object: &Arc<CachedObject>) -> bool {
        if self.limit > 0 && self.items.len() >= self.limit {
            self.more = true;
            if !self.unfiltered() {
                return false;
            }
            if let Some(known) = self.known {
                // Unfiltered: every object visited so far is an item.
                self.remaining = known - self.items.len() as i64;
                return false;
            }
            self.remaining += 1;
            return true;
        }
        if object
            .selectable
            .selected_by(&self.options.labels, &self.options.fields)
        {
            self.last_key = Some(object.key.clone());
            self.items.push(object.clone());
        }
        true
    }

    fn finish(self, prefix: &str, revision: Revision, counts: &PageCounts) -> ListResult {
        let unfiltered = self.unfiltered();
        let continue_token = match (&self.last_key, self.more) {
            (Some(key), true) => {
                let token = ContinueToken::after(revision, key.strip_prefix(prefix).unwrap_or(key));
                if unfiltered {
                    let start = format!("{prefix}{}", token.resume_after());
                    counts.remember(prefix, revision, start, self.remaining);
                }
                Some(token.encode())
            }
            _ => None,
        };
        ListResult {
            items: self.items,
            revision,
            remaining: (continue_token.is_some() && unfiltered).then_some(self.remaining),
            continue_token,
        }
    }
}

/// How many objects recent pages left after them. A list's objects at a revision never
/// change, so the page that resumes after a key at that revision knows how many objects follow
/// its start and subtracts its own items, instead of counting the rest for `remainingItemCount`
/// again: paging through N objects counts them once rather than about N² / (2 × limit) times.
#[derive(Default)]
struct PageCounts {
    recent: std::sync::Mutex<std::collections::VecDeque<PageCount>>,
}

struct PageCount {
    prefix: String,
    revision: Revision,
    /// The key the next page's scan starts after.
    start: String,
    /// Objects under `prefix` after `start` at `revision`.
    after: i64,
}

impl PageCounts {
    /// Pages remembered (a few concurrent paginations per kind; older ones count again).
    const RECENT: usize = 64;

    fn after(&self, prefix: &str, revision: Revision, start: &str) -> Option<i64> {
        let recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent
            .iter()
            .find(|c| c.revision == revision && c.start == start && c.prefix == prefix)
            .map(|c| c.after)
    }

    fn remember(&self, prefix: &str, revision: Revision, start: String, after: i64) {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() >= Self::RECENT {
            recent.pop_front();
        }
        recent.push_back(PageCount {
            prefix: prefix.to_string(),
            revision,
            start,
            after,
        });
    }
}
