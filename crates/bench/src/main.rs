//! `capstan-bench`: a load tool for any Kubernetes API server — Capstan or kube-apiserver —
//! through the public API only, so one run can be pointed at both.
//!
//! `capstan-bench <scenario> --kubeconfig FILE [--count N] [--concurrency C] [--watchers W]
//! [--updates M] [--json FILE] [--server-pid PID]…`. Every scenario works in its own namespace
//! and deletes what it created; each prints a table and can write a JSON report.

mod abuse;
mod churn;
mod process;
mod proxy;
mod watch;

/// The same allocator as the server, so the client's own cost stays small under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(name = "capstan-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ScenarioName {
    Create,
    Get,
    List,
    Watch,
    Update,
    Delete,
    Mixed,
    EndpointsChurn,
    ApiserviceProxy,
    Abuse,
}

#[derive(Subcommand)]
enum Scenario {
    /// Create N services from C concurrent clients.
    Create(Args),
    /// Random gets of existing services.
    Get(Args),
    /// Full lists of N services (JSON and Table) and paginated lists (limit=500).
    List(Args),
    /// W watchers on services, M updates: delivery latency and missed events.
    Watch(Args),
    /// Update throughput (a label change per service).
    Update(Args),
    /// Delete throughput.
    Delete(Args),
    /// A steady read/write mix at a fixed rate; latency percentiles per interval.
    Mixed(Args),
    /// S services x P pods; a share of the pods flips readiness every second: delay from each
    /// pod status write to the Endpoints event showing it, and the server's CPU by thread.
    EndpointsChurn(Args),
    /// What the aggregation proxy adds: a backend run by the bench, registered with an
    /// APIService; the same GETs at a fixed rate straight to it and through the server.
    ApiserviceProxy(Args),
    /// A fuzzing campaign: --count generated requests (mutated paths, parameters, headers,
    /// media types and bodies of every kind and patch type, some malformed HTTP), every answer
    /// classified; undocumented 5xx and dropped connections are findings.
    Abuse(Args),
}

#[derive(clap::Args, Clone)]
struct Args {
    /// Kubeconfig of the server to measure (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,
    /// Server URL, instead of a kubeconfig (with --token and --certificate-authority or --insecure).
    #[arg(long)]
    server: Option<String>,
    /// Bearer token for --server.
    #[arg(long)]
    token: Option<String>,
    /// CA certificate (PEM file) for --server.
    #[arg(long)]
    certificate_authority: Option<std::path::PathBuf>,
    /// Skip TLS verification for --server.
    #[arg(long)]
    insecure: bool,
    /// Speak HTTP/2 (as client-go does by default): the kube client's requests share one
    /// connection, and the watch scenario's watchers are multiplexed over --connections.
    #[arg(long)]
    http2: bool,
    /// Connections the watch scenario's watchers share with --http2 (1: every watch on one
    /// connection, as one client-go process's informers).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Services (create, get, list, update, delete fixtures).
    #[arg(long, default_value_t = 10_000)]
    count: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Watchers (watch).
    #[arg(long, default_value_t = 1_000)]
    watchers: usize,
    /// Updates observed by the watchers (watch).
    #[arg(long, default_value_t = 100)]
    updates: usize,
    /// Requests per second (mixed).
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Services (endpoints-churn).
    #[arg(long, default_value_t = 1_000)]
    services: usize,
    /// Pods per service (endpoints-churn).
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Percent of the pods that flip readiness each second (endpoints-churn).
    #[arg(long, default_value_t = 1.0)]
    flip_percent: f64,
    /// Address for the backend apiservice-proxy runs (an IP of this machine the server can
    /// reach; Capstan's Endpoints refuse loopback).
    #[arg(long)]
    backend_address: Option<String>,
    /// Seconds to run (mixed, endpoints-churn, apiservice-proxy).
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Sample RSS and CPU of these server processes during the run (repeatable).
    #[arg(long = "server-pid")]
    server_pids: Vec<u32>,
    /// Namespace to work in (default: a fresh `capstan-bench-xxxxx`, deleted afterwards).
    #[arg(long)]
    namespace: Option<String>,
    /// Keep what the scenario created (no clean-up).
    #[arg(long)]
    keep: bool,
    /// Seed of the generated requests (abuse); each connection uses seed + its index.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The server's log, searched for panics afterwards (abuse).
    #[arg(long)]
    server_log: Option<std::path::PathBuf>,
}

