//! The embedded engine: the storage contract on one machine, on top of `redb`.
//!
//! # Layout
//! One redb file, `store.redb`, in the data directory, with four tables:
//! - `live`: key → the key's current value (create revision, version, mod revision, bytes). Latest
//!   reads and transaction compares use only this table.
//! - `revs`: (key, revision) → the value written (or a tombstone) at that revision. Reads at an
//!   older revision take, per key, the newest entry at or below it; watch catch-up reads the
//!   entry at the event's revision and the one before it (the previous value).
//! - `log`: revision → the keys that revision changed, in op order. Watches catch up from it,
//!   and compaction walks it to find the history it may drop.
//! - `meta`: the current revision, the compaction point, and how far compaction has cleaned.
//!
//! # Writes
//! Every transaction goes to one writer thread. It takes all requests queued at that moment,
//! applies them one after another in a single redb write transaction (each successful mutating
//! request gets its own revision), commits with an fsync, and only then answers the callers
//! and publishes their events to the watch hub. Concurrent writers therefore share one fsync
//! (group commit) and are serialised in revision order. A crash before the commit loses the
//! whole batch, none of which was acknowledged.
//!
//! # Compaction
//! Compacting moves the compaction point at once (reads below it fail from then on). The writer
//! then drops the superseded history in small chunks whenever it has no requests waiting, so a
//! large compaction never stalls writers for long. Only history no read at or above the
//! compaction point can need is dropped, so the chunks need not be durable on their own.

use std::collections::HashSet;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc as std_mpsc};
use std::thread;

use async_trait::async_trait;
use bytes::Bytes;
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
    WriteTransaction,
};
use tokio::sync::{mpsc, oneshot};

use crate::watch::{CloseReason, Hub, Registration};
use crate::{
    Compare, Event, EventKind, GetResponse, KeyValue, Op, RangeRequest, RangeResponse, Result,
    Revision, Storage, StorageError, Txn, TxnOutcome, WatchStream, prefix_end,
};

const LIVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("live");
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
        let path = options.data_dir.join("store.redb");
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
        let revision = initialise(&db)?;
        let hub = Arc::new(Hub::default());
        hub.set_published(revision);

        let (writer, requests) = std_mpsc::channel();
        let writer_db = db.clone();
        let writer_hub = hub.clone();
        let writer_thread = thread::Builder::new()
            .name("capstan-storage-writer".into())
            .spawn(move || Writer::new(writer_db, writer_hub).run(requests))
            .map_err(|e| StorageError::Embedded(format!("cannot start writer thread: {e}")))?;

        Ok(Self {
            shared: Arc::new(Shared {
                db,
                hub,
                writer: Some(writer),
                writer_thread: Some(writer_thread),
                watch_buffer: options.watch_buffer,
            }),
        })
    }

    /// The path of the database file for a data directory.
    pub fn database_path(data_dir: &Path) -> PathBuf {
        data_dir.join("store.redb")
    }

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
}

/// Creates the tables on first open and returns the current revision.
fn initialise(db: &Database) -> Result<Revision> {
    let wt = db.begin_write().map_err(db_err)?;
    let revision = {
        wt.open_table(LIVE).map_err(db_err)?;
        wt.open_table(REVS).map_err(db_err)?;
        wt.open_table(LOG).map_err(db_err)?;
        let meta = wt.open_table(META).map_err(db_err)?;
        read_meta(&meta, META_REVISION)?
    };
    wt.commit().map_err(db_err)?;
    Ok(revision)
}

fn read_meta(table: &impl ReadableTable<&'static str, u64>, name: &str) -> Result<Revision> {
    let value = table.get(name).map_err(db_err)?.map_or(0, |v| v.value());
    i64::try_from(value).map_err(|_| StorageError::Corrupt(format!("meta {name} = {value}")))
}

fn to_u64(revision: Revision) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

// ---- record encoding -------------------------------------------------------------------------

