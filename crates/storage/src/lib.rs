//! Capstan's storage contract, with etcd v3 semantics, and its two engines.
//!
//! Start with [`Storage`]: everything Capstan keeps goes through it. It is a flat, ordered
//! key space under one global [`Revision`] counter. Every committed mutation bumps the revision
//! by one, and every key remembers the revision that created it, the revision that last changed
//! it and how many times it has changed ([`KeyValue`]). Reads can be made at an older revision,
//! writes are multi-key transactions guarded by compares ([`Txn`]), and a [`Storage::watch`]
//! delivers every change after a revision, in order, with the previous value. History older than
//! the compaction point is dropped; asking for it fails with [`StorageError::Compacted`].
//!
//! Two engines implement it:
//! - [`EmbeddedStore`], the default: a crash-safe single-machine store on top of `redb`, with
//!   group commit (concurrent writers share one fsync) and an in-process watch fan-out.
//! - `EtcdStore` (cargo feature `etcd`): etcd v3 itself, under a configurable key prefix, for
//!   several Capstan replicas sharing one cluster state.
//!
//! [`Compactor`] drops old history on a schedule, the way kube-apiserver compacts etcd.
//!
//! This crate knows nothing about HTTP or Kubernetes types: keys are strings, values are bytes.

mod compactor;
mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
mod watch;
mod zero_filled;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

pub use compactor::Compactor;
pub use embedded::{EmbeddedOptions, EmbeddedStats, EmbeddedStore};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdOptions, EtcdStore, EtcdTls};
pub use watch::WatchStream;

/// The global, strictly increasing revision of the store. `0` is the revision of an empty store;
/// the first committed write has revision `1`.
pub type Revision = i64;

/// One stored key with its value and revision bookkeeping, as etcd's `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, relative to the engine's root (no engine prefix).
    pub key: Arc<str>,
    /// The stored bytes.
    pub value: Bytes,
    /// The revision of the write that created this key (since it last did not exist).
    pub create_revision: Revision,
    /// The revision of the last write to this key.
    pub mod_revision: Revision,
    /// How many writes this key has seen since it was created; `1` right after creation.
    pub version: i64,
}

impl fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &self.key)
            .field("value_len", &self.value.len())
            .field("create_revision", &self.create_revision)
            .field("mod_revision", &self.mod_revision)
            .field("version", &self.version)
            .finish()
    }
}

/// The result of a [`Storage::get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetResponse {
    /// The key's value at the requested revision, if it existed then.
    pub kv: Option<KeyValue>,
    /// The revision the read was served at.
    pub revision: Revision,
}

/// A request for a page of keys under a prefix, as Kubernetes list pagination needs it.
#[derive(Debug, Clone, Default)]
pub struct RangeRequest {
    /// Only keys starting with this prefix are returned.
    pub prefix: String,
    /// Only keys strictly greater than this one are returned (the continue point of a page).
    pub start_after: Option<String>,
    /// At most this many items; `0` means no limit.
    pub limit: usize,
    /// Read at this revision instead of the latest one.
    pub at_revision: Option<Revision>,
}

/// A page of keys, in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeResponse {
    /// The keys of this page.
    pub kvs: Vec<KeyValue>,
    /// Whether keys under the prefix remain after this page.
    pub more: bool,
    /// How many keys under the prefix remain after this page.
    pub remaining: u64,
    /// The revision the page was read at; read the next page at the same revision for a
    /// consistent snapshot.
    pub revision: Revision,
}

/// A condition a [`Txn`] checks before it applies its operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key exists and was last written at exactly this revision.
    ModRevision(String, Revision),
}

impl Compare {
    /// The key this compare is about.
    pub fn key(&self) -> &str {
        match self {
            Compare::Absent(k) | Compare::ModRevision(k, _) => k,
        }
    }
}

/// A mutation inside a [`Txn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create or overwrite a key.
    Put(String, Bytes),
    /// Delete a key; a no-op when it does not exist.
    Delete(String),
}

impl Op {
    /// The key this operation writes.
    pub fn key(&self) -> &str {
        match self {
            Op::Put(k, _) | Op::Delete(k) => k,
        }
    }
}

