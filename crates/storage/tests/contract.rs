//! The storage contract suite. Every case runs against every engine: the embedded engine always,
//! the etcd engine when the crate is built with the `etcd` feature (against the etcd named by
//! `CAPSTAN_TEST_ETCD_ENDPOINTS`, or one the suite starts itself).

#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capstan_storage::{
    Compare, EventKind, KeyValue, Op, RangeRequest, RangeResponse, Revision, Storage, StorageError,
    Txn, TxnOutcome, WatchStream,
};

// ---- engines ---------------------------------------------------------------------------------

/// Where a test's store lives; `open` may be called again to simulate a restart.
enum Engine {
    Embedded(tempfile::TempDir),
    #[cfg(feature = "etcd")]
    Etcd {
        endpoint: String,
        prefix: String,
    },
}

#[cfg(feature = "etcd")]
static PREFIX_COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Engine {
    fn embedded() -> Self {
        Engine::Embedded(tempfile::tempdir().unwrap())
    }

    #[cfg(feature = "etcd")]
    fn etcd(endpoint: String) -> Self {
        let n = PREFIX_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefix = format!("/capstan-test/{}-{n}-{}/", std::process::id(), nanos());
        Engine::Etcd { endpoint, prefix }
    }

    /// Whether the test has the store to itself. A shared etcd also carries other tests'
    /// writes, so there revisions can move between two writes of one test.
    fn exclusive(&self) -> bool {
        matches!(self, Engine::Embedded(_))
    }

    /// `later` is the next revision after `earlier` (on a shared store: some later one).
    fn assert_follows(&self, earlier: Revision, later: Revision) {
        if self.exclusive() {
            assert_eq!(later, earlier + 1, "exactly one revision later");
        } else {
            assert!(later > earlier, "{later} is after {earlier}");
        }
    }

    /// Nothing this test did moved the revision from `before` to `now`.
    fn assert_unmoved(&self, before: Revision, now: Revision) {
        if self.exclusive() {
            assert_eq!(now, before, "no revision consumed");
        } else {
            assert!(now >= before);
        }
    }

    async fn open(&self) -> Arc<dyn Storage> {
        self.open_with_buffer(10_000).await
    }

    async fn open_with_buffer(&self, watch_buffer: usize) -> Arc<dyn Storage> {
        match self {
            Engine::Embedded(dir) => {
                let mut options = capstan_storage::EmbeddedOptions::new(dir.path());
                options.watch_buffer = watch_buffer;
                Arc::new(capstan_storage::EmbeddedStore::open(options).unwrap())
            }
            #[cfg(feature = "etcd")]
            Engine::Etcd { endpoint, prefix } => {
                let mut options = capstan_storage::EtcdOptions::new(vec![endpoint.clone()]);
                options.prefix = prefix.clone();
                options.watch_buffer = watch_buffer;
                options.lag_grace = Duration::from_millis(100);
                Arc::new(capstan_storage::EtcdStore::connect(options).await.unwrap())
            }
        }
    }
}

#[cfg(feature = "etcd")]
fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

#[cfg(feature = "etcd")]
fn shared_etcd() -> String {
    use std::sync::OnceLock;
    static SERVER: OnceLock<common::etcd_server::EtcdServer> = OnceLock::new();
    match std::env::var("CAPSTAN_TEST_ETCD_ENDPOINTS") {
        Ok(endpoints) if !endpoints.is_empty() => endpoints,
        _ => SERVER
            .get_or_init(common::etcd_server::EtcdServer::start)
            .endpoint
            .clone(),
    }
}

/// Declares one `#[tokio::test]` per engine for a case.
macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::cases::$case(super::Engine::embedded()).await;
                }
            )*
        }
        #[cfg(feature = "etcd")]
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::cases::$case(super::Engine::etcd(super::shared_etcd())).await;
                }
            )*
        }
    };
}

