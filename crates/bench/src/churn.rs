//! `endpoints-churn`: S Services selecting P pods each (on one Node, in one zone); a fixed share
//! of the pods flips readiness every second (a `/status` write), and one watcher on Endpoints
//! and one on EndpointSlices measure the delay from each pod status write to the update that
//! shows it. The slice watcher also counts what the controller wrote per flip (a flip should
//! change one slice in place, never create or delete one).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::watch::Event;
use crate::{Bench, histogram, latency_json, process, run};

/// The label that ties a pod to its Service in this scenario.
const SELECT: &str = "capstan-bench/ep";
/// The node every pod of the scenario runs on.
const NODE: &str = "capstan-bench";

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
type EndpointsEvent<'a> = Event<'a, EndpointsObject<'a>>;

#[derive(serde::Deserialize)]
struct EndpointsObject<'a> {
    #[serde(borrow)]
    metadata: NameOnly<'a>,
    #[serde(default, borrow)]
    subsets: Vec<Subset<'a>>,
}

#[derive(serde::Deserialize)]
struct NameOnly<'a> {
    #[serde(default, borrow)]
    name: Cow<'a, str>,
}

#[derive(serde::Deserialize)]
struct Subset<'a> {
    #[serde(default, borrow)]
    addresses: Vec<Address<'a>>,
    #[serde(default, rename = "notReadyAddresses", borrow)]
    not_ready: Vec<Address<'a>>,
}

#[derive(serde::Deserialize)]
struct Address<'a> {
    #[serde(borrow)]
    ip: Cow<'a, str>,
}

/// The parts of an EndpointSlice watch line this scenario reads.
type SliceEvent<'a> = Event<'a, SliceObject<'a>>;

#[derive(serde::Deserialize)]
struct SliceObject<'a> {
    #[serde(borrow)]
    metadata: SliceMeta<'a>,
    #[serde(default, borrow)]
    endpoints: Option<Vec<SliceEndpoint<'a>>>,
}

#[derive(serde::Deserialize)]
struct SliceMeta<'a> {
    #[serde(default, borrow)]
    labels: HashMap<Cow<'a, str>, Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct SliceEndpoint<'a> {
    #[serde(default, borrow)]
    addresses: Vec<Cow<'a, str>>,
    #[serde(default)]
    conditions: SliceConditions,
}

#[derive(serde::Deserialize, Default)]
struct SliceConditions {
    ready: Option<bool>,
}

/// What one watch event shows of a Service: its event type, the Service's index, and each IP
/// it shows with whether it shows it ready.
struct Shown<'a> {
    kind: Cow<'a, str>,
    service: usize,
    ips: Vec<(Cow<'a, str>, bool)>,
}

impl Shown<'_> {
    /// Whether the event shows `ip` with readiness `ready`.
    fn shows(&self, ip: &str, ready: bool) -> bool {
        self.ips.iter().any(|(shown, r)| shown == ip && *r == ready)
    }
}

/// Reads what a watch line shows.
type ShownFn = for<'a> fn(&'a [u8]) -> Option<Shown<'a>>;

fn endpoints_shown(line: &[u8]) -> Option<Shown<'_>> {
    let event = serde_json::from_slice::<EndpointsEvent>(line).ok()?;
    let service = service_index(&event.object.metadata.name)?;
    let mut ips = Vec::new();
    for subset in event.object.subsets {
        ips.extend(subset.addresses.into_iter().map(|a| (a.ip, true)));
        ips.extend(subset.not_ready.into_iter().map(|a| (a.ip, false)));
    }
    Some(Shown {
        kind: Cow::Borrowed(""),
        service,
        ips,
    })
}

fn slice_shown(line: &[u8]) -> Option<Shown<'_>> {
    let event = serde_json::from_slice::<SliceEvent>(line).ok()?;
    let service = service_index(
        event
            .object
            .metadata
            .labels
            .get("kubernetes.io/service-name")?,
    )?;
    let mut ips = Vec::new();
    for endpoint in event.object.endpoints.into_iter().flatten() {
        let ready = endpoint.conditions.ready.unwrap_or(true);
        ips.extend(endpoint.addresses.into_iter().map(|ip| (ip, ready)));
    }
    Some(Shown {
        kind: event.kind,
        service,
        ips,
    })
}

fn service_index(name: &str) -> Option<usize> {
    name.strip_prefix("ep-")?.parse().ok()
}

/// The scenario's objects.
fn bench_objects() -> ListParams {
    ListParams::default().labels("app=capstan-bench")
}

