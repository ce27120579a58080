//! The registry's write path in process, without HTTP or controllers: Service creates as the
//! create handler makes them, and a controller's Endpoints update (one of 50 pods flipping
//! readiness, as `capstan-bench endpoints-churn` drives) and the EndpointSlice controller's
//! update of the same flip in a 50-endpoint slice, on the embedded store with its watch cache,
//! each write durable as in `capstan serve`.
//!
//! Figures are CPU time per write (what issues 17 and 18 count): the whole process's, and the
//! one thread's that runs the registry and the watch cache (the storage engine commits on a
//! thread of its own). One write at a time, so every write is its own commit.
//!
//! `cargo bench -p capstan-resources --bench write` (env `CAPSTAN_BENCH_ITERATIONS`, default
//! 2,000 writes per figure; `CAPSTAN_BENCH_ONLY=create|endpoints|slice` measures one figure, for
//! profiles). `scripts/allocations-per-write` counts each figure's allocations per write, with
//! the feature `bench-system-allocator`.

use std::cell::RefCell;
use std::time::Instant;

use capstan_registry::{Subresource, WriteOptions};
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(not(feature = "bench-system-allocator"))]
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

/// Runs `count` writes and prints CPU and wall time per write, unless `CAPSTAN_BENCH_ONLY`
/// names another figure (then nothing is measured; the setup of each figure still runs).
async fn measure<F: std::future::Future<Output = ()>>(
    (figure, label): (&str, &str),
    count: usize,
    mut write: impl FnMut(usize) -> F,
) {
    if std::env::var("CAPSTAN_BENCH_ONLY").is_ok_and(|only| only != figure) {
        return;
    }
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

/// A 50-endpoint slice of one Service as the EndpointSlice controller writes it, the first
/// `not_ready` endpoints not ready.
fn slice(service: usize, not_ready: usize) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = (0..50)
        .map(|pod| {
            let ready = pod >= not_ready;
            json!({
                "addresses": [format!("10.{}.{}.{}", service / 250, service % 250, pod + 1)],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
                "targetRef": {"kind": "Pod", "namespace": "bench",
                              "name": format!("svc-{service}-pod-{pod}"),
                              "uid": format!("00000000-0000-0000-{service:04}-{pod:012}")},
                "nodeName": "node-1",
                "zone": "zone-a"
            })
        })
        .collect();
    json!({
        "metadata": {
            "name": format!("svc-{service}-abcde"),
            "labels": {"kubernetes.io/service-name": format!("svc-{service}"),
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-27T10:00:00Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": format!("svc-{service}"),
                                 "uid": format!("00000000-0000-0000-0000-{service:012}"),
                                 "controller": true, "blockOwnerDeletion": true}]
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    })
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
        measure(("create", "Service create (capstan-bench's body)"), count, |i| {
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
        measure(("endpoints", "Endpoints update, 50 pods, one flips"), count, |i| {
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
                        |current: &Endpoints| {
                            // As the controller: the stored metadata, the computed subsets.
                            let ports = current.subsets.iter().flatten().next();
                            Ok(Endpoints {
                                metadata: current.metadata.clone(),
                                subsets: Some(vec![EndpointSubset {
                                    addresses: Some(ready.clone()).filter(|a| !a.is_empty()),
                                    not_ready_addresses: Some(not_ready.clone())
                                        .filter(|a| !a.is_empty()),
                                    ports: ports.and_then(|s| s.ports.clone()),
                                }]),
                            })
                        },
                    )
                    .await
                    .expect("updated");
            }
        })
        .await;

        // The EndpointSlice controller's update of the same flip: the slice it read, with one
        // endpoint's conditions changed, written at the revision it read.
        let (slices, slice_controller) = (
            registry("EndpointSlice"),
            options("endpointslice-controller.k8s.io"),
        );
        let mut read: Vec<[EndpointSlice; 2]> = Vec::new();
        for service in 0..100 {
            let created = slices
                .create("bench", slice(service, 0), &slice_controller)
                .await
                .expect("created");
            let version = &created["metadata"]["resourceVersion"];
            let flipped = |not_ready| {
                let mut object = slice(service, not_ready);
                object["metadata"]["resourceVersion"] = version.clone();
                serde_json::from_value::<EndpointSlice>(object).expect("a slice")
            };
            read.push([flipped(0), flipped(1)]);
        }
        let read = RefCell::new(read);
        measure(("slice", "EndpointSlice update, 50 endpoints, one flips"), count, |i| {
            let (service, flip) = (i % 100, 1 - (i / 100) % 2);
            let new = read.borrow()[service][flip].clone();
            let (slices, slice_controller, read) = (&slices, &slice_controller, &read);
            async move {
                let (stored, _) = slices
                    .update_typed_over(
                        "bench",
                        &format!("svc-{service}-abcde"),
                        (&new, None),
                        slice_controller,
                        Subresource::Main,
                    )
                    .await
                    .expect("updated");
                let version = stored["metadata"]["resourceVersion"].as_str().map(String::from);
                for object in read.borrow_mut()[service].iter_mut() {
                    object.metadata.resource_version = version.clone();
                }
            }
        })
        .await;
    });
}
