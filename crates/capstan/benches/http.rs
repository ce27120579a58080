//! HTTP benchmark: create, get, list (10,000 Services) and watch fan-out against the real
//! `capstan` binary over HTTPS, through the `kube` client.
//!
//! `cargo bench -p capstan --bench http` (env: `CAPSTAN_BENCH_SERVICES`, default 10000;
//! `CAPSTAN_BENCH_WATCHERS`, default 100).

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

#[path = "../tests/common/mod.rs"]
mod common;

fn service(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "yes"}},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .expect("service")
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn report(what: &str, count: usize, elapsed: Duration, histogram: &Histogram<u64>) {
    println!(
        "{what:<28} {count:>6} ops in {:>7.2}s = {:>8.0} ops/s   p50 {:>7.2} ms   p99 {:>7.2} ms",
        elapsed.as_secs_f64(),
        count as f64 / elapsed.as_secs_f64(),
        histogram.value_at_quantile(0.5) as f64 / 1000.0,
        histogram.value_at_quantile(0.99) as f64 / 1000.0,
    );
}

async fn concurrently<F, Fut>(count: usize, concurrency: usize, op: F) -> (Duration, Histogram<u64>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let op = op.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3).expect("histogram");
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return histogram;
                }
                let t = Instant::now();
                op(i).await;
                let _ = histogram.record(t.elapsed().as_micros() as u64);
            }
        }));
    }
    let mut total = Histogram::<u64>::new(3).expect("histogram");
    for task in tasks {
        total.add(task.await.expect("task")).expect("merge");
    }
    (started.elapsed(), total)
}

#[tokio::main]
async fn main() {
    let services = env("CAPSTAN_BENCH_SERVICES", 10_000);
    let watchers = env("CAPSTAN_BENCH_WATCHERS", 100);
    let server = common::Server::start();
    let client = server.client().await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    println!(
        "capstan HTTP benchmark: {services} services, {watchers} watchers, 32 concurrent clients"
    );

    let create_api = api.clone();
    let (elapsed, histogram) = concurrently(services, 32, move |i| {
        let api = create_api.clone();
        async move {
            api.create(&PostParams::default(), &service(&format!("bench-{i:05}")))
                .await
                .expect("create");
        }
    })
    .await;
    report("create", services, elapsed, &histogram);

    let get_api = api.clone();
    let (elapsed, histogram) = concurrently(services, 32, move |i| {
        let api = get_api.clone();
        async move {
            api.get(&format!("bench-{i:05}")).await.expect("get");
        }
    })
    .await;
    report("get", services, elapsed, &histogram);

    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let rounds = 10;
    let started = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let list = api.list(&ListParams::default()).await.expect("list");
        assert!(list.items.len() > services);
        let _ = histogram.record(t.elapsed().as_micros() as u64);
    }
    report(
        &format!("list all ({services})"),
        rounds,
        started.elapsed(),
        &histogram,
    );

    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let started = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let mut pages = 0;
        let mut params = ListParams::default().limit(500);
        loop {
            let page = api.list(&params).await.expect("page");
            pages += 1;
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        assert!(pages > 1);
        let _ = histogram.record(t.elapsed().as_micros() as u64);
    }
    report(
        "list paginated (limit=500)",
        rounds,
        started.elapsed(),
        &histogram,
    );

    // Watch fan-out: `watchers` open watches; each new Service must reach all of them.
    let rv = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("rv")
        .metadata
        .resource_version
        .unwrap_or_default();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let mut handles = Vec::new();
    for _ in 0..watchers {
        let api = api.clone();
        let tx = tx.clone();
        let rv = rv.clone();
        handles.push(tokio::spawn(async move {
            let mut stream = api
                .watch(&WatchParams::default().timeout(290), &rv)
                .await
                .expect("watch")
                .boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                if let WatchEvent::Added(s) = event {
                    let _ = tx.send((s.metadata.name.unwrap_or_default(), Instant::now()));
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = 100;
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let started = Instant::now();
    for i in 0..events {
        let name = format!("fanout-{i:03}");
        let t = Instant::now();
        api.create(&PostParams::default(), &service(&name))
            .await
            .expect("create");
        let mut delivered = 0;
        while delivered < watchers {
            let (seen, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("fan-out within 10s")
                .expect("channel open");
            if seen == name {
                delivered += 1;
                let _ = histogram.record(at.duration_since(t).as_micros() as u64);
            }
        }
    }
    report(
        &format!("watch fan-out x{watchers} (create→event)"),
        events * watchers,
        started.elapsed(),
        &histogram,
    );
    for handle in handles {
        handle.abort();
    }
}