contract!(
    a_missing_key_reads_as_absent,
    create_then_update_tracks_revisions_and_version,
    every_transaction_takes_exactly_one_revision,
    reads_at_an_older_revision_see_the_state_then,
    reads_in_the_future_fail,
    range_pages_in_key_order_with_remaining_count,
    range_at_a_revision_is_a_consistent_snapshot,
    range_stays_inside_its_prefix,
    failed_compares_change_nothing_and_report_current_values,
    delete_returns_the_previous_value_and_missing_keys_are_no_ops,
    duplicate_keys_in_one_transaction_are_refused,
    concurrent_compare_and_swap_has_exactly_one_winner,
    concurrent_creates_of_one_key_have_exactly_one_winner,
    watch_delivers_puts_and_deletes_with_previous_values,
    watch_delivers_a_transaction_in_op_order,
    watch_from_the_past_catches_up_then_goes_live,
    concurrent_writes_reach_every_watcher_once_in_order,
    a_slow_watcher_is_closed_without_stalling_others,
    dropping_a_watch_stream_cancels_it,
    data_survives_a_restart,
);

/// Compaction is global to an etcd cluster, so on etcd it runs against a private server.
mod compaction {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn embedded() {
        super::cases::compaction_drops_history_and_reports_compacted(super::Engine::embedded())
            .await;
    }

    #[cfg(feature = "etcd")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn etcd() {
        let server = super::common::etcd_server::EtcdServer::start();
        super::cases::compaction_drops_history_and_reports_compacted(super::Engine::etcd(
            server.endpoint.clone(),
        ))
        .await;
    }
}

// ---- helpers ---------------------------------------------------------------------------------

fn put(key: &str, value: &str) -> Txn {
    Txn::new().then(Op::Put(key.into(), Bytes::from(value.to_owned())))
}

async fn commit(store: &Arc<dyn Storage>, txn: Txn) -> (Revision, Vec<Option<KeyValue>>) {
    match store.txn(txn).await.unwrap() {
        TxnOutcome::Committed { revision, previous } => (revision, previous),
        failed => panic!("transaction failed: {failed:?}"),
    }
}

async fn put_ok(store: &Arc<dyn Storage>, key: &str, value: &str) -> Revision {
    commit(store, put(key, value)).await.0
}

/// Deletes `key` in a transaction of its own; the transaction's revision.
async fn delete_ok(store: &Arc<dyn Storage>, key: &str) -> Revision {
    commit(store, Txn::new().then(Op::Delete(key.into())))
        .await
        .0
}

/// Runs the transactions `txn(0)` to `txn(31)` all at once; the `n`s of those that succeeded.
async fn race(store: &Arc<dyn Storage>, txn: impl Fn(usize) -> Txn) -> Vec<usize> {
    let tasks: Vec<_> = (0..32)
        .map(|n| {
            let (store, txn) = (store.clone(), txn(n));
            tokio::spawn(async move { store.txn(txn).await.unwrap().succeeded() })
        })
        .collect();
    let mut winners = Vec::new();
    for (n, task) in tasks.into_iter().enumerate() {
        if task.await.unwrap() {
            winners.push(n);
        }
    }
    winners
}

async fn value_of(store: &Arc<dyn Storage>, key: &str, at: Option<Revision>) -> Option<String> {
    let got = store.get(key, at).await.unwrap();
    got.kv
        .map(|kv| String::from_utf8(kv.value.to_vec()).unwrap())
}

async fn next(watch: &mut WatchStream) -> capstan_storage::Event {
    tokio::time::timeout(Duration::from_secs(10), watch.next_event())
        .await
        .expect("an event within 10s")
        .expect("the watch is still open")
        .expect("an event, not an error")
}

async fn assert_quiet(watch: &mut WatchStream) {
    let got = tokio::time::timeout(Duration::from_millis(200), watch.next_event()).await;
    assert!(got.is_err(), "expected no event, got {got:?}");
}

/// A read of every key under `prefix`; cases set the other fields on it.
fn under(prefix: &str) -> RangeRequest {
    RangeRequest {
        prefix: prefix.into(),
        ..Default::default()
    }
}

/// A range read that must succeed.
async fn range_ok(store: &Arc<dyn Storage>, request: RangeRequest) -> RangeResponse {
    store.range(request).await.unwrap()
}

