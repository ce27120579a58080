//! The embedded engine: the storage contract on one machine, on top of `redb`.
//!
//! # Layout
//! One redb file, `store.redb`, in the data directory, with three tables:
//! - `revs`: (key, revision) → the value written (or a tombstone) at that revision, with the
//!   key's create revision and version. Reads at an older revision take, per key, the newest
//!   entry at or below it; watch catch-up reads the entry at the event's revision and the one
//!   before it (the previous value).
//! - `log`: revision → the keys that revision changed, in op order. Watches catch up from it,
//!   and compaction walks it to find the history it may drop.
//! - `meta`: the current revision, the compaction point, and how far compaction has cleaned.
//!
//! The current state of every key is also held in memory ([`LiveState`]), rebuilt from `revs`
//! on open — the way etcd keeps its key index in memory. Latest reads, ranges and transaction
//! compares are served from it without touching the disk; each value is written to disk once.
//!
//! # Writes
//! Every transaction goes to one writer thread. It takes all requests queued at that moment,
//! applies them one after another in a single redb write transaction (each successful mutating
//! request gets its own revision; later requests of the batch see earlier ones through an
//! overlay), commits with an fsync, and only then updates the in-memory state, answers the
//! callers and publishes their events to the watch hub. Concurrent writers therefore share one fsync
//! (group commit) and are serialised in revision order. A crash before the commit loses the
//! whole batch, none of which was acknowledged.
//!
//! # Compaction
//! Compacting moves the compaction point at once (reads below it fail from then on). The writer
//! then drops the superseded history in small chunks whenever it has no requests waiting, so a
//! large compaction never stalls writers for long. Only history no read at or above the
//! compaction point can need is dropped, so the chunks need not be durable on their own.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, mpsc as std_mpsc};
use std::thread;

use async_trait::async_trait;
use bytes::Bytes;
use redb::{Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use crate::watch::{CloseReason, Hub, Registration};
use crate::{
    Compare, Event, EventKind, GetResponse, KeyValue, Op, RangeRequest, RangeResponse, Result,
    Revision, Storage, StorageError, Txn, TxnOutcome, WatchStream, prefix_end,
};

const REVS: TableDefinition<(&[u8], u64), &[u8]> = TableDefinition::new("revs");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";
const META_CLEANED: &str = "cleaned";

/// Most requests one group commit takes.
const MAX_BATCH: usize = 4096;
/// Most log revisions one compaction clean-up chunk processes.
const CLEANUP_CHUNK: usize = 2048;
/// Most revisions one watch catch-up read covers before it hands events over.
const CATCH_UP_CHUNK: usize = 4096;

/// Settings of the embedded engine.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The data directory; created when missing. The store lives in `store.redb` inside it.
    pub data_dir: PathBuf,
    /// How many undelivered events one watcher may hold before it is closed as lagging.
    pub watch_buffer: usize,
    /// redb's page cache size in bytes.
    pub cache_bytes: usize,
}

impl EmbeddedOptions {
    /// Default settings for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            watch_buffer: 10_000,
            cache_bytes: 256 * 1024 * 1024,
        }
    }
}

/// The embedded storage engine. Cheap to clone; all clones share one database and writer.
#[derive(Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

struct Shared {
    db: Arc<Database>,
    live: Arc<RwLock<LiveState>>,
    hub: Arc<Hub>,
    writer: Option<std_mpsc::Sender<WriteRequest>>,
    writer_thread: Option<thread::JoinHandle<()>>,
    watch_buffer: usize,
}