fn latency_json(histogram: &Histogram<u64>) -> Value {
    let ms = |micros: u64| (micros as f64 / 1000.0 * 1000.0).round() / 1000.0;
    json!({
        "p50": ms(histogram.value_at_quantile(0.50)),
        "p90": ms(histogram.value_at_quantile(0.90)),
        "p99": ms(histogram.value_at_quantile(0.99)),
        "max": ms(histogram.max()),
        "count": histogram.len(),
    })
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits are valid"))
    })
}

/// [`line`] of what [`run`] measured.
/// Starts `task` `rate` times a second for `seconds`, at most
/// `concurrency × 8` at once, with progress on stderr; returns, when every task has ended, how
/// many were started.
async fn open_loop<F, Fut>(
    (label, rate, seconds): (&str, u64, u64),
    concurrency: usize,
    task: F,
) -> u64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let limit = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1) * 8));
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        ticker.tick().await;
        let Ok(permit) = limit.clone().acquire_owned().await else {
            break;
        };
        sent += 1;
        let work = task();
        tokio::spawn(async move {
            work.await;
            drop(permit);
        });
        if sent.is_multiple_of(rate.max(1)) {
            eprint!(
                "\r{label}: {:.0}s / {seconds}s        ",
                started.elapsed().as_secs_f64()
            );
        }
    }
    let _ = limit.acquire_many(concurrency.max(1) as u32 * 8).await;
    eprint!("\r{:80}\r", "");
    sent
}

fn measured_line(what: &str, count: usize, measured: (Duration, Histogram<u64>)) -> Value {
    line(what, count, measured.0, &measured.1)
}

fn line(what: &str, count: usize, elapsed: Duration, latencies: &Histogram<u64>) -> Value {
    let throughput = count as f64 / elapsed.as_secs_f64().max(1e-9);
    println!(
        "{what:<22} {count:>8} {:>9.2}s {:>10.0}/s   p50 {:>8.2} ms  p90 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms",
        elapsed.as_secs_f64(),
        throughput,
        latencies.value_at_quantile(0.5) as f64 / 1000.0,
        latencies.value_at_quantile(0.9) as f64 / 1000.0,
        latencies.value_at_quantile(0.99) as f64 / 1000.0,
        latencies.max() as f64 / 1000.0,
    );
    json!({
        "operations": count,
        "elapsed_seconds": elapsed.as_secs_f64(),
        "throughput_per_second": throughput,
        "latency_ms": latency_json(latencies),
    })
}

/// A live progress line on stderr while a phase runs.
fn progress(label: String, done: Arc<AtomicUsize>, total: usize) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let n = done.load(Ordering::Relaxed);
            let rate = n as f64 / started.elapsed().as_secs_f64();
            eprint!("\r{label}: {n}/{total} ({rate:.0}/s)        ");
            if n >= total {
                break;
            }
        }
    })
}

/// Runs `op(i)` for i in 0..count from `concurrency` tasks; returns elapsed time and latencies.
async fn run<F, Fut>(
    label: &str,
    count: usize,
    concurrency: usize,
    op: F,
) -> anyhow::Result<(Duration, Histogram<u64>)>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let ticker = progress(label.to_string(), done.clone(), count);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (op, next, done) = (op.clone(), next.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = histogram();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let t = Instant::now();
                op(i).await?;
                let _ = latencies.record(t.elapsed().as_micros().max(1) as u64);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut total = histogram();
    for task in tasks {
        total
            .add(task.await.context("worker panicked")??)
            .context("merging latencies")?;
    }
    let elapsed = started.elapsed();
    ticker.abort();
    eprint!("\r{:80}\r", "");
    Ok((elapsed, total))
}

fn service(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "capstan-bench"}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))
    .unwrap_or_default()
}

