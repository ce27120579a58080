//! Capstan's HTTPS API server.
//!
//! Start with [`ApiServer`]: it authenticates a request, routes it (discovery, OpenAPI, health,
//! or a resource), and hands resource requests to the generic verb handlers in [`handlers`],
//! which call the kind's [`capstan_registry::Registry`]. [`serve`] runs it on a TLS listener
//! and shuts down gracefully.

pub mod aggregator;
pub mod discovery;
pub mod handlers;
pub mod openapi;
pub mod pki;
pub mod request;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use capstan_machinery::ApiError;
use capstan_registry::Registry;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::handlers::{Call, ResourceRequest};
use crate::request::{Body, Encoding, Query, error_response, json_response, text_response};

/// The API server's state.
pub struct ApiServer {
    registries: Vec<Arc<Registry>>,
    aggregator: aggregator::Aggregator,
    token: String,
    server_address: String,
    shutting_down: AtomicBool,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl ApiServer {
    /// A server for these kinds, accepting `token`, advertising `server_address`.
    pub fn new(registries: Vec<Arc<Registry>>, token: String, server_address: String) -> Self {
        let (shutdown, _) = tokio::sync::watch::channel(false);
        ApiServer {
            aggregator: aggregator::Aggregator::new(&registries),
            registries,
            token,
            server_address,
            shutting_down: AtomicBool::new(false),
            shutdown,
        }
    }

    /// Begins shutdown: `/readyz` fails and open watches end.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.shutdown.send_replace(true);
    }

    fn authenticated(&self, request: &Request<Incoming>) -> bool {
        let Some(value) = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let Some(token) = value.strip_prefix("Bearer ").map(str::trim) else {
            return false;
        };
        // Constant-time comparison.
        token.len() == self.token.len()
            && token
                .bytes()
                .zip(self.token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// Handles one request.
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<Body> {
        let mut response = self.route(request).await;
        let headers = response.headers_mut();
        if let Ok(id) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()) {
            headers.insert("audit-id", id);
        }
        response
    }

    async fn route(self: Arc<Self>, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_string();
        let query = Query::parse(request.uri().query());
        let public = matches!(
            path.as_str(),
            "/version" | "/healthz" | "/livez" | "/readyz"
        ) || path.starts_with("/healthz/")
            || path.starts_with("/livez/")
            || path.starts_with("/readyz/");
        if !public && !self.authenticated(&request) {
            return error_response(&ApiError::unauthorized(), Encoding::json());
        }
        if let Some(response) = self.health(&path, &query) {
            return response;
        }
        let accept = request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if path.starts_with("/openapi/") {
            if request.method() != Method::GET {
                return error_response(&ApiError::method_not_allowed(), Encoding::json());
            }
            if let Some(response) = openapi::serve(&path, &query, &accept) {
                return response;
            }
        }
        let pretty = query.flag("pretty").unwrap_or(false);
        let discovery = |value: serde_json::Value| json_response(StatusCode::OK, &value, pretty);
        match path.trim_end_matches('/') {
            "/version" => return discovery(discovery::version()),
            "/api" => {
                return match discovery::wants_aggregated(&accept) {
                    Some(version) => aggregated(
                        &request,
                        discovery::aggregated_core(&self.registries, version),
                        version,
                    ),
                    None => discovery(discovery::api_versions(&self.server_address)),
                };
            }
            "/api/v1" => return discovery(discovery::core_resources(&self.registries)),
            "/apis" => {
                return match discovery::wants_aggregated(&accept) {
                    Some(version) => {
                        let remote = self.aggregator.aggregated_groups().await;
                        aggregated(
                            &request,
                            discovery::aggregated_groups(&self.registries, version, remote),
                            version,
                        )
                    }
                    None => discovery(discovery::api_groups(self.aggregator.legacy_groups().await)),
                };
            }
            _ => {}
        }
        if let Some(rest) = path.strip_prefix("/apis/") {
            return self.group_request(rest, request, query, pretty).await;
        }
        if let Some(rest) = path.strip_prefix("/api/v1/") {
            return self.resource("", "v1", rest, request, query).await;
        }
        text_response(StatusCode::NOT_FOUND, "404 page not found\n")
    }

    /// `/apis/<group>[/<version>[/…]]`: an APIService's backend (proxied), or a group Capstan
    /// serves itself, or 404.
    async fn group_request(
        &self,
        rest: &str,
        request: Request<Incoming>,
        query: Query,
        pretty: bool,
    ) -> Response<Body> {
        let not_found = || text_response(StatusCode::NOT_FOUND, "404 page not found\n");
        let mut segments = rest.splitn(3, '/');
        let group = segments.next().unwrap_or("");
        let version = segments.next().filter(|v| !v.is_empty());
        let tail = segments.next().unwrap_or("");
        let Some(version) = version else {
            if discovery::serves_group(&self.registries, group) {
                return json_response(
                    StatusCode::OK,
                    &discovery::local_group(&self.registries, group),
                    pretty,
                );
            }
            return match self.aggregator.legacy_group(group).await {
                Some(document) => json_response(StatusCode::OK, &document, pretty),
                None => not_found(),
            };
        };
        // The server's own groups always win over an APIService claiming them.
        if !discovery::serves(&self.registries, group, version) {
            return match self.aggregator.find_remote(group, version).await {
                Some(apiservice) => self.aggregator.proxy(&apiservice, request).await,
                None => not_found(),
            };
        }
        if tail.is_empty() {
            return json_response(
                StatusCode::OK,
                &discovery::group_resources(&self.registries, group, version),
                pretty,
            );
        }
        self.resource(group, version, tail, request, query).await
    }

    /// A request under a group/version Capstan serves: to its kind's verb handler, or the
    /// NotFound `Status` when the path names no resource.
    async fn resource(
        &self,
        group: &str,
        version: &str,
        rest: &str,
        request: Request<Incoming>,
        query: Query,
    ) -> Response<Body> {
        let Some(resource) = self.resource_request(group, version, rest) else {
            return error_response(&ApiError::resource_not_found(), Encoding::json());
        };
        let (parts, body) = request.into_parts();
        let call = Call {
            method: parts.method,
            headers: parts.headers,
            query,
            body: Some(body),
            shutdown: self.shutdown.subscribe(),
        };
        handlers::handle(resource, call).await
    }

    fn resource_request(&self, group: &str, version: &str, rest: &str) -> Option<ResourceRequest> {
        let mut parts: Vec<&str> = rest.split('/').collect();
        if parts.last() == Some(&"") {
            parts.pop();
        }
        let mut watch_path = false;
        if parts.first() == Some(&"watch") {
            watch_path = true;
            parts.remove(0);
        }
        let mut namespace = String::new();
        if parts.first() == Some(&"namespaces")
            && parts.len() >= 3
            && !matches!(parts[2], "status" | "finalize")
        {
            namespace = parts[1].to_string();
            parts.drain(..2);
        }
        if parts.is_empty()
            || parts.len() > 3
            || parts
                .iter()
                .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            return None;
        }
        let registry = self
            .registries
            .iter()
            .find(|r| {
                let info = r.strategy().info();
                info.group == group && info.version == version && info.plural == parts[0]
            })?
            .clone();
        let info = registry.strategy().info();
        let name = parts.get(1).map(|s| s.to_string());
        let subresource = parts.get(2).map(|s| s.to_string());
        if let Some(sub) = &subresource
            && (sub != "status" || !info.has_status)
        {
            return None;
        }
        if !info.namespaced && !namespace.is_empty() {
            return None;
        }
        if info.namespaced && namespace.is_empty() && name.is_some() {
            return None;
        }
        Some(ResourceRequest {
            registry,
            namespace,
            name,
            subresource,
            watch_path,
        })
    }