impl Drop for Shared {
    /// Ends every watch and waits for the writer to finish its batch, so the database file is
    /// released when the last handle goes away (a reopen in the same process then succeeds).
    fn drop(&mut self) {
        self.hub.close();
        self.writer.take();
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

/// The committed current state, in memory: every live key and the revision it is at.
/// Only the writer changes it, after each commit.
struct LiveState {
    revision: Revision,
    compacted: Revision,
    keys: BTreeMap<Arc<str>, KeyValue>,
}

enum WriteRequest {
    Txn(Txn, oneshot::Sender<Result<TxnOutcome>>),
    Compact(Revision, oneshot::Sender<Result<()>>),
}

fn db_err(error: impl Into<redb::Error>) -> StorageError {
    StorageError::Embedded(error.into().to_string())
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `options.data_dir`. Fails with
    /// [`StorageError::Locked`] when another process has it open.
    pub fn open(options: EmbeddedOptions) -> Result<Self> {
        std::fs::create_dir_all(&options.data_dir).map_err(|e| {
            StorageError::Embedded(format!(
                "cannot create data directory {}: {e}",
                options.data_dir.display()
            ))
        })?;
        let path = Self::database_path(&options.data_dir);
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen
                | redb::DatabaseError::LockProtocolMismatch => StorageError::Locked {
                    path: path.display().to_string(),
                },
                other => db_err(other),
            })?;
        let db = Arc::new(db);
        let live = Arc::new(RwLock::new(load(&db)?));
        let hub = Arc::new(Hub::default());
        hub.set_published(read_live(&live).revision);

        let (sender, requests) = std_mpsc::channel();
        let writer = Writer {
            db: db.clone(),
            live: live.clone(),
            hub: hub.clone(),
            cleanup_pending: true,
        };
        let writer_thread = thread::Builder::new()
            .name("capstan-storage-writer".into())
            .spawn(move || writer.run(requests))
            .map_err(|e| StorageError::Embedded(format!("cannot start writer thread: {e}")))?;

        Ok(Self {
            shared: Arc::new(Shared {
                db,
                live,
                hub,
                writer: Some(sender),
                writer_thread: Some(writer_thread),
                watch_buffer: options.watch_buffer,
            }),
        })
    }

    /// The path of the database file for a data directory.
    pub fn database_path(data_dir: &Path) -> PathBuf {
        data_dir.join("store.redb")
    }

    /// Reads history from a disk snapshot, off the async runtime.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Snapshot) -> Result<T> + Send + 'static,
    {
        let db = self.shared.db.clone();
        tokio::task::spawn_blocking(move || f(&Snapshot::begin(&db)?))
            .await
            .map_err(|e| StorageError::Embedded(format!("read task failed: {e}")))?
    }

    async fn write<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T>>) -> WriteRequest,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        let writer = self.shared.writer.as_ref().ok_or(StorageError::Closed)?;
        writer.send(request(tx)).map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// The in-memory state when `at` asks for the latest revision, `None` when it asks for
    /// history (or a revision not reached yet), which the disk answers.
    fn latest(&self, at: Option<Revision>) -> Option<std::sync::RwLockReadGuard<'_, LiveState>> {
        let state = read_live(&self.shared.live);
        match at {
            None => Some(state),
            Some(r) if r <= 0 || r == state.revision => Some(state),
            Some(_) => None,
        }
    }
}

fn read_live(live: &RwLock<LiveState>) -> std::sync::RwLockReadGuard<'_, LiveState> {
    live.read().unwrap_or_else(PoisonError::into_inner)
}

/// Creates the tables on first open and rebuilds the in-memory state from `revs`.
fn load(db: &Database) -> Result<LiveState> {
    let wt = db.begin_write().map_err(db_err)?;
    {
        wt.open_table(REVS).map_err(db_err)?;
        wt.open_table(LOG).map_err(db_err)?;
        wt.open_table(META).map_err(db_err)?;
    }
    wt.commit().map_err(db_err)?;

    let rt = db.begin_read().map_err(db_err)?;
    let meta = rt.open_table(META).map_err(db_err)?;
    let revision = read_meta(&meta, META_REVISION)?;
    let compacted = read_meta(&meta, META_COMPACTED)?;
    let revs = rt.open_table(REVS).map_err(db_err)?;
    let mut keys = BTreeMap::new();
    // Entries come grouped by key, oldest first; the last of each group is the current state.
    let mut newest: Option<(Vec<u8>, u64, Vec<u8>)> = None;
    let mut keep = |entry: Option<(Vec<u8>, u64, Vec<u8>)>| -> Result<()> {
        if let Some((key, rev, bytes)) = entry {
            let mut record = Record::decode(&bytes)?;
            record.mod_revision = i64::try_from(rev).unwrap_or(i64::MAX);
            if let Some(kv) = record.into_kv(&key)? {
                keys.insert(kv.key.clone(), kv);
            }
        }
        Ok(())
    };
    for entry in revs.iter().map_err(db_err)? {
        let (k, v) = entry.map_err(db_err)?;
        let (key, rev) = k.value();
        if newest.as_ref().is_some_and(|(nk, _, _)| nk.as_slice() != key) {
            keep(newest.take())?;
        }
        newest = Some((key.to_vec(), rev, v.value().to_vec()));
    }
    keep(newest)?;
    Ok(LiveState {
        revision,
        compacted,
        keys,
    })
}