/// What the writer of a value already knows of it, attached to its [`Op::Put`] with
/// [`Txn::hint`]: a watch of the same engine in the same process receives it with the
/// write's [`Event`], so it need not work out again from the bytes what their writer knew
/// (the registry's watch cache: where an object's metadata lies, what its selectors read).
/// Opaque to this crate, and never stored. An engine whose events come from elsewhere (etcd)
/// delivers none, nor do events read back from a store's history: a reader always has the
/// bytes.
#[derive(Clone)]
pub struct Hint(Arc<dyn std::any::Any + Send + Sync>);

impl Hint {
    /// A hint holding `value`.
    pub fn new(value: impl std::any::Any + Send + Sync) -> Self {
        Hint(Arc::new(value))
    }

    /// What it holds, when that is a `T`.
    pub fn get<T: std::any::Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hint")
    }
}

/// A hint is not part of what was written: transactions and events compare without theirs.
impl PartialEq for Hint {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Hint {}

/// An all-or-nothing transaction: when every compare holds, every op is applied at one new
/// revision; otherwise nothing changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    /// Conditions that must all hold.
    pub compares: Vec<Compare>,
    /// Mutations applied, in order, when they do.
    pub ops: Vec<Op>,
    /// [`Hint`]s for the ops, by their index in `ops`.
    pub hints: Vec<(usize, Hint)>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a condition.
    pub fn when(mut self, compare: Compare) -> Self {
        self.compares.push(compare);
        self
    }

    /// Adds a mutation.
    pub fn then(mut self, op: Op) -> Self {
        self.ops.push(op);
        self
    }

    /// Attaches `hint` to the last mutation added (a put's event carries it).
    pub fn hint(mut self, hint: Hint) -> Self {
        if let Some(last) = self.ops.len().checked_sub(1) {
            self.hints.push((last, hint));
        }
        self
    }

    /// The hint attached to the op at `index`.
    pub fn hint_of(&self, index: usize) -> Option<&Hint> {
        self.hints
            .iter()
            .find(|(at, _)| *at == index)
            .map(|(_, hint)| hint)
    }

    /// Refuses a transaction that writes one key twice, as etcd does.
    pub fn validate(&self) -> Result<()> {
        let mut seen = std::collections::HashSet::with_capacity(self.ops.len());
        match self.ops.iter().find(|op| !seen.insert(op.key())) {
            Some(dup) => Err(StorageError::InvalidTxn(format!(
                "duplicate key given in txn request: {}",
                dup.key()
            ))),
            None => Ok(()),
        }
    }
}

/// What a [`Txn`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every compare held and every op was applied.
    Committed {
        /// The revision of the store after the transaction: the new revision when the
        /// transaction changed anything, otherwise the revision it was evaluated at.
        revision: Revision,
        /// For each op, in order, the value its key had just before the transaction.
        previous: Vec<Option<KeyValue>>,
    },
    /// A compare failed; nothing was applied.
    Failed {
        /// The revision the transaction was evaluated at.
        revision: Revision,
        /// For each compare, in order, the current value of its key — so a caller can report a
        /// conflict against the object as it is now without another read.
        current: Vec<Option<KeyValue>>,
    },
}

impl TxnOutcome {
    /// Whether the transaction was applied.
    pub fn succeeded(&self) -> bool {
        matches!(self, TxnOutcome::Committed { .. })
    }

    /// The revision reported by the transaction.
    pub fn revision(&self) -> Revision {
        match self {
            TxnOutcome::Committed { revision, .. } | TxnOutcome::Failed { revision, .. } => {
                *revision
            }
        }
    }
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or overwritten.
    Put,
    /// The key was deleted.
    Delete,
}

/// One change, as delivered by [`Storage::watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change. For a delete: the key, an empty value, and `mod_revision` set
    /// to the revision of the deletion (`create_revision` and `version` are 0), as etcd does.
    pub kv: KeyValue,
    /// The key's value just before the change, when it existed.
    pub prev: Option<KeyValue>,
    /// The [`Hint`] its writer attached, when this process wrote it through this engine.
    pub hint: Option<Hint>,
}

