//! The watch cache: every kind's objects and recent changes, in memory, fed by one storage
//! watch over the whole key space. Lists and watches are served from here.

use std::collections::{BTreeMap, VecDeque};

use capstan_machinery::hash::{HashMap, HashMapExt};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use capstan_storage::{EventKind, KeyValue, RangeRequest, Revision, Storage, StorageError};
use tokio::sync::{broadcast, watch};
mod json;
mod kept;
mod object;
mod selectable;

pub use json::member;
pub use kept::ByRevision;
pub use object::{CachedObject, Writer, Written};
pub use selectable::{Project, Projection, Selectable, SelectableFrom, SelectableMeta};

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watchers see it.
#[derive(Debug)]
pub struct CacheEvent {
    /// When the cache applied it (history older than the retention window is dropped).
    pub at: std::time::Instant,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for a delete: its last state, at the deletion revision).
    pub object: Arc<CachedObject>,
    /// The object before the change.
    pub prev: Option<Arc<CachedObject>>,
}

impl CacheEvent {
    /// The revision of the change.
    pub fn revision(&self) -> Revision {
        self.object.revision
    }

    /// About how much memory the event keeps alive: each object's JSON, twice (as stored and
    /// as its encoded watch line).
    fn footprint(&self) -> usize {
        let object = |o: &CachedObject| 2 * o.item_len() + 256;
        object(&self.object) + self.prev.as_deref().map_or(0, object)
    }
}

/// What a watcher receives from the cache.
#[derive(Debug, Clone)]
pub enum CacheMessage {
    /// A change. Weak: the history holds events, and one the history has already dropped
    /// (it is bounded in count, age and bytes) cannot be delivered — its watcher fell too far
    /// behind and is ended, as one the channel overran is. So the channel never keeps objects
    /// alive beyond the history's bounds.
    Event(std::sync::Weak<CacheEvent>),
    /// Every change up to this revision has been sent.
    Progress(Revision),
}

struct State {
    objects: BTreeMap<Arc<str>, Arc<CachedObject>>,
    history: VecDeque<Arc<CacheEvent>>,
    /// Changes after this revision are in `history`.
    oldest: Revision,
    revision: Revision,
    sender: broadcast::Sender<CacheMessage>,
    progress_sent: Revision,
    /// The approximate memory the history holds.
    history_bytes: usize,
}

/// How long changes stay replayable for watches that resume from a revision: 75 s, as
/// kube-apiserver's watch cache; older resumes get 410 and relist, as there.
const HISTORY_RETENTION: Duration = Duration::from_secs(75);
/// Changes kept regardless of age (unless the byte bound needs their room).
const HISTORY_MINIMUM: usize = 1_000;

/// How many changes, and how many bytes of them, a kind's watch cache keeps for watches that
/// resume from a revision.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    /// Most changes kept.
    pub events: usize,
    /// Most bytes kept (objects are up to 1.5 MiB each: a count alone bounds nothing).
    pub bytes: usize,
}

/// The objects of one kind (one storage prefix) and their recent changes.
pub struct WatchCache {
    prefix: String,
    project: Projection,
    /// Who wrote the values it reads.
    writer: Writer,
    state: RwLock<State>,
    history_limit: HistoryLimits,
    channel_capacity: usize,
    global: watch::Receiver<Revision>,
}

/// Where a watch starts.
pub struct Subscription {
    /// Current objects when the watch asked for initial events (with their snapshot
    /// revision); otherwise empty.
    pub initial: Vec<Arc<CachedObject>>,
    /// The revision the initial objects were read at, or the revision the watch starts after.
    pub start_revision: Revision,
    /// Buffered changes after the start revision.
    pub replay: Vec<Arc<CacheEvent>>,
    /// Live changes after those.
    pub receiver: broadcast::Receiver<CacheMessage>,
}

/// The watch asked for a revision older than the cache remembers.
#[derive(Debug, Clone, Copy)]
pub struct TooOld {
    /// The oldest revision a watch can start after.
    pub oldest: Revision,
}

impl WatchCache {
    fn new(
        (prefix, project): (String, Projection),
        writer: Writer,
        global: watch::Receiver<Revision>,
        history_limit: HistoryLimits,
    ) -> Self {
        let channel_capacity = 4096;
        let (sender, _) = broadcast::channel(channel_capacity);
        WatchCache {
            prefix,
            project,
            writer,
            state: RwLock::new(State {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                oldest: 0,
                revision: 0,
                sender,
                progress_sent: 0,
                history_bytes: 0,
            }),
            history_limit,
            channel_capacity,
            global,
        }
    }