fn read_meta(table: &impl ReadableTable<&'static str, u64>, name: &str) -> Result<Revision> {
    let value = table.get(name).map_err(db_err)?.map_or(0, |v| v.value());
    i64::try_from(value).map_err(|_| StorageError::Corrupt(format!("meta {name} = {value}")))
}

fn to_u64(revision: Revision) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

// ---- record encoding -------------------------------------------------------------------------

/// A value as kept in `revs`: create revision, version, and bytes; `None` bytes is a
/// tombstone. The mod revision is the `revs` key's revision.
struct Record {
    create_revision: Revision,
    version: i64,
    mod_revision: Revision,
    value: Option<Bytes>,
}

const HEADER: usize = 1 + 8 + 8 + 8;

impl Record {
    fn encode(&self) -> Vec<u8> {
        let value = self.value.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(HEADER + value.len());
        out.push(u8::from(self.value.is_none()));
        out.extend_from_slice(&self.create_revision.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.mod_revision.to_le_bytes());
        out.extend_from_slice(value);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < HEADER {
            return Err(StorageError::Corrupt(format!(
                "record of {} bytes is shorter than its header",
                bytes.len()
            )));
        }
        let int = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&bytes[at..at + 8]);
            i64::from_le_bytes(raw)
        };
        Ok(Self {
            create_revision: int(1),
            version: int(9),
            mod_revision: int(17),
            value: (bytes[0] == 0).then(|| Bytes::copy_from_slice(&bytes[HEADER..])),
        })
    }

    fn into_kv(self, key: &[u8]) -> Result<Option<KeyValue>> {
        let Some(value) = self.value else {
            return Ok(None);
        };
        Ok(Some(KeyValue {
            key: key_str(key)?,
            value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
        }))
    }
}

fn key_str(key: &[u8]) -> Result<Arc<str>> {
    std::str::from_utf8(key)
        .map(Arc::from)
        .map_err(|_| StorageError::Corrupt("key is not UTF-8".into()))
}