impl Event {
    /// The revision at which this change was committed.
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

/// Failures of the storage contract.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// The requested revision is older than the compaction point; its history is gone.
    #[error("required revision {requested} has been compacted (compacted revision {compacted})")]
    Compacted {
        /// The revision asked for.
        requested: Revision,
        /// The oldest revision still readable.
        compacted: Revision,
    },
    /// The requested revision has not been reached yet.
    #[error("required revision {requested} is a future revision (current revision {current})")]
    FutureRevision {
        /// The revision asked for.
        requested: Revision,
        /// The store's current revision.
        current: Revision,
    },
    /// A watcher did not keep up: its bounded buffer filled, so it was closed. Start a new
    /// watch after the last revision received (or relist when that is compacted).
    #[error("watcher fell too far behind; last delivered revision {last_delivered}")]
    WatcherLagged {
        /// The revision of the last event that was delivered to the watcher.
        last_delivered: Revision,
    },
    /// A transaction names the same key twice among its ops, which etcd refuses too.
    #[error("invalid transaction: {0}")]
    InvalidTxn(String),
    /// The store is already open, in another process or in this one.
    #[error("the store {path} is already open in another process")]
    Locked {
        /// The database file that is locked.
        path: String,
    },
    /// The store was shut down.
    #[error("the store is closed")]
    Closed,
    /// The embedded database failed (I/O error, corruption, ...).
    #[error("embedded database error: {0}")]
    Embedded(String),
    /// The data on disk is not in the expected format.
    #[error("corrupt record in the store: {0}")]
    Corrupt(String),
    /// The etcd cluster failed or could not be reached.
    #[error("etcd error: {0}")]
    Etcd(String),
    /// The embedded database's file could not be read or written (a full disk, a failed
    /// device).
    #[error("I/O error: {0}")]
    Io(String),
    /// The store cannot take writes now (a disk that filled up, a failed device); it keeps
    /// trying to recover and reports it through [`Storage::health`].
    #[error("the store cannot take writes: {0}")]
    Unavailable(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// The storage contract: a revisioned, transactional, watchable key-value space with etcd v3
/// semantics. Every engine passes the same contract suite (`tests/contract.rs`).
#[async_trait]
pub trait Storage: Send + Sync + 'static {
    /// Reads one key at the latest revision, or at `at_revision` when given.
    async fn get(&self, key: &str, at_revision: Option<Revision>) -> Result<GetResponse>;

    /// Reads a page of keys under a prefix, in key order.
    async fn range(&self, request: RangeRequest) -> Result<RangeResponse>;

    /// Applies a transaction atomically and durably.
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome>;

    /// Streams every change to keys under `prefix` with a revision greater than
    /// `after_revision`, in revision order (ops of one transaction in their order).
    /// Fails with [`StorageError::Compacted`] when `after_revision` is older than the
    /// compaction point.
    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream>;

    /// The current revision.
    async fn current_revision(&self) -> Result<Revision>;

    /// Drops history before `revision`: afterwards reads at revisions below it, and watches
    /// from before it, fail with [`StorageError::Compacted`]. Compacting to a revision at or
    /// below the current compaction point is a no-op.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// Whether the store can serve and take writes now (readiness reports it).
    async fn health(&self) -> Result<()>;

    /// Whether this process is the store's only writer (an embedded store it holds locked):
    /// then every value in it was written by this process, or by an earlier run of it, and a
    /// reader may trust it to have the shape this process gives its values. A store others
    /// can write (etcd) says no, and its values are checked as they are read.
    fn exclusive(&self) -> bool {
        false
    }

    /// Whether the store's watches deliver the [`Hint`]s of this process's writes with their
    /// events (so a writer need not work one out when none would).
    fn delivers_hints(&self) -> bool {
        false
    }
}

/// The first key after every key that starts with `prefix` (etcd's `range_end` for a prefix),
/// or `None` when no such key exists (prefix empty or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"abc"), Some(b"abd".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