/// The keys a range read returned, in its order.
fn keys(range: &RangeResponse) -> Vec<&str> {
    range.kvs.iter().map(|kv| &*kv.key).collect()
}

fn text(kv: &KeyValue) -> &str {
    std::str::from_utf8(&kv.value).unwrap()
}

// ---- the cases -------------------------------------------------------------------------------

mod cases {
    use super::*;

    pub async fn a_missing_key_reads_as_absent(engine: Engine) {
        let store = engine.open().await;
        let got = store.get("nothing/here", None).await.unwrap();
        assert!(got.kv.is_none());
        engine.assert_unmoved(got.revision, store.current_revision().await.unwrap());
    }

    pub async fn create_then_update_tracks_revisions_and_version(engine: Engine) {
        let store = engine.open().await;
        let created = put_ok(&store, "svc/a", "one").await;
        let kv = store.get("svc/a", None).await.unwrap().kv.unwrap();
        assert_eq!(&*kv.key, "svc/a");
        assert_eq!(text(&kv), "one");
        assert_eq!(
            (kv.create_revision, kv.mod_revision, kv.version),
            (created, created, 1)
        );

        let updated = put_ok(&store, "svc/a", "two").await;
        engine.assert_follows(created, updated);
        let kv = store.get("svc/a", None).await.unwrap().kv.unwrap();
        assert_eq!(text(&kv), "two");
        assert_eq!(
            (kv.create_revision, kv.mod_revision, kv.version),
            (created, updated, 2)
        );

        // Deleting and recreating starts a new life: new create revision, version 1.
        delete_ok(&store, "svc/a").await;
        let recreated = put_ok(&store, "svc/a", "three").await;
        let kv = store.get("svc/a", None).await.unwrap().kv.unwrap();
        assert_eq!((kv.create_revision, kv.version), (recreated, 1));
    }

    pub async fn every_transaction_takes_exactly_one_revision(engine: Engine) {
        let store = engine.open().await;
        let before = store.current_revision().await.unwrap();
        let txn = Txn::new()
            .then(Op::Put("t/a".into(), Bytes::from_static(b"1")))
            .then(Op::Put("t/b".into(), Bytes::from_static(b"2")))
            .then(Op::Put("t/c".into(), Bytes::from_static(b"3")));
        let (revision, previous) = commit(&store, txn).await;
        engine.assert_follows(before, revision);
        assert_eq!(previous, vec![None, None, None]);
        engine.assert_unmoved(revision, store.current_revision().await.unwrap());
        for key in ["t/a", "t/b", "t/c"] {
            let kv = store.get(key, None).await.unwrap().kv.unwrap();
            assert_eq!(kv.mod_revision, revision, "{key}");
        }
    }

    pub async fn reads_at_an_older_revision_see_the_state_then(engine: Engine) {
        let store = engine.open().await;
        let before = put_ok(&store, "h/other", "x").await;
        // The key's history: a put of each value, a delete for `None`.
        let history = [Some("v1"), Some("v2"), None, Some("v4")];
        let mut revisions = Vec::new();
        for value in history {
            revisions.push(match value {
                Some(value) => put_ok(&store, "h/k", value).await,
                None => delete_ok(&store, "h/k").await,
            });
        }

        // A read at each write's revision sees that write; before the first, nothing.
        assert_eq!(value_of(&store, "h/k", Some(before)).await, None);
        for (&at, value) in revisions.iter().zip(history) {
            let seen = value_of(&store, "h/k", Some(at)).await;
            assert_eq!(seen.as_deref(), value, "at {at}");
        }
        let (r1, r2) = (revisions[0], revisions[1]);

        let at_r1 = store.get("h/k", Some(r1)).await.unwrap();
        assert_eq!(at_r1.revision, r1);
        let kv = at_r1.kv.unwrap();
        assert_eq!(
            (kv.create_revision, kv.mod_revision, kv.version),
            (r1, r1, 1)
        );
        let kv = store.get("h/k", Some(r2)).await.unwrap().kv.unwrap();
        assert_eq!(
            (kv.create_revision, kv.mod_revision, kv.version),
            (r1, r2, 2)
        );
    }