    /// The kind's selector projection.
    pub fn projection(&self) -> &Projection {
        &self.project
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The revision the cache is complete up to.
    pub fn revision(&self) -> Revision {
        let state = self.read();
        state.revision.max(*self.global.borrow())
    }

    /// One object.
    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        self.read().objects.get(key).cloned()
    }

    /// Objects under `prefix` with keys after `start_after`, in key order, with the snapshot
    /// revision; `visit` returns `false` to stop.
    pub fn scan(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        mut visit: impl FnMut(&Arc<CachedObject>) -> bool,
    ) -> Revision {
        let state = self.read();
        let revision = state.revision.max(*self.global.borrow());
        let lower = match start_after {
            Some(key) => std::ops::Bound::Excluded(key),
            None => std::ops::Bound::Included(prefix),
        };
        for (key, object) in state
            .objects
            .range::<str, _>((lower, std::ops::Bound::Unbounded))
        {
            if !key.starts_with(prefix) {
                break;
            }
            if !visit(object) {
                break;
            }
        }
        revision
    }

    /// Visits the objects under `prefix` (after the key `start_after`) as they were at
    /// `revision`: the current objects with every later change in the history undone, as
    /// kube-apiserver 1.36 serves a list's later pages from its cache's snapshots. `false`
    /// (nothing visited) when the history no longer reaches back to `revision`, or the cache
    /// has not reached it yet.
    pub fn scan_at(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        revision: Revision,
        mut visit: impl FnMut(&Arc<CachedObject>) -> bool,
    ) -> bool {
        let state = self.read();
        let current = state.revision.max(*self.global.borrow());
        if revision < state.oldest || revision > current {
            return false;
        }
        let after = |key: &str| key.starts_with(prefix) && start_after.is_none_or(|s| key > s);
        // Each key changed since `revision`, as it was before its first later change.
        let mut undone: BTreeMap<&str, Option<&Arc<CachedObject>>> = BTreeMap::new();
        let first_later = state.history.partition_point(|e| e.revision() <= revision);
        for event in state.history.range(first_later..) {
            let key = &*event.object.key;
            if after(key) {
                let before = match event.kind {
                    EventType::Added => None,
                    EventType::Modified | EventType::Deleted => event.prev.as_ref(),
                };
                undone.entry(key).or_insert(before);
            }
        }
        let lower = match start_after {
            Some(key) => std::ops::Bound::Excluded(key),
            None => std::ops::Bound::Included(prefix),
        };
        let mut live = state
            .objects
            .range::<str, _>((lower, std::ops::Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .peekable();
        let mut undone = undone.into_iter().peekable();
        loop {
            let next = match (live.peek(), undone.peek()) {
                (None, None) => break,
                (Some(_), None) => live.next().map(|(_, o)| Some(o)),
                (None, Some(_)) => undone.next().map(|(_, o)| o),
                (Some((live_key, _)), Some((undone_key, _))) => {
                    match (***live_key).cmp(*undone_key) {
                        std::cmp::Ordering::Less => live.next().map(|(_, o)| Some(o)),
                        std::cmp::Ordering::Greater => undone.next().map(|(_, o)| o),
                        std::cmp::Ordering::Equal => {
                            live.next();
                            undone.next().map(|(_, o)| o)
                        }
                    }
                }
            };
            if let Some(Some(object)) = next
                && !visit(object)
            {
                break;
            }
        }
        true
    }

    /// Starts a watch: with `initial`, from the current objects; otherwise after `after`.
    pub fn subscribe(&self, initial: bool, after: Revision) -> Result<Subscription, TooOld> {
        let state = self.read();
        let current = state.revision.max(*self.global.borrow());
        if initial {
            return Ok(Subscription {
                initial: state.objects.values().cloned().collect(),
                start_revision: current,
                replay: Vec::new(),
                receiver: state.sender.subscribe(),
            });
        }
        if after < state.oldest {
            return Err(TooOld {
                oldest: state.oldest,
            });
        }
        let replay = state
            .history
            .iter()
            .filter(|e| e.revision() > after)
            .cloned()
            .collect();
        Ok(Subscription {
            initial: Vec::new(),
            start_revision: after,
            replay,
            receiver: state.sender.subscribe(),
        })
    }

    /// Waits until the cache has seen `revision`; `false` on timeout.
    pub async fn wait_for(&self, revision: Revision, timeout: Duration) -> bool {
        let mut global = self.global.clone();
        let reached = tokio::time::timeout(timeout, global.wait_for(|r| *r >= revision)).await;
        matches!(reached, Ok(Ok(_)))
    }

    fn reset(&self, objects: BTreeMap<Arc<str>, Arc<CachedObject>>, revision: Revision) {
        let (sender, _) = broadcast::channel(self.channel_capacity);
        let mut state = self.write();
        // Dropping the old sender ends every current watch; clients re-watch and, when their
        // revision is no longer buffered, relist.
        *state = State {
            objects,
            history: VecDeque::new(),
            oldest: revision,
            revision,
            sender,
            progress_sent: revision,
            history_bytes: 0,
        };
    }

    fn apply(
        &self,
        kind: EventKind,
        kv: &KeyValue,
        prev: Option<&KeyValue>,
        hint: Option<&capstan_storage::Hint>,
    ) {
        let revision = kv.mod_revision;
        // Decoded before the lock is taken: readers (lists, the controllers' reads) do not
        // wait for the scan of a large object.
        let decoded = match kind {
            EventKind::Put => CachedObject::decode_hinted(
                self.writer,
                kv.key.clone(),
                &kv.value,
                revision,
                &self.project,
                hint,
            ),
            EventKind::Delete => None,
        };
        let mut state = self.write();
        let previous = state.objects.get(&kv.key).cloned();
        let event = match kind {
            EventKind::Put => {
                let Some(object) = decoded else {
                    state.revision = revision;
                    return;
                };
                let object = Arc::new(object);
                state.objects.insert(kv.key.clone(), object.clone());
                CacheEvent {
                    at: std::time::Instant::now(),
                    kind: if previous.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    object,
                    prev: previous,
                }
            }
            EventKind::Delete => {
                state.objects.remove(&kv.key);
                let last = previous.or_else(|| {
                    prev.and_then(|p| {
                        CachedObject::decode_written(
                            self.writer,
                            p.key.clone(),
                            &p.value,
                            p.mod_revision,
                            &self.project,
                        )
                        .map(Arc::new)
                    })
                });
                let Some(last) = last else {
                    state.revision = revision;
                    return;
                };
                let object = Arc::new(last.at_revision(revision, &self.project));
                CacheEvent {
                    at: std::time::Instant::now(),
                    kind: EventType::Deleted,
                    object,
                    prev: Some(last),
                }
            }
        };
        let event = Arc::new(event);
        let weak = Arc::downgrade(&event);
        state.history_bytes += event.footprint();
        state.history.push_back(event);
        while state.history.len() > self.history_limit.events
            // The newest change always stays: live watchers are still to receive it.
            || (state.history_bytes > self.history_limit.bytes && state.history.len() > 1)
            || (state.history.len() > HISTORY_MINIMUM
                && state
                    .history
                    .front()
                    .is_some_and(|e| e.at.elapsed() > HISTORY_RETENTION))
        {
            let Some(dropped) = state.history.pop_front() else {
                break;
            };
            state.history_bytes = state.history_bytes.saturating_sub(dropped.footprint());
            state.oldest = dropped.revision();
        }
        state.revision = revision;
        state.progress_sent = revision;
        let _ = state.sender.send(CacheMessage::Event(weak));
    }

    fn progress(&self, revision: Revision) {
        let mut state = self.write();
        if state.progress_sent < revision {
            state.progress_sent = revision;
            state.revision = state.revision.max(revision);
            let _ = state.sender.send(CacheMessage::Progress(revision));
        }
    }
}

/// All watch caches, fed by one storage watch.
pub struct CacheSet {
    storage: Arc<dyn Storage>,
    caches: Vec<Arc<WatchCache>>,
    global: watch::Sender<Revision>,
}

impl CacheSet {
    /// A cache for each of these kinds, under its storage prefix.
    pub fn for_kinds(
        storage: Arc<dyn Storage>,
        kinds: impl IntoIterator<Item = Arc<dyn Project>>,
        history_limit: HistoryLimits,
    ) -> Self {
        let prefixes = kinds
            .into_iter()
            .map(|kind| (kind.storage_prefix(), Projection::of(kind)))
            .collect();
        Self::new(storage, prefixes, history_limit)
    }

    /// Caches for these storage prefixes (each ending in `/`), each with its kind's projection.
    pub fn new(
        storage: Arc<dyn Storage>,
        prefixes: Vec<(String, Projection)>,
        history_limit: HistoryLimits,
    ) -> Self {
        let (global, receiver) = watch::channel(0);
        let writer = if storage.exclusive() {
            Writer::ThisProcess
        } else {
            Writer::Anyone
        };
        let caches = prefixes
            .into_iter()
            .map(|kind| {
                Arc::new(WatchCache::new(
                    kind,
                    writer,
                    receiver.clone(),
                    history_limit,
                ))
            })
            .collect();
        CacheSet {
            storage,
            caches,
            global,
        }
    }

    /// The cache for a prefix.
    pub fn cache(&self, prefix: &str) -> Option<Arc<WatchCache>> {
        self.caches.iter().find(|c| c.prefix == prefix).cloned()
    }

    /// The revision every cache is complete up to.
    pub fn revision(&self) -> Revision {
        *self.global.borrow()
    }

    async fn load(&self) -> Result<Revision, StorageError> {
        let revision = self.storage.current_revision().await?;
        for cache in &self.caches {
            let response = self
                .storage
                .range(RangeRequest {
                    prefix: cache.prefix.clone(),
                    start_after: None,
                    limit: 0,
                    at_revision: Some(revision),
                })
                .await?;
            let objects = response
                .kvs
                .into_iter()
                .filter_map(|kv| {
                    CachedObject::decode_written(
                        cache.writer,
                        kv.key.clone(),
                        &kv.value,
                        kv.mod_revision,
                        &cache.project,
                    )
                    .map(|o| (kv.key, Arc::new(o)))
                })
                .collect();
            cache.reset(objects, revision);
        }
        self.global.send_replace(revision);
        Ok(revision)
    }

    /// Loads every cache and keeps them current in a background task until the set is dropped.
    pub async fn start(self: &Arc<Self>) -> Result<(), StorageError> {
        let revision = self.load().await?;
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            // Where the watch resumes: after the last revision whose changes were all applied,
            // skipping those of the next one already applied (a break can fall inside one
            // transaction's changes, which storage sends again in the same order).
            let mut resume = Resume {
                complete: revision,
                partial: (revision, 0),
            };
            loop {
                let Some(set) = weak.upgrade() else { return };
                let error = match set.follow(&mut resume).await {
                    Ok(()) => return,
                    Err(error) => error,
                };
                // A broken watch (a storage member gone, say) is resumed where it stopped, so
                // the caches keep their history and watchers resuming from a resourceVersion
                // miss nothing; only history storage no longer has forces a reload.
                if !matches!(error, StorageError::Compacted { .. }) {
                    tracing::warn!(%error, "storage watch ended; resuming it");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                tracing::warn!(%error, "storage watch ended; reloading the watch cache");
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    match set.load().await {
                        Ok(r) => {
                            resume = Resume {
                                complete: r,
                                partial: (r, 0),
                            };
                            break;
                        }
                        Err(error) => tracing::warn!(%error, "reloading the watch cache failed"),
                    }
                }
            }
        });
        Ok(())
    }

