//! The embedded engine: the storage contract on one machine, on top of `redb`.
//!
//! # Layout
//! The design is etcd's: history on disk keyed by revision, the key index in memory.
//!
//! On disk, one redb file (`store.redb` in the data directory) with two tables:
//! - `history`: (revision, op index) → one change: its key, the value written (or a tombstone),
//!   the key's create revision and version, and where the key's previous change is. Keyed by
//!   revision, so every commit appends at the end of the tree and dirties few pages however
//!   scattered its keys are. Watches catch up by reading it in order.
//! - `meta`: the current revision, the compaction point, and how far compaction has cleaned.
//!
//! In memory, rebuilt from `history` on open, the [`Index`]: every key's current value and the
//! revisions of its changes still on disk. Latest reads, ranges and transaction compares are
//! served from it alone; reads at an older revision find the right change in it and fetch the
//! value from a disk snapshot.
//!
//! # Writes
//! Every transaction goes to one writer thread. It takes all requests queued at that moment,
//! applies them one after another in a single redb write transaction (each successful mutating
//! request gets its own revision; later requests of the batch see earlier ones through an
//! overlay), commits with an fsync, and only then updates the index, answers the callers and
//! publishes their events to the watch hub. Concurrent writers therefore share one fsync (group
//! commit) and are serialised in revision order. A crash before the commit loses the whole
//! batch, none of which was acknowledged.
//!
//! When writers are busy (the last commit took several requests, and the next came soon after
//! it), the writer first waits [`EmbeddedOptions::commit_delay`] for more (PostgreSQL's
//! `commit_delay` behind `commit_siblings`): a commit's fixed cost (redb's commit, the
//! `fdatasync` and the block requests behind it) is most of a small write's, so fewer, larger
//! commits cost less CPU per write. A lone writer's commit never waits.
//!
//! # Compaction
//! Compacting moves the compaction point at once (reads below it fail from then on). The writer
//! then drops superseded history in small chunks whenever it has no requests waiting, so a large
//! compaction never stalls writers for long. Per key, only the newest change at or below the
//! compaction point is kept (and not even that when it is a delete): reads at the compaction
//! point and the previous value of later changes need nothing else. The chunks need not be
//! durable on their own: a lost one is redone after a restart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, mpsc as std_mpsc};
use std::thread;

use async_trait::async_trait;
use bytes::Bytes;
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
};
use tokio::sync::{mpsc, oneshot};

use crate::watch::{CloseReason, Hub, Registration};
use crate::{
    Compare, Event, EventKind, GetResponse, KeyValue, Op, RangeRequest, RangeResponse, Result,
    Revision, Storage, StorageError, Txn, TxnOutcome, WatchStream,
};

const HISTORY: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("history");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";
const META_CLEANED: &str = "cleaned";

/// Most requests one group commit takes.
const MAX_BATCH: usize = 4096;
/// The fewest requests the last group commit took for the next one to wait
/// [`EmbeddedOptions::commit_delay`] for more, when its first request came within that delay
/// of the last commit: writers this many at once are busy enough that others are on their way
/// (PostgreSQL's `commit_siblings`, which gates its `commit_delay`).
const COMMIT_SIBLINGS: usize = 4;
/// Most revisions one compaction clean-up chunk processes.
const CLEANUP_CHUNK: u64 = 4096;
/// Most changes one watch catch-up read hands over at once.
const CATCH_UP_CHUNK: usize = 4096;
/// How often a store that failed to write tries to recover.
const RECOVERY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The free space a recovery proves before the store takes writes again.
const SPACE_PROBE_BYTES: usize = 1024 * 1024;
/// At most this many batches commit while compaction clean-up is pending before one chunk of
/// it runs, so a constant write load cannot starve it (history would grow without bound).
const CLEANUP_EVERY_BATCHES: u32 = 64;

/// Settings of the embedded engine.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The data directory; created when missing. The store lives in `store.redb` inside it.
    pub data_dir: PathBuf,
    /// How many undelivered events one watcher may hold before it is closed as lagging.
    pub watch_buffer: usize,
    /// redb's page cache size in bytes. Latest reads never touch redb (they are served from
    /// the in-memory index), so the cache only serves historical reads and watch catch-up.
    pub cache_bytes: usize,
    /// How long a group commit waits for more requests before it writes, when the last one
    /// took [`COMMIT_SIBLINGS`] or more and ended at most this long before (zero: never); see
    /// the module's documentation. Default: 300 µs.
    pub commit_delay: std::time::Duration,
}

/// [`EmbeddedOptions::commit_delay`]'s default. Measured in BENCHMARKS.md: 16 clients
/// creating Services commit about half as often, for about a quarter less CPU in the writer.
const DEFAULT_COMMIT_DELAY: std::time::Duration = std::time::Duration::from_micros(300);

impl EmbeddedOptions {
    /// Default settings for a data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            watch_buffer: 10_000,
            cache_bytes: 4 * 1024 * 1024,
            commit_delay: DEFAULT_COMMIT_DELAY,
        }
    }
}

