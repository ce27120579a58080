//! Capstan's HTTPS API server.
//!
//! Start with [`ApiServer`]: it authenticates a request, routes it (discovery, OpenAPI, health,
//! or a resource), and hands resource requests to the generic verb handlers in [`handlers`],
//! which call the kind's [`capstan_registry::Registry`]. [`serve`] runs it on a TLS listener
//! and shuts down gracefully.

pub mod compression;
pub mod connection;
pub mod discovery;
pub mod handlers;
mod held;
pub mod limits;
pub mod openapi;
pub mod pki;
pub mod remote;
pub mod request;
pub mod request_info;
pub mod unread;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::unread::RequestBody;
use capstan_machinery::ApiError;
use capstan_registry::Registry;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};

use crate::handlers::{Call, ResourceRequest};
use crate::request::{Body, Query, document_response, text_response};
use crate::request_info::RequestInfo;

/// The API server's state.
pub struct ApiServer {
    registries: Vec<Arc<Registry>>,
    openapi: openapi::Documents,
    remote: Option<Arc<dyn remote::RemoteGroups>>,
    token: String,
    server_address: String,
    shutting_down: AtomicBool,
    shutdown: tokio::sync::watch::Sender<bool>,
    limits: limits::Limits,
    in_flight: limits::InFlight,
    compression: bool,
}

impl ApiServer {
    /// A server for these kinds, accepting `token`, advertising `server_address`, within
    /// `limits`.
    pub fn new(
        registries: Vec<Arc<Registry>>,
        token: String,
        server_address: String,
        limits: limits::Limits,
    ) -> Self {
        let (shutdown, _) = tokio::sync::watch::channel(false);
        ApiServer {
            remote: None,
            openapi: openapi::Documents::of(&registries),
            registries,
            token,
            server_address,
            shutting_down: AtomicBool::new(false),
            shutdown,
            in_flight: limits::InFlight::new(&limits),
            limits,
            compression: true,
        }
    }

    /// Whether large responses are gzipped for clients that accept it
    /// (`--feature-gates APIResponseCompression=…`, on by default as upstream).
    pub fn with_response_compression(mut self, enabled: bool) -> Self {
        self.compression = enabled;
        self
    }

    /// Group versions other servers serve (APIServices' backends) are discovered and reached
    /// through `remote`.
    pub fn with_remote_groups(mut self, remote: Arc<dyn remote::RemoteGroups>) -> Self {
        self.remote = Some(remote);
        self
    }

    /// The kinds served here.
    pub fn registries(&self) -> &[Arc<Registry>] {
        &self.registries
    }

    /// The limits the server enforces.
    pub fn limits(&self) -> &limits::Limits {
        &self.limits
    }

