//! Storage engine benchmark: the embedded engine and the etcd engine side by side, in one run.
//!
//! `cargo bench -p capstan-storage --features etcd --bench engines`
//!
//! Without the `etcd` feature only the embedded engine is measured. The etcd engine runs
//! against `CAPSTAN_TEST_ETCD_ENDPOINTS` when set, else against an etcd this benchmark starts
//! (Debian's `etcd-server`) with its data in a temporary directory on the same disk.
//! `CAPSTAN_BENCH_SECONDS` sets how long each write phase runs (default 3).

#![allow(missing_docs, clippy::unwrap_used)]

#[cfg(feature = "etcd")]
#[path = "../tests/common/etcd_server.rs"]
mod etcd_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capstan_storage::{Op, RangeRequest, Storage, Txn};
use hdrhistogram::Histogram;

/// A Service-sized value (a defaulted Service is about 600 bytes of JSON).
fn value(tag: &str) -> Bytes {
    let mut v = format!("{{\"kind\":\"Service\",\"tag\":\"{tag}\",\"pad\":\"");
    v.push_str(&"x".repeat(560));
    v.push_str("\"}");
    Bytes::from(v)
}

struct WriteFigures {
    writers: usize,
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

async fn writes(store: &Arc<dyn Storage>, writers: usize, seconds: f64) -> WriteFigures {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (store, stop, count) = (store.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3).unwrap();
            let payload = value("w");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("bench/writes/{writers}/{w}/{n}");
                let began = Instant::now();
                store
                    .txn(Txn::new().then(Op::Put(key, payload.clone())))
                    .await
                    .unwrap();
                histogram
                    .record(began.elapsed().as_micros() as u64)
                    .unwrap();
                count.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            histogram
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut histogram = Histogram::<u64>::new(3).unwrap();
    for task in tasks {
        histogram.add(task.await.unwrap()).unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    WriteFigures {
        writers,
        per_second: count.load(Ordering::Relaxed) as f64 / elapsed,
        p50: Duration::from_micros(histogram.value_at_quantile(0.50)),
        p99: Duration::from_micros(histogram.value_at_quantile(0.99)),
    }
}

/// Median time to range 10,000 keys (whole values) at the latest revision.
async fn range_10k(store: &Arc<dyn Storage>) -> Duration {
    let payload = value("r");
    for chunk in 0..100 {
        let mut txn = Txn::new();
        for n in 0..100 {
            txn = txn.then(Op::Put(
                format!("bench/range/{:05}", chunk * 100 + n),
                payload.clone(),
            ));
        }
        store.txn(txn).await.unwrap();
    }
    let mut times = Vec::new();
    for _ in 0..21 {
        let began = Instant::now();
        let page = store
            .range(RangeRequest {
                prefix: "bench/range/".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        times.push(began.elapsed());
        assert_eq!(page.kvs.len(), 10_000);
    }
    times.sort();
    times[times.len() / 2]
}

/// p99 (and p50) from commit acknowledgement to delivery, over 100 watchers.
async fn watch_fan_out(store: &Arc<dyn Storage>) -> (Duration, Duration) {
    const WATCHERS: usize = 100;
    const EVENTS: usize = 1_000;
    let epoch = Instant::now();
    let base = store.current_revision().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..WATCHERS {
        let mut watch = store.watch("bench/watch/", base).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3).unwrap();
            for _ in 0..EVENTS {
                let event = watch.next_event().await.unwrap().unwrap();
                let sent = u64::from_le_bytes(event.kv.value[..8].try_into().unwrap());
                let now = epoch.elapsed().as_micros() as u64;
                histogram.record(now.saturating_sub(sent)).unwrap();
            }
            histogram
        }));
    }
    // Let every watcher register before the first write.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 0..EVENTS {
        // Stamp the value just before the write; delivery latency includes the commit.
        let stamp = (epoch.elapsed().as_micros() as u64).to_le_bytes();
        let mut v = stamp.to_vec();
        v.extend_from_slice(&value("w"));
        store
            .txn(Txn::new().then(Op::Put(format!("bench/watch/{n}"), Bytes::from(v))))
            .await
            .unwrap();
    }
    let mut histogram = Histogram::<u64>::new(3).unwrap();
    for task in tasks {
        histogram.add(task.await.unwrap()).unwrap();
    }
    (
        Duration::from_micros(histogram.value_at_quantile(0.50)),
        Duration::from_micros(histogram.value_at_quantile(0.99)),
    )
}

struct Figures {
    name: &'static str,
    writes: Vec<WriteFigures>,
    range: Duration,
    watch: (Duration, Duration),
}

async fn measure(name: &'static str, store: Arc<dyn Storage>, seconds: f64) -> Figures {
    eprintln!("measuring {name} ...");
    let mut all = Vec::new();
    for writers in [1, 16, 128] {
        all.push(writes(&store, writers, seconds).await);
    }
    let range = range_10k(&store).await;
    let watch = watch_fan_out(&store).await;
    Figures {
        name,
        writes: all,
        range,
        watch,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let seconds: f64 = std::env::var("CAPSTAN_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let mut results = Vec::new();

    let dir =
        tempfile::tempdir_in(std::env::var("CAPSTAN_BENCH_DIR").unwrap_or_else(|_| ".".into()))
            .unwrap();
    let embedded =
        capstan_storage::EmbeddedStore::open(capstan_storage::EmbeddedOptions::new(dir.path()))
            .unwrap();
    results.push(measure("embedded", Arc::new(embedded), seconds).await);

    #[cfg(feature = "etcd")]
    {
        let mut _server = None;
        let endpoint = match std::env::var("CAPSTAN_TEST_ETCD_ENDPOINTS") {
            Ok(e) if !e.is_empty() => e,
            _ => {
                let server = etcd_server::EtcdServer::start();
                let endpoint = server.endpoint.clone();
                _server = Some(server);
                endpoint
            }
        };
        let mut options = capstan_storage::EtcdOptions::new(vec![endpoint]);
        options.prefix = format!("/capstan-bench-{}/", std::process::id());
        let etcd = capstan_storage::EtcdStore::connect(options).await.unwrap();
        results.push(measure("etcd", Arc::new(etcd), seconds).await);
    }

    println!();
    print!("{:<34}", "");
    for r in &results {
        print!("{:>22}", r.name);
    }
    println!();
    for (i, writers) in [1, 16, 128].into_iter().enumerate() {
        print!("{:<34}", format!("durable writes/s, {writers} writers"));
        for r in &results {
            assert_eq!(r.writes[i].writers, writers);
            print!("{:>22}", format!("{:.0}", r.writes[i].per_second));
        }
        println!();
        print!("{:<34}", format!("  write latency p50 / p99"));
        for r in &results {
            print!(
                "{:>22}",
                format!("{} / {}", ms(r.writes[i].p50), ms(r.writes[i].p99))
            );
        }
        println!();
    }
    print!("{:<34}", "range 10,000 keys (median)");
    for r in &results {
        print!("{:>22}", ms(r.range));
    }
    println!();
    print!("{:<34}", "100 watchers: delivery p50 / p99");
    for r in &results {
        print!("{:>22}", format!("{} / {}", ms(r.watch.0), ms(r.watch.1)));
    }
    println!();
    if results.len() == 2 {
        let ratio = results[0].writes[2].per_second / results[1].writes[2].per_second;
        println!("\nembedded / etcd write throughput at 128 writers: {ratio:.1}x");
    }
}