    fn health(&self, path: &str, query: &Query) -> Option<Response<Body>> {
        let (endpoint, only) = match path.trim_start_matches('/').split_once('/') {
            Some((endpoint, check)) => (endpoint, Some(check)),
            None => (path.trim_start_matches('/'), None),
        };
        if !matches!(endpoint, "healthz" | "livez" | "readyz") {
            return None;
        }
        let shutting_down = self.shutting_down.load(Ordering::SeqCst);
        let mut checks: Vec<(&str, bool)> = vec![("ping", true), ("log", true), ("etcd", true)];
        if endpoint == "readyz" {
            checks.extend([
                ("etcd-readiness", true),
                ("informer-sync", true),
                ("shutdown", !shutting_down),
            ]);
        }
        if let Some(name) = only {
            return Some(match checks.iter().find(|(n, _)| *n == name) {
                Some((_, true)) => text_response(StatusCode::OK, "ok"),
                Some((name, false)) => text_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("internal server error: {name} check failed\n"),
                ),
                None => text_response(StatusCode::NOT_FOUND, "404 page not found\n"),
            });
        }
        let excluded: Vec<&str> = query.all("exclude");
        let failed = checks.iter().any(|(n, ok)| !ok && !excluded.contains(n));
        let verbose = query.get("verbose").is_some();
        if !failed && !verbose {
            return Some(text_response(StatusCode::OK, "ok"));
        }
        let mut text = String::new();
        for (name, ok) in &checks {
            if excluded.contains(name) {
                text.push_str(&format!("[+]{name} excluded: ok\n"));
            } else if *ok {
                text.push_str(&format!("[+]{name} ok\n"));
            } else {
                text.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
        for name in &excluded {
            if !checks.iter().any(|(n, _)| n == name) {
                text.push_str(&format!(
                    "warn: some health checks cannot be excluded: no matches for \"{name}\"\n"
                ));
            }
        }
        if failed {
            text.push_str(&format!("{endpoint} check failed\n"));
            Some(text_response(StatusCode::INTERNAL_SERVER_ERROR, text))
        } else {
            text.push_str(&format!("{endpoint} check passed\n"));
            Some(text_response(StatusCode::OK, text))
        }
    }
}

fn aggregated(
    request: &Request<Incoming>,
    value: serde_json::Value,
    version: &str,
) -> Response<Body> {
    let body = serde_json::to_vec(&value).unwrap_or_default();
    let etag = format!("\"{}\"", discovery::sha512_hex(&body));
    let matches = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str());
    let mut response = if matches {
        let mut response = Response::new(request::full(bytes::Bytes::new()));
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        response
    } else {
        Response::new(request::full(body))
    };
    let headers = response.headers_mut();
    if let Ok(content_type) = HeaderValue::from_str(&format!(
        "application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
    )) {
        headers.insert(header::CONTENT_TYPE, content_type);
    }
    if let Ok(etag) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    response
}

/// Serves HTTPS on `listener` until `shutdown` resolves, then drains in-flight requests
/// (up to `drain`) and returns.
pub async fn serve(
    server: Arc<ApiServer>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let server = server.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                .await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper::service::service_fn(move |request| {
                let server = server.clone();
                async move { Ok::<_, std::convert::Infallible>(server.handle(request).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let connection = builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    server.begin_shutdown();
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not finish within the drain period");
    }
}
