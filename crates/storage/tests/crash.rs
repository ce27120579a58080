//! Durability under `kill -9`: a child process writes as fast as it can and is killed with
//! SIGKILL at a random moment; every write it saw acknowledged must be there after reopening,
//! and the revision sequence must have no gaps or duplicates. Three rounds on the same data
//! directory, so recovery after a crash is itself crashed.

#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use capstan_storage::{EmbeddedOptions, EmbeddedStore, EventKind, RangeRequest, Storage};

fn random_millis(low: u64, high: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0);
    low + nanos % (high - low)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut acknowledged: BTreeMap<String, i64> = BTreeMap::new();
    for round in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_capstan-crash-writer"))
            .arg(dir.path())
            .arg(format!("round{round}"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (going, first_ack) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acked = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A line cut by the kill has no revision: it was never fully acknowledged.
                if let Some((key, revision)) = line.split_once(' ')
                    && let Ok(revision) = revision.parse::<i64>()
                {
                    acked.push((key.to_owned(), revision));
                    if acked.len() == 1 {
                        let _ = going.send(());
                    }
                }
            }
            acked
        });
        // Let it get going (its first write acknowledged: a loaded machine may take a while to
        // start it), then kill it at a random moment.
        let started = Instant::now();
        let _ = first_ack.recv_timeout(Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(random_millis(0, 1200)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acked = reader.join().unwrap();
        assert!(
            !acked.is_empty(),
            "round {round}: nothing acknowledged in {:?}",
            started.elapsed()
        );
        for (key, revision) in acked {
            assert!(
                acknowledged.insert(key, revision).is_none(),
                "key written twice"
            );
        }

        let store = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).unwrap();
        // Every acknowledged write is there, with the revision that was acknowledged.
        for (key, revision) in &acknowledged {
            let kv = store.get(key, None).await.unwrap().kv;
            let kv = kv.unwrap_or_else(|| panic!("round {round}: acknowledged {key} is lost"));
            assert_eq!(kv.mod_revision, *revision, "{key}");
            assert_eq!(&kv.value[..], key.as_bytes());
        }
        // Revisions are unique, and the history is exactly 1..=current with no gap.
        let unique: BTreeSet<i64> = acknowledged.values().copied().collect();
        assert_eq!(
            unique.len(),
            acknowledged.len(),
            "a revision was acknowledged twice"
        );
        let current = store.current_revision().await.unwrap();
        let mut watch = store.watch("", 0).await.unwrap();
        for expected in 1..=current {
            let event = tokio::time::timeout(Duration::from_secs(10), watch.next_event())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(event.revision(), expected, "revision sequence has a gap");
            assert_eq!(event.kind, EventKind::Put);
        }
        // Writes that made it to disk without being acknowledged are fine; nothing else is.
        let all = store.range(RangeRequest::default()).await.unwrap();
        assert_eq!(all.kvs.len() as i64, current, "one key per revision");
        eprintln!(
            "round {round}: {} acknowledged in total, {} on disk",
            acknowledged.len(),
            current
        );
    }
}
