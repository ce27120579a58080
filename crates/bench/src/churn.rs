//! `endpoints-churn`: S Services selecting P pods each; a fixed share of the pods flips
//! readiness every second (a `/status` write), and one watcher on Endpoints measures the delay
//! from each pod status write to the Endpoints update that shows it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::{Bench, histogram, latency_json, process, run};

/// The label that ties a pod to its Service in this scenario.
const SELECT: &str = "capstan-bench/ep";

fn service_name(i: usize) -> String {
    format!("ep-{i:04}")
}

fn pod_name(service: usize, j: usize) -> String {
    format!("ep-{service:04}-{j:03}")
}

/// A distinct pod IP per pod: 10.128.0.1 upwards.
fn pod_ip(k: usize) -> String {
    let n = (10u32 << 24 | 128 << 16) + k as u32 + 1;
    std::net::Ipv4Addr::from(n).to_string()
}

fn ready_status(ip: &str, ready: bool) -> Value {
    let status = if ready { "True" } else { "False" };
    json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status}],
    }})
}

/// A readiness flip written and not yet seen in the Endpoints: the state it asks for and when
/// its write was sent.
struct Pending {
    ready: bool,
    sent: Instant,
}

/// The parts of an Endpoints watch line this scenario reads.
#[derive(serde::Deserialize)]
struct EndpointsEvent {
    object: EndpointsObject,
}

#[derive(serde::Deserialize)]
struct EndpointsObject {
    metadata: NameOnly,
    #[serde(default)]
    subsets: Vec<Subset>,
}

impl EndpointsObject {
    /// The IPs of one address list (`addresses` or `notReadyAddresses`) of every subset.
    fn ips(&self, list: impl Fn(&Subset) -> &Vec<Address>) -> std::collections::HashSet<&str> {
        self.subsets
            .iter()
            .flat_map(|s| list(s).iter().map(|a| a.ip.as_str()))
            .collect()
    }
}

#[derive(serde::Deserialize)]
struct NameOnly {
    #[serde(default)]
    name: String,
}

#[derive(serde::Deserialize)]
struct Subset {
    #[serde(default)]
    addresses: Vec<Address>,
    #[serde(default, rename = "notReadyAddresses")]
    not_ready: Vec<Address>,
}

#[derive(serde::Deserialize)]
struct Address {
    ip: String,
}