/// Polls `complete` (how many of `services` are complete, and the list's resourceVersion)
/// until all are; at most 300 s after `since`.
async fn wait_complete<F, Fut>(
    what: &str,
    services: usize,
    since: Instant,
    complete: F,
) -> anyhow::Result<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(usize, String)>>,
{
    loop {
        let (full, rv) = complete().await?;
        eprint!("\rendpoints-churn: {full}/{services} {what} complete        ");
        if full == services {
            return Ok(rv);
        }
        anyhow::ensure!(
            since.elapsed() < Duration::from_secs(300),
            "only {full} of {services} {what} were complete after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The delays one watcher saw: all of them, and the worst per second of the churn (by when
/// the flip was sent), to tell a steady tail from a few stalls.
struct Delays {
    all: hdrhistogram::Histogram<u64>,
    worst_by_second: Vec<u64>,
    started: Instant,
}

impl Delays {
    fn new(started: Instant) -> Self {
        Delays {
            all: histogram(),
            worst_by_second: Vec::new(),
            started,
        }
    }

    fn record(&mut self, sent: Instant, micros: u64) {
        let _ = self.all.record(micros.max(1));
        let second = sent.saturating_duration_since(self.started).as_secs() as usize;
        if self.worst_by_second.len() <= second {
            self.worst_by_second.resize(second + 1, 0);
        }
        self.worst_by_second[second] = self.worst_by_second[second].max(micros);
    }
}

/// A merge patch of a pod's status. The answer is read, not decoded: the bench shares the
/// server's CPUs, and a typed decode of every answered pod was a tenth of its CPU.
async fn patch_status(client: &kube::Client, path: &str, patch: &Value) -> anyhow::Result<()> {
    use http_body_util::BodyExt;
    let request = http::Request::builder()
        .method(http::Method::PATCH)
        .uri(path)
        .header("content-type", "application/merge-patch+json")
        .header("accept", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(patch)?))?;
    let response = client.send(request).await?;
    let status = response.status();
    response.into_body().collect().await?;
    anyhow::ensure!(status.is_success(), "PATCH {path}: {status}");
    Ok(())
}

/// Flips written and not yet seen, per Service, by pod IP.
type PendingFlips = Arc<Mutex<HashMap<usize, HashMap<String, Pending>>>>;

/// Follows a watch from `rv`, clearing the flips each event shows and recording how long after
/// its write each was seen; counts the events by type.
fn follow_watch(
    client: kube::Client,
    path: String,
    pending: PendingFlips,
    delays: Arc<Mutex<Delays>>,
    counts: Arc<Mutex<HashMap<String, usize>>>,
    done: Arc<AtomicBool>,
    shown: ShownFn,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        use http_body_util::BodyExt;
        let mut body = crate::open(&client, &path, "application/json").await?;
        let mut buffer = bytes::BytesMut::new();
        let mut scanned = 0;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            let arrived = Instant::now();
            buffer.extend_from_slice(&data);
            // Only what arrived since the last look is searched for a line's end.
            while let Some(end) = buffer[scanned..].iter().position(|b| *b == b'\n') {
                let line = buffer.split_to(scanned + end + 1);
                scanned = 0;
                let Some(shown) = shown(&line) else {
                    continue;
                };
                *counts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(shown.kind.to_string())
                    .or_default() += 1;
                let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
                let Some(flips) = pending.get_mut(&shown.service) else {
                    continue;
                };
                let mut delays = delays.lock().unwrap_or_else(|e| e.into_inner());
                flips.retain(|ip, flip| {
                    let seen = shown.shows(ip, flip.ready);
                    if seen {
                        let micros = arrived.duration_since(flip.sent).as_micros();
                        delays.record(flip.sent, micros as u64);
                    }
                    !seen
                });
            }
            scanned = buffer.len();
            if done.load(Ordering::Relaxed) {
                break;
            }
        }
        Ok::<_, anyhow::Error>(())
    })
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
        // The node the pods run on (the EndpointSlice controller reads its zone).
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let node = serde_json::from_value(json!({"metadata": {"name": NODE,
            "labels": {"topology.kubernetes.io/zone": "capstan-bench-zone"}}}))?;
        match nodes.create(&PostParams::default(), &node).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => {
                other?;
            }
        }
        let pod_api = self.pods();
        run("pods (create + ready)", total, args.concurrency, move |k| {
            let api = pod_api.clone();
            async move {
                let (i, j) = (k / per, k % per);
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": pod_name(i, j),
                                 "labels": {"app": "capstan-bench", SELECT: service_name(i)}},
                    "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "capstan-bench",
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
        let rv = wait_complete("Endpoints", services, settle, || async {
            let list = endpoints.list(&bench_objects()).await?;
            let ready = |e: &Endpoints| {
                let subsets = e.subsets.iter().flatten();
                subsets
                    .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
                    .sum::<usize>()
            };
            let full = list.items.iter().filter(|e| ready(e) == per).count();
            Ok((full, list.metadata.resource_version.unwrap_or_default()))
        })
        .await?;
        let settled = settle.elapsed();
        // And every Service's slices.
        let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let slice_rv = wait_complete("Services' slices", services, settle, || async {
            let list = slices.list(&bench_objects()).await?;
            let mut ready: HashMap<String, usize> = HashMap::new();
            for slice in &list.items {
                let labels = slice.metadata.labels.as_ref();
                let service = labels.and_then(|l| l.get("kubernetes.io/service-name"));
                let endpoints = slice.endpoints.iter().flatten();
                let count = endpoints
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                    .count();
                *ready
                    .entry(service.cloned().unwrap_or_default())
                    .or_default() += count;
            }
            let full = ready.values().filter(|n| **n == per).count();
            Ok((full, list.metadata.resource_version.unwrap_or_default()))
        })
        .await?;
        let slices_settled = settle.elapsed();

        // One watcher on Endpoints and one on EndpointSlices; each event clears the flips it
        // shows.
        let pending: PendingFlips = Arc::default();
        let slice_pending: PendingFlips = Arc::default();
        let delays = Arc::new(Mutex::new(Delays::new(Instant::now())));
        let slice_delays = Arc::new(Mutex::new(Delays::new(Instant::now())));
        let slice_events: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let namespace = &self.namespace;
        let watches: [(String, &PendingFlips, _, _, ShownFn); 2] = [
            (
                format!("/api/v1/namespaces/{namespace}/endpoints"),
                &pending,
                &delays,
                Arc::default(),
                endpoints_shown,
            ),
            (
                format!("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"),
                &slice_pending,
                &slice_delays,
                slice_events.clone(),
                slice_shown,
            ),
        ];
        let watchers: Vec<_> = watches
            .into_iter()
            .zip([&rv, &slice_rv])
            .map(|((path, pending, delays, counts, shown), rv)| {
                let path = format!("{path}?watch=1&resourceVersion={rv}&timeoutSeconds=3600");
                let (pending, delays) = (pending.clone(), delays.clone());
                follow_watch(
                    self.client.clone(),
                    path,
                    pending,
                    delays,
                    counts,
                    done.clone(),
                    shown,
                )
            })
            .collect();

        // The churn: `flip_percent` of the pods per second, in 10 ms ticks.
        let per_second = (total as f64 * args.flip_percent / 100.0).max(1.0);
        let threads_before = process::thread_ticks(&args.server_pids);
        let machine_before = process::machine_ticks();
        let sampler = process::Sampler::start(&args.server_pids);
        let ready: Arc<Vec<AtomicBool>> =
            Arc::new((0..total).map(|_| AtomicBool::new(true)).collect());
        let busy: Arc<Vec<AtomicBool>> =
            Arc::new((0..total).map(|_| AtomicBool::new(false)).collect());
        let errors = Arc::new(AtomicUsize::new(0));
        let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1) * 8));
        let started = Instant::now();
        for delays in [&delays, &slice_delays] {
            delays.lock().unwrap_or_else(|e| e.into_inner()).started = started;
        }
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
                let sent = Instant::now();
                for map in [&pending, &slice_pending] {
                    map.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(k / per)
                        .or_default()
                        .insert(ip.clone(), Pending { ready: want, sent });
                }
                let permit = limit.clone().acquire_owned().await?;
                let (client, busy, errors) = (self.client.clone(), busy.clone(), errors.clone());
                let path = format!(
                    "/api/v1/namespaces/{}/pods/{}/status",
                    self.namespace,
                    pod_name(k / per, k % per)
                );
                let maps = [pending.clone(), slice_pending.clone()];
                tokio::spawn(async move {
                    let patch = ready_status(&ip, want);
                    if patch_status(&client, &path, &patch).await.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                        for map in &maps {
                            if let Some(flips) = map
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_mut(&(k / per))
                            {
                                flips.remove(&ip);
                            }
                        }
                    }
                    // Wait until both watches have shown the flip before this pod may flip
                    // again.
                    for _ in 0..3000 {
                        let seen = maps.iter().all(|map| {
                            map.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get(&(k / per))
                                .is_none_or(|f| !f.contains_key(&ip))
                        });
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
        let idle = machine_before
            .zip(process::machine_ticks())
            .map(|(before, after)| process::idle_share(before, after));
        // Flips still unseen after 10 s are missed.
        let deadline = Instant::now() + Duration::from_secs(10);
        let outstanding = |map: &PendingFlips| {
            map.lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(HashMap::len)
                .sum::<usize>()
        };
        while outstanding(&pending) + outstanding(&slice_pending) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let missed = outstanding(&pending);
        let slice_missed = outstanding(&slice_pending);
        done.store(true, Ordering::Relaxed);
        for watcher in &watchers {
            watcher.abort();
        }
        let slice_events = slice_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let count = |kind: &str| slice_events.get(kind).copied().unwrap_or(0);
        eprint!("\r{:80}\r", "");

        let take = |delays: &Arc<Mutex<Delays>>| {
            let delays = delays.lock().unwrap_or_else(|e| e.into_inner());
            (delays.all.clone(), delays.worst_by_second.clone())
        };
        let (delays, _) = take(&delays);
        let errors = errors.load(Ordering::Relaxed);
        println!(
            "endpoints-churn        {services} services x {per} pods, {per_second:.0} flips/s for {:.0} s (Endpoints complete {:.1} s, EndpointSlices {:.1} s after the last pod write)",
            churn.as_secs_f64(),
            settled.as_secs_f64(),
            slices_settled.as_secs_f64()
        );
        let (slice_delays, slice_worst) = take(&slice_delays);
        for (what, delays, missed) in [
            ("Endpoints event", &delays, missed),
            ("slice event    ", &slice_delays, slice_missed),
        ] {
            let ms = |q: f64| delays.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "pod status write -> {what}   {flips} flips, {} seen, missed {missed}, {errors} errors   p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
                delays.len(),
                ms(0.5),
                ms(0.9),
                ms(0.99),
                delays.max() as f64 / 1000.0,
            );
        }
        let worst: Vec<String> = slice_worst
            .iter()
            .map(|micros| format!("{}", micros / 1000))
            .collect();
        println!(
            "slowest slice event of the flips sent in each second (ms): {}",
            worst.join(" ")
        );
        let slice_writes = count("ADDED") + count("MODIFIED") + count("DELETED");
        println!(
            "slice writes during the churn: {} added, {} modified, {} deleted = {:.2} per flip",
            count("ADDED"),
            count("MODIFIED"),
            count("DELETED"),
            slice_writes as f64 / flips.max(1) as f64
        );
        let mut report = json!({
            "slices_settle_seconds": slices_settled.as_secs_f64(),
            "slice_delay_ms": latency_json(&slice_delays),
            "slice_delay_worst_ms_by_second": slice_worst.iter().map(|m| *m as f64 / 1000.0).collect::<Vec<_>>(),
            "slice_missed": slice_missed,
            "slice_events": {"added": count("ADDED"), "modified": count("MODIFIED"), "deleted": count("DELETED")},
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
            for used in threads.iter().take(8) {
                println!(
                    "  thread {:<32} {:>7.2} CPU s  {:>5.1}% of one core, waited {:>6.2} s for a CPU",
                    used.thread,
                    used.cpu_seconds,
                    100.0 * used.cpu_seconds / seconds,
                    used.waited_seconds
                );
            }
            if let Some(idle) = idle {
                println!(
                    "machine during the churn: {:.1}% of its CPU time idle",
                    100.0 * idle
                );
            }
            report["churn_server"] = json!({
                "cpu_seconds": usage.cpu_seconds,
                "cpu_share_of_one_core": usage.cpu_seconds / seconds,
                "machine_idle_share": idle,
                "threads": threads.iter().map(|used| json!({
                    "thread": used.thread,
                    "cpu_seconds": used.cpu_seconds,
                    "waited_for_cpu_seconds": used.waited_seconds,
                })).collect::<Vec<_>>(),
            });
        }
        Ok(report)
    }
}

/// Deletes the pods the scenario made (the namespace may not take them with it). They are on
/// a node, so a plain delete would wait out their grace period for a kubelet that is not
/// there: they go at once, as `kubectl delete --grace-period=0 --force` does.
pub(crate) async fn delete_pods(bench: &Bench) {
    let _ = bench
        .pods()
        .delete_collection(
            &kube::api::DeleteParams::default().grace_period(0),
            &ListParams::default().labels("app=capstan-bench"),
        )
        .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(bench.client.clone());
    let _ = nodes
        .delete(NODE, &kube::api::DeleteParams::default())
        .await;
}
