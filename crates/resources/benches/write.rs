//! The registry's write path in process, without HTTP or controllers: Service creates as the
//! create handler makes them, and a controller's Endpoints update (one of 50 pods flipping
//! readiness, as `capstan-bench endpoints-churn` drives), on the embedded store with its watch
//! cache, each write durable as in `capstan serve`.
//!
//! Figures are CPU time per write (what issues 17 and 18 count): the whole process's, and the
//! one thread's that runs the registry and the watch cache (the storage engine commits on a
//! thread of its own). One write at a time, so every write is its own commit.
//!
//! `cargo bench -p capstan-resources --bench write` (env `CAPSTAN_BENCH_ITERATIONS`, default
//! 2,000 writes per figure).

use std::time::Instant;

use capstan_registry::{Subresource, WriteOptions};
use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints};
use serde_json::json;

#[path = "../tests/support/mod.rs"]
mod support;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// CPU time so far, in seconds (user and system, from `/proc`): of this process (`self`) or of
/// this thread (`thread-self`).
fn cpu_seconds(of: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{of}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let ticks: Vec<f64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse().ok())
        .collect();
    ticks.iter().sum::<f64>() / 100.0
}

/// Runs `count` writes and prints CPU and wall time per write.
async fn measure<F: std::future::Future<Output = ()>>(
    label: &str,
    count: usize,
    mut write: impl FnMut(usize) -> F,
) {
    let (cpu, thread, wall) = (
        cpu_seconds("self"),
        cpu_seconds("thread-self"),
        Instant::now(),
    );
    for i in 0..count {
        write(i).await;
    }
    let per = |seconds: f64| seconds * 1e6 / count as f64;
    println!(
        "{label:<40} {:>6.1} µs CPU ({:>6.1} µs registry and cache, the rest storage), {:>6.1} µs wall per write",
        per(cpu_seconds("self") - cpu),
        per(cpu_seconds("thread-self") - thread),
        per(wall.elapsed().as_secs_f64())
    );
}

fn options(manager: &str) -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_manager: manager.into(),
        applied: false,
    }
}

/// A subset's ready and not-ready addresses.
type Subset = (Vec<EndpointAddress>, Vec<EndpointAddress>);

/// Endpoints of 50 pods, the first `not_ready` of them not ready.
fn addresses(service: usize, not_ready: usize) -> Subset {
    let all: Vec<EndpointAddress> = (0..50)
        .map(|pod| {
            serde_json::from_value(json!({
                "ip": format!("10.{}.{}.{}", service / 250, service % 250, pod + 1),
                "nodeName": "node-1",
                "targetRef": {"kind": "Pod", "namespace": "bench",
                              "name": format!("svc-{service}-pod-{pod}"),
                              "uid": format!("00000000-0000-0000-{service:04}-{pod:012}")}
            }))
            .unwrap_or_default()
        })
        .collect();
    let (not, ready) = all.split_at(not_ready);
    (ready.to_vec(), not.to_vec())
}

fn main() {
    let count: usize = std::env::var("CAPSTAN_BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let registry = support::registries(dir.path()).await;
        let (services, endpoints) = (registry("Service"), registry("Endpoints"));

        let created = options("capstan-bench");
        measure("Service create (capstan-bench's body)", count, |i| {
            let body = json!({"metadata": {"name": format!("svc-{i}"), "labels": {"app": format!("svc-{i}")}},
                "spec": {"selector": {"app": format!("svc-{i}")},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}});
            let services = &services;
            let created = &created;
            async move {
                services.create("bench", body, created).await.expect("created");
            }
        })
        .await;

        let controller = options("endpoint-controller");
        for service in 0..100 {
            let (ready, not_ready) = addresses(service, 0);
            let body = json!({"metadata": {"name": format!("svc-{service}")},
                "subsets": [{"addresses": ready, "notReadyAddresses": not_ready,
                             "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]});
            endpoints
                .create("bench", body, &controller)
                .await
                .expect("created");
        }
        // What the controller computes, made before measuring: only the write is measured.
        let subsets: Vec<[Subset; 2]> = (0..100)
            .map(|service| [addresses(service, 0), addresses(service, 1)])
            .collect();
        measure("Endpoints update, 50 pods, one flips", count, |i| {
            let (service, flipped) = (i % 100, (i / 100) % 2);
            let (endpoints, controller) = (&endpoints, &controller);
            let (ready, not_ready) = subsets[service][flipped].clone();
            async move {
                endpoints
                    .patch_typed(
                        "bench",
                        &format!("svc-{service}"),
                        controller,
                        Subresource::Main,
                        |mut current: Endpoints| {
                            let (ready, not_ready) = (ready.clone(), not_ready.clone());
                            if let Some(subset) = current.subsets.iter_mut().flatten().next() {
                                subset.addresses = Some(ready).filter(|a| !a.is_empty());
                                subset.not_ready_addresses =
                                    Some(not_ready).filter(|a| !a.is_empty());
                            }
                            Ok(current)
                        },
                    )
                    .await
                    .expect("updated");
            }
        })
        .await;
    });
}
