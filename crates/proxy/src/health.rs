//! The proxy's `/healthz` and `/livez` (upstream's `ProxyHealthServer`), and a health check
//! server on each `healthCheckNodePort` (upstream's `ServiceHealthServer`), answering as
//! kube-proxy does: a load balancer sends traffic only to nodes with local endpoints.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::metrics::{Code, Metrics};
use crate::state::{Family, ServiceName};

type Body = Full<hyper::body::Bytes>;

/// Whether the proxy keeps up: a family is unhealthy when a change has waited longer than
/// twice the sync period for its sync.
pub struct ProxyHealth {
    timeout: Duration,
    inner: Mutex<HealthInner>,
    metrics: Arc<Metrics>,
}

struct HealthInner {
    families: BTreeMap<Family, (SystemTime, Option<Instant>)>,
    last_updated: SystemTime,
    node_eligible: bool,
}

impl ProxyHealth {
    /// Health for `families`, unhealthy after `2 × sync_period` behind.
    pub fn new(families: &[Family], sync_period: Duration, metrics: Arc<Metrics>) -> ProxyHealth {
        let now = SystemTime::now();
        ProxyHealth {
            timeout: sync_period * 2,
            inner: Mutex::new(HealthInner {
                families: families.iter().map(|f| (*f, (now, None))).collect(),
                last_updated: now,
                node_eligible: false,
            }),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change was queued for every family.
    pub fn queued(&self) {
        let now = Instant::now();
        for (_, queued) in self.lock().families.values_mut() {
            queued.get_or_insert(now);
        }
    }

    /// A family's rules were synced.
    pub fn updated(&self, family: Family) {
        let mut inner = self.lock();
        let now = SystemTime::now();
        inner.families.insert(family, (now, None));
        inner.last_updated = now;
    }

    /// Whether this node may take traffic: its Node exists, is not being deleted, and is not
    /// tainted for deletion by the cluster autoscaler.
    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_eligible = eligible;
    }

    /// Whether every family is keeping up.
    pub fn healthy(&self) -> bool {
        let inner = self.lock();
        inner
            .families
            .values()
            .all(|(_, queued)| queued.is_none_or(|q| q.elapsed() <= self.timeout))
    }

    /// The `/healthz` (with node eligibility) or `/livez` answer.
    fn answer(&self, with_node: bool) -> (StatusCode, String) {
        let healthy = self.healthy();
        let mut inner = self.lock();
        let eligible = inner.node_eligible;
        let ok = healthy && (!with_node || eligible);
        let now = SystemTime::now();
        if ok {
            inner.last_updated = now;
        }
        let mut status = serde_json::Map::new();
        for (family, (updated, queued)) in &inner.families {
            let family_ok = queued.is_none_or(|q| q.elapsed() <= self.timeout);
            let name = match family {
                Family::V4 => "IPv4",
                Family::V6 => "IPv6",
            };
            status.insert(
                name.to_owned(),
                serde_json::json!({"lastUpdated": rfc3339(*updated), "healthy": family_ok}),
            );
        }
        let mut body = serde_json::Map::new();
        body.insert("lastUpdated".into(), rfc3339(inner.last_updated).into());
        body.insert("currentTime".into(), rfc3339(now).into());
        if with_node {
            body.insert("nodeEligible".into(), eligible.into());
        }
        body.insert("healthy".into(), healthy.into());
        if !status.is_empty() {
            body.insert("status".into(), status.into());
        }
        let code = if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (code, serde_json::Value::Object(body).to_string())
    }
}

/// RFC 3339 with nanoseconds, as Go's `time.Time` marshals to JSON.
fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn json_response(
    code: StatusCode,
    body: String,
    extra: Option<(&'static str, String)>,
) -> Response<Body> {
    let mut builder = Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .header("X-Content-Type-Options", "nosniff");
    if let Some((name, value)) = extra {
        builder = builder.header(name, value);
    }
    builder
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::default()))
}

/// Serves `/healthz` and `/livez` at `addr` until the process ends.
pub async fn serve_proxy_health(addr: SocketAddr, health: Arc<ProxyHealth>) -> anyhow::Result<()> {
    serve_paths(addr, "/healthz and /livez", health, health_response).await
}

/// Serves `/metrics`, `/healthz` and `/proxyMode` at `addr` until the process ends.
pub async fn serve_metrics(addr: SocketAddr, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    serve_paths(addr, "/metrics", metrics, metrics_response).await
}

/// kube-proxy's answer at a path of its health server.
fn health_response(health: &ProxyHealth, path: &str) -> Response<Body> {
    let (metric, with_node) = match path {
        "/healthz" => (&health.metrics.healthz, true),
        "/livez" => (&health.metrics.livez, false),
        _ => {
            return text_response(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "404 page not found\n".into(),
            );
        }
    };
    let (code, body) = health.answer(with_node);
    metric
        .get_or_create(&Code {
            code: code.as_u16().to_string(),
        })
        .inc();
    json_response(code, body, None)
}