impl Bench {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub(crate) async fn endpoints_churn(&self) -> anyhow::Result<Value> {
        let args = &self.args;
        let (services, per) = (args.services, args.pods);
        let total = services * per;
        let service_api = self.services();
        run("services", services, args.concurrency, move |i| {
            let api = service_api.clone();
            async move {
                let service = serde_json::from_value(json!({
                    "metadata": {"name": service_name(i), "labels": {"app": "capstan-bench"}},
                    "spec": {"selector": {SELECT: service_name(i)},
                             "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
                }))?;
                api.create(&PostParams::default(), &service).await?;
                Ok(())
            }
        })
        .await?;
        let pod_api = self.pods();
        run("pods (create + ready)", total, args.concurrency, move |k| {
            let api = pod_api.clone();
            async move {
                let (i, j) = (k / per, k % per);
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": pod_name(i, j),
                                 "labels": {"app": "capstan-bench", SELECT: service_name(i)}},
                    "spec": {"containers": [{"name": "app", "image": "capstan-bench",
                                             "ports": [{"containerPort": 8080}]}]},
                }))?;
                api.create(&PostParams::default(), &pod).await?;
                api.patch_status(
                    &pod_name(i, j),
                    &PatchParams::default(),
                    &Patch::Merge(&ready_status(&pod_ip(k), true)),
                )
                .await?;
                Ok(())
            }
        })
        .await?;

        // Every Endpoints must show its pods ready before the churn starts.
        let endpoints: Api<Endpoints> = Api::namespaced(self.client.clone(), &self.namespace);
        let settle = Instant::now();
        let rv = loop {
            let list = endpoints
                .list(&ListParams::default().labels("app=capstan-bench"))
                .await?;
            let full = list
                .items
                .iter()
                .filter(|e| {
                    e.subsets.as_ref().is_some_and(|s| {
                        s.iter()
                            .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
                            .sum::<usize>()
                            == per
                    })
                })
                .count();
            eprint!("\rendpoints-churn: {full}/{services} Endpoints complete        ");
            if full == services {
                break list.metadata.resource_version.unwrap_or_default();
            }
            anyhow::ensure!(
                settle.elapsed() < Duration::from_secs(300),
                "only {full} of {services} Endpoints were complete after 300 s"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let settled = settle.elapsed();

        // One watcher on Endpoints; each event clears the flips it shows.
        let pending: Arc<Mutex<HashMap<usize, HashMap<String, Pending>>>> = Arc::default();
        let delays = Arc::new(Mutex::new(histogram()));
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (client, namespace) = (self.client.clone(), self.namespace.clone());
            let (pending, delays, done) = (pending.clone(), delays.clone(), done.clone());
            tokio::spawn(async move {
                use http_body_util::BodyExt;
                let path = format!(
                    "/api/v1/namespaces/{namespace}/endpoints?watch=1&resourceVersion={rv}&timeoutSeconds=3600"
                );
                let request = http::Request::builder()
                    .uri(path)
                    .body(kube::client::Body::empty())?;
                let response = client.send(request).await?;
                anyhow::ensure!(
                    response.status().is_success(),
                    "watch: {}",
                    response.status()
                );
                let mut body = response.into_body();
                let mut buffer = bytes::BytesMut::new();
                while let Some(frame) = body.frame().await {
                    let Ok(data) = frame?.into_data() else {
                        continue;
                    };
                    let arrived = Instant::now();
                    buffer.extend_from_slice(&data);
                    while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                        let line = buffer.split_to(end + 1);
                        let Ok(event) = serde_json::from_slice::<EndpointsEvent>(&line) else {
                            continue;
                        };
                        let Some(service) = event
                            .object
                            .metadata
                            .name
                            .strip_prefix("ep-")
                            .and_then(|n| n.parse::<usize>().ok())
                        else {
                            continue;
                        };
                        let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
                        let Some(flips) = pending.get_mut(&service) else {
                            continue;
                        };
                        let ready = event.object.ips(|s| &s.addresses);
                        let not_ready = event.object.ips(|s| &s.not_ready);
                        let mut delays = delays.lock().unwrap_or_else(|e| e.into_inner());
                        flips.retain(|ip, flip| {
                            let shown = if flip.ready {
                                ready.contains(ip.as_str())
                            } else {
                                not_ready.contains(ip.as_str())
                            };
                            if shown {
                                let micros = arrived.duration_since(flip.sent).as_micros();
                                let _ = delays.record((micros as u64).max(1));
                            }
                            !shown
                        });
                    }
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                }
                Ok::<_, anyhow::Error>(())
            })
        };

        // The churn: `flip_percent` of the pods per second, in 10 ms ticks.
        let per_second = (total as f64 * args.flip_percent / 100.0).max(1.0);
        let threads_before = process::thread_ticks(&args.server_pids);
        let sampler = process::Sampler::start(&args.server_pids);
        let ready: Arc<Vec<AtomicBool>> =
            Arc::new((0..total).map(|_| AtomicBool::new(true)).collect());
        let busy: Arc<Vec<AtomicBool>> =
            Arc::new((0..total).map(|_| AtomicBool::new(false)).collect());
        let errors = Arc::new(AtomicUsize::new(0));
        let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1) * 8));
        let started = Instant::now();
        let mut ticker = tokio::time::interval(Duration::from_millis(10));
        let mut flips = 0usize;
        while started.elapsed() < Duration::from_secs(args.duration) {
            ticker.tick().await;
            let due = (started.elapsed().as_secs_f64() * per_second) as usize;
            while flips < due {
                // A pod with no flip in flight, so every flip is seen on its own.
                let k = loop {
                    let k = fastrand::usize(..total);
                    if !busy[k].swap(true, Ordering::Relaxed) {
                        break k;
                    }
                };
                flips += 1;
                let want = !ready[k].load(Ordering::Relaxed);
                ready[k].store(want, Ordering::Relaxed);
                let ip = pod_ip(k);
                pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(k / per)
                    .or_default()
                    .insert(
                        ip.clone(),
                        Pending {
                            ready: want,
                            sent: Instant::now(),
                        },
                    );
                let permit = limit.clone().acquire_owned().await?;
                let (api, busy, errors) = (self.pods(), busy.clone(), errors.clone());
                let pending = pending.clone();
                tokio::spawn(async move {
                    let patch = ready_status(&ip, want);
                    let name = pod_name(k / per, k % per);
                    if api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .is_err()
                    {
                        errors.fetch_add(1, Ordering::Relaxed);
                        if let Some(flips) = pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_mut(&(k / per))
                        {
                            flips.remove(&ip);
                        }
                    }
                    // Wait until the flip has been seen before this pod may flip again.
                    for _ in 0..3000 {
                        let seen = pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(&(k / per))
                            .is_none_or(|f| !f.contains_key(&ip));
                        if seen {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    busy[k].store(false, Ordering::Relaxed);
                    drop(permit);
                });
            }
            if flips.is_multiple_of(per_second as usize / 2 + 1) {
                eprint!(
                    "\rendpoints-churn: {:.0}s / {}s, {flips} flips        ",
                    started.elapsed().as_secs_f64(),
                    args.duration
                );
            }
        }
        let churn = started.elapsed();
        let usage = sampler.finish();
        let threads =
            process::thread_seconds(&threads_before, &process::thread_ticks(&args.server_pids));
        // Flips still unseen after 10 s are missed.
        let deadline = Instant::now() + Duration::from_secs(10);
        let outstanding = || {
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(HashMap::len)
                .sum::<usize>()
        };
        while outstanding() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let missed = outstanding();
        done.store(true, Ordering::Relaxed);
        watcher.abort();
        eprint!("\r{:80}\r", "");

        let delays = delays.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let errors = errors.load(Ordering::Relaxed);
        println!(
            "endpoints-churn        {services} services x {per} pods, {per_second:.0} flips/s for {:.0} s (Endpoints complete {:.1} s after the last pod write)",
            churn.as_secs_f64(),
            settled.as_secs_f64()
        );
        println!(
            "pod status write -> Endpoints event   {} flips, {} seen, missed {missed}, {errors} errors   p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
            flips,
            delays.len(),
            delays.value_at_quantile(0.5) as f64 / 1000.0,
            delays.value_at_quantile(0.9) as f64 / 1000.0,
            delays.value_at_quantile(0.99) as f64 / 1000.0,
            delays.max() as f64 / 1000.0,
        );
        let mut report = json!({
            "services": services,
            "pods_per_service": per,
            "flips_per_second": per_second,
            "churn_seconds": churn.as_secs_f64(),
            "settle_seconds": settled.as_secs_f64(),
            "flips": flips,
            "seen": delays.len(),
            "missed": missed,
            "errors": errors,
            "delay_ms": latency_json(&delays),
        });
        if let Some(usage) = usage {
            let seconds = churn.as_secs_f64();
            println!(
                "server during the churn: {:.2} CPU seconds = {:.0}% of one core",
                usage.cpu_seconds,
                100.0 * usage.cpu_seconds / seconds
            );
            for (thread, cpu) in threads.iter().take(8) {
                println!(
                    "  thread {thread:<32} {cpu:>7.2} CPU s  {:>5.1}% of one core",
                    100.0 * cpu / seconds
                );
            }
            report["churn_server"] = json!({
                "cpu_seconds": usage.cpu_seconds,
                "cpu_share_of_one_core": usage.cpu_seconds / seconds,
                "threads": threads.iter().map(|(t, s)| json!({"thread": t, "cpu_seconds": s})).collect::<Vec<_>>(),
            });
        }
        Ok(report)
    }
}

/// Deletes the pods the scenario made (the namespace may not take them with it).
pub(crate) async fn delete_pods(bench: &Bench) {
    let _ = bench
        .pods()
        .delete_collection(
            &kube::api::DeleteParams::default(),
            &ListParams::default().labels("app=capstan-bench"),
        )
        .await;
}