    pub async fn reads_in_the_future_fail(engine: Engine) {
        let store = engine.open().await;
        let current = put_ok(&store, "f/k", "v").await;
        let err = store.get("f/k", Some(current + 1000)).await.unwrap_err();
        assert!(
            matches!(err, StorageError::FutureRevision { requested, current: c } if requested == current + 1000 && c >= current),
            "{err:?}"
        );
        let request = RangeRequest {
            prefix: "f/".into(),
            at_revision: Some(current + 1000),
            ..Default::default()
        };
        let err = store.range(request).await.unwrap_err();
        assert!(
            matches!(err, StorageError::FutureRevision { .. }),
            "{err:?}"
        );
    }

    pub async fn range_pages_in_key_order_with_remaining_count(engine: Engine) {
        let store = engine.open().await;
        // Written out of order; read back in key order.
        for n in [7, 3, 9, 1, 5, 2, 8, 4, 6, 0] {
            put_ok(&store, &format!("p/k{n}"), &n.to_string()).await;
        }
        let all = range_ok(&store, under("p/")).await;
        assert_eq!(
            keys(&all),
            (0..10).map(|n| format!("p/k{n}")).collect::<Vec<_>>()
        );
        assert!(!all.more);
        assert_eq!(all.remaining, 0);

        let mut pages = Vec::new();
        let mut start_after = None;
        loop {
            let page = range_ok(
                &store,
                RangeRequest {
                    start_after: start_after.clone(),
                    limit: 4,
                    ..under("p/")
                },
            )
            .await;
            pages.push((page.kvs.len(), page.more, page.remaining));
            start_after = page.kvs.last().map(|kv| kv.key.to_string());
            if !page.more {
                break;
            }
        }
        assert_eq!(pages, vec![(4, true, 6), (4, true, 2), (2, false, 0)]);
    }

    pub async fn range_at_a_revision_is_a_consistent_snapshot(engine: Engine) {
        let store = engine.open().await;
        for n in 0..6 {
            put_ok(&store, &format!("s/k{n}"), "old").await;
        }
        let first = range_ok(
            &store,
            RangeRequest {
                limit: 3,
                ..under("s/")
            },
        )
        .await;
        let snapshot = first.revision;
        // Writes after the first page must not show in later pages read at its revision.
        put_ok(&store, "s/k4", "new").await;
        delete_ok(&store, "s/k5").await;
        put_ok(&store, "s/k3a", "new").await;
        let second = range_ok(
            &store,
            RangeRequest {
                start_after: first.kvs.last().map(|kv| kv.key.to_string()),
                limit: 3,
                at_revision: Some(snapshot),
                ..under("s/")
            },
        )
        .await;
        assert_eq!(second.revision, snapshot);
        let seen: Vec<(&str, &str)> = second.kvs.iter().map(|kv| (&*kv.key, text(kv))).collect();
        assert_eq!(
            seen,
            vec![("s/k3", "old"), ("s/k4", "old"), ("s/k5", "old")]
        );
        assert!(!second.more);

        // An old snapshot counts what remained then, not now.
        let counted = range_ok(
            &store,
            RangeRequest {
                limit: 1,
                at_revision: Some(snapshot),
                ..under("s/")
            },
        )
        .await;
        assert_eq!(counted.remaining, 5);
    }

    pub async fn range_stays_inside_its_prefix(engine: Engine) {
        let store = engine.open().await;
        put_ok(&store, "a/x", "1").await;
        put_ok(&store, "a0", "outside").await;
        put_ok(&store, "a/y", "2").await;
        put_ok(&store, "b/x", "outside").await;
        let got = range_ok(&store, under("a/")).await;
        assert_eq!(keys(&got), vec!["a/x", "a/y"]);
        // A start point past the prefix yields nothing rather than failing.
        let past = range_ok(
            &store,
            RangeRequest {
                start_after: Some("zzz".into()),
                ..under("a/")
            },
        )
        .await;
        assert!(past.kvs.is_empty() && !past.more);
    }

