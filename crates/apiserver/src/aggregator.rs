//! The aggregation layer (`spec/apiservice.md` §9–§10): which group/versions APIServices
//! claim, discovery merged from them, and the proxy to their backends.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capstan_controllers::apiservice::{ProxyClient, connect, resolve, service_ref, tls_config};
use capstan_machinery::meta;
use capstan_registry::{ListOptions, ReadAt, Registry};
use capstan_resources::apiservice::{is_available, is_local};
use futures_util::StreamExt;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::discovery;
use crate::request::{Body, MAX_BODY, text_response};

/// How long fetched discovery of a backend is reused.
const DISCOVERY_TTL: Duration = Duration::from_secs(60);
/// The timeout of discovery requests to a backend.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Hop-by-hop headers, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The identity the proxy passes to backends for the admin token's user.
const REMOTE_USER: &str = "admin";
const REMOTE_GROUPS: &[&str] = &["system:masters", "system:authenticated"];

/// An idle connection to a backend.
type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>;

/// Idle backend connections, by APIService (name and resourceVersion: a changed caBundle never
/// reuses a connection made under the old one) and address.
type Pool = Arc<Mutex<HashMap<(String, SocketAddr), Vec<Sender>>>>;

/// Idle connections kept per backend address.
const IDLE_PER_BACKEND: usize = 32;

/// A connection in use; [`Lease::release`] returns it to the pool.
struct Lease {
    pool: Pool,
    key: (String, SocketAddr),
    sender: Sender,
}