/// A kube client that speaks only HTTP/2 (ALPN `h2`), with the kubeconfig's TLS settings and
/// credentials applied by kube's own layers; its requests share one connection.
fn http2_client<L>(config: &kube::Config, counted: L) -> anyhow::Result<kube::Client>
where
    L: tower::Layer<
            tower::util::BoxCloneService<
                http::Request<kube::client::Body>,
                http::Response<hyper::body::Incoming>,
                tower::BoxError,
            >,
        >,
    L::Service: tower::Service<
            http::Request<kube::client::Body>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        > + Send
        + Clone
        + 'static,
    <L::Service as tower::Service<http::Request<kube::client::Body>>>::Future: Send,
{
    use kube::client::ConfigExt;
    // hyper-rustls sets the ALPN protocols itself (`h2` only, with `enable_http2` alone).
    let tls = config.rustls_client_config()?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build(https);
    let base = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    let service = counted.layer(tower::util::BoxCloneService::new(base));
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// Requests sent to the server under test (by the kube client and the watch scenario's readers).
static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn name(i: usize) -> String {
    format!("svc-{i:06}")
}

async fn client(args: &Args) -> anyhow::Result<(kube::Client, kube::Config, String)> {
    let config = if let Some(server) = &args.server {
        let mut cluster = serde_json::json!({"server": server});
        if args.insecure {
            cluster["insecure-skip-tls-verify"] = true.into();
        }
        if let Some(ca) = &args.certificate_authority {
            cluster["certificate-authority"] = ca.display().to_string().into();
        }
        let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": {"token": args.token.clone().unwrap_or_default()}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }))
        .context("building a kubeconfig for --server")?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
    } else if let Some(path) = &args.kubeconfig {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("reading {}", path.display()))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
    } else {
        kube::Config::infer()
            .await
            .context("no --kubeconfig or --server, and no default kubeconfig")?
    };
    let url = config.cluster_url.to_string();
    // Every request to the server is counted, for the server's CPU per 1,000 requests.
    let counted = tower::util::MapRequestLayer::new(|request| {
        REQUESTS.fetch_add(1, Ordering::Relaxed);
        request
    });
    let client = if args.http2 {
        http2_client(&config, counted)?
    } else {
        kube::client::ClientBuilder::try_from(config.clone())?
            .with_layer(&counted)
            .build()
    };
    Ok((client, config, url))
}

struct Bench {
    client: kube::Client,
    config: kube::Config,
    namespace: String,
    owns_namespace: bool,
    args: Args,
}

