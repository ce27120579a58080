//! The in-memory key index, rebuilt from `history` on open, and read snapshots of the disk.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable};

use crate::{Event, EventKind, KeyValue, RangeRequest, Result, Revision, StorageError};

use super::format::*;

/// Most changes one watch catch-up read hands over at once.
pub(super) const CATCH_UP_CHUNK: usize = 4096;

/// Where one change of a key is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Change {
    pub(super) revision: Revision,
    pub(super) op: u32,
    pub(super) deleted: bool,
}

impl Change {
    pub(super) fn at(self) -> (u64, u32) {
        (to_u64(self.revision), self.op)
    }
}

/// One key in the index.
#[derive(Debug, Default, Clone)]
pub(super) struct IndexEntry {
    /// The key's current value; `None` once deleted (the entry stays while history remains).
    pub(super) current: Option<KeyValue>,
    /// The key's changes still on disk, oldest first.
    pub(super) changes: Vec<Change>,
}

impl IndexEntry {
    /// The key's newest change at or below `revision`.
    pub(super) fn change_at(&self, revision: Revision) -> Option<Change> {
        let n = self.changes.partition_point(|c| c.revision <= revision);
        n.checked_sub(1).map(|i| self.changes[i])
    }
}

/// The committed state, in memory. Only the writer changes it, after each commit.
#[derive(Default)]
pub(super) struct Index {
    pub(super) revision: Revision,
    pub(super) compacted: Revision,
    /// Group commits of writes since the store was opened.
    pub(super) commits: u64,
    pub(super) keys: BTreeMap<Arc<str>, IndexEntry>,
}

impl Index {
    pub(super) fn current(&self, key: &str) -> Option<&KeyValue> {
        self.keys.get(key).and_then(|e| e.current.as_ref())
    }

    /// Checks that revision `r` is readable; `Ok(None)` means "the latest state".
    pub(super) fn check(&self, r: Option<Revision>) -> Result<Option<Revision>> {
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
    pub(super) fn keys_in<'a>(
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

pub(super) fn read_index(index: &RwLock<Index>) -> RwLockReadGuard<'_, Index> {
    index.read().unwrap_or_else(PoisonError::into_inner)
}

/// Creates the tables on first open and rebuilds the index by replaying `history` in order.
pub(super) fn load(db: &Database) -> Result<Index> {
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

// ---- disk reads ------------------------------------------------------------------------------

/// A consistent read snapshot of the disk with its revision bookkeeping.
pub(super) struct Snapshot {
    pub(super) rt: ReadTransaction,
    pub(super) revision: Revision,
    pub(super) compacted: Revision,
}

impl Snapshot {
    pub(super) fn begin(db: &Database) -> Result<Self> {
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

    pub(super) fn history(&self) -> Result<HistoryTable> {
        self.rt.open_table(HISTORY).map_err(db_err)
    }

    /// The changes under `prefix` after `after`, at most [`CATCH_UP_CHUNK`] of them (never
    /// splitting a revision), and the revision through which they are complete.
    pub(super) fn changes_after(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<(Vec<Event>, Revision)> {
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