impl Lease {
    fn release(self) {
        if self.sender.is_closed() {
            return;
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let idle = pool.entry(self.key).or_default();
        if idle.len() < IDLE_PER_BACKEND {
            idle.push(self.sender);
        }
    }
}

/// What the aggregation layer knows.
pub struct Aggregator {
    pool: Pool,
    apiservices: Option<Arc<Registry>>,
    services: Option<Arc<Registry>>,
    endpoints: Option<Arc<Registry>>,
    /// Discovery fetched from backends: APIService name → (its resourceVersion, when, the
    /// version's aggregated discovery).
    fetched: Mutex<HashMap<String, (String, Instant, Value)>>,
    /// The client certificate presented to backends.
    client: Option<Arc<ProxyClient>>,
    /// How long a backend may take to send its response headers (`--request-timeout`: even
    /// a proxied watch, which has no request deadline, must start within it).
    response_header_timeout: Duration,
}

fn registry(registries: &[Arc<Registry>], group: &str, plural: &str) -> Option<Arc<Registry>> {
    registries
        .iter()
        .find(|r| {
            let info = r.strategy().info();
            info.group == group && info.plural == plural
        })
        .cloned()
}

fn spec_str<'a>(apiservice: &'a Value, field: &str) -> &'a str {
    apiservice
        .pointer(&format!("/spec/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn spec_int(apiservice: &Value, field: &str) -> i64 {
    apiservice
        .pointer(&format!("/spec/{field}"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// `503 service unavailable` as upstream's proxy answers it (plain text, not a Status).
fn unavailable(text: &str) -> Response<Body> {
    text_response(StatusCode::SERVICE_UNAVAILABLE, format!("{text}\n"))
}

impl Aggregator {
    /// Backends are sent this client certificate.
    pub fn set_proxy_client(&mut self, client: Option<Arc<ProxyClient>>) {
        self.client = client;
    }

    /// The aggregation layer over these registries (APIServices, Services, Endpoints).
    pub fn new(registries: &[Arc<Registry>], response_header_timeout: Duration) -> Self {
        Aggregator {
            client: None,
            response_header_timeout,
            pool: Pool::default(),
            apiservices: registry(registries, "apiregistration.k8s.io", "apiservices"),
            services: registry(registries, "", "services"),
            endpoints: registry(registries, "", "endpoints"),
            fetched: Mutex::new(HashMap::new()),
        }
    }

    async fn all(&self) -> Vec<Value> {
        let Some(apiservices) = &self.apiservices else {
            return Vec::new();
        };
        apiservices
            .list(
                "",
                &ListOptions {
                    read_at: ReadAt::Any,
                    ..Default::default()
                },
            )
            .await
            .map(|list| list.items.iter().map(|o| o.object()).collect())
            .unwrap_or_default()
    }

    /// The service-backed APIService that claims `group/version`, if any (a local one is
    /// served by the server itself).
    pub async fn find_remote(&self, group: &str, version: &str) -> Option<Value> {
        self.apiservices
            .as_ref()?
            .get("", &format!("{version}.{group}"), ReadAt::Any)
            .await
            .ok()
            .filter(|apiservice| !is_local(apiservice))
    }

    /// The APIServices of non-core groups, ordered as legacy discovery walks them:
    /// groupPriorityMinimum descending, then name.
    async fn sorted(&self) -> Vec<Value> {
        let mut all: Vec<Value> = self
            .all()
            .await
            .into_iter()
            .filter(|a| !spec_str(a, "group").is_empty())
            .collect();
        all.sort_by(|a, b| {
            spec_int(b, "groupPriorityMinimum")
                .cmp(&spec_int(a, "groupPriorityMinimum"))
                .then_with(|| meta::name(a).cmp(meta::name(b)))
        });
        all
    }

    /// Groups and their versions in legacy order (§9.1), local groups left out.
    async fn groups(&self) -> Vec<(String, Vec<Value>)> {
        let mut groups: Vec<(String, Vec<Value>)> = Vec::new();
        for apiservice in self.sorted().await {
            let group = spec_str(&apiservice, "group").to_string();
            if discovery::LOCAL_GROUPS.iter().any(|(g, _, _)| *g == group) {
                continue;
            }
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, versions)) => versions.push(apiservice),
                None => groups.push((group, vec![apiservice])),
            }
        }
        for (_, versions) in groups.iter_mut() {
            versions.sort_by(|a, b| {
                spec_int(b, "versionPriority")
                    .cmp(&spec_int(a, "versionPriority"))
                    .then_with(|| {
                        discovery::version_order(spec_str(a, "version"), spec_str(b, "version"))
                    })
            });
        }
        groups
    }

    /// The `APIGroup` entries legacy `/apis` adds for APIService groups.
    pub async fn legacy_groups(&self) -> Vec<Value> {
        self.groups()
            .await
            .into_iter()
            .map(|(group, versions)| {
                let versions: Vec<String> = versions
                    .iter()
                    .map(|a| spec_str(a, "version").to_string())
                    .collect();
                discovery::api_group(&group, &versions)
            })
            .collect()
    }

    /// `/apis/<group>` for a group APIServices claim.
    pub async fn legacy_group(&self, group: &str) -> Option<Value> {
        let mut entry = self
            .legacy_groups()
            .await
            .into_iter()
            .find(|g| g.get("name").and_then(Value::as_str) == Some(group))?;
        if let Value::Object(map) = &mut entry {
            map.insert("kind".into(), json!("APIGroup"));
            map.insert("apiVersion".into(), json!("v1"));
        }
        Some(entry)
    }

    /// Aggregated discovery of the APIService groups (§9.2): `(priority, group, discovery)`.
    /// Remote versions are fetched from their backends (reused for a minute, or until the
    /// APIService changes); a backend that cannot answer leaves its version `Stale`.
    pub async fn aggregated_groups(&self) -> Vec<(i64, String, Value)> {
        let mut out = Vec::new();
        let groups = self.groups().await;
        // Discovery fetched for APIServices that no longer exist is forgotten.
        let names: std::collections::HashSet<String> = groups
            .iter()
            .flat_map(|(_, versions)| versions.iter().map(|a| meta::name(a).to_string()))
            .collect();
        self.fetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| names.contains(name));
        for (group, versions) in groups {
            let priority = versions
                .iter()
                .map(|a| spec_int(a, "groupPriorityMinimum"))
                .max()
                .unwrap_or(1000);
            let mut entries = Vec::new();
            for apiservice in &versions {
                let version = spec_str(apiservice, "version");
                if is_local(apiservice) {
                    continue;
                }
                entries.push(self.version_discovery(apiservice, &group, version).await);
            }
            if !entries.is_empty() {
                out.push((
                    priority,
                    group.clone(),
                    json!({"metadata": {"name": group}, "versions": entries}),
                ));
            }
        }
        out
    }

    async fn version_discovery(&self, apiservice: &Value, group: &str, version: &str) -> Value {
        let name = meta::name(apiservice).to_string();
        let rv = meta::resource_version(apiservice).to_string();
        let cached = self
            .fetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name)
            .cloned();
        if let Some((seen_rv, at, value)) = &cached
            && *seen_rv == rv
            && at.elapsed() < DISCOVERY_TTL
        {
            return value.clone();
        }
        let fetched = if is_available(apiservice) {
            self.fetch_resources(apiservice, group, version).await
        } else {
            Err("unavailable".to_string())
        };
        let value = match fetched {
            Ok(list) => discovery::version_from_resource_list(version, &list),
            Err(_) => {
                let mut stale = cached
                    .map(|(_, _, v)| v)
                    .unwrap_or_else(|| json!({"version": version, "resources": []}));
                stale["freshness"] = json!("Stale");
                stale
            }
        };
        self.fetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, (rv, Instant::now(), value.clone()));
        value
    }

    async fn fetch_resources(
        &self,
        apiservice: &Value,
        group: &str,
        version: &str,
    ) -> Result<Value, String> {
        let request = Request::get(format!("/apis/{group}/{version}"))
            .header(header::ACCEPT, "application/json")
            .body(http_body_util::Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(DISCOVERY_TIMEOUT, async {
            let (response, lease) = self.send(apiservice, request).await?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            lease.release();
            if !status.is_success() {
                return Err(format!("bad status {}", status.as_u16()));
            }
            serde_json::from_slice::<Value>(&body).map_err(|e| e.to_string())
        })
        .await
        .map_err(|_| "timed out".to_string())??;
        Ok(response)
    }

    /// Sends a request to an APIService's backend over verified TLS, on an idle pooled
    /// connection when there is one. Returns the response and the connection's pool slot: hand
    /// it to [`Aggregator::release`] once the response body has been read to its end.
    async fn send(
        &self,
        apiservice: &Value,
        mut request: Request<http_body_util::Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Lease), String> {
        let (namespace, name, port) =
            service_ref(apiservice).ok_or_else(|| "local APIService".to_string())?;
        let (Some(services), Some(endpoints)) = (&self.services, &self.endpoints) else {
            return Err("no Services".into());
        };
        let service = services
            .get(&namespace, &name, ReadAt::Any)
            .await
            .map_err(|e| e.message)?;
        let endpoints = endpoints.get(&namespace, &name, ReadAt::Any).await.ok();
        let addr = resolve(&name, port, &service, endpoints.as_ref())?;
        let key = (
            format!(
                "{}@{}",
                meta::name(apiservice),
                meta::resource_version(apiservice)
            ),
            addr,
        );
        let idle = {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            // Connections made for another version of this APIService (another caBundle,
            // say) are closed.
            let name = meta::name(apiservice);
            pool.retain(|(other, _), _| *other == key.0 || other.split('@').next() != Some(name));
            let mut found = None;
            if let Some(senders) = pool.get_mut(&key) {
                while let Some(sender) = senders.pop() {
                    if !sender.is_closed() && sender.is_ready() {
                        found = Some(sender);
                        break;
                    }
                }
            }
            found
        };
        let mut sender = match idle {
            Some(sender) => sender,
            None => {
                let config = tls_config(apiservice, true, self.client.as_deref())?;
                connect(addr, &format!("{name}.{namespace}.svc"), config).await?
            }
        };
        let headers = request.headers_mut();
        if let Ok(host) = HeaderValue::from_str(&addr.to_string()) {
            headers.insert(header::HOST, host);
        }
        headers.insert("x-remote-user", HeaderValue::from_static(REMOTE_USER));
        for group in REMOTE_GROUPS {
            headers.append("x-remote-group", HeaderValue::from_static(group));
        }
        // A backend that takes the connection and never answers does not hold the request
        // (a proxied watch has no request deadline) for longer than this.
        let response =
            tokio::time::timeout(self.response_header_timeout, sender.send_request(request))
                .await
                .map_err(|_| "timeout awaiting response headers".to_string())?
                .map_err(|e| e.to_string())?;
        Ok((
            response,
            Lease {
                pool: self.pool.clone(),
                key,
                sender,
            },
        ))
    }

    /// Proxies a request under `/apis/<group>/<version>` to the APIService's backend (§10).
    pub async fn proxy(&self, apiservice: &Value, request: Request<Incoming>) -> Response<Body> {
        if !is_available(apiservice) {
            return unavailable("service unavailable");
        }
        if let Err(error) = tls_config(apiservice, true, self.client.as_deref()) {
            return text_response(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"));
        }
        let (parts, body) = request.into_parts();
        let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => return unavailable(&error.to_string()),
        };
        let path_and_query = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| parts.uri.path().to_string());
        let mut forwarded = Request::builder()
            .method(parts.method.clone())
            .uri(&path_and_query);
        for (name, value) in &parts.headers {
            let lower = name.as_str();
            if lower == "authorization"
                || lower == "host"
                || lower.starts_with("x-remote-")
                || HOP_BY_HOP.contains(&lower)
            {
                continue;
            }
            forwarded = forwarded.header(name, value);
        }
        let Ok(forwarded) = forwarded.body(http_body_util::Full::new(body)) else {
            return unavailable("service unavailable");
        };
        // Discovery requests (`/apis/<group>/<version>`) get a short timeout.
        let discovery_request = parts.uri.path().trim_end_matches('/').split('/').count() == 4;
        let sent = self.send(apiservice, forwarded);
        let response = if discovery_request {
            match tokio::time::timeout(DISCOVERY_TIMEOUT, sent).await {
                Ok(result) => result,
                Err(_) => Err("context deadline exceeded".into()),
            }
        } else {
            sent.await
        };
        let (response, lease) = match response {
            Ok(sent) => sent,
            Err(error) => return unavailable(&error),
        };
        if response.status().is_redirection() && response.headers().contains_key(header::LOCATION) {
            return text_response(
                StatusCode::BAD_GATEWAY,
                "the backend attempted to redirect this request, which is not permitted",
            );
        }
        let (parts, body) = response.into_parts();
        // Streamed as it arrives (watches through the proxy); a backend error ends the body.
        // The connection goes back to the pool when the body has been read to its end.
        let frames = futures_util::stream::unfold(
            (BodyStream::new(body), Some(lease)),
            |(mut body, lease)| async move {
                match body.next().await {
                    Some(Ok(frame)) => Some((Ok::<_, Infallible>(frame), (body, lease))),
                    Some(Err(_)) => None,
                    None => {
                        if let Some(lease) = lease {
                            lease.release();
                        }
                        None
                    }
                }
            },
        );
        let mut out = Response::new(BodyExt::boxed(StreamBody::new(frames)));
        *out.status_mut() = parts.status;
        for (name, value) in &parts.headers {
            if !HOP_BY_HOP.contains(&name.as_str()) && name != header::CONTENT_LENGTH {
                out.headers_mut().append(name, value.clone());
            }
        }
        out
    }
}