    /// Turns true when the server begins to shut down.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Begins shutdown: `/readyz` fails and open watches end.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.shutdown.send_replace(true);
    }

    fn authenticated(&self, request: &Request<RequestBody>) -> bool {
        request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .is_some_and(|token| constant_time_eq(token.as_bytes(), self.token.as_bytes()))
    }

    /// Handles one request: what it is ([`RequestInfo`], worked out once), its deadline (400
    /// for a malformed `timeout`, 504 when it runs out), authentication, admission against
    /// the in-flight limits (429), then routing. A panic answers 500 instead of taking the
    /// connection down.
    pub async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<Body> {
        use futures_util::FutureExt;
        let query = Query::parse(request.uri().query());
        let info = RequestInfo::new(request.method(), request.uri().path(), &query);
        let mut response = if info.long_running() {
            std::panic::AssertUnwindSafe(self.route(request, info, query, None))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| panicked())
        } else {
            match limits::deadline(&self.limits, &query) {
                Err(error) => request::negotiated_error(&error, request.headers(), &query),
                Ok(timeout) => {
                    let deadline = tokio::time::Instant::now() + timeout;
                    let routed = std::panic::AssertUnwindSafe(self.route(
                        request,
                        info,
                        query,
                        Some(deadline),
                    ))
                    .catch_unwind();
                    let mut response = match tokio::time::timeout_at(deadline, routed).await {
                        Ok(Ok(response)) => response,
                        Ok(Err(_)) => panicked(),
                        Err(_) => limits::timed_out(),
                    };
                    response.extensions_mut().insert(limits::SendBy(deadline));
                    response
                }
            }
        };
        let headers = response.headers_mut();
        if let Ok(id) = HeaderValue::from_str(&capstan_machinery::uid::new_v4_string()) {
            headers.insert("audit-id", id);
        }
        response
    }

    /// Routes an authenticated request. `deadline` is that of a request that takes an
    /// in-flight slot (none for long-running ones); the slot is held until the response body
    /// has been sent.
    async fn route(
        self: Arc<Self>,
        request: Request<RequestBody>,
        info: RequestInfo,
        query: Query,
        deadline: Option<tokio::time::Instant>,
    ) -> Response<Body> {
        if !info.public() && !self.authenticated(&request) {
            return request::negotiated_error(&ApiError::unauthorized(), request.headers(), &query);
        }
        let permit = match deadline.map(|_| self.in_flight.admit(&info)) {
            Some(Err(limits::Overloaded)) => return limits::too_many_requests(),
            Some(Ok(permit)) => permit,
            None => None,
        };
        let permit = permit.map(Arc::new);
        let admitted = limits::Admission {
            deadline,
            slot: permit.clone(),
        };
        let gzip = self.compression && compression::accepts_gzip(request.headers());
        let response = self
            .clone()
            .serve_route(request, info, query, admitted)
            .await;
        let response = if gzip {
            compression::compress(response).await
        } else {
            response
        };
        match permit {
            Some(permit) => request::hold_until_sent(response, permit),
            None => response,
        }
    }

    async fn serve_route(
        self: Arc<Self>,
        request: Request<RequestBody>,
        info: RequestInfo,
        query: Query,
        admission: limits::Admission,
    ) -> Response<Body> {
        let path = info.path.clone();
        if let Some(response) = self.health(&path, &query).await {
            return response;
        }
        // Upstream's index (`routes.Index`): any method, written raw.
        if matches!(path.as_str(), "/" | "/index.html") {
            let remote = match &self.remote {
                Some(remote) => remote.legacy_groups().await,
                None => Vec::new(),
            };
            let paths = discovery::root_paths(&self.registries, &remote);
            return request::raw_json_response(StatusCode::OK, &paths);
        }
        let accept = request::header_text(request.headers(), header::ACCEPT).to_string();
        if path.starts_with("/openapi/") {
            if request.method() != Method::GET {
                return request::negotiated_error(
                    &ApiError::method_not_allowed(),
                    request.headers(),
                    &query,
                );
            }
            if let Some(response) = openapi::serve(&self.openapi, &path, &query, &accept) {
                return response;
            }
        }
        let pretty = request::pretty_requested(request.headers(), &query);
        let discovery = |value: serde_json::Value| document_response(&accept, &value, pretty);
        let root = path.trim_end_matches('/');
        // Upstream serves these through go-restful web services with a GET route alone (what
        // `/apis` and the health paths, plain handlers there, are not).
        let produces = match root {
            "/version" => Some(vec!["application/json"]),
            "/api" | "/api/v1" => Some(capstan_machinery::media::route_produces(false)),
            _ => None,
        };
        if let Some(produces) = produces
            && let Some(refused) = get_route_refusal(&request, &query, &produces)
        {
            return refused;
        }
        match root {
            // `/version` is written raw: it never negotiates (upstream's WriteRawJSON).
            "/version" => {
                return request::raw_json_response(StatusCode::OK, &discovery::version());
            }
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
                        let remote = match &self.remote {
                            Some(remote) => remote.aggregated_groups().await,
                            None => Vec::new(),
                        };
                        aggregated(
                            &request,
                            discovery::aggregated_groups(&self.registries, version, remote),
                            version,
                        )
                    }
                    None => {
                        let remote = match &self.remote {
                            Some(remote) => remote.legacy_groups().await,
                            None => Vec::new(),
                        };
                        discovery(discovery::api_groups(&self.registries, remote))
                    }
                };
            }
            _ => {}
        }
        if let Some(rest) = path.strip_prefix("/apis/") {
            return self
                .group_request(rest, &info, request, query, pretty, admission)
                .await;
        }
        if path.starts_with("/api/v1/") {
            return self.resource(&info, request, query, admission).await;
        }
        // Under `/api` upstream's router (go-restful's `/api` web service) answers every other
        // path with the NotFound Status; outside the API, Go's plain 404.
        if path.starts_with("/api/") {
            return request::negotiated_error(
                &ApiError::resource_not_found(),
                request.headers(),
                &query,
            );
        }
        text_response(StatusCode::NOT_FOUND, "404 page not found\n")
    }

    /// `/apis/<group>[/<version>[/…]]`: an APIService's backend (proxied), or a group Capstan
    /// serves itself, or 404.
    async fn group_request(
        &self,
        rest: &str,
        info: &RequestInfo,
        request: Request<RequestBody>,
        query: Query,
        pretty: bool,
        admission: limits::Admission,
    ) -> Response<Body> {
        let not_found = || text_response(StatusCode::NOT_FOUND, "404 page not found\n");
        let accept = request::header_text(request.headers(), header::ACCEPT).to_string();
        let mut segments = rest.splitn(3, '/');
        let group = segments.next().unwrap_or_default();
        let version = segments.next().filter(|v| !v.is_empty());
        let tail = segments.next().unwrap_or_default();
        // A local group's discovery routes (`/apis/<group>`, `/apis/<group>/<version>`) are
        // go-restful's too.
        let route_refused = || {
            let produces = capstan_machinery::media::route_produces(false);
            get_route_refusal(&request, &query, &produces)
        };
        let Some(version) = version else {
            if discovery::serves_group(&self.registries, group) {
                if let Some(refused) = route_refused() {
                    return refused;
                }
                return document_response(
                    &accept,
                    &discovery::local_group(&self.registries, group),
                    pretty,
                );
            }
            let remote = match &self.remote {
                Some(remote) => remote.legacy_group(group).await,
                None => None,
            };
            return match remote {
                Some(document) => document_response(&accept, &document, pretty),
                None => not_found(),
            };
        };
        // The server's own groups always win over an APIService claiming them.
        if !discovery::serves(&self.registries, group, version) {
            let request = match &self.remote {
                Some(remote) => match remote.proxy(group, version, request).await {
                    Ok(response) => return response,
                    Err(request) => request,
                },
                None => request,
            };
            // A group served here routes all of `/apis/<group>/` (upstream's go-restful group
            // web service): an unknown version is the NotFound Status.
            if discovery::serves_group(&self.registries, group) {
                let headers = request.headers();
                return request::negotiated_error(&ApiError::resource_not_found(), headers, &query);
            }
            return not_found();
        }
        if tail.is_empty() {
            if let Some(refused) = route_refused() {
                return refused;
            }
            return document_response(
                &accept,
                &discovery::group_resources(&self.registries, group, version),
                pretty,
            );
        }
        self.resource(info, request, query, admission).await
    }

    /// A request under a group/version Capstan serves: to its kind's verb handler, or the
    /// NotFound `Status` when the path names no resource.
    async fn resource(
        &self,
        info: &RequestInfo,
        request: Request<RequestBody>,
        query: Query,
        admission: limits::Admission,
    ) -> Response<Body> {
        let Some(resource) = self.resource_request(info) else {
            return request::negotiated_error(
                &ApiError::resource_not_found(),
                request.headers(),
                &query,
            );
        };
        let (parts, body) = request.into_parts();
        let call = Call {
            method: parts.method,
            headers: parts.headers,
            query,
            body: Some(body),
            shutdown: self.shutdown.subscribe(),
            admission,
            min_request_timeout: self.limits.min_request_timeout,
        };
        handlers::handle(resource, call).await
    }

    /// The kind and object a resource request names, when one is served: a known resource of
    /// the group version, a subresource it has, a namespace only for a namespaced kind (and
    /// one for a namespaced object).
    fn resource_request(&self, info: &RequestInfo) -> Option<ResourceRequest> {
        let parts = &info.parts;
        let unservable = |p: &String| p.is_empty() || p == "." || p == "..";
        // Nothing is served through the proxy verb (`/api/v1/proxy/…`).
        if !info.is_resource_request || info.verb == "proxy" {
            return None;
        }
        if parts.len() > 3 || parts.iter().any(unservable) {
            return None;
        }
        let registry = self
            .registries
            .iter()
            .find(|r| {
                let kind = r.strategy().info();
                (kind.group, kind.version, kind.plural)
                    == (&info.api_group, &info.api_version, &info.resource)
            })?
            .clone();
        let kind = registry.strategy().info();
        let served = match info.subresource.as_str() {
            "" => true,
            "status" => kind.has_status,
            "finalize" => kind.has_finalize,
            _ => false,
        };
        let namespace = info.collection_namespace();
        if !served || (!kind.namespaced && !namespace.is_empty()) {
            return None;
        }
        if kind.namespaced && namespace.is_empty() && !info.name.is_empty() {
            return None;
        }
        Some(ResourceRequest {
            registry,
            namespace: namespace.to_string(),
            info: info.clone(),
        })
    }

    /// `/healthz`, `/livez`, `/readyz`: the store's health is the `etcd` checks (a store that
    /// cannot take writes fails them until it recovers).
    async fn health(&self, path: &str, query: &Query) -> Option<Response<Body>> {
        let (endpoint, only) = match path.trim_start_matches('/').split_once('/') {
            Some((endpoint, check)) => (endpoint, Some(check)),
            None => (path.trim_start_matches('/'), None),
        };
        if !matches!(endpoint, "healthz" | "livez" | "readyz") {
            return None;
        }
        let shutting_down = self.shutting_down.load(Ordering::SeqCst);
        let store = match self.registries.first() {
            Some(registry) => registry.storage_health().await,
            None => Ok(()),
        };
        if let Err(problem) = &store {
            tracing::debug!(%problem, "{endpoint}: the store is unhealthy");
        }
        let store = store.is_ok();
        let ready = if endpoint == "readyz" {
            READY_CHECKS
        } else {
            &[]
        };
        let checks: Vec<(&str, bool)> = HEALTH_CHECKS
            .iter()
            .chain(ready)
            .map(|&name| {
                let ok = match name {
                    "etcd" | "etcd-readiness" => store,
                    "shutdown" => !shutting_down,
                    _ => true,
                };
                (name, ok)
            })
            .collect();
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

/// Upstream's router (go-restful) for a route that serves GET alone: another method is its
/// 405, and an `Accept` naming nothing the route produces its 406, both negotiated as any
/// error (written raw when nothing is acceptable).
fn get_route_refusal(
    request: &Request<RequestBody>,
    query: &Query,
    produces: &[&str],
) -> Option<Response<Body>> {
    let refused = |error: ApiError| request::negotiated_error(&error, request.headers(), query);
    if request.method() != Method::GET {
        return Some(refused(ApiError::method_not_allowed()));
    }
    let accept = request::header_text(request.headers(), header::ACCEPT);
    capstan_machinery::media::route_accepts(accept, produces)
        .err()
        .map(refused)
}

/// The checks of `/healthz`, `/livez` and `/readyz`, in the order they are reported.
pub(crate) const HEALTH_CHECKS: &[&str] = &["ping", "log", "etcd"];
/// The checks `/readyz` adds.
pub(crate) const READY_CHECKS: &[&str] = &["etcd-readiness", "informer-sync", "shutdown"];

/// The token of an `Authorization: Bearer <token>` header, read as upstream's bearer-token
/// authenticator reads it: the scheme in any case, the token the second space-separated word
/// (anything after a third space is ignored), and an empty token is no token.
fn bearer_token(header: &str) -> Option<&str> {
    let mut parts = header.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares secrets in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Upstream's answer when a handler panics (`WithPanicRecovery`): plain text, 500.
fn panicked() -> Response<Body> {
    text_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "This request caused apiserver to panic. Look in the logs for details.\n",
    )
}

fn aggregated(
    request: &Request<RequestBody>,
    value: serde_json::Value,
    version: &str,
) -> Response<Body> {
    let body = capstan_machinery::json::to_vec(&value);
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

pub use connection::serve;

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn bearer_tokens_are_read_as_upstream_reads_them() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("  Bearer abc  "), Some("abc"));
        assert_eq!(bearer_token("Bearer abc extra"), Some("abc"));
        assert_eq!(
            bearer_token("Bearer  abc"),
            None,
            "two spaces: an empty token"
        );
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }
}