/// What an [`EmbeddedStore`] holds, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedStats {
    /// The current revision.
    pub revision: Revision,
    /// The compaction point.
    pub compacted: Revision,
    /// Keys that exist now.
    pub live_keys: usize,
    /// Changes kept in history (live values included).
    pub changes: usize,
    /// Group commits of writes since the store was opened.
    pub commits: u64,
}

/// The embedded storage engine. Cheap to clone; all clones share one database and writer.
#[derive(Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

/// The open database, or none while a failed store recovers (the file must be closed to be
/// reopened).
#[derive(Default)]
struct DbSlot(RwLock<Option<Arc<Database>>>);

impl DbSlot {
    fn get(&self) -> Result<Arc<Database>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| StorageError::Unavailable("the database is being reopened".into()))
    }

    fn set(&self, db: Option<Arc<Database>>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = db;
    }
}

/// Why the store cannot take writes, while it cannot.
#[derive(Default)]
struct Health(std::sync::Mutex<Option<String>>);

impl Health {
    fn check(&self) -> Result<()> {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(()),
            Some(why) => Err(StorageError::Unavailable(why.clone())),
        }
    }

    fn set(&self, problem: Option<String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = problem;
    }
}

struct Shared {
    db: Arc<DbSlot>,
    health: Arc<Health>,
    index: Arc<RwLock<Index>>,
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

/// Where one change of a key is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Change {
    revision: Revision,
    op: u32,
    deleted: bool,
}

impl Change {
    fn at(self) -> (u64, u32) {
        (to_u64(self.revision), self.op)
    }
}

/// One key in the index.
#[derive(Debug, Default, Clone)]
struct IndexEntry {
    /// The key's current value; `None` once deleted (the entry stays while history remains).
    current: Option<KeyValue>,
    /// The key's changes still on disk, oldest first.
    changes: Vec<Change>,
}

impl IndexEntry {
    /// The key's newest change at or below `revision`.
    fn change_at(&self, revision: Revision) -> Option<Change> {
        let n = self.changes.partition_point(|c| c.revision <= revision);
        n.checked_sub(1).map(|i| self.changes[i])
    }
}

/// The committed state, in memory. Only the writer changes it, after each commit.
#[derive(Default)]
struct Index {
    revision: Revision,
    compacted: Revision,
    /// Group commits of writes since the store was opened.
    commits: u64,
    keys: BTreeMap<Arc<str>, IndexEntry>,
}

impl Index {
    fn current(&self, key: &str) -> Option<&KeyValue> {
        self.keys.get(key).and_then(|e| e.current.as_ref())
    }

    /// Checks that revision `r` is readable; `Ok(None)` means "the latest state".
    fn check(&self, r: Option<Revision>) -> Result<Option<Revision>> {
        match r {
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

    /// Keys under the request's prefix, in order, starting after its start point.
    fn keys_in<'a>(
        &'a self,
        request: &'a RangeRequest,
    ) -> impl Iterator<Item = (&'a Arc<str>, &'a IndexEntry)> + 'a {
        let prefix = request.prefix.as_str();
        let start = match &request.start_after {
            Some(after) if after.as_str() >= prefix => Bound::Excluded(after.as_str()),
            _ => Bound::Included(prefix),
        };
        self.keys
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(move |(key, _)| key.starts_with(prefix))
    }
}

enum WriteRequest {
    Txn(Txn, oneshot::Sender<Result<TxnOutcome>>),
    Compact(Revision, oneshot::Sender<Result<()>>),
}

fn db_err(error: impl Into<redb::Error>) -> StorageError {
    match error.into() {
        redb::Error::Io(error) => StorageError::Io(error.to_string()),
        redb::Error::PreviousIo => {
            StorageError::Io("a previous I/O error left the database unusable".into())
        }
        other => StorageError::Embedded(other.to_string()),
    }
}

fn read_index(index: &RwLock<Index>) -> RwLockReadGuard<'_, Index> {
    index.read().unwrap_or_else(PoisonError::into_inner)
}

fn to_u64(revision: Revision) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

fn to_revision(raw: u64) -> Revision {
    i64::try_from(raw).unwrap_or(i64::MAX)
}