/// kube-proxy's answer at a path of its metrics server.
fn metrics_response(metrics: &Metrics, path: &str) -> Response<Body> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/metrics" => text_response(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => text_response(StatusCode::OK, TEXT, "ok".to_owned()),
        "/proxyMode" => text_response(StatusCode::OK, TEXT, "nftables".to_owned()),
        _ => text_response(
            StatusCode::NOT_FOUND,
            TEXT,
            "404 page not found\n".to_owned(),
        ),
    }
}

fn text_response(code: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::default()))
}

/// Listens at `addr` and answers each request with `respond` to its path.
async fn serve_paths<S: Send + Sync + 'static>(
    addr: SocketAddr,
    what: &str,
    state: Arc<S>,
    respond: fn(&S, &str) -> Response<Body>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving {what}");
    serve(listener, move |req: Request<Incoming>| {
        let state = state.clone();
        async move { respond(&state, req.uri().path()) }
    })
    .await
}

async fn serve<F, Fut>(listener: TcpListener, handler: F) -> anyhow::Result<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(%err, "accepting a health or metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let fut = handler(req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

struct CheckServer {
    port: u16,
    count: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// The health check servers, one per Service with a `healthCheckNodePort`.
pub struct HealthChecks {
    servers: HashMap<ServiceName, CheckServer>,
    /// Servers that could not listen yet: (port, local endpoints).
    failed: HashMap<ServiceName, (u16, usize)>,
    addresses: Vec<IpAddr>,
    health: Arc<ProxyHealth>,
}

impl HealthChecks {
    /// Servers listening on `addresses` (the node port addresses; empty: every address).
    pub fn new(addresses: Vec<IpAddr>, health: Arc<ProxyHealth>) -> HealthChecks {
        HealthChecks {
            servers: HashMap::new(),
            failed: HashMap::new(),
            addresses,
            health,
        }
    }

    /// Applies the health check ports and local endpoint counts of the Services a sync
    /// looked at; with `full`, Services not listed lose their servers.
    pub async fn sync(
        &mut self,
        mut updates: Vec<(ServiceName, Option<(u16, usize)>)>,
        full: bool,
    ) {
        // A full sync lists every Service itself; a partial one only the changed.
        for (name, failed) in std::mem::take(&mut self.failed) {
            if !full && !updates.iter().any(|(n, _)| *n == name) {
                updates.push((name, Some(failed)));
            }
        }
        if full {
            let keep: std::collections::HashSet<&ServiceName> = updates
                .iter()
                .filter(|(_, u)| u.is_some())
                .map(|(n, _)| n)
                .collect();
            self.servers.retain(|name, server| {
                let kept = keep.contains(name);
                if !kept {
                    server.task.abort();
                }
                kept
            });
        }
        for (name, update) in updates {
            let Some((port, count)) = update else {
                if let Some(server) = self.servers.remove(&name) {
                    server.task.abort();
                }
                continue;
            };
            if let Some(server) = self.servers.get(&name)
                && server.port == port
            {
                server.count.store(count, Ordering::Relaxed);
                continue;
            }
            if let Some(old) = self.servers.remove(&name) {
                old.task.abort();
            }
            match self.start(&name, port, count).await {
                Ok(server) => {
                    self.servers.insert(name, server);
                }
                Err(err) => {
                    tracing::warn!(
                        service = %format!("{}/{}", name.0, name.1), port, %err,
                        "failed to start healthcheck"
                    );
                    // Tried again at the next sync, whatever it looks at.
                    self.failed.insert(name, (port, count));
                }
            }
        }
    }

    async fn start(
        &self,
        name: &ServiceName,
        port: u16,
        count: usize,
    ) -> anyhow::Result<CheckServer> {
        let addresses: Vec<IpAddr> = if self.addresses.is_empty() {
            vec![IpAddr::from([0, 0, 0, 0])]
        } else {
            self.addresses.clone()
        };
        let mut listeners = Vec::new();
        for ip in addresses {
            listeners.push(TcpListener::bind(SocketAddr::new(ip, port)).await?);
        }
        let count = Arc::new(AtomicUsize::new(count));
        let (ns, svc) = name.clone();
        let health = self.health.clone();
        let answer_count = count.clone();
        let task = tokio::spawn(async move {
            let handler = move |_req: Request<Incoming>| {
                let n = answer_count.load(Ordering::Relaxed);
                let healthy = health.healthy();
                let body = format!(
                    "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {n},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
                    serde_json::Value::from(ns.as_str()),
                    serde_json::Value::from(svc.as_str()),
                );
                let code = if n != 0 && healthy {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let response = json_response(
                    code,
                    body,
                    Some(("X-Load-Balancing-Endpoint-Weight", n.to_string())),
                );
                async move { response }
            };
            // Aborting this task drops the set, which aborts every listener's task.
            let mut tasks = tokio::task::JoinSet::new();
            for listener in listeners {
                tasks.spawn(serve(listener, handler.clone()));
            }
            while tasks.join_next().await.is_some() {}
        });
        Ok(CheckServer { port, count, task })
    }
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        for server in self.servers.values() {
            server.task.abort();
        }
    }
}