    pub async fn failed_compares_change_nothing_and_report_current_values(engine: Engine) {
        let store = engine.open().await;
        let r1 = put_ok(&store, "c/k", "v1").await;
        let before = store.current_revision().await.unwrap();

        // Absent fails when the key exists; the current value comes back.
        let outcome = store
            .txn(
                Txn::new()
                    .when(Compare::Absent("c/k".into()))
                    .then(Op::Put("c/k".into(), Bytes::from_static(b"clobber"))),
            )
            .await
            .unwrap();
        match outcome {
            TxnOutcome::Failed { revision, current } => {
                engine.assert_unmoved(before, revision);
                assert_eq!(current.len(), 1);
                let kv = current[0].as_ref().unwrap();
                assert_eq!((text(kv), kv.mod_revision), ("v1", r1));
            }
            other => panic!("expected failure, got {other:?}"),
        }

        // A stale mod revision fails; a failed transaction writes nothing, not even its
        // unconditional-looking ops on other keys.
        let outcome = store
            .txn(
                Txn::new()
                    .when(Compare::ModRevision("c/k".into(), r1 - 1))
                    .then(Op::Put("c/other".into(), Bytes::from_static(b"x"))),
            )
            .await
            .unwrap();
        assert!(!outcome.succeeded());
        assert_eq!(value_of(&store, "c/other", None).await, None);
        engine.assert_unmoved(before, store.current_revision().await.unwrap());

        // ModRevision on a missing key fails, reporting it absent.
        let outcome = store
            .txn(Txn::new().when(Compare::ModRevision("c/missing".into(), r1)))
            .await
            .unwrap();
        match outcome {
            TxnOutcome::Failed { revision, current } => {
                engine.assert_unmoved(before, revision);
                assert_eq!(current, vec![None]);
            }
            other => panic!("expected failure, got {other:?}"),
        }

        // The right mod revision succeeds and returns the previous value.
        let (r2, previous) = commit(
            &store,
            Txn::new()
                .when(Compare::ModRevision("c/k".into(), r1))
                .then(Op::Put("c/k".into(), Bytes::from_static(b"v2"))),
        )
        .await;
        engine.assert_follows(before, r2);
        assert_eq!(text(previous[0].as_ref().unwrap()), "v1");
    }

    pub async fn delete_returns_the_previous_value_and_missing_keys_are_no_ops(engine: Engine) {
        let store = engine.open().await;
        let r1 = put_ok(&store, "d/k", "v").await;
        let (r2, previous) = commit(&store, Txn::new().then(Op::Delete("d/k".into()))).await;
        engine.assert_follows(r1, r2);
        let prev = previous[0].as_ref().unwrap();
        assert_eq!((text(prev), prev.mod_revision), ("v", r1));
        assert_eq!(value_of(&store, "d/k", None).await, None);

        // Deleting what is not there changes nothing and takes no revision.
        let (r3, previous) = commit(&store, Txn::new().then(Op::Delete("d/k".into()))).await;
        engine.assert_unmoved(r2, r3);
        assert_eq!(previous, vec![None]);
        engine.assert_unmoved(r2, store.current_revision().await.unwrap());
    }