    async fn follow(self: &Arc<Self>, resume: &mut Resume) -> Result<(), StorageError> {
        let mut stream = self.storage.watch("", resume.complete).await?;
        let mut skip = if resume.partial.0 > resume.complete {
            resume.partial.1
        } else {
            0
        };
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut routes: HashMap<Arc<str>, usize> = HashMap::new();
        loop {
            tokio::select! {
                event = stream.next_event() => {
                    let Some(event) = event else { return Err(StorageError::Closed) };
                    let event = event?;
                    let revision = event.revision();
                    if revision == resume.partial.0 && skip > 0 {
                        // Applied before the watch broke.
                        skip -= 1;
                        continue;
                    }
                    if revision > resume.partial.0 {
                        resume.complete = resume.partial.0;
                        resume.partial = (revision, 0);
                    }
                    resume.partial.1 += 1;
                    let index = match routes.get(&event.kv.key) {
                        Some(i) => Some(*i),
                        None => {
                            let found = self.caches.iter().position(|c| event.kv.key.starts_with(c.prefix.as_str()));
                            if let Some(i) = found {
                                if routes.len() > 100_000 { routes.clear(); }
                                routes.insert(event.kv.key.clone(), i);
                            }
                            found
                        }
                    };
                    if let Some(i) = index {
                        self.caches[i].apply(event.kind, &event.kv, event.prev.as_ref(), event.hint.as_ref());
                    }
                    self.global.send_replace(revision);
                }
                _ = tick.tick() => {
                    let revision = *self.global.borrow();
                    for cache in &self.caches {
                        cache.progress(revision);
                    }
                }
            }
        }
    }
}

/// Where a broken storage watch resumes.
struct Resume {
    /// The last revision whose changes were all applied.
    complete: Revision,
    /// The revision being applied, and how many of its changes were.
    partial: (Revision, usize),
}

#[cfg(test)]
mod tests;