impl Bench {
    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// APIServices, untyped (k8s-openapi has no apiregistration types).
    fn apiservices(&self) -> Api<kube::api::DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &kube::api::ApiResource {
                group: "apiregistration.k8s.io".into(),
                version: "v1".into(),
                api_version: "apiregistration.k8s.io/v1".into(),
                kind: "APIService".into(),
                plural: "apiservices".into(),
            },
        )
    }

    async fn prepare(&self) -> anyhow::Result<()> {
        if self.owns_namespace {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": self.namespace}}))?;
            namespaces
                .create(&PostParams::default(), &ns)
                .await
                .context("creating the benchmark namespace")?;
        }
        Ok(())
    }

    async fn cleanup(&self) {
        churn::delete_pods(self).await;
        let api = self.services();
        let _ = api
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels("app=capstan-bench"),
            )
            .await;
        if self.owns_namespace {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            let _ = namespaces
                .delete(&self.namespace, &DeleteParams::default())
                .await;
        }
    }

    /// Creates `count` services (the measured phase of `create`, the fixture of the others).
    /// Creates the fixture, then times `op` over its objects; the report's line.
    async fn on_fixture<F, Fut>(&self, label: &str, op: F) -> anyhow::Result<Value>
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
    {
        self.create("fixture (create)").await?;
        let measured = run(label, self.args.count, self.args.concurrency, op).await?;
        Ok(measured_line(label, self.args.count, measured))
    }

    async fn create(&self, label: &str) -> anyhow::Result<(Duration, Histogram<u64>)> {
        let api = self.services();
        run(label, self.args.count, self.args.concurrency, move |i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &service(&name(i)))
                    .await
                    .with_context(|| format!("creating {}", name(i)))?;
                Ok(())
            }
        })
        .await
    }

    async fn scenario(&self, which: ScenarioName) -> anyhow::Result<Value> {
        let args = &self.args;
        let api = self.services();
        let mut report = serde_json::Map::new();
        match which {
            ScenarioName::Create => {
                let (elapsed, latencies) = self.create("create").await?;
                report.insert(
                    "create".into(),
                    line("create", args.count, elapsed, &latencies),
                );
            }
            ScenarioName::Get => {
                let count = args.count;
                let measured = self.on_fixture("get", move |_| {
                    let api = api.clone();
                    async move {
                        api.get(&name(fastrand::usize(..count))).await?;
                        Ok(())
                    }
                });
                report.insert("get".into(), measured.await?);
            }
            ScenarioName::List => {
                self.create("fixture (create)").await?;
                let rounds = 10;
                let mut full = histogram();
                let mut table = histogram();
                let mut paged = histogram();
                let started = Instant::now();
                let path = format!("/api/v1/namespaces/{}/services", self.namespace);
                // Lists are timed to the last byte received, not through a typed decode, so
                // the figure is the server's (and the wire's), comparable across servers.
                for _ in 0..rounds {
                    let t = Instant::now();
                    let body = fetch(&self.client, &path, "application/json").await?;
                    let _ = full.record(t.elapsed().as_micros() as u64);
                    let list: ItemCount = serde_json::from_slice(&body)?;
                    anyhow::ensure!(
                        list.items.len() >= args.count,
                        "list returned {} items",
                        list.items.len()
                    );
                }
                let full_elapsed = started.elapsed();
                let started = Instant::now();
                for _ in 0..rounds {
                    let t = Instant::now();
                    let body = fetch(
                        &self.client,
                        &path,
                        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
                    )
                    .await?;
                    let _ = table.record(t.elapsed().as_micros() as u64);
                    anyhow::ensure!(
                        body.starts_with(b"{\"kind\":\"Table\""),
                        "the server did not answer a Table"
                    );
                }
                let table_elapsed = started.elapsed();
                let started = Instant::now();
                // Each page is timed to its last byte, as the full list is; reading the page
                // for its continue token and item count is the client's work, not timed.
                for _ in 0..rounds {
                    let mut waited = Duration::ZERO;
                    let mut seen = 0;
                    let mut token = String::new();
                    loop {
                        let page_path = format!("{path}?limit=500&continue={token}");
                        let t = Instant::now();
                        let body = fetch(&self.client, &page_path, "application/json").await?;
                        waited += t.elapsed();
                        let page: Page = serde_json::from_slice(&body)?;
                        seen += page.items.len();
                        match page.metadata.r#continue.filter(|c| !c.is_empty()) {
                            Some(next) => token = next,
                            None => break,
                        }
                    }
                    anyhow::ensure!(seen >= args.count, "paginated list returned {seen} items");
                    let _ = paged.record(waited.as_micros() as u64);
                }
                let paged_elapsed = started.elapsed();
                report.insert(
                    "list_json".into(),
                    line("list (JSON)", rounds, full_elapsed, &full),
                );
                report.insert(
                    "list_table".into(),
                    line("list (Table)", rounds, table_elapsed, &table),
                );
                report.insert(
                    "list_paginated".into(),
                    line("list (limit=500)", rounds, paged_elapsed, &paged),
                );
            }
            ScenarioName::Update => {
                let measured = self.on_fixture("update", move |i| {
                    let api = api.clone();
                    async move {
                        let patch = json!({"metadata": {"labels": {"capstan-bench/round": "1"}}});
                        api.patch(&name(i), &PatchParams::default(), &Patch::Merge(&patch))
                            .await?;
                        Ok(())
                    }
                });
                report.insert("update".into(), measured.await?);
            }
            ScenarioName::Delete => {
                let measured = self.on_fixture("delete", move |i| {
                    let api = api.clone();
                    async move {
                        api.delete(&name(i), &DeleteParams::default()).await?;
                        Ok(())
                    }
                });
                report.insert("delete".into(), measured.await?);
            }
            ScenarioName::Watch => {
                report.insert("watch".into(), self.watch().await?);
            }
            ScenarioName::Mixed => {
                report.insert("mixed".into(), self.mixed().await?);
            }
            ScenarioName::EndpointsChurn => {
                report.insert("endpoints_churn".into(), self.endpoints_churn().await?);
            }
            ScenarioName::ApiserviceProxy => {
                report.insert("apiservice_proxy".into(), self.apiservice_proxy().await?);
            }
            ScenarioName::Abuse => {
                report.insert("abuse".into(), self.abuse().await?);
            }
        }
        Ok(Value::Object(report))
    }

    async fn mixed(&self) -> anyhow::Result<Value> {
        let args = &self.args;
        let fixture = args.count.min(1_000);
        let api = self.services();
        run("fixture (create)", fixture, args.concurrency, {
            let api = api.clone();
            move |i| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &service(&name(i)))
                        .await?;
                    Ok(())
                }
            }
        })
        .await?;
        let windows: Arc<std::sync::Mutex<Vec<Histogram<u64>>>> = Arc::new(std::sync::Mutex::new(
            (0..args.duration.div_ceil(5) as usize + 1)
                .map(|_| histogram())
                .collect(),
        ));
        let errors = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let task = || {
            let (api, windows, errors) = (api.clone(), windows.clone(), errors.clone());
            async move {
                let t = Instant::now();
                let pick = fastrand::u32(..100);
                let target = name(fastrand::usize(..fixture));
                let result = if pick < 80 {
                    api.get(&target).await.map(|_| ())
                } else if pick < 85 {
                    api.list(&ListParams::default().limit(100))
                        .await
                        .map(|_| ())
                } else {
                    let patch = json!({"metadata": {"labels": {"capstan-bench/touch": fastrand::u32(..1000).to_string()}}});
                    api.patch(&target, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map(|_| ())
                };
                if result.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                let window = (t.duration_since(started).as_secs() / 5) as usize;
                if let Ok(mut windows) = windows.lock()
                    && let Some(h) = windows.get_mut(window)
                {
                    let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                }
            }
        };
        let sent = open_loop(("mixed", args.rate, args.duration), args.concurrency, task).await;
        let windows = windows.lock().map(|w| w.clone()).unwrap_or_default();
        let mut rows = Vec::new();
        println!(
            "mixed: {} req/s for {} s (80% get, 5% list limit=100, 15% patch), {} errors",
            args.rate,
            args.duration,
            errors.load(Ordering::Relaxed)
        );
        for (i, h) in windows.iter().enumerate().filter(|(_, h)| !h.is_empty()) {
            println!(
                "  {:>3}-{:<3}s  {:>7} req   p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
                i * 5,
                i * 5 + 5,
                h.len(),
                h.value_at_quantile(0.5) as f64 / 1000.0,
                h.value_at_quantile(0.99) as f64 / 1000.0,
                h.max() as f64 / 1000.0
            );
            rows.push(json!({"from_second": i * 5, "latency_ms": latency_json(h)}));
        }
        Ok(
            json!({"rate": args.rate, "duration_seconds": args.duration, "requests": sent, "errors": errors.load(Ordering::Relaxed), "windows": rows}),
        )
    }
}