/// A value as kept in `live` or `revs`: create revision, version, and bytes; `None` bytes is a
/// tombstone (only in `revs`). The mod revision is the `revs` key, or stored in `live`.
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

    /// Which revision to read at: `None` for the latest state, `Some(r)` for history.
    fn resolve(&self, at: Option<Revision>) -> Result<Option<Revision>> {
        match at {
            None => Ok(None),
            Some(r) if r <= 0 || r == self.revision => Ok(None),
            Some(r) if r > self.revision => Err(StorageError::FutureRevision {
                requested: r,
                current: self.revision,
            }),
            Some(r) if r < self.compacted => Err(StorageError::Compacted {
                requested: r,
                compacted: self.compacted,
            }),
            Some(r) => Ok(Some(r)),
        }
    }

    fn get(&self, key: &str, at: Option<Revision>) -> Result<GetResponse> {
        let kv = match self.resolve(at)? {
            None => {
                let live = self.rt.open_table(LIVE).map_err(db_err)?;
                let found = live.get(key.as_bytes()).map_err(db_err)?;
                match found {
                    Some(v) => Record::decode(v.value())?.into_kv(key.as_bytes())?,
                    None => None,
                }
            }
            Some(r) => {
                let revs = self.rt.open_table(REVS).map_err(db_err)?;
                newest_at(&revs, key.as_bytes(), to_u64(r))?
                    .and_then(|(_, rec)| rec.into_kv(key.as_bytes()).transpose())
                    .transpose()?
            }
        };
        let revision = at.filter(|r| *r > 0).unwrap_or(self.revision);
        Ok(GetResponse { kv, revision })
    }

    fn range(&self, request: &RangeRequest) -> Result<RangeResponse> {
        let at = self.resolve(request.at_revision)?;
        let prefix = request.prefix.as_bytes();
        let end = prefix_end(prefix);
        if let (Some(after), Some(end)) = (&request.start_after, &end)
            && after.as_bytes() >= end.as_slice()
        {
            return Ok(RangeResponse {
                kvs: Vec::new(),
                more: false,
                remaining: 0,
                revision: at.unwrap_or(self.revision),
            });
        }
        let start = match &request.start_after {
            Some(after) if after.as_bytes() >= prefix => Bound::Excluded(after.as_bytes()),
            _ => Bound::Included(prefix),
        };
        let limit = if request.limit == 0 {
            usize::MAX
        } else {
            request.limit
        };
        let mut kvs = Vec::new();
        let mut remaining = 0u64;
        match at {
            None => {
                let live = self.rt.open_table(LIVE).map_err(db_err)?;
                let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                for entry in live.range::<&[u8]>((start, end)).map_err(db_err)? {
                    let (key, value) = entry.map_err(db_err)?;
                    if kvs.len() < limit {
                        if let Some(kv) = Record::decode(value.value())?.into_kv(key.value())? {
                            kvs.push(kv);
                        }
                    } else {
                        remaining += 1;
                    }
                }
            }
            Some(r) => {
                let revs = self.rt.open_table(REVS).map_err(db_err)?;
                let lower = match start {
                    Bound::Excluded(k) => Bound::Excluded((k, u64::MAX)),
                    Bound::Included(k) => Bound::Included((k, 0)),
                    Bound::Unbounded => Bound::Unbounded,
                };
                let upper = end
                    .as_deref()
                    .map_or(Bound::Unbounded, |e| Bound::Excluded((e, 0)));
                // Entries come grouped by key, oldest first: remember the newest at or below
                // `r` for the current key and emit it when the key changes.
                let mut current: Option<(Vec<u8>, Option<Record>)> = None;
                let mut emit = |key: Vec<u8>, rec: Option<Record>| -> Result<()> {
                    if let Some(rec) = rec.filter(|rec| rec.value.is_some()) {
                        if kvs.len() < limit {
                            kvs.extend(rec.into_kv(&key)?);
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
                        if let Some((ck, rec)) = current.take() {
                            emit(ck, rec)?;
                        }
                        current = Some((key.to_vec(), None));
                    }
                    if rev <= to_u64(r) {
                        let mut rec = Record::decode(v.value())?;
                        rec.mod_revision = i64::try_from(rev).unwrap_or(i64::MAX);
                        if let Some((_, slot)) = current.as_mut() {
                            *slot = Some(rec);
                        }
                    }
                }
                if let Some((ck, rec)) = current.take() {
                    emit(ck, rec)?;
                }
            }
        }
        Ok(RangeResponse {
            kvs,
            more: remaining > 0,
            remaining,
            revision: at.unwrap_or(self.revision),
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

impl Writer {
    fn new(db: Arc<Database>, hub: Arc<Hub>) -> Self {
        Self {
            db,
            hub,
            cleanup_pending: true,
        }
    }

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

    fn commit_batch(&mut self, batch: Vec<WriteRequest>) {
        let mut applied = Vec::with_capacity(batch.len());
        let committed = (|| -> Result<()> {
            let mut wt = self.db.begin_write().map_err(db_err)?;
            wt.set_durability(Durability::Immediate).map_err(db_err)?;
            for request in batch {
                applied.push(match request {
                    WriteRequest::Txn(txn, reply) => match apply_txn(&wt, &txn) {
                        Ok((outcome, events)) => Applied::Txn {
                            reply,
                            outcome: Ok(outcome),
                            events,
                        },
                        // A malformed request fails alone; anything else fails the batch.
                        Err(e @ StorageError::InvalidTxn(_)) => Applied::Txn {
                            reply,
                            outcome: Err(e),
                            events: Vec::new(),
                        },
                        Err(e) => {
                            applied.push(Applied::Txn {
                                reply,
                                outcome: Err(StorageError::Closed),
                                events: Vec::new(),
                            });
                            return Err(e);
                        }
                    },
                    WriteRequest::Compact(revision, reply) => {
                        let outcome = set_compaction_point(&wt, revision);
                        if let Err(e) = &outcome
                            && !matches!(e, StorageError::FutureRevision { .. })
                        {
                            let error = StorageError::Embedded(e.to_string());
                            applied.push(Applied::Compact { reply, outcome });
                            return Err(error);
                        }
                        Applied::Compact { reply, outcome }
                    }
                });
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
                    self.cleanup_pending |= outcome.is_ok();
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

/// Applies one transaction inside the batch's write transaction.
fn apply_txn(wt: &WriteTransaction, txn: &Txn) -> Result<(TxnOutcome, Vec<Event>)> {
    let mut seen = HashSet::with_capacity(txn.ops.len());
    if let Some(dup) = txn.ops.iter().find(|op| !seen.insert(op.key())) {
        return Err(StorageError::InvalidTxn(format!(
            "duplicate key given in txn request: {}",
            dup.key()
        )));
    }

    let mut meta = wt.open_table(META).map_err(db_err)?;
    let mut live = wt.open_table(LIVE).map_err(db_err)?;
    let current = read_meta(&meta, META_REVISION)?;

    let live_value = |live: &redb::Table<&[u8], &[u8]>, key: &str| -> Result<Option<KeyValue>> {
        match live.get(key.as_bytes()).map_err(db_err)? {
            Some(v) => Record::decode(v.value())?.into_kv(key.as_bytes()),
            None => Ok(None),
        }
    };

    let mut holds = true;
    let mut current_values = Vec::with_capacity(txn.compares.len());
    for compare in &txn.compares {
        let value = live_value(&live, compare.key())?;
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
                revision: current,
                current: current_values,
            },
            Vec::new(),
        ));
    }

    let revision = current + 1;
    let mut revs = wt.open_table(REVS).map_err(db_err)?;
    let mut previous = Vec::with_capacity(txn.ops.len());
    let mut events = Vec::with_capacity(txn.ops.len());
    let mut changed: Vec<&str> = Vec::with_capacity(txn.ops.len());
    for op in &txn.ops {
        let prev = live_value(&live, op.key())?;
        match op {
            Op::Put(key, value) => {
                let record = Record {
                    create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
                    version: prev.as_ref().map_or(1, |p| p.version + 1),
                    mod_revision: revision,
                    value: Some(value.clone()),
                };
                let encoded = record.encode();
                live.insert(key.as_bytes(), encoded.as_slice())
                    .map_err(db_err)?;
                revs.insert((key.as_bytes(), to_u64(revision)), encoded.as_slice())
                    .map_err(db_err)?;
                let kv = KeyValue {
                    key: Arc::from(key.as_str()),
                    value: value.clone(),
                    create_revision: record.create_revision,
                    mod_revision: revision,
                    version: record.version,
                };
                events.push(Event {
                    kind: EventKind::Put,
                    kv,
                    prev: prev.clone(),
                });
                changed.push(key);
            }
            Op::Delete(key) => {
                if prev.is_some() {
                    live.remove(key.as_bytes()).map_err(db_err)?;
                    let tombstone = Record {
                        create_revision: 0,
                        version: 0,
                        mod_revision: revision,
                        value: None,
                    };
                    revs.insert(
                        (key.as_bytes(), to_u64(revision)),
                        tombstone.encode().as_slice(),
                    )
                    .map_err(db_err)?;
                    events.push(Event {
                        kind: EventKind::Delete,
                        kv: deleted_kv(Arc::from(key.as_str()), revision),
                        prev: prev.clone(),
                    });
                    changed.push(key);
                }
            }
        }
        previous.push(prev);
    }

    if changed.is_empty() {
        return Ok((
            TxnOutcome::Committed {
                revision: current,
                previous,
            },
            events,
        ));
    }
    let mut log = wt.open_table(LOG).map_err(db_err)?;
    log.insert(to_u64(revision), encode_keys(&changed).as_slice())
        .map_err(db_err)?;
    meta.insert(META_REVISION, to_u64(revision))
        .map_err(db_err)?;
    Ok((TxnOutcome::Committed { revision, previous }, events))
}

/// Moves the compaction point to `revision` (never backwards).
fn set_compaction_point(wt: &WriteTransaction, revision: Revision) -> Result<()> {
    let mut meta = wt.open_table(META).map_err(db_err)?;
    let current = read_meta(&meta, META_REVISION)?;
    if revision > current {
        return Err(StorageError::FutureRevision {
            requested: revision,
            current,
        });
    }
    if revision > read_meta(&meta, META_COMPACTED)? {
        meta.insert(META_COMPACTED, to_u64(revision))
            .map_err(db_err)?;
    }
    Ok(())
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
        let key = key.to_owned();
        self.read(move |s| s.get(&key, at_revision)).await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse> {
        self.read(move |s| s.range(&request)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.write(|reply| WriteRequest::Txn(txn, reply)).await
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        let compacted = self.read(|s| Ok(s.compacted)).await?;
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
        self.read(|s| Ok(s.revision)).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.write(|reply| WriteRequest::Compact(revision, reply))
            .await
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