    pub async fn duplicate_keys_in_one_transaction_are_refused(engine: Engine) {
        let store = engine.open().await;
        let before = store.current_revision().await.unwrap();
        let err = store
            .txn(
                Txn::new()
                    .then(Op::Put("dup/k".into(), Bytes::from_static(b"1")))
                    .then(Op::Delete("dup/k".into())),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::InvalidTxn(_)), "{err:?}");
        engine.assert_unmoved(before, store.current_revision().await.unwrap());
        assert_eq!(value_of(&store, "dup/k", None).await, None);
    }

    pub async fn concurrent_compare_and_swap_has_exactly_one_winner(engine: Engine) {
        let store = engine.open().await;
        let base = put_ok(&store, "cas/k", "start").await;
        let winners = race(&store, |n| {
            Txn::new()
                .when(Compare::ModRevision("cas/k".into(), base))
                .then(Op::Put("cas/k".into(), Bytes::from(format!("w{n}"))))
        })
        .await;
        assert_eq!(winners.len(), 1, "winners: {winners:?}");
        let kv = store.get("cas/k", None).await.unwrap().kv.unwrap();
        assert_eq!(text(&kv), format!("w{}", winners[0]));
        assert_eq!(kv.version, 2);
    }

    pub async fn concurrent_creates_of_one_key_have_exactly_one_winner(engine: Engine) {
        let store = engine.open().await;
        let winners = race(&store, |n| {
            Txn::new()
                .when(Compare::Absent("create/k".into()))
                .then(Op::Put("create/k".into(), Bytes::from(format!("w{n}"))))
        })
        .await;
        assert_eq!(winners.len(), 1, "winners: {winners:?}");
    }

    pub async fn watch_delivers_puts_and_deletes_with_previous_values(engine: Engine) {
        let store = engine.open().await;
        let base = put_ok(&store, "unwatched", "x").await;
        let mut watch = store.watch("w/", base).await.unwrap();

        let r1 = put_ok(&store, "w/k", "v1").await;
        put_ok(&store, "elsewhere", "x").await;
        let r2 = put_ok(&store, "w/k", "v2").await;
        let r3 = delete_ok(&store, "w/k").await;

        let created = next(&mut watch).await;
        assert_eq!(created.kind, EventKind::Put);
        assert_eq!(
            (text(&created.kv), created.revision(), created.kv.version),
            ("v1", r1, 1)
        );
        assert!(created.prev.is_none());

        let updated = next(&mut watch).await;
        assert_eq!((text(&updated.kv), updated.revision()), ("v2", r2));
        assert_eq!(updated.kv.create_revision, r1);
        assert_eq!(text(updated.prev.as_ref().unwrap()), "v1");

        let deleted = next(&mut watch).await;
        assert_eq!(deleted.kind, EventKind::Delete);
        assert_eq!((&*deleted.kv.key, deleted.revision()), ("w/k", r3));
        let prev = deleted.prev.as_ref().unwrap();
        assert_eq!((text(prev), prev.mod_revision), ("v2", r2));
        assert_quiet(&mut watch).await;
    }

    pub async fn watch_delivers_a_transaction_in_op_order(engine: Engine) {
        let store = engine.open().await;
        let base = store.current_revision().await.unwrap();
        let mut watch = store.watch("o/", base).await.unwrap();
        let (revision, _) = commit(
            &store,
            Txn::new()
                .then(Op::Put("o/z".into(), Bytes::from_static(b"1")))
                .then(Op::Put("o/a".into(), Bytes::from_static(b"2")))
                .then(Op::Put("o/m".into(), Bytes::from_static(b"3"))),
        )
        .await;
        let mut keys = Vec::new();
        for _ in 0..3 {
            let event = next(&mut watch).await;
            assert_eq!(event.revision(), revision);
            keys.push(event.kv.key.to_string());
        }
        assert_eq!(keys, vec!["o/z", "o/a", "o/m"]);
    }

    pub async fn watch_from_the_past_catches_up_then_goes_live(engine: Engine) {
        let store = engine.open().await;
        let base = store.current_revision().await.unwrap();
        for n in 0..100 {
            put_ok(&store, &format!("past/k{n:03}"), "v").await;
        }
        let mut watch = store.watch("past/", base).await.unwrap();
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                for n in 100..200 {
                    put_ok(&store, &format!("past/k{n:03}"), "v").await;
                }
            })
        };
        let mut last = base;
        for n in 0..200 {
            let event = next(&mut watch).await;
            assert_eq!(&*event.kv.key, format!("past/k{n:03}"));
            assert!(event.revision() > last);
            last = event.revision();
        }
        writer.await.unwrap();
        assert_quiet(&mut watch).await;
    }

    pub async fn concurrent_writes_reach_every_watcher_once_in_order(engine: Engine) {
        const WRITERS: usize = 8;
        const EACH: usize = 150;
        let store = engine.open().await;
        let base = store.current_revision().await.unwrap();
        let mut watchers = Vec::new();
        for _ in 0..3 {
            watchers.push(store.watch("cc/", base).await.unwrap());
        }
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut revisions = Vec::new();
                for i in 0..EACH {
                    revisions.push(put_ok(&store, &format!("cc/{w}/{i}"), "v").await);
                }
                revisions
            }));
        }
        // A watcher started in the middle of the writes must see the same tail.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let midway = store.current_revision().await.unwrap();
        let mut late = store.watch("cc/", midway).await.unwrap();

        let mut acknowledged = BTreeSet::new();
        for task in tasks {
            acknowledged.extend(task.await.unwrap());
        }
        assert_eq!(acknowledged.len(), WRITERS * EACH, "revisions are unique");
        for watch in &mut watchers {
            let mut seen = Vec::new();
            for _ in 0..WRITERS * EACH {
                seen.push(next(watch).await.revision());
            }
            assert!(seen.windows(2).all(|w| w[0] < w[1]), "in revision order");
            assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), acknowledged);
            assert_quiet(watch).await;
        }
        let tail: BTreeSet<_> = acknowledged.range(midway + 1..).copied().collect();
        let mut seen = BTreeSet::new();
        for _ in 0..tail.len() {
            assert!(
                seen.insert(next(&mut late).await.revision()),
                "no duplicates"
            );
        }
        assert_eq!(seen, tail);
        assert_quiet(&mut late).await;
    }

    pub async fn a_slow_watcher_is_closed_without_stalling_others(engine: Engine) {
        let store = engine.open_with_buffer(16).await;
        let base = store.current_revision().await.unwrap();
        let mut slow = store.watch("lag/", base).await.unwrap();
        let mut fast = store.watch("lag/", base).await.unwrap();
        let reader = tokio::spawn(async move {
            let mut n = 0;
            while n < 200 {
                next(&mut fast).await;
                n += 1;
            }
            n
        });
        // Writers finish although the slow watcher reads nothing.
        let mut written = Vec::new();
        for n in 0..200 {
            written.push(
                tokio::time::timeout(
                    Duration::from_secs(10),
                    put_ok(&store, &format!("lag/k{n}"), "v"),
                )
                .await
                .expect("a write is not stalled by a slow watcher"),
            );
        }
        let last = *written.last().unwrap();
        assert_eq!(reader.await.unwrap(), 200);
        // Past any grace period an engine gives a full watcher.
        tokio::time::sleep(Duration::from_millis(500)).await;

        let mut delivered = 0;
        let error = loop {
            match tokio::time::timeout(Duration::from_secs(10), slow.next_event())
                .await
                .unwrap()
            {
                Some(Ok(_)) => delivered += 1,
                Some(Err(e)) => break e,
                None => panic!("the slow watcher ended without saying why"),
            }
        };
        assert!((1..200).contains(&delivered), "delivered {delivered}");
        match error {
            StorageError::WatcherLagged { last_delivered } => {
                assert!(last_delivered >= base && last_delivered < last);
                // The error tells where to resume: a new watch from there sees the rest.
                let mut resumed = store.watch("lag/", last_delivered).await.unwrap();
                let mut count = 0;
                loop {
                    let event = next(&mut resumed).await;
                    count += 1;
                    if event.revision() == last {
                        break;
                    }
                }
                assert_eq!(
                    written.iter().filter(|r| **r > last_delivered).count(),
                    count,
                    "resuming after last_delivered sees every later event once"
                );
            }
            other => panic!("expected WatcherLagged, got {other:?}"),
        }
        assert!(slow.next_event().await.is_none());
    }

    pub async fn dropping_a_watch_stream_cancels_it(engine: Engine) {
        let store = engine.open_with_buffer(4).await;
        let base = store.current_revision().await.unwrap();
        for _ in 0..20 {
            drop(store.watch("drop/", base).await.unwrap());
        }
        // Writes keep going with many abandoned watchers around.
        for n in 0..50 {
            put_ok(&store, &format!("drop/k{n}"), "v").await;
        }
        let mut watch = store.watch("drop/", base).await.unwrap();
        assert_eq!(&*next(&mut watch).await.kv.key, "drop/k0");
    }

    pub async fn data_survives_a_restart(engine: Engine) {
        let (first, second, revision, kv) = {
            let store = engine.open().await;
            let first = put_ok(&store, "r/a", "1").await;
            let second = put_ok(&store, "r/b", "2").await;
            delete_ok(&store, "r/a").await;
            let revision = put_ok(&store, "r/b", "3").await;
            (
                first,
                second,
                revision,
                store.get("r/b", None).await.unwrap().kv.unwrap(),
            )
        };
        let store = engine.open().await;
        assert!(store.current_revision().await.unwrap() >= revision);
        assert_eq!(store.get("r/b", None).await.unwrap().kv.unwrap(), kv);
        assert_eq!(value_of(&store, "r/a", None).await, None);
        // History survives too: the state before the delete, and the events since.
        assert_eq!(
            value_of(&store, "r/a", Some(second)).await.as_deref(),
            Some("1")
        );
        let mut watch = store.watch("r/", first).await.unwrap();
        let kinds: Vec<EventKind> = [
            next(&mut watch).await,
            next(&mut watch).await,
            next(&mut watch).await,
        ]
        .iter()
        .map(|e| e.kind)
        .collect();
        assert_eq!(
            kinds,
            vec![EventKind::Put, EventKind::Delete, EventKind::Put]
        );
        // And the revision counter continues where it was.
        let after = put_ok(&store, "r/c", "4").await;
        engine.assert_unmoved(after, store.current_revision().await.unwrap());
        assert!(after > revision);
    }

    pub async fn compaction_drops_history_and_reports_compacted(engine: Engine) {
        let store = engine.open().await;
        let r1 = put_ok(&store, "cp/k", "v1").await;
        let r2 = put_ok(&store, "cp/k", "v2").await;
        let r3 = put_ok(&store, "cp/gone", "x").await;
        let r4 = delete_ok(&store, "cp/gone").await;
        let r5 = put_ok(&store, "cp/k", "v3").await;

        let err = store.compact(r5 + 100).await.unwrap_err();
        assert!(
            matches!(err, StorageError::FutureRevision { .. }),
            "{err:?}"
        );

        store.compact(r4).await.unwrap();
        // Give background clean-up a moment, so the checks below see its result.
        tokio::time::sleep(Duration::from_millis(200)).await;

        for at in [r1, r2, r3] {
            let err = store.get("cp/k", Some(at)).await.unwrap_err();
            assert!(
                matches!(err, StorageError::Compacted { requested, compacted } if requested == at && compacted > at),
                "{err:?}"
            );
            let err = store
                .range(RangeRequest {
                    prefix: "cp/".into(),
                    at_revision: Some(at),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert!(matches!(err, StorageError::Compacted { .. }), "{err:?}");
        }
        let err = store
            .watch("cp/", r2)
            .await
            .err()
            .expect("watch from before compaction fails");
        assert!(matches!(err, StorageError::Compacted { .. }), "{err:?}");

        // The compaction point itself is still readable, and so is everything after it.
        assert_eq!(
            value_of(&store, "cp/k", Some(r4)).await.as_deref(),
            Some("v2")
        );
        assert_eq!(value_of(&store, "cp/gone", Some(r4)).await, None);
        assert_eq!(value_of(&store, "cp/k", None).await.as_deref(), Some("v3"));
        let mut watch = store.watch("cp/", r4).await.unwrap();
        let event = next(&mut watch).await;
        assert_eq!((text(&event.kv), event.revision()), ("v3", r5));
        assert_eq!(
            text(event.prev.as_ref().unwrap()),
            "v2",
            "previous value kept"
        );
        assert_eq!(event.kv.version, 3);

        // Compacting backwards is a no-op; forwards keeps working.
        store.compact(r2).await.unwrap();
        store.compact(r5).await.unwrap();
        let err = store.get("cp/k", Some(r4)).await.unwrap_err();
        assert!(matches!(err, StorageError::Compacted { .. }), "{err:?}");
        let kv = store.get("cp/k", None).await.unwrap().kv.unwrap();
        assert_eq!((kv.create_revision, kv.version), (r1, 3));
        let unique: HashSet<_> = [r1, r2, r3, r4, r5].into_iter().collect();
        assert_eq!(unique.len(), 5);
    }
}
