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

mod format;
mod index;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, mpsc as std_mpsc};
use std::thread;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::watch::{CloseReason, Hub, Registration};
use crate::{
    Event, GetResponse, KeyValue, RangeRequest, RangeResponse, Result, Revision, Storage,
    StorageError, Txn, TxnOutcome, WatchStream,
};

use format::*;
use index::*;
use writer::*;

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