fn encode_keys(keys: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for key in keys {
        out.extend_from_slice(&u32::try_from(key.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
    }
    out
}

fn decode_keys(mut bytes: &[u8]) -> Result<Vec<&[u8]>> {
    let mut keys = Vec::new();
    while !bytes.is_empty() {
        let corrupt = || StorageError::Corrupt("truncated log entry".into());
        let len_bytes: [u8; 4] = bytes
            .get(..4)
            .ok_or_else(corrupt)?
            .try_into()
            .map_err(|_| corrupt())?;
        let len = u32::from_le_bytes(len_bytes) as usize;
        let key = bytes.get(4..4 + len).ok_or_else(corrupt)?;
        keys.push(key);
        bytes = &bytes[4 + len..];
    }
    Ok(keys)
}

// ---- reads -----------------------------------------------------------------------------------

/// A consistent read snapshot with its revision bookkeeping.
struct Snapshot {
    rt: ReadTransaction,
    revision: Revision,
    compacted: Revision,
}

impl Snapshot {
    fn begin(db: &Database) -> Result<Self> {
        let rt = db.begin_read().map_err(db_err)?;
        let meta = rt.open_table(META).map_err(db_err)?;
        let revision = read_meta(&meta, META_REVISION)?;
        let compacted = read_meta(&meta, META_COMPACTED)?;
        drop(meta);
        Ok(Self {
            rt,
            revision,
            compacted,
        })
    }

    /// Checks that revision `r` can be read from this snapshot.
    fn check(&self, r: Revision) -> Result<u64> {
        if r > self.revision {
            return Err(StorageError::FutureRevision {
                requested: r,
                current: self.revision,
            });
        }
        if r < self.compacted {
            return Err(StorageError::Compacted {
                requested: r,
                compacted: self.compacted,
            });
        }
        Ok(to_u64(r))
    }

    fn get_at(&self, key: &str, r: Revision) -> Result<GetResponse> {
        let at = self.check(r)?;
        let revs = self.rt.open_table(REVS).map_err(db_err)?;
        let kv = match newest_at(&revs, key.as_bytes(), at)? {
            Some((_, record)) => record.into_kv(key.as_bytes())?,
            None => None,
        };
        Ok(GetResponse { kv, revision: r })
    }

    fn range_at(&self, request: &RangeRequest, r: Revision) -> Result<RangeResponse> {
        let at = self.check(r)?;
        let prefix = request.prefix.as_bytes();
        let end = prefix_end(prefix);
        let lower = match &request.start_after {
            Some(after) if after.as_bytes() >= prefix => {
                Bound::Excluded((after.as_bytes(), u64::MAX))
            }
            _ => Bound::Included((prefix, 0)),
        };
        let upper = end
            .as_deref()
            .map_or(Bound::Unbounded, |e| Bound::Excluded((e, 0)));
        let limit = if request.limit == 0 {
            usize::MAX
        } else {
            request.limit
        };
        let mut kvs = Vec::new();
        let mut remaining = 0u64;
        if let (Bound::Excluded((after, _)), Bound::Excluded((end, _))) = (&lower, &upper)
            && after >= end
        {
            return Ok(RangeResponse {
                kvs,
                more: false,
                remaining,
                revision: r,
            });
        }
        let revs = self.rt.open_table(REVS).map_err(db_err)?;
        // Entries come grouped by key, oldest first: keep the newest at or below `at` of the
        // current key and count it when the key changes.
        let mut current: Option<(Vec<u8>, Option<Record>)> = None;
        let mut emit = |key: Vec<u8>, record: Option<Record>| -> Result<()> {
            if let Some(record) = record.filter(|record| record.value.is_some()) {
                if kvs.len() < limit {
                    kvs.extend(record.into_kv(&key)?);
                } else {
                    remaining += 1;
                }
            }
            Ok(())
        };
        for entry in revs.range::<(&[u8], u64)>((lower, upper)).map_err(db_err)? {
            let (k, v) = entry.map_err(db_err)?;
            let (key, rev) = k.value();
            if current.as_ref().is_none_or(|(ck, _)| ck.as_slice() != key) {
                if let Some((ck, record)) = current.take() {
                    emit(ck, record)?;
                }
                current = Some((key.to_vec(), None));
            }
            if rev <= at {
                let mut record = Record::decode(v.value())?;
                record.mod_revision = i64::try_from(rev).unwrap_or(i64::MAX);
                if let Some((_, slot)) = current.as_mut() {
                    *slot = Some(record);
                }
            }
        }
        if let Some((ck, record)) = current.take() {
            emit(ck, record)?;
        }
        Ok(RangeResponse {
            kvs,
            more: remaining > 0,
            remaining,
            revision: r,
        })
    }

    /// The changes under `prefix` after `after`, up to [`CATCH_UP_CHUNK`] revisions, and the
    /// revision through which they are complete.
    fn history(&self, prefix: &str, after: Revision) -> Result<(Vec<Event>, Revision)> {
        if after < self.compacted {
            return Err(StorageError::Compacted {
                requested: after,
                compacted: self.compacted,
            });
        }
        let log = self.rt.open_table(LOG).map_err(db_err)?;
        let revs = self.rt.open_table(REVS).map_err(db_err)?;
        let mut events = Vec::new();
        let mut through = after.max(self.revision);
        for (n, entry) in log.range(to_u64(after) + 1..).map_err(db_err)?.enumerate() {
            let (rev, keys) = entry.map_err(db_err)?;
            let rev = rev.value();
            if n == CATCH_UP_CHUNK {
                through = i64::try_from(rev).unwrap_or(i64::MAX) - 1;
                break;
            }
            for key in decode_keys(keys.value())? {
                if !key.starts_with(prefix.as_bytes()) {
                    continue;
                }
                events.push(event_at(&revs, key, rev)?);
            }
        }
        Ok((events, through))
    }
}

/// The newest `revs` entry for `key` at or below `at`, with its revision.
fn newest_at(
    revs: &impl ReadableTable<(&'static [u8], u64), &'static [u8]>,
    key: &[u8],
    at: u64,
) -> Result<Option<(u64, Record)>> {
    let mut range = revs
        .range::<(&[u8], u64)>((key, 0)..=(key, at))
        .map_err(db_err)?;
    match range.next_back() {
        Some(entry) => {
            let (k, v) = entry.map_err(db_err)?;
            let rev = k.value().1;
            let mut rec = Record::decode(v.value())?;
            rec.mod_revision = i64::try_from(rev).unwrap_or(i64::MAX);
            Ok(Some((rev, rec)))
        }
        None => Ok(None),
    }
}

/// The event that changed `key` at `rev`, with the key's previous value.
fn event_at(
    revs: &impl ReadableTable<(&'static [u8], u64), &'static [u8]>,
    key: &[u8],
    rev: u64,
) -> Result<Event> {
    let revision = i64::try_from(rev).unwrap_or(i64::MAX);
    let (_, rec) = newest_at(revs, key, rev)?
        .filter(|(r, _)| *r == rev)
        .ok_or_else(|| {
            StorageError::Corrupt(format!("log names a change at {rev} with no value"))
        })?;
    let prev = match rev.checked_sub(1) {
        Some(before) => match newest_at(revs, key, before)? {
            Some((_, rec)) => rec.into_kv(key)?,
            None => None,
        },
        None => None,
    };
    let key_arc = key_str(key)?;
    Ok(match rec.into_kv(key)? {
        Some(kv) => Event {
            kind: EventKind::Put,
            kv,
            prev,
        },
        None => Event {
            kind: EventKind::Delete,
            kv: deleted_kv(key_arc, revision),
            prev,
        },
    })
}

fn deleted_kv(key: Arc<str>, revision: Revision) -> KeyValue {
    KeyValue {
        key,
        value: Bytes::new(),
        create_revision: 0,
        mod_revision: revision,
        version: 0,
    }
}

// ---- the writer ------------------------------------------------------------------------------

struct Writer {
    db: Arc<Database>,
    live: Arc<RwLock<LiveState>>,
    hub: Arc<Hub>,
    cleanup_pending: bool,
}

/// What one request of a batch produced; answered (and published) only after the commit.
enum Applied {
    Txn {
        reply: oneshot::Sender<Result<TxnOutcome>>,
        outcome: Result<TxnOutcome>,
        events: Vec<Event>,
    },
    Compact {
        reply: oneshot::Sender<Result<()>>,
        outcome: Result<()>,
    },
}

/// The writes of one batch: what it will change in memory once committed.
struct Batch {
    revision: Revision,
    compacted: Revision,
    /// Keys the batch wrote, with their new state (`None`: deleted).
    overlay: HashMap<Arc<str>, Option<KeyValue>>,
}

impl Batch {
    fn current(&self, state: &LiveState, key: &str) -> Option<KeyValue> {
        match self.overlay.get(key) {
            Some(value) => value.clone(),
            None => state.keys.get(key).cloned(),
        }
    }
}

/// The tables a batch writes, opened once per batch.
struct Tables<'t> {
    revs: redb::Table<'t, (&'static [u8], u64), &'static [u8]>,
    log: redb::Table<'t, u64, &'static [u8]>,
}

impl Writer {
    fn run(mut self, requests: std_mpsc::Receiver<WriteRequest>) {
        loop {
            let first = if self.cleanup_pending {
                match requests.try_recv() {
                    Ok(request) => request,
                    Err(std_mpsc::TryRecvError::Empty) => {
                        self.clean_up_chunk();
                        continue;
                    }
                    Err(std_mpsc::TryRecvError::Disconnected) => return,
                }
            } else {
                match requests.recv() {
                    Ok(request) => request,
                    Err(_) => return,
                }
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.commit_batch(batch);
        }
    }

    fn commit_batch(&mut self, requests: Vec<WriteRequest>) {
        let mut applied = Vec::with_capacity(requests.len());
        let (revision, compacted) = {
            let state = read_live(&self.live);
            (state.revision, state.compacted)
        };
        let mut batch = Batch {
            revision,
            compacted,
            overlay: HashMap::new(),
        };
        let committed = (|| -> Result<()> {
            let mut wt = self.db.begin_write().map_err(db_err)?;
            wt.set_durability(Durability::Immediate).map_err(db_err)?;
            {
                let mut tables = Tables {
                    revs: wt.open_table(REVS).map_err(db_err)?,
                    log: wt.open_table(LOG).map_err(db_err)?,
                };
                let state = read_live(&self.live);
                for request in requests {
                    match request {
                        WriteRequest::Txn(txn, reply) => {
                            match apply_txn(&mut tables, &state, &mut batch, &txn) {
                                Ok((outcome, events)) => applied.push(Applied::Txn {
                                    reply,
                                    outcome: Ok(outcome),
                                    events,
                                }),
                                // A malformed request fails alone; anything else fails the batch.
                                Err(e @ StorageError::InvalidTxn(_)) => applied.push(Applied::Txn {
                                    reply,
                                    outcome: Err(e),
                                    events: Vec::new(),
                                }),
                                Err(e) => {
                                    applied.push(Applied::Txn {
                                        reply,
                                        outcome: Err(StorageError::Closed),
                                        events: Vec::new(),
                                    });
                                    return Err(e);
                                }
                            }
                        }
                        WriteRequest::Compact(target, reply) => {
                            let outcome = if target > batch.revision {
                                Err(StorageError::FutureRevision {
                                    requested: target,
                                    current: batch.revision,
                                })
                            } else {
                                batch.compacted = batch.compacted.max(target);
                                Ok(())
                            };
                            applied.push(Applied::Compact { reply, outcome });
                        }
                    }
                }
                let mut meta = wt.open_table(META).map_err(db_err)?;
                meta.insert(META_REVISION, to_u64(batch.revision))
                    .map_err(db_err)?;
                meta.insert(META_COMPACTED, to_u64(batch.compacted))
                    .map_err(db_err)?;
            }
            wt.commit().map_err(db_err)
        })();

        if let Err(error) = committed {
            tracing::error!(%error, "storage commit failed; the whole batch is refused");
            let text = error.to_string();
            for done in applied {
                let failure = StorageError::Embedded(text.clone());
                let _ = match done {
                    Applied::Txn { reply, .. } => reply.send(Err(failure)).is_ok(),
                    Applied::Compact { reply, .. } => reply.send(Err(failure)).is_ok(),
                };
            }
            return;
        }

        {
            let mut state = self.live.write().unwrap_or_else(PoisonError::into_inner);
            for (key, value) in batch.overlay {
                match value {
                    Some(kv) => state.keys.insert(key, kv),
                    None => state.keys.remove(&key),
                };
            }
            self.cleanup_pending |= batch.compacted > state.compacted;
            state.revision = batch.revision;
            state.compacted = batch.compacted;
        }
        for done in applied {
            match done {
                Applied::Txn {
                    reply,
                    outcome,
                    events,
                } => {
                    if let Ok(TxnOutcome::Committed { revision, .. }) = &outcome
                        && !events.is_empty()
                    {
                        self.hub.publish(*revision, &events);
                    }
                    let _ = reply.send(outcome);
                }
                Applied::Compact { reply, outcome } => {
                    let _ = reply.send(outcome);
                }
            }
        }
    }

    /// Drops one chunk of history that compaction made unreachable.
    fn clean_up_chunk(&mut self) {
        match clean_up(&self.db) {
            Ok(more) => self.cleanup_pending = more,
            Err(error) => {
                tracing::error!(%error, "compaction clean-up failed");
                self.cleanup_pending = false;
            }
        }
    }
}

/// Applies one transaction inside the batch.
fn apply_txn(
    tables: &mut Tables<'_>,
    state: &LiveState,
    batch: &mut Batch,
    txn: &Txn,
) -> Result<(TxnOutcome, Vec<Event>)> {
    let mut seen = HashSet::with_capacity(txn.ops.len());
    if let Some(dup) = txn.ops.iter().find(|op| !seen.insert(op.key())) {
        return Err(StorageError::InvalidTxn(format!(
            "duplicate key given in txn request: {}",
            dup.key()
        )));
    }

    let mut holds = true;
    let mut current_values = Vec::with_capacity(txn.compares.len());
    for compare in &txn.compares {
        let value = batch.current(state, compare.key());
        holds &= match (compare, &value) {
            (Compare::Absent(_), None) => true,
            (Compare::ModRevision(_, r), Some(kv)) => kv.mod_revision == *r,
            _ => false,
        };
        current_values.push(value);
    }
    if !holds {
        return Ok((
            TxnOutcome::Failed {
                revision: batch.revision,
                current: current_values,
            },
            Vec::new(),
        ));
    }

    let revision = batch.revision + 1;
    let mut previous = Vec::with_capacity(txn.ops.len());
    let mut events = Vec::with_capacity(txn.ops.len());
    let mut changed: Vec<&str> = Vec::with_capacity(txn.ops.len());
    for op in &txn.ops {
        let prev = batch.current(state, op.key());
        match op {
            Op::Put(key, value) => {
                let kv = KeyValue {
                    key: Arc::from(key.as_str()),
                    value: value.clone(),
                    create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
                    mod_revision: revision,
                    version: prev.as_ref().map_or(1, |p| p.version + 1),
                };
                let record = Record {
                    create_revision: kv.create_revision,
                    version: kv.version,
                    mod_revision: revision,
                    value: Some(value.clone()),
                };
                tables
                    .revs
                    .insert((key.as_bytes(), to_u64(revision)), record.encode().as_slice())
                    .map_err(db_err)?;
                batch.overlay.insert(kv.key.clone(), Some(kv.clone()));
                events.push(Event {
                    kind: EventKind::Put,
                    kv,
                    prev: prev.clone(),
                });
                changed.push(key);
            }
            Op::Delete(key) => {
                if prev.is_some() {
                    let tombstone = Record {
                        create_revision: 0,
                        version: 0,
                        mod_revision: revision,
                        value: None,
                    };
                    tables
                        .revs
                        .insert(
                            (key.as_bytes(), to_u64(revision)),
                            tombstone.encode().as_slice(),
                        )
                        .map_err(db_err)?;
                    let key: Arc<str> = Arc::from(key.as_str());
                    batch.overlay.insert(key.clone(), None);
                    events.push(Event {
                        kind: EventKind::Delete,
                        kv: deleted_kv(key, revision),
                        prev: prev.clone(),
                    });
                    changed.push(op.key());
                }
            }
        }
        previous.push(prev);
    }

    if changed.is_empty() {
        return Ok((
            TxnOutcome::Committed {
                revision: batch.revision,
                previous,
            },
            events,
        ));
    }
    tables
        .log
        .insert(to_u64(revision), encode_keys(&changed).as_slice())
        .map_err(db_err)?;
    batch.revision = revision;
    Ok((TxnOutcome::Committed { revision, previous }, events))
}

/// Drops one chunk of the history below the compaction point; returns whether more remains.
///
/// For every key changed in the chunk's log entries, only the newest `revs` entry at or below
/// the compaction point is still needed — by reads at the compaction point and as the previous
/// value of later events — and not even that when it is a tombstone.
fn clean_up(db: &Database) -> Result<bool> {
    let mut wt = db.begin_write().map_err(db_err)?;
    wt.set_durability(Durability::None).map_err(db_err)?;
    let more = {
        let mut meta = wt.open_table(META).map_err(db_err)?;
        let compacted = to_u64(read_meta(&meta, META_COMPACTED)?);
        let cleaned = to_u64(read_meta(&meta, META_CLEANED)?);
        if cleaned >= compacted {
            return Ok(false);
        }
        let mut log = wt.open_table(LOG).map_err(db_err)?;
        let mut revs = wt.open_table(REVS).map_err(db_err)?;
        let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
        for entry in log.range(cleaned + 1..=compacted).map_err(db_err)? {
            let (rev, keys) = entry.map_err(db_err)?;
            entries.push((rev.value(), keys.value().to_vec()));
            if entries.len() == CLEANUP_CHUNK {
                break;
            }
        }
        let reached = entries.last().map_or(compacted, |(rev, _)| *rev);
        let mut done: HashSet<Vec<u8>> = HashSet::new();
        for (rev, keys) in &entries {
            for key in decode_keys(keys)? {
                if !done.insert(key.to_vec()) {
                    continue;
                }
                let mut stale: Vec<u64> = Vec::new();
                let mut newest: Option<(u64, bool)> = None;
                for entry in revs
                    .range::<(&[u8], u64)>((key, 0)..=(key, compacted))
                    .map_err(db_err)?
                {
                    let (k, v) = entry.map_err(db_err)?;
                    if let Some((older, _)) = newest {
                        stale.push(older);
                    }
                    newest = Some((k.value().1, v.value().first() == Some(&1)));
                }
                if let Some((rev, true)) = newest {
                    stale.push(rev);
                }
                for old in stale {
                    revs.remove((key, old)).map_err(db_err)?;
                }
            }
            log.remove(*rev).map_err(db_err)?;
        }
        let reached = if entries.len() < CLEANUP_CHUNK {
            compacted
        } else {
            reached
        };
        meta.insert(META_CLEANED, reached).map_err(db_err)?;
        reached < compacted
    };
    wt.commit().map_err(db_err)?;
    Ok(more)
}

// ---- the contract ----------------------------------------------------------------------------

#[async_trait]
impl Storage for EmbeddedStore {
    async fn get(&self, key: &str, at_revision: Option<Revision>) -> Result<GetResponse> {
        if let Some(state) = self.latest(at_revision) {
            return Ok(GetResponse {
                kv: state.keys.get(key).cloned(),
                revision: state.revision,
            });
        }
        let (key, at) = (key.to_owned(), at_revision.unwrap_or(0));
        self.read(move |s| s.get_at(&key, at)).await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse> {
        if let Some(state) = self.latest(request.at_revision) {
            return Ok(range_latest(&state, &request));
        }
        let at = request.at_revision.unwrap_or(0);
        self.read(move |s| s.range_at(&request, at)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.write(|reply| WriteRequest::Txn(txn, reply)).await
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        let compacted = read_live(&self.shared.live).compacted;
        if after_revision < compacted {
            return Err(StorageError::Compacted {
                requested: after_revision,
                compacted,
            });
        }
        let (tx, reason, stream) = WatchStream::channel(self.shared.watch_buffer);
        let catch_up = CatchUp {
            db: self.shared.db.clone(),
            hub: self.shared.hub.clone(),
            prefix: prefix.to_owned(),
            delivered_through: after_revision.max(0),
            tx,
            reason,
        };
        tokio::spawn(catch_up.run());
        Ok(stream)
    }

    async fn current_revision(&self) -> Result<Revision> {
        Ok(read_live(&self.shared.live).revision)
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.write(|reply| WriteRequest::Compact(revision, reply))
            .await
    }
}

/// A page of the current state, from memory.
fn range_latest(state: &LiveState, request: &RangeRequest) -> RangeResponse {
    let prefix = request.prefix.as_str();
    let start = match &request.start_after {
        Some(after) if after.as_str() >= prefix => Bound::Excluded(after.as_str()),
        _ => Bound::Included(prefix),
    };
    let limit = if request.limit == 0 {
        usize::MAX
    } else {
        request.limit
    };
    let mut keys = state
        .keys
        .range::<str, _>((start, Bound::Unbounded))
        .take_while(|(key, _)| key.starts_with(prefix));
    let kvs: Vec<KeyValue> = keys.by_ref().take(limit).map(|(_, kv)| kv.clone()).collect();
    let remaining = keys.count() as u64;
    RangeResponse {
        kvs,
        more: remaining > 0,
        remaining,
        revision: state.revision,
    }
}

/// Brings a new watcher up to date from the log, then hands it to the hub.
struct CatchUp {
    db: Arc<Database>,
    hub: Arc<Hub>,
    prefix: String,
    delivered_through: Revision,
    tx: mpsc::Sender<Event>,
    reason: Arc<CloseReason>,
}

impl CatchUp {
    async fn run(mut self) {
        loop {
            let db = self.db.clone();
            let prefix = self.prefix.clone();
            let after = self.delivered_through;
            let read =
                tokio::task::spawn_blocking(move || Snapshot::begin(&db)?.history(&prefix, after))
                    .await
                    .unwrap_or_else(|e| {
                        Err(StorageError::Embedded(format!("watch read failed: {e}")))
                    });
            let (events, through) = match read {
                Ok(read) => read,
                Err(error) => {
                    self.reason.set(error);
                    return;
                }
            };
            for event in events {
                if self.tx.send(event).await.is_err() {
                    return; // the consumer went away
                }
            }
            self.delivered_through = through;
            match self
                .hub
                .register(&self.prefix, through, self.tx.clone(), self.reason.clone())
            {
                Registration::Registered | Registration::Closed => return,
                Registration::Behind => continue,
            }
        }
    }
}