fn limit_of(request: &RangeRequest) -> usize {
    if request.limit == 0 {
        usize::MAX
    } else {
        request.limit
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `options.data_dir`. Fails with
    /// [`StorageError::Locked`] when another process has it open.
    pub fn open(options: EmbeddedOptions) -> Result<Self> {
        private_store_files(&options.data_dir).map_err(|e| {
            StorageError::Embedded(format!(
                "cannot create data directory {}: {e}",
                options.data_dir.display()
            ))
        })?;
        let path = Self::database_path(&options.data_dir);
        let db = Arc::new(open_database(&path, options.cache_bytes)?);
        let index = Arc::new(RwLock::new(load(&db)?));
        let hub = Arc::new(Hub::default());
        hub.set_published(read_index(&index).revision);
        let slot = Arc::new(DbSlot::default());
        slot.set(Some(db.clone()));
        let health = Arc::new(Health::default());

        let (sender, requests) = std_mpsc::channel();
        let writer = Writer {
            db: Some(db),
            slot: slot.clone(),
            health: health.clone(),
            path,
            cache_bytes: options.cache_bytes,
            commit_delay: options.commit_delay,
            last_batch: 0,
            last_commit: std::time::Instant::now(),
            index: index.clone(),
            hub: hub.clone(),
            cleanup_pending: true,
            batches_since_cleanup: 0,
            broken: None,
        };
        let writer_thread = thread::Builder::new()
            .name("capstan-storage-writer".into())
            .spawn(move || writer.run(requests))
            .map_err(|e| StorageError::Embedded(format!("cannot start writer thread: {e}")))?;

        Ok(Self {
            shared: Arc::new(Shared {
                db: slot,
                health,
                index,
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

    /// Counts describing what the store holds now.
    pub fn stats(&self) -> EmbeddedStats {
        let index = self.index();
        EmbeddedStats {
            revision: index.revision,
            compacted: index.compacted,
            live_keys: index.keys.values().filter(|e| e.current.is_some()).count(),
            changes: index.keys.values().map(|e| e.changes.len()).sum(),
            commits: index.commits,
        }
    }

    fn index(&self) -> RwLockReadGuard<'_, Index> {
        read_index(&self.shared.index)
    }

    /// Fetches changes from a disk snapshot, off the async runtime. A change missing from the
    /// snapshot was dropped by a compaction that overtook the read: report it as compacted.
    async fn fetch(&self, wanted: Vec<Change>, requested: Revision) -> Result<Vec<Record>> {
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let db = self.shared.db.get()?;
        let index = self.shared.index.clone();
        tokio::task::spawn_blocking(move || {
            let snapshot = Snapshot::begin(&db)?;
            let history = snapshot.history()?;
            wanted
                .iter()
                .map(|change| {
                    read_record(&history, change.at())?.ok_or_else(|| StorageError::Compacted {
                        requested,
                        compacted: read_index(&index).compacted,
                    })
                })
                .collect()
        })
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

/// Opens (or creates) the database file; another process holding it is [`StorageError::Locked`].
fn open_database(path: &Path, cache_bytes: usize) -> Result<Database> {
    crate::zero_filled::ZeroFilledFile::open(path)
        .and_then(|backend| {
            Database::builder()
                .set_cache_size(cache_bytes)
                .create_with_backend(backend)
        })
        .map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen
            | redb::DatabaseError::LockProtocolMismatch => StorageError::Locked {
                path: path.display().to_string(),
            },
            other => db_err(other),
        })
}

/// Proves the file system has room again: writes [`SPACE_PROBE_BYTES`] next to the store,
/// syncs them, and removes them.
fn probe_space(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join(".capstan-space-probe");
    let result = std::fs::File::create(&path).and_then(|mut file| {
        file.write_all(&vec![0u8; SPACE_PROBE_BYTES])?;
        file.sync_all()
    });
    let _ = std::fs::remove_file(&path);
    result
}

/// Creates the data directory readable by its owner only (0700) and the database file 0600
/// before redb opens it, so the store is never readable by others, not even for a moment; an
/// existing directory and file are tightened to those modes.
fn private_store_files(data_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)?;
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))?;
    let path = EmbeddedStore::database_path(data_dir);
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
}

/// Creates the tables on first open and rebuilds the index by replaying `history` in order.
fn load(db: &Database) -> Result<Index> {
    let wt = db.begin_write().map_err(db_err)?;
    {
        wt.open_table(HISTORY).map_err(db_err)?;
        wt.open_table(META).map_err(db_err)?;
    }
    wt.commit().map_err(db_err)?;

    let snapshot = Snapshot::begin(db)?;
    let mut index = Index {
        revision: snapshot.revision,
        compacted: snapshot.compacted,
        commits: 0,
        keys: BTreeMap::new(),
    };
    for entry in snapshot.history()?.iter().map_err(db_err)? {
        let (at, bytes) = entry.map_err(db_err)?;
        let (revision, op) = at.value();
        let record = Record::decode(bytes.value())?;
        let revision = to_revision(revision);
        let entry = index.keys.entry(record.key.clone()).or_default();
        entry.changes.push(Change {
            revision,
            op,
            deleted: record.value.is_none(),
        });
        entry.current = record.into_kv(revision);
    }
    Ok(index)
}

fn read_meta(table: &impl ReadableTable<&'static str, u64>, name: &str) -> Result<Revision> {
    let value = table.get(name).map_err(db_err)?.map_or(0, |v| v.value());
    i64::try_from(value).map_err(|_| StorageError::Corrupt(format!("meta {name} = {value}")))
}

// ---- record encoding -------------------------------------------------------------------------

/// One change as kept in `history`: the key, its create revision and version after the
/// change, where its previous change is, and the value (`None`: a delete).
struct Record {
    key: Arc<str>,
    create_revision: Revision,
    version: i64,
    prev: Option<(u64, u32)>,
    value: Option<Bytes>,
}

/// flag, create revision, version, previous change (revision, op), key length.
const HEADER: usize = 1 + 8 + 8 + 8 + 4 + 4;

impl Record {
    fn encode(&self) -> Vec<u8> {
        let value = self.value.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(HEADER + self.key.len() + value.len());
        out.push(u8::from(self.value.is_none()));
        out.extend_from_slice(&self.create_revision.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        let (prev_revision, prev_op) = self.prev.unwrap_or((0, 0));
        out.extend_from_slice(&prev_revision.to_le_bytes());
        out.extend_from_slice(&prev_op.to_le_bytes());
        out.extend_from_slice(
            &u32::try_from(self.key.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(value);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        let corrupt = || StorageError::Corrupt(format!("history record of {} bytes", bytes.len()));
        let field = |at: usize, len: usize| bytes.get(at..at + len).ok_or_else(corrupt);
        let int = |at: usize| -> Result<u64> {
            let raw: [u8; 8] = field(at, 8)?.try_into().map_err(|_| corrupt())?;
            Ok(u64::from_le_bytes(raw))
        };
        let int32 = |at: usize| -> Result<u32> {
            let raw: [u8; 4] = field(at, 4)?.try_into().map_err(|_| corrupt())?;
            Ok(u32::from_le_bytes(raw))
        };
        let deleted = *field(0, 1)?.first().ok_or_else(corrupt)? == 1;
        let prev_revision = int(17)?;
        let key_len = int32(29)? as usize;
        let key = std::str::from_utf8(field(HEADER, key_len)?)
            .map_err(|_| StorageError::Corrupt("key is not UTF-8".into()))?;
        Ok(Self {
            key: Arc::from(key),
            create_revision: to_revision(int(1)?),
            version: to_revision(int(9)?),
            prev: (prev_revision > 0).then_some((prev_revision, int32(25)?)),
            value: (!deleted).then(|| Bytes::copy_from_slice(&bytes[HEADER + key_len..])),
        })
    }

    /// The key's value after this change, if it was not a delete.
    fn into_kv(self, revision: Revision) -> Option<KeyValue> {
        Some(KeyValue {
            value: self.value?,
            key: self.key,
            create_revision: self.create_revision,
            mod_revision: revision,
            version: self.version,
        })
    }
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

type HistoryTable = redb::ReadOnlyTable<(u64, u32), &'static [u8]>;

fn read_record(
    history: &impl ReadableTable<(u64, u32), &'static [u8]>,
    at: (u64, u32),
) -> Result<Option<Record>> {
    match history.get(at).map_err(db_err)? {
        Some(bytes) => Record::decode(bytes.value()).map(Some),
        None => Ok(None),
    }
}

// ---- disk reads ------------------------------------------------------------------------------

/// A consistent read snapshot of the disk with its revision bookkeeping.
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

    fn history(&self) -> Result<HistoryTable> {
        self.rt.open_table(HISTORY).map_err(db_err)
    }

    /// The changes under `prefix` after `after`, at most [`CATCH_UP_CHUNK`] of them (never
    /// splitting a revision), and the revision through which they are complete.
    fn changes_after(&self, prefix: &str, after: Revision) -> Result<(Vec<Event>, Revision)> {
        if after < self.compacted {
            return Err(StorageError::Compacted {
                requested: after,
                compacted: self.compacted,
            });
        }
        let history = self.history()?;
        let mut events = Vec::new();
        let mut through = after.max(self.revision);
        for (seen, entry) in history
            .range((to_u64(after) + 1, 0)..)
            .map_err(db_err)?
            .enumerate()
        {
            let (at, bytes) = entry.map_err(db_err)?;
            let (revision, op) = at.value();
            let revision = to_revision(revision);
            if seen >= CATCH_UP_CHUNK && op == 0 {
                through = revision - 1;
                break;
            }
            let record = Record::decode(bytes.value())?;
            if !record.key.starts_with(prefix) {
                continue;
            }
            let prev = match record.prev {
                Some(at) => read_record(&history, at)?.and_then(|p| {
                    let revision = to_revision(at.0);
                    p.into_kv(revision)
                }),
                None => None,
            };
            let key = record.key.clone();
            events.push(match record.into_kv(revision) {
                Some(kv) => Event {
                    kind: EventKind::Put,
                    kv,
                    prev,
                    hint: None,
                },
                None => Event {
                    kind: EventKind::Delete,
                    kv: deleted_kv(key, revision),
                    prev,
                    hint: None,
                },
            });
        }
        Ok((events, through))
    }
}

// ---- the writer ------------------------------------------------------------------------------

struct Writer {
    /// The open database; none while broken.
    db: Option<Arc<Database>>,
    /// Where readers find it.
    slot: Arc<DbSlot>,
    health: Arc<Health>,
    path: PathBuf,
    cache_bytes: usize,
    commit_delay: std::time::Duration,
    /// How many requests the last group commit took, and when it ended.
    last_batch: usize,
    last_commit: std::time::Instant,
    index: Arc<RwLock<Index>>,
    hub: Arc<Hub>,
    cleanup_pending: bool,
    batches_since_cleanup: u32,
    /// Why the last write failed and when recovery was last tried, while the store is broken.
    broken: Option<(String, std::time::Instant)>,
}

/// Whether writers are busy enough for a group commit to wait `delay` for more: the last
/// commit took [`COMMIT_SIBLINGS`] or more requests and ended at most `delay` before this
/// one's first request came (a write after a pause is a lone writer's, whatever came before).
fn writers_busy(
    last_batch: usize,
    since_last_commit: std::time::Duration,
    delay: std::time::Duration,
) -> bool {
    !delay.is_zero() && last_batch >= COMMIT_SIBLINGS && since_last_commit <= delay
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

/// The writes of one batch: what it will change in the index once committed.
struct Batch {
    revision: Revision,
    compacted: Revision,
    /// Keys the batch wrote: their state after the batch and the changes it added.
    overlay: HashMap<Arc<str>, (Option<KeyValue>, Vec<Change>)>,
}

impl Batch {
    fn current(&self, index: &Index, key: &str) -> Option<KeyValue> {
        match self.overlay.get(key) {
            Some((value, _)) => value.clone(),
            None => index.current(key).cloned(),
        }
    }

    /// The key's current value and its newest change, with one lookup.
    fn state(&self, index: &Index, key: &str) -> (Option<KeyValue>, Option<Change>) {
        if let Some((value, changes)) = self.overlay.get(key) {
            return (value.clone(), changes.last().copied());
        }
        match index.keys.get(key) {
            Some(entry) => (entry.current.clone(), entry.changes.last().copied()),
            None => (None, None),
        }
    }
}

impl Writer {
    fn run(mut self, requests: std_mpsc::Receiver<WriteRequest>) {
        loop {
            let first = if let Some((_, tried)) = &self.broken {
                let wait = RECOVERY_INTERVAL.saturating_sub(tried.elapsed());
                match requests.recv_timeout(wait) {
                    Ok(request) => Some(request),
                    Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
                }
            } else if self.cleanup_pending {
                match requests.try_recv() {
                    Ok(request) => Some(request),
                    Err(std_mpsc::TryRecvError::Empty) => {
                        self.clean_up_chunk();
                        continue;
                    }
                    Err(std_mpsc::TryRecvError::Disconnected) => return,
                }
            } else {
                match requests.recv() {
                    Ok(request) => Some(request),
                    Err(_) => return,
                }
            };
            if self
                .broken
                .as_ref()
                .is_some_and(|(_, tried)| tried.elapsed() >= RECOVERY_INTERVAL)
            {
                self.recover();
            }
            let Some(first) = first else { continue };
            if self.broken.is_none()
                && writers_busy(
                    self.last_batch,
                    self.last_commit.elapsed(),
                    self.commit_delay,
                )
            {
                thread::sleep(self.commit_delay);
            }
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            if let Some((why, _)) = &self.broken {
                refuse(batch, &StorageError::Unavailable(why.clone()));
                continue;
            }
            self.last_batch = batch.len();
            self.commit_batch(batch);
            self.last_commit = std::time::Instant::now();
            // Under a constant write load the queue is never empty: clean up a chunk every so
            // many batches anyway.
            if self.cleanup_pending {
                self.batches_since_cleanup += 1;
                if self.batches_since_cleanup >= CLEANUP_EVERY_BATCHES {
                    self.clean_up_chunk();
                }
            }
        }
    }

    /// A write failed: redb refuses every later operation after an I/O error, so the database
    /// is closed, readiness turns false, and writes are refused until [`Writer::recover`]
    /// reopens it.
    fn fail(&mut self, error: &StorageError) {
        tracing::error!(%error, "the store failed to write; refusing writes until it recovers");
        let why = describe(error);
        self.health.set(Some(why.clone()));
        self.broken = Some((why, std::time::Instant::now()));
        self.last_batch = 0;
        self.db = None;
        self.slot.set(None);
    }

    /// Reopens the database after a failure, once the file system has room again: the index
    /// is reconciled with what the disk holds (a batch whose commit reported an error may have
    /// reached the disk all the same; its changes are then published to watchers), a small
    /// commit proves the store writable, and writes resume.
    fn recover(&mut self) {
        let attempt = || -> Result<Arc<Database>> {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            probe_space(dir).map_err(|e| StorageError::Unavailable(e.to_string()))?;
            let db = Arc::new(open_database(&self.path, self.cache_bytes)?);
            let on_disk = Snapshot::begin(&db)?.revision;
            let in_memory = read_index(&self.index).revision;
            if on_disk < in_memory {
                // Acknowledged writes are not on the disk: nothing to resume from. The store
                // stays unready (and unlive) so that it is restarted and seen to.
                return Err(StorageError::Corrupt(format!(
                    "the disk holds revisions up to {on_disk} but {in_memory} were acknowledged; the store will not take writes again"
                )));
            }
            // A batch whose commit reported an error may have reached the disk all the same
            // (so may a clean-up chunk, or a compaction): the index is rebuilt from the disk,
            // and changes the watchers have not seen are published to them.
            let mut events: Vec<Event> = Vec::new();
            let mut through = in_memory;
            while through < on_disk {
                let (chunk, reached) = Snapshot::begin(&db)?.changes_after("", through.max(0))?;
                events.extend(chunk);
                if reached <= through {
                    break;
                }
                through = reached;
            }
            let mut index = load(&db)?;
            let mut current = self.index.write().unwrap_or_else(PoisonError::into_inner);
            index.commits = current.commits;
            *current = index;
            drop(current);
            if on_disk != in_memory {
                tracing::warn!(
                    on_disk,
                    in_memory,
                    "a failed commit reached the disk; publishing it"
                );
            }
            let mut start = 0;
            while start < events.len() {
                let revision = events[start].revision();
                let end = events[start..]
                    .iter()
                    .position(|e| e.revision() != revision)
                    .map_or(events.len(), |n| start + n);
                self.hub.publish(revision, &events[start..end]);
                start = end;
            }
            let wt = db.begin_write().map_err(db_err)?;
            {
                let mut meta = wt.open_table(META).map_err(db_err)?;
                meta.insert(META_REVISION, to_u64(on_disk))
                    .map_err(db_err)?;
            }
            wt.commit().map_err(db_err)?;
            Ok(db)
        };
        match attempt() {
            Ok(db) => {
                tracing::info!("the store recovered; writes resume");
                self.slot.set(Some(db.clone()));
                self.db = Some(db);
                self.broken = None;
                self.health.set(None);
                self.cleanup_pending = true;
            }
            Err(error) => {
                tracing::debug!(%error, "the store has not recovered yet");
                if let Some((why, tried)) = &mut self.broken {
                    *tried = std::time::Instant::now();
                    if !matches!(error, StorageError::Locked { .. }) {
                        *why = describe(&error);
                        self.health.set(Some(why.clone()));
                    }
                }
            }
        }
    }

    fn commit_batch(&mut self, requests: Vec<WriteRequest>) {
        let mut applied = Vec::with_capacity(requests.len());
        let (revision, compacted) = {
            let index = read_index(&self.index);
            (index.revision, index.compacted)
        };
        let mut batch = Batch {
            revision,
            compacted,
            overlay: HashMap::new(),
        };
        let Some(db) = self.db.clone() else {
            refuse(
                requests,
                &StorageError::Unavailable("the store is recovering".into()),
            );
            return;
        };
        let committed = (|| -> Result<()> {
            let mut wt = db.begin_write().map_err(db_err)?;
            wt.set_durability(Durability::Immediate).map_err(db_err)?;
            {
                let mut history = wt.open_table(HISTORY).map_err(db_err)?;
                let index = read_index(&self.index);
                for request in requests {
                    match request {
                        WriteRequest::Txn(txn, reply) => {
                            match apply_txn(&mut history, &index, &mut batch, &txn) {
                                Ok((outcome, events)) => applied.push(Applied::Txn {
                                    reply,
                                    outcome: Ok(outcome),
                                    events,
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
                // Stored already unless a compaction in this batch moved it.
                if batch.compacted != compacted {
                    meta.insert(META_COMPACTED, to_u64(batch.compacted))
                        .map_err(db_err)?;
                }
            }
            wt.commit().map_err(db_err)
        })();

        if let Err(error) = committed {
            tracing::error!(%error, "storage commit failed; the whole batch is refused");
            for done in applied {
                let failure = error.clone();
                let _ = match done {
                    Applied::Txn { reply, .. } => reply.send(Err(failure)).is_ok(),
                    Applied::Compact { reply, .. } => reply.send(Err(failure)).is_ok(),
                };
            }
            self.fail(&error);
            return;
        }

        {
            let mut index = self.index.write().unwrap_or_else(PoisonError::into_inner);
            for (key, (current, changes)) in batch.overlay {
                let entry = index.keys.entry(key).or_default();
                entry.current = current;
                entry.changes.extend(changes);
            }
            self.cleanup_pending |= batch.compacted > index.compacted;
            index.revision = batch.revision;
            index.compacted = batch.compacted;
            index.commits += 1;
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
        self.batches_since_cleanup = 0;
        let Some(db) = self.db.clone() else { return };
        match clean_up(&db, &self.index) {
            Ok(more) => self.cleanup_pending = more,
            Err(error) => {
                tracing::error!(%error, "compaction clean-up failed");
                self.cleanup_pending = false;
                // An I/O error leaves redb refusing everything until it is reopened; anything
                // else only stops this clean-up.
                if matches!(error, StorageError::Io(_)) {
                    self.fail(&error);
                }
            }
        }
    }
}

/// What went wrong, without the variant's own prefix (for [`StorageError::Unavailable`]).
fn describe(error: &StorageError) -> String {
    match error {
        StorageError::Unavailable(why) | StorageError::Embedded(why) | StorageError::Io(why) => {
            why.clone()
        }
        other => other.to_string(),
    }
}

/// Answers every request of a batch with the same error, writing nothing.
fn refuse(requests: Vec<WriteRequest>, error: &StorageError) {
    for request in requests {
        let failure = StorageError::Unavailable(describe(error));
        let _ = match request {
            WriteRequest::Txn(_, reply) => reply.send(Err(failure)).is_ok(),
            WriteRequest::Compact(_, reply) => reply.send(Err(failure)).is_ok(),
        };
    }
}

/// Applies one transaction inside the batch.
fn apply_txn(
    history: &mut redb::Table<'_, (u64, u32), &'static [u8]>,
    index: &Index,
    batch: &mut Batch,
    txn: &Txn,
) -> Result<(TxnOutcome, Vec<Event>)> {
    let mut holds = true;
    let mut current_values = Vec::with_capacity(txn.compares.len());
    for compare in &txn.compares {
        let value = batch.current(index, compare.key());
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
    let mut op_index = 0u32;
    for (at, op) in txn.ops.iter().enumerate() {
        let (prev, last_change) = batch.state(index, op.key());
        let value = match op {
            Op::Put(_, value) => Some(value.clone()),
            Op::Delete(_) if prev.is_some() => None,
            Op::Delete(_) => {
                previous.push(prev);
                continue; // deleting what is not there changes nothing
            }
        };
        let key: Arc<str> = Arc::from(op.key());
        let record = Record {
            key: key.clone(),
            create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            prev: last_change.map(Change::at),
            value,
        };
        let change = Change {
            revision,
            op: op_index,
            deleted: record.value.is_none(),
        };
        history
            .insert(change.at(), record.encode().as_slice())
            .map_err(db_err)?;
        op_index += 1;
        let current = record.into_kv(revision);
        let event = match &current {
            Some(kv) => Event {
                kind: EventKind::Put,
                kv: kv.clone(),
                prev: prev.clone(),
                hint: txn.hint_of(at).cloned(),
            },
            None => Event {
                kind: EventKind::Delete,
                kv: deleted_kv(key.clone(), revision),
                prev: prev.clone(),
                hint: None,
            },
        };
        let slot = batch.overlay.entry(key).or_default();
        slot.0 = current;
        slot.1.push(change);
        events.push(event);
        previous.push(prev);
    }

    if events.is_empty() {
        return Ok((
            TxnOutcome::Committed {
                revision: batch.revision,
                previous,
            },
            events,
        ));
    }
    batch.revision = revision;
    Ok((TxnOutcome::Committed { revision, previous }, events))
}

/// Drops one chunk of the history below the compaction point; returns whether more remains.
fn clean_up(db: &Database, index: &RwLock<Index>) -> Result<bool> {
    let (compacted, cleaned) = {
        let snapshot = Snapshot::begin(db)?;
        let meta = snapshot.rt.open_table(META).map_err(db_err)?;
        (
            to_u64(read_meta(&meta, META_COMPACTED)?),
            to_u64(read_meta(&meta, META_CLEANED)?),
        )
    };
    if cleaned >= compacted {
        return Ok(false);
    }
    let upto = compacted.min(cleaned + CLEANUP_CHUNK);

    // Which changes are superseded at the compaction point, for keys changed in this chunk.
    let mut drop_changes: Vec<(Arc<str>, Change)> = Vec::new();
    {
        let snapshot = Snapshot::begin(db)?;
        let history = snapshot.history()?;
        let index = read_index(index);
        let mut keys: HashSet<Arc<str>> = HashSet::new();
        for entry in history
            .range((cleaned + 1, 0)..(upto + 1, 0))
            .map_err(db_err)?
        {
            let (_, bytes) = entry.map_err(db_err)?;
            let record = Record::decode(bytes.value())?;
            keys.insert(record.key);
        }
        let compacted = to_revision(compacted);
        for key in keys {
            let Some(entry) = index.keys.get(&key) else {
                continue;
            };
            let kept = entry.change_at(compacted).filter(|c| !c.deleted);
            for change in entry.changes.iter().take_while(|c| c.revision <= compacted) {
                if Some(*change) != kept {
                    drop_changes.push((key.clone(), *change));
                }
            }
        }
    }

    let mut wt = db.begin_write().map_err(db_err)?;
    wt.set_durability(Durability::None).map_err(db_err)?;
    {
        let mut history = wt.open_table(HISTORY).map_err(db_err)?;
        for (_, change) in &drop_changes {
            history.remove(change.at()).map_err(db_err)?;
        }
        let mut meta = wt.open_table(META).map_err(db_err)?;
        meta.insert(META_CLEANED, upto).map_err(db_err)?;
    }
    wt.commit().map_err(db_err)?;

    let mut index = index.write().unwrap_or_else(PoisonError::into_inner);
    for (key, change) in drop_changes {
        if let Some(entry) = index.keys.get_mut(&key) {
            entry.changes.retain(|c| *c != change);
            if entry.changes.is_empty() && entry.current.is_none() {
                index.keys.remove(&key);
            }
        }
    }
    Ok(upto < compacted)
}

// ---- the contract ----------------------------------------------------------------------------

#[async_trait]
impl Storage for EmbeddedStore {
    async fn get(&self, key: &str, at_revision: Option<Revision>) -> Result<GetResponse> {
        let (at, change) = {
            let index = self.index();
            match index.check(at_revision)? {
                None => {
                    return Ok(GetResponse {
                        kv: index.current(key).cloned(),
                        revision: index.revision,
                    });
                }
                Some(at) => (at, index.keys.get(key).and_then(|e| e.change_at(at))),
            }
        };
        let kv = match change.filter(|c| !c.deleted) {
            Some(change) => self
                .fetch(vec![change], at)
                .await?
                .pop()
                .and_then(|record| record.into_kv(change.revision)),
            None => None,
        };
        Ok(GetResponse { kv, revision: at })
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse> {
        let (at, wanted, remaining) = {
            let index = self.index();
            let limit = limit_of(&request);
            match index.check(request.at_revision)? {
                None => {
                    let mut keys = index
                        .keys_in(&request)
                        .filter_map(|(_, e)| e.current.as_ref());
                    let kvs: Vec<KeyValue> = keys.by_ref().take(limit).cloned().collect();
                    let remaining = keys.count() as u64;
                    return Ok(RangeResponse {
                        kvs,
                        more: remaining > 0,
                        remaining,
                        revision: index.revision,
                    });
                }
                Some(at) => {
                    let mut changes = index
                        .keys_in(&request)
                        .filter_map(|(_, e)| e.change_at(at).filter(|c| !c.deleted));
                    let wanted: Vec<Change> = changes.by_ref().take(limit).collect();
                    (at, wanted, changes.count() as u64)
                }
            }
        };
        let revisions: Vec<Revision> = wanted.iter().map(|c| c.revision).collect();
        let kvs = self
            .fetch(wanted, at)
            .await?
            .into_iter()
            .zip(revisions)
            .filter_map(|(record, revision)| record.into_kv(revision))
            .collect();
        Ok(RangeResponse {
            kvs,
            more: remaining > 0,
            remaining,
            revision: at,
        })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        // Refused before it reaches the writer, so any error inside a batch fails the batch.
        txn.validate()?;
        self.write(|reply| WriteRequest::Txn(txn, reply)).await
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        let compacted = self.index().compacted;
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
        Ok(self.index().revision)
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.write(|reply| WriteRequest::Compact(revision, reply))
            .await
    }

    async fn health(&self) -> Result<()> {
        self.shared.health.check()
    }

    /// redb holds its file locked: no other process writes it while this one has it open.
    fn exclusive(&self) -> bool {
        true
    }

    fn delivers_hints(&self) -> bool {
        true
    }
}

/// Brings a new watcher up to date from history, then hands it to the hub.
struct CatchUp {
    db: Arc<DbSlot>,
    hub: Arc<Hub>,
    prefix: String,
    delivered_through: Revision,
    tx: mpsc::Sender<Event>,
    reason: Arc<CloseReason>,
}

impl CatchUp {
    async fn run(mut self) {
        loop {
            let slot = self.db.clone();
            let prefix = self.prefix.clone();
            let after = self.delivered_through;
            let read = tokio::task::spawn_blocking(move || {
                let db = slot.get()?;
                Snapshot::begin(&db)?.changes_after(&prefix, after)
            })
            .await
            .unwrap_or_else(|e| Err(StorageError::Embedded(format!("watch read failed: {e}"))));
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

#[cfg(test)]
mod tests {
    use super::{COMMIT_SIBLINGS, writers_busy};
    use std::time::Duration;

    #[test]
    fn a_group_commit_waits_only_right_after_a_busy_one() {
        let delay = Duration::from_micros(300);
        let soon = Duration::from_micros(10);
        assert!(writers_busy(COMMIT_SIBLINGS, soon, delay));
        assert!(writers_busy(100, delay, delay));
        // Too few writers last time.
        assert!(!writers_busy(COMMIT_SIBLINGS - 1, soon, delay));
        // A write after a pause, whatever came before.
        assert!(!writers_busy(100, Duration::from_millis(5), delay));
        // Never, with no delay.
        assert!(!writers_busy(100, Duration::ZERO, Duration::ZERO));
    }
}
