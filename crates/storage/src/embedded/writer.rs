//! The writer thread: batches of transactions in one redb write transaction, one fsync,
//! then the index, the callers and the watch hub; compaction's clean-up between batches.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, mpsc as std_mpsc};
use std::thread;

use redb::{Database, Durability};
use tokio::sync::oneshot;

use crate::watch::Hub;
use crate::{
    Compare, Event, EventKind, KeyValue, Op, Result, Revision, StorageError, Txn, TxnOutcome,
};

use super::format::*;
use super::index::*;

/// Most requests one group commit takes.
pub(super) const MAX_BATCH: usize = 4096;
/// The fewest requests the last group commit took for the next one to wait
/// [`EmbeddedOptions::commit_delay`] for more, when its first request came within that delay
/// of the last commit: writers this many at once are busy enough that others are on their way
/// (PostgreSQL's `commit_siblings`, which gates its `commit_delay`).
pub(super) const COMMIT_SIBLINGS: usize = 4;
/// Most revisions one compaction clean-up chunk processes.
pub(super) const CLEANUP_CHUNK: u64 = 4096;
/// How often a store that failed to write tries to recover.
pub(super) const RECOVERY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// At most this many batches commit while compaction clean-up is pending before one chunk of
/// it runs, so a constant write load cannot starve it (history would grow without bound).
pub(super) const CLEANUP_EVERY_BATCHES: u32 = 64;

/// The open database, or none while a failed store recovers (the file must be closed to be
/// reopened).
#[derive(Default)]
pub(super) struct DbSlot(RwLock<Option<Arc<Database>>>);

impl DbSlot {
    pub(super) fn get(&self) -> Result<Arc<Database>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| StorageError::Unavailable("the database is being reopened".into()))
    }

    pub(super) fn set(&self, db: Option<Arc<Database>>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = db;
    }
}

/// Why the store cannot take writes, while it cannot.
#[derive(Default)]
pub(super) struct Health(std::sync::Mutex<Option<String>>);

impl Health {
    pub(super) fn check(&self) -> Result<()> {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(()),
            Some(why) => Err(StorageError::Unavailable(why.clone())),
        }
    }

    pub(super) fn set(&self, problem: Option<String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = problem;
    }
}

pub(super) enum WriteRequest {
    Txn(Txn, oneshot::Sender<Result<TxnOutcome>>),
    Compact(Revision, oneshot::Sender<Result<()>>),
}

// ---- the writer ------------------------------------------------------------------------------

pub(super) struct Writer {
    /// The open database; none while broken.
    pub(super) db: Option<Arc<Database>>,
    /// Where readers find it.
    pub(super) slot: Arc<DbSlot>,
    pub(super) health: Arc<Health>,
    pub(super) path: PathBuf,
    pub(super) cache_bytes: usize,
    pub(super) commit_delay: std::time::Duration,
    /// How many requests the last group commit took, and when it ended.
    pub(super) last_batch: usize,
    pub(super) last_commit: std::time::Instant,
    pub(super) index: Arc<RwLock<Index>>,
    pub(super) hub: Arc<Hub>,
    pub(super) cleanup_pending: bool,
    pub(super) batches_since_cleanup: u32,
    /// Why the last write failed and when recovery was last tried, while the store is broken.
    pub(super) broken: Option<(String, std::time::Instant)>,
}

/// Whether writers are busy enough for a group commit to wait `delay` for more: the last
/// commit took [`COMMIT_SIBLINGS`] or more requests and ended at most `delay` before this
/// one's first request came (a write after a pause is a lone writer's, whatever came before).
pub(super) fn writers_busy(
    last_batch: usize,
    since_last_commit: std::time::Duration,
    delay: std::time::Duration,
) -> bool {
    !delay.is_zero() && last_batch >= COMMIT_SIBLINGS && since_last_commit <= delay
}

/// What one request of a batch produced; answered (and published) only after the commit.
pub(super) enum Applied {
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
pub(super) struct Batch {
    pub(super) revision: Revision,
    pub(super) compacted: Revision,
    /// Keys the batch wrote: their state after the batch and the changes it added.
    pub(super) overlay: HashMap<Arc<str>, (Option<KeyValue>, Vec<Change>)>,
}

impl Batch {
    pub(super) fn current(&self, index: &Index, key: &str) -> Option<KeyValue> {
        match self.overlay.get(key) {
            Some((value, _)) => value.clone(),
            None => index.current(key).cloned(),
        }
    }

    /// The key's current value and its newest change, with one lookup.
    pub(super) fn state(&self, index: &Index, key: &str) -> (Option<KeyValue>, Option<Change>) {
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
    pub(super) fn run(mut self, requests: std_mpsc::Receiver<WriteRequest>) {
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
    pub(super) fn fail(&mut self, error: &StorageError) {
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
    pub(super) fn recover(&mut self) {
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

    pub(super) fn commit_batch(&mut self, requests: Vec<WriteRequest>) {
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
    pub(super) fn clean_up_chunk(&mut self) {
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
pub(super) fn describe(error: &StorageError) -> String {
    match error {
        StorageError::Unavailable(why) | StorageError::Embedded(why) | StorageError::Io(why) => {
            why.clone()
        }
        other => other.to_string(),
    }
}

/// Answers every request of a batch with the same error, writing nothing.
pub(super) fn refuse(requests: Vec<WriteRequest>, error: &StorageError) {
    for request in requests {
        let failure = StorageError::Unavailable(describe(error));
        let _ = match request {
            WriteRequest::Txn(_, reply) => reply.send(Err(failure)).is_ok(),
            WriteRequest::Compact(_, reply) => reply.send(Err(failure)).is_ok(),
        };
    }
}

/// Applies one transaction inside the batch.
pub(super) fn apply_txn(
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
pub(super) fn clean_up(db: &Database, index: &RwLock<Index>) -> Result<bool> {
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
