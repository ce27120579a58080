//! How long `capstan proxy` takes to program nftables for a large cluster: a full sync of
//! 10,000 Services × 10 endpoints, and the partial sync after one Service's endpoints change.
//!
//! Needs root (it makes a network namespace for the rules): `cargo bench -p capstan-proxy
//! --bench sync [-- SERVICES ENDPOINTS]`.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capstan_proxy::health::{HealthChecks, ProxyHealth};
use capstan_proxy::metrics::Metrics;
use capstan_proxy::state::Family;
use capstan_proxy::sync::{Shared, SyncConfig, Syncer, lock};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

#[path = "../../capstan/tests/common/require.rs"]
mod require;

const INNER: &str = "CAPSTAN_PROXY_BENCH_NETNS";

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let services: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let endpoints: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    if std::env::var_os(INNER).is_none() {
        // Run again inside a fresh network namespace, so the rules touch nothing else.
        // A benchmark, not a test: without root it says so and exits 0, in CI too (which runs
        // no benchmarks). As root, making the namespace must work.
        if !require::is_root() {
            require::skipped("root, to make a network namespace (ip netns add)");
            return;
        }
        let netns = format!("capsync{}", std::process::id());
        let made = Command::new("ip").args(["netns", "add", &netns]).status();
        assert!(
            made.is_ok_and(|s| s.success()),
            "ip netns add {netns} failed"
        );
        let exe = std::env::current_exe().expect("own path");
        let status = Command::new("ip")
            .args(["netns", "exec", &netns])
            .arg(exe)
            .args([services.to_string(), endpoints.to_string()])
            .env(INNER, &netns)
            .status();
        let _ = Command::new("ip").args(["netns", "del", &netns]).status();
        assert!(status.is_ok_and(|s| s.success()), "benchmark failed");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(bench(services, endpoints));
}

fn service(i: usize) -> Service {
    Service {
        metadata: ObjectMeta {
            namespace: Some("bench".into()),
            name: Some(format!("svc-{i}")),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some(format!("10.96.{}.{}", i / 250, i % 250 + 1)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn slice(i: usize, endpoints: usize, ready_until: usize) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some("bench".into()),
            name: Some(format!("svc-{i}-abcde")),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_owned(),
                format!("svc-{i}"),
            )])),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(
            (0..endpoints)
                .map(|e| {
                    let n = i * endpoints + e;
                    Endpoint {
                        addresses: vec![format!(
                            "10.{}.{}.{}",
                            128 + n / 62_500,
                            n / 250 % 250,
                            n % 250 + 1
                        )],
                        conditions: Some(EndpointConditions {
                            ready: Some(e < ready_until),
                            ..EndpointConditions::default()
                        }),
                        node_name: Some(format!("node-{}", n % 50)),
                        ..Endpoint::default()
                    }
                })
                .collect(),
        ),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn bench(services: usize, endpoints: usize) {
    let shared = Arc::new(Mutex::new(Shared::default()));
    {
        let mut s = lock(&shared);
        s.state
            .replace_services((0..services).map(service).collect());
        s.state.replace_slices(
            (0..services)
                .map(|i| slice(i, endpoints, endpoints))
                .collect(),
        );
        s.services_synced = true;
        s.slices_synced = true;
    }
    let metrics = Arc::new(Metrics::new());
    let families = [Family::V4];
    let health = Arc::new(ProxyHealth::new(
        &families,
        Duration::from_secs(30),
        metrics.clone(),
    ));
    let config = SyncConfig {
        table: "capstan-proxy".into(),
        families: families.to_vec(),
        node_name: "node-0".into(),
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        nodeport_cidrs: Vec::new(),
        min_sync_period: Duration::ZERO,
        sync_period: Duration::from_secs(30),
    };
    let notify = Arc::new(tokio::sync::Notify::new());
    let checks = HealthChecks::new(Vec::new(), health.clone());
    let mut syncer = Syncer::new(
        config,
        shared.clone(),
        notify,
        metrics.clone(),
        health,
        checks,
    );

    let t = Instant::now();
    syncer.sync().await;
    let first = t.elapsed();
    let table = Command::new("nft")
        .args(["list", "table", "ip", "capstan-proxy"])
        .output()
        .expect("nft");
    let text = String::from_utf8_lossy(&table.stdout);
    let rules = text
        .lines()
        .filter(|l| l.contains("dnat ip to") || l.contains(" : goto "))
        .count();
    assert!(
        rules >= services,
        "the table holds the Services' rules ({rules} lines)"
    );
    println!("{services} Services x {endpoints} endpoints");
    println!("  first full sync (empty table): {first:.2?}");

    lock(&shared).need_full = true;
    let t = Instant::now();
    syncer.sync().await;
    println!("  full resync of an unchanged table: {:.2?}", t.elapsed());

    let mut partial = Vec::new();
    for round in 0..30 {
        let i = (round * 7919) % services;
        {
            let mut s = lock(&shared);
            let touched = s.state.put_slice(slice(
                i,
                endpoints,
                if round % 2 == 0 {
                    endpoints - 1
                } else {
                    endpoints
                },
            ));
            s.dirty.extend(touched);
        }
        let t = Instant::now();
        syncer.sync().await;
        partial.push(t.elapsed());
        // Let the stale-chain timer pass so each round deletes what the one before emptied.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    partial.sort();
    println!(
        "  partial sync after one Service's endpoints change: p50 {:.2?}, p99 {:.2?} (30 rounds)",
        percentile(&partial, 0.5),
        percentile(&partial, 0.99)
    );
}
