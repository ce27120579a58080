//! The watch cache: every kind's objects and recent changes, in memory, fed by one storage
//! watch over the whole key space. Lists and watches are served from here.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use capstan_machinery::meta;
use capstan_storage::{EventKind, KeyValue, RangeRequest, Revision, Storage, StorageError};
use serde_json::Value;
use tokio::sync::{broadcast, watch};

/// A kind's [`Selectable`] of an object.
pub type Projection = Arc<dyn Fn(&Value) -> Selectable + Send + Sync>;

/// What selectors read of an object, kept beside its JSON in the watch cache: its name,
/// namespace and labels, and the values of its kind's other selectable fields. Plain strings,
/// a few hundred bytes per object: as a `serde_json::Value` tree the same took over a kilobyte,
/// and a lookup hashed its way through three maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectable {
    name: Box<str>,
    namespace: Box<str>,
    /// Sorted by key.
    labels: Box<[(Box<str>, Box<str>)]>,
    /// Field selector fields other than `metadata.name` and `metadata.namespace`.
    fields: Box<[(&'static str, Box<str>)]>,
}

impl Selectable {
    /// The name, namespace and labels of `object`, and these field values.
    pub fn new(object: &Value, fields: impl IntoIterator<Item = (&'static str, String)>) -> Self {
        let mut labels: Vec<(Box<str>, Box<str>)> = capstan_machinery::meta::metadata(object)
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|labels| {
                labels
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                    .collect()
            })
            .unwrap_or_default();
        labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Self {
            name: capstan_machinery::meta::name(object).into(),
            namespace: capstan_machinery::meta::namespace(object).into(),
            labels: labels.into(),
            fields: fields
                .into_iter()
                .map(|(field, value)| (field, value.into_boxed_str()))
                .collect(),
        }
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.namespace` (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The value of one label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| &*self.labels[i].1)
    }

    /// The value of a field selector field; `None` for a field the kind is not selected by.
    pub fn field(&self, field: &str) -> Option<&str> {
        match field {
            "metadata.name" => Some(&self.name),
            "metadata.namespace" => Some(&self.namespace),
            _ => self
                .fields
                .iter()
                .find(|(f, _)| *f == field)
                .map(|(_, value)| &**value),
        }
    }

    /// Whether both selectors select the object. Empty selectors read nothing of it (in a long
    /// list, each object read is a cache miss).
    pub fn selected_by(
        &self,
        labels: &capstan_machinery::labels::LabelSelector,
        fields: &capstan_machinery::fields::FieldSelector,
    ) -> bool {
        labels.matches_with(|key| self.label(key)) && fields.matches(|f| self.field(f))
    }
}

/// An object's JSON as the cache keeps it.
enum Json {
    /// The stored value itself, shared with the storage engine.
    Stored(Stored),
    /// The object as a list item (re-encoded: a stored value of another shape, or a
    /// deletion stamped with its own revision).
    Item(Bytes),
}

/// A stored value (`{"kind":…,"apiVersion":…,…,"metadata":{…},…}`, no `resourceVersion`) and
/// where its parts are, so it is served without re-encoding: a list item skips `kind` and
/// `apiVersion`, and `resourceVersion` goes in at the end of `metadata`.
struct Stored {
    bytes: Bytes,
    /// Where the members after `kind` and `apiVersion` start.
    members: usize,
    /// Where `metadata`'s closing brace is.
    metadata_end: usize,
    metadata_empty: bool,
}

impl Stored {
    /// Finds the parts of a stored value (valid JSON); `None` when it has another shape.
    fn locate(bytes: Bytes) -> Option<Self> {
        let mut scan = Scanner {
            bytes: &bytes,
            at: 0,
        };
        scan.expect(b'{')?;
        let mut index = 0;
        let mut members = None;
        let mut metadata = None;
        loop {
            scan.whitespace();
            if index == 2 {
                members = Some(scan.at);
            }
            let key = scan.string()?;
            scan.whitespace();
            scan.expect(b':')?;
            scan.whitespace();
            let value = scan.at;
            scan.value()?;
            match (index, key) {
                (0, b"kind") | (1, b"apiVersion") => {}
                (0 | 1, _) => return None,
                (_, b"metadata") => metadata = Some((value, scan.at)),
                _ => {}
            }
            index += 1;
            scan.whitespace();
            match scan.next()? {
                b',' => {}
                b'}' => break,
                _ => return None,
            }
        }
        let (start, end) = metadata?;
        if scan.at != bytes.len() || bytes.get(start) != Some(&b'{') {
            return None;
        }
        let metadata_end = end - 1;
        let metadata_empty = bytes[start + 1..metadata_end]
            .iter()
            .all(u8::is_ascii_whitespace);
        Some(Stored {
            members: members?,
            metadata_end,
            metadata_empty,
            bytes,
        })
    }
}

/// Steps over the members and values of JSON already known to be valid.
struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scanner<'a> {
    fn next(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn whitespace(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    /// A string; returns its raw contents (escapes not decoded).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.at;
        loop {
            match self.next()? {
                b'\\' => {
                    self.next()?;
                }
                b'"' => return Some(&self.bytes[start..self.at - 1]),
                _ => {}
            }
        }
    }

    fn value(&mut self) -> Option<()> {
        match *self.bytes.get(self.at)? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.bytes.get(self.at)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                while self
                    .bytes
                    .get(self.at)
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    self.at += 1;
                }
                Some(())
            }
        }
    }
}

/// `head` (`{"kind":…,"apiVersion":…,`) and the members of the JSON object `item`.
fn with_type(head: &[u8], item: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + item.len());
    out.extend_from_slice(head);
    if item.len() > 2 {
        out.extend_from_slice(&item[1..]);
    } else {
        // `{}`: no members, so no comma after the type either.
        out.pop();
        out.push(b'}');
    }
    out
}

/// `"resourceVersion":"N"`, after a comma unless it is `metadata`'s only member; written
/// without allocating (list bodies write one per item).
struct ResourceVersionMember {
    bytes: [u8; 48],
    len: usize,
}

impl ResourceVersionMember {
    fn new(metadata_empty: bool, revision: Revision) -> Self {
        use std::io::Write;
        let mut bytes = [0u8; 48];
        let mut cursor = std::io::Cursor::new(&mut bytes[..]);
        let comma = if metadata_empty { "" } else { "," };
        // 48 bytes hold the longest i64: the write cannot fail.
        let _ = write!(cursor, "{comma}\"resourceVersion\":\"{revision}\"");
        let len = cursor.position() as usize;
        Self { bytes, len }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What a kind's projection reads of a stored object ([`Strategy::selectable`]: the name,
/// namespace and labels, and field values from `spec` and `status`); the rest is skipped.
///
/// [`Strategy::selectable`]: crate::Strategy::selectable
#[derive(serde::Deserialize)]
struct Projected {
    metadata: Option<ProjectedMeta>,
    spec: Option<Value>,
    status: Option<Value>,
}

#[derive(serde::Deserialize)]
struct ProjectedMeta {
    name: Option<Value>,
    namespace: Option<Value>,
    labels: Option<Value>,
    /// Whether the key is there at all (`null` included).
    #[serde(rename = "resourceVersion", default, deserialize_with = "present")]
    resource_version: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(value: D) -> Result<bool, D::Error> {
    <serde::de::IgnoredAny as serde::Deserialize>::deserialize(value).map(|_| true)
}

impl Projected {
    fn into_value(self) -> Value {
        let mut object = serde_json::Map::new();
        if let Some(meta) = self.metadata {
            let mut metadata = serde_json::Map::new();
            for (field, value) in [
                ("name", meta.name),
                ("namespace", meta.namespace),
                ("labels", meta.labels),
            ] {
                if let Some(value) = value {
                    metadata.insert(field.into(), value);
                }
            }
            object.insert("metadata".into(), Value::Object(metadata));
        }
        for (field, value) in [("spec", self.spec), ("status", self.status)] {
            if let Some(value) = value {
                object.insert(field.into(), value);
            }
        }
        Value::Object(object)
    }
}

/// One object as the cache holds it: serialized once, plus what selectors read.
pub struct CachedObject {
    /// Its storage key.
    pub key: Arc<str>,
    /// The revision of its last write (its `resourceVersion`).
    pub revision: Revision,
    /// Its JSON.
    json: Json,
    /// What label and field selectors look at.
    pub selectable: Selectable,
    /// Encoded JSON watch lines (ADDED, MODIFIED, DELETED), built once and shared by every
    /// watcher that sends this object.
    lines: [std::sync::OnceLock<Bytes>; 3],
}

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedObject")
            .field("key", &self.key)
            .field("revision", &self.revision)
            .finish()
    }
}

impl CachedObject {
    /// Decodes a stored value; `revision` becomes its `resourceVersion`. The stored bytes
    /// themselves are kept (shared with the storage engine's copy, not duplicated) when they
    /// have the shape Capstan writes: `kind` and `apiVersion` first, then a `metadata` object
    /// without `resourceVersion`.
    pub fn decode(
        key: Arc<str>,
        value: &Bytes,
        revision: Revision,
        project: &Projection,
    ) -> Option<Self> {
        // Only what the projection reads is decoded (not managedFields, not the rest).
        if let Ok(projected) = serde_json::from_slice::<Projected>(value)
            && projected
                .metadata
                .as_ref()
                .is_some_and(|m| !m.resource_version)
            // The partial decode skips what it does not read without checking its text.
            && std::str::from_utf8(value).is_ok()
            && let Some(stored) = Stored::locate(value.clone())
        {
            return Some(CachedObject {
                selectable: project(&projected.into_value()),
                key,
                revision,
                json: Json::Stored(stored),
                lines: Default::default(),
            });
        }
        let mut object: Value = match serde_json::from_slice(value) {
            Ok(object) => object,
            Err(error) => {
                tracing::warn!(%key, %error, "skipping an undecodable stored object");
                return None;
            }
        };
        Some(Self::from_object(key, &mut object, revision, project))
    }

    /// Wraps an object, stamping `revision` as its `resourceVersion`.
    pub fn from_object(
        key: Arc<str>,
        object: &mut Value,
        revision: Revision,
        project: &Projection,
    ) -> Self {
        meta::strip_type_meta(object);
        meta::set_meta_str(object, "resourceVersion", &revision.to_string());
        let json = Json::Item(Bytes::from(
            serde_json::to_vec(&*object).unwrap_or_default(),
        ));
        CachedObject {
            key,
            revision,
            json,
            selectable: project(object),
            lines: Default::default(),
        }
    }

    /// The watch line for this object as a `kind` event, built by `encode` the first time.
    pub fn watch_line(&self, kind: EventType, encode: impl FnOnce() -> Bytes) -> Bytes {
        let slot = match kind {
            EventType::Added => &self.lines[0],
            EventType::Modified => &self.lines[1],
            EventType::Deleted => &self.lines[2],
        };
        slot.get_or_init(encode).clone()
    }

    /// The object itself (decoded from its JSON).
    pub fn object(&self) -> Value {
        let mut item = Vec::with_capacity(self.item_len());
        self.write_item(&mut item);
        serde_json::from_slice(&item).unwrap_or(Value::Null)
    }

    /// The object's JSON as held: with or without `kind` and `apiVersion`, and without
    /// `metadata.resourceVersion` when stored bytes are held. For reading a few fields with a
    /// partial decode; [`CachedObject::object`] is the object itself.
    pub fn raw_json(&self) -> &[u8] {
        match &self.json {
            Json::Item(json) => json,
            Json::Stored(stored) => &stored.bytes,
        }
    }

    /// The length of [`CachedObject::write_item`]'s output.
    pub fn item_len(&self) -> usize {
        match &self.json {
            Json::Item(json) => json.len(),
            Json::Stored(stored) => {
                1 + (stored.bytes.len() - stored.members)
                    + ResourceVersionMember::new(stored.metadata_empty, self.revision)
                        .as_bytes()
                        .len()
            }
        }
    }

    /// Writes the object as a list item: without `kind` and `apiVersion`, with
    /// `metadata.resourceVersion`.
    pub fn write_item(&self, out: &mut Vec<u8>) {
        match &self.json {
            Json::Item(json) => out.extend_from_slice(json),
            Json::Stored(stored) => {
                out.push(b'{');
                out.extend_from_slice(&stored.bytes[stored.members..stored.metadata_end]);
                out.extend_from_slice(
                    ResourceVersionMember::new(stored.metadata_empty, self.revision).as_bytes(),
                );
                out.extend_from_slice(&stored.bytes[stored.metadata_end..]);
            }
        }
    }

    /// The object with `kind` and `apiVersion` (as served alone or in a watch event).
    pub fn typed_json(&self, kind: &str, api_version: &str) -> Vec<u8> {
        let mut head = meta::type_head(kind, api_version);
        head.push(b',');
        match &self.json {
            // Stored with another type: served as the item with this one.
            Json::Stored(stored) if !stored.bytes.starts_with(&head) => {
                let mut item = Vec::with_capacity(self.item_len());
                self.write_item(&mut item);
                with_type(&head, &item)
            }
            Json::Item(json) => with_type(&head, json),
            Json::Stored(stored) => {
                let rv = ResourceVersionMember::new(stored.metadata_empty, self.revision);
                let mut out = Vec::with_capacity(stored.bytes.len() + rv.as_bytes().len());
                out.extend_from_slice(&stored.bytes[..stored.metadata_end]);
                out.extend_from_slice(rv.as_bytes());
                out.extend_from_slice(&stored.bytes[stored.metadata_end..]);
                out
            }
        }
    }

    /// The same object stamped with another revision (a deletion's).
    pub fn at_revision(&self, revision: Revision, project: &Projection) -> Self {
        let mut object = self.object();
        Self::from_object(self.key.clone(), &mut object, revision, project)
    }
}

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
        prefix: String,
        project: Projection,
        global: watch::Receiver<Revision>,
        history_limit: HistoryLimits,
    ) -> Self {
        let channel_capacity = 4096;
        let (sender, _) = broadcast::channel(channel_capacity);
        WatchCache {
            prefix,
            project,
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

    fn apply(&self, kind: EventKind, kv: &KeyValue, prev: Option<&KeyValue>) {
        let revision = kv.mod_revision;
        let mut state = self.write();
        let previous = state.objects.get(&kv.key).cloned();
        let event = match kind {
            EventKind::Put => {
                let Some(object) =
                    CachedObject::decode(kv.key.clone(), &kv.value, revision, &self.project)
                else {
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
                        CachedObject::decode(p.key.clone(), &p.value, p.mod_revision, &self.project)
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
    /// Caches for these storage prefixes (each ending in `/`), each with its kind's projection.
    pub fn new(
        storage: Arc<dyn Storage>,
        prefixes: Vec<(String, Projection)>,
        history_limit: HistoryLimits,
    ) -> Self {
        let (global, receiver) = watch::channel(0);
        let caches = prefixes
            .into_iter()
            .map(|(p, project)| {
                Arc::new(WatchCache::new(p, project, receiver.clone(), history_limit))
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
                    CachedObject::decode(kv.key.clone(), &kv.value, kv.mod_revision, &cache.project)
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
            let mut revision = revision;
            loop {
                let Some(set) = weak.upgrade() else { return };
                match set.follow(revision).await {
                    Ok(()) => return,
                    Err(error) => {
                        tracing::warn!(%error, "storage watch ended; reloading the watch cache");
                    }
                }
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    match set.load().await {
                        Ok(r) => {
                            revision = r;
                            break;
                        }
                        Err(error) => tracing::warn!(%error, "reloading the watch cache failed"),
                    }
                }
            }
        });
        Ok(())
    }

    async fn follow(self: &Arc<Self>, after: Revision) -> Result<(), StorageError> {
        let mut stream = self.storage.watch("", after).await?;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut routes: HashMap<Arc<str>, usize> = HashMap::new();
        loop {
            tokio::select! {
                event = stream.next_event() => {
                    let Some(event) = event else { return Err(StorageError::Closed) };
                    let event = event?;
                    let revision = event.revision();
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
                        self.caches[i].apply(event.kind, &event.kv, event.prev.as_ref());
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

#[cfg(test)]
mod tests {
    use capstan_machinery::fields::FieldSelector;
    use capstan_machinery::labels::LabelSelector;
    use serde_json::json;

    use std::sync::Arc;

    use bytes::Bytes;
    use serde_json::Value;

    use super::{CachedObject, Projection, Selectable};

    fn projection() -> Projection {
        Arc::new(|object: &Value| Selectable::new(object, []))
    }

    /// The cached object served from the stored bytes equals the re-encoded one.
    fn same_as_reencoded(stored: &Value) {
        let bytes = Bytes::from(serde_json::to_vec(stored).expect("encodes"));
        let project = projection();
        let cached = CachedObject::decode("/k".into(), &bytes, 42, &project).expect("decodes");
        let mut object = stored.clone();
        let reencoded = CachedObject::from_object("/k".into(), &mut object, 42, &project);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        cached.write_item(&mut a);
        reencoded.write_item(&mut b);
        assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
        assert_eq!(cached.item_len(), a.len());
        assert_eq!(
            String::from_utf8_lossy(&cached.typed_json("Service", "v1")),
            String::from_utf8_lossy(&reencoded.typed_json("Service", "v1"))
        );
        assert_eq!(cached.object(), reencoded.object());
        assert_eq!(cached.object()["metadata"]["resourceVersion"], "42");
    }

    #[test]
    fn the_history_is_bounded_in_bytes_and_an_overrun_watcher_gets_nothing_stale() {
        use capstan_storage::{EventKind, KeyValue};
        let (_global, receiver) = tokio::sync::watch::channel(0);
        let cache = super::WatchCache::new(
            "/k/".into(),
            projection(),
            receiver,
            super::HistoryLimits {
                events: 100_000,
                bytes: 1024 * 1024,
            },
        );
        let subscription = cache.subscribe(false, 0).expect("subscribes");
        let mut receiver = subscription.receiver;
        let big = "x".repeat(100 * 1024);
        for revision in 1..=100 {
            let object = json!({"metadata": {"name": "a", "annotations": {"a": big}}});
            let kv = KeyValue {
                key: "/k/a".into(),
                value: Bytes::from(serde_json::to_vec(&object).expect("encodes")),
                create_revision: 1,
                mod_revision: revision,
                version: revision,
            };
            cache.apply(EventKind::Put, &kv, None);
        }
        let state = cache.read();
        // 100 changes of ~100 KiB each would be 10 MiB (twice that with their watch lines).
        assert!(
            state.history_bytes <= 1024 * 1024,
            "{}",
            state.history_bytes
        );
        assert!(state.history.len() < 10, "{}", state.history.len());
        assert!(state.oldest > 90);
        drop(state);
        // The channel holds no object alive: the first changes are gone for a slow watcher.
        match receiver.try_recv() {
            Ok(super::CacheMessage::Event(event)) => assert!(event.upgrade().is_none()),
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[test]
    fn stored_values_are_served_without_reencoding() {
        same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1",
            "metadata": {"name": "a", "namespace": "n", "annotations": {"x": "{\"y\":[1,\"}\"]}"}},
            "spec": {"ports": [{"port": 80}], "selector": {"a": "b"}}, "status": {"loadBalancer": {}}}));
        same_as_reencoded(
            &json!({"kind": "Service", "apiVersion": "v1", "metadata": {}, "spec": {}}),
        );
        same_as_reencoded(
            &json!({"kind": "Service", "apiVersion": "v1", "spec": {"a": [true, null, 1.5e3]}, "metadata": {"name": "z\\\"q"}}),
        );
        // Other shapes take the re-encoding path and still agree.
        same_as_reencoded(
            &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}}),
        );
        same_as_reencoded(
            &json!({"kind": "Service", "apiVersion": "v1", "metadata": {"name": "a", "resourceVersion": "7"}}),
        );
        same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1"}));
        same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v1", "metadata": "odd"}));
        same_as_reencoded(
            &json!({"kind": "Service", "apiVersion": "v1", "metadata": {"name": "a", "resourceVersion": null}}),
        );
        // Stored as another type: served with the type asked for.
        same_as_reencoded(
            &json!({"kind": "Endpoints", "apiVersion": "v1", "metadata": {"name": "a"}}),
        );
        same_as_reencoded(&json!({"kind": "Service", "apiVersion": "v2", "metadata": {}}));
    }

    #[test]
    fn selectable_answers_selectors_as_the_object_would() {
        let object = json!({
            "metadata": {"name": "web", "namespace": "prod", "labels": {"tier": "front", "app": "web", "odd": 1}},
            "spec": {"type": "NodePort"},
        });
        let s = Selectable::new(&object, [("spec.type", "NodePort".to_string())]);
        assert_eq!((s.name(), s.namespace()), ("web", "prod"));
        assert_eq!(s.label("app"), Some("web"));
        assert_eq!(s.label("tier"), Some("front"));
        assert_eq!(s.label("odd"), None, "labels are strings");
        assert_eq!(s.field("spec.type"), Some("NodePort"));
        assert_eq!(s.field("spec.clusterIP"), None);
        let selects = |labels: &str, fields: &str| {
            s.selected_by(
                &LabelSelector::parse(labels).expect("label selector"),
                &FieldSelector::parse(fields).expect("field selector"),
            )
        };
        assert!(selects(
            "app=web,tier in (front,back)",
            "metadata.name=web,spec.type=NodePort"
        ));
        assert!(selects("!missing", "metadata.namespace!=dev"));
        assert!(!selects("app=db", ""));
        assert!(!selects("", "spec.type=ClusterIP"));
        assert!(!selects("", "metadata.name=other"));
    }
}