/// A page of a list: its items (not decoded) and continue token.
#[derive(serde::Deserialize)]
struct Page {
    items: Vec<serde::de::IgnoredAny>,
    metadata: PageMeta,
}

#[derive(serde::Deserialize)]
struct PageMeta {
    #[serde(default)]
    r#continue: Option<String>,
}

/// Counts a list's items without decoding them.
#[derive(serde::Deserialize)]
struct ItemCount {
    items: Vec<serde::de::IgnoredAny>,
}

/// GETs a path (a list or a watch) and returns the response's body once its status says
/// success.
pub(crate) async fn open(
    client: &kube::Client,
    path: &str,
    accept: &str,
) -> anyhow::Result<kube::client::Body> {
    let request = http::Request::builder()
        .uri(path)
        .header("accept", accept)
        .body(kube::client::Body::empty())?;
    let response = client.send(request).await?;
    let status = response.status();
    anyhow::ensure!(status.is_success(), "GET {path}: {status}");
    Ok(response.into_body())
}

/// GETs a path and returns the whole body (timed to the last byte; not decoded here).
async fn fetch(client: &kube::Client, path: &str, accept: &str) -> anyhow::Result<bytes::Bytes> {
    use http_body_util::BodyExt;
    use hyper::body::Body;
    let body = open(client, path, accept).await?;
    // Each piece is copied as it arrives, while the next is on its way, so the figure ends
    // with the last byte rather than with a copy of the whole body made after it.
    let mut body = body;
    let mut out = Vec::with_capacity(usize::try_from(body.size_hint().lower()).unwrap_or(0));
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            out.extend_from_slice(&data);
        }
    }
    Ok(out.into())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (which, args) = match cli.scenario {
        Scenario::Create(a) => (ScenarioName::Create, a),
        Scenario::Get(a) => (ScenarioName::Get, a),
        Scenario::List(a) => (ScenarioName::List, a),
        Scenario::Watch(a) => (ScenarioName::Watch, a),
        Scenario::Update(a) => (ScenarioName::Update, a),
        Scenario::Delete(a) => (ScenarioName::Delete, a),
        Scenario::Mixed(a) => (ScenarioName::Mixed, a),
        Scenario::EndpointsChurn(a) => (ScenarioName::EndpointsChurn, a),
        Scenario::ApiserviceProxy(a) => (ScenarioName::ApiserviceProxy, a),
        Scenario::Abuse(a) => (ScenarioName::Abuse, a),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let (client, config, url) = client(&args).await?;
        let namespace = args.namespace.clone().unwrap_or_else(|| {
            format!(
                "capstan-bench-{}",
                (0..5).map(|_| fastrand::lowercase()).collect::<String>()
            )
        });
        let bench = Bench {
            client,
            config,
            owns_namespace: args.namespace.is_none(),
            namespace,
            args: args.clone(),
        };
        println!(
            "capstan-bench {which:?} against {url} (namespace {}, {} clients)",
            bench.namespace, args.concurrency
        );
        let sampler = process::Sampler::start(&args.server_pids);
        let requests_before = REQUESTS.load(Ordering::Relaxed);
        bench.prepare().await?;
        let outcome = bench.scenario(which).await;
        // Server usage covers the scenario, not the clean-up after it.
        let usage = sampler.finish();
        let requests = REQUESTS.load(Ordering::Relaxed) - requests_before;
        let trailing = if outcome.is_ok() {
            let pids = args.server_pids.clone();
            tokio::task::spawn_blocking(move || process::settle(&pids))
                .await
                .ok()
                .flatten()
        } else {
            None
        };
        if !args.keep {
            bench.cleanup().await;
        }
        let mut report = outcome?;
        if let (Some(usage), Value::Object(map)) = (usage, &mut report) {
            let per_thousand = usage.cpu_seconds * 1000.0 / requests.max(1) as f64;
            println!(
                "server: peak RSS {:.1} MiB, {:.2} CPU seconds ({per_thousand:.3} per 1,000 of {requests} requests)",
                usage.peak_rss_mib, usage.cpu_seconds
            );
            println!(
                "server: {:.2} of those CPU seconds in user space, {:.2} in the kernel",
                usage.cpu_seconds - usage.system_seconds,
                usage.system_seconds
            );
            let trailing = trailing.unwrap_or_default();
            let with_trailing = (usage.cpu_seconds + trailing) * 1000.0 / requests.max(1) as f64;
            println!(
                "server: {trailing:.2} more CPU seconds before it went idle (work the scenario left queued, such as controllers catching up): {with_trailing:.3} per 1,000 requests with it"
            );
            map.insert(
                "server".into(),
                json!({
                    "peak_rss_mib": usage.peak_rss_mib,
                    "cpu_seconds": usage.cpu_seconds,
                    "system_seconds": usage.system_seconds,
                    "requests": requests,
                    "cpu_seconds_per_1000_requests": per_thousand,
                    "cpu_seconds_after_scenario": trailing,
                    "cpu_seconds_per_1000_requests_until_idle": with_trailing,
                }),
            );
        }
        if let Value::Object(map) = &mut report {
            map.insert(
                "scenario".into(),
                json!(format!("{which:?}").to_lowercase()),
            );
            map.insert("server_url".into(), json!(url));
            map.insert("count".into(), json!(args.count));
            map.insert("concurrency".into(), json!(args.concurrency));
        }
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(&report)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    })
}
