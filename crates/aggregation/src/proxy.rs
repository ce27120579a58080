//! The aggregation layer: which group/versions APIServices
//! claim, discovery merged from them, and the proxy to their backends.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use capstan_apiserver::discovery;
use capstan_apiserver::remote::RemoteGroups;
use capstan_apiserver::request::{Body, MAX_BODY, text_response};
use capstan_resources::apiregistration::apiservice::{is_available, is_local};
use capstan_resources::discovery::endpointslice::of_service as service_slices;

use crate::backend::{ProxyClient, service_ref};
use crate::client::Backends;
use crate::registry;
use capstan_apiserver::unread::RequestBody;
use capstan_registry::{ReadAt, Registry};
use futures_util::StreamExt;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Incoming;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{APIService, APIServiceSpec};
use serde_json::{Value, json};

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

/// What the aggregation layer knows.
pub struct Aggregator {
    backends: Backends,
    apiservices: Option<Arc<Registry>>,
    services: Option<Arc<Registry>>,
    slices: Option<Arc<Registry>>,
    /// Discovery fetched from backends: APIService name → (its resourceVersion, when, the
    /// version's aggregated discovery).
    fetched: Mutex<HashMap<String, (String, Instant, Value)>>,
    /// Served groups (the server's own, never taken from APIServices).
    local_groups: Vec<&'static str>,
}

fn spec(
    apiservice: &APIService,
) -> std::borrow::Cow<
    '_,
    k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIServiceSpec,
> {
    match &apiservice.spec {
        Some(spec) => std::borrow::Cow::Borrowed(spec),
        None => std::borrow::Cow::Owned(Default::default()),
    }
}

fn group_of(apiservice: &APIService) -> &str {
    spec_text(apiservice, |spec| spec.group.as_deref())
}

fn version_of(apiservice: &APIService) -> &str {
    spec_text(apiservice, |spec| spec.version.as_deref())
}

/// A text field of the spec, `""` when unset.
fn spec_text(apiservice: &APIService, field: impl Fn(&APIServiceSpec) -> Option<&str>) -> &str {
    apiservice.spec.as_ref().and_then(field).unwrap_or_default()
}

fn name_of(apiservice: &APIService) -> &str {
    apiservice.metadata.name.as_deref().unwrap_or_default()
}

/// `503 service unavailable` as upstream's proxy answers it (plain text, not a Status).
fn unavailable(text: &str) -> Response<Body> {
    text_response(StatusCode::SERVICE_UNAVAILABLE, format!("{text}\n"))
}

impl Aggregator {
    /// The aggregation layer over these registries (APIServices, Services, EndpointSlices):
    /// backends must send their response headers within `response_header_timeout`, and are
    /// shown the proxy `client` certificate.
    pub fn new(
        registries: &[Arc<Registry>],
        response_header_timeout: Duration,
        client: Option<Arc<ProxyClient>>,
    ) -> Self {
        Aggregator {
            backends: Backends::new(client, response_header_timeout),
            local_groups: discovery::local_groups(registries)
                .into_iter()
                .map(|(group, _, _)| group)
                .collect(),
            apiservices: registry(registries, "apiregistration.k8s.io", "apiservices"),
            services: registry(registries, "", "services"),
            slices: registry(registries, "discovery.k8s.io", "endpointslices"),
            fetched: Mutex::new(HashMap::new()),
        }
    }

    /// Every APIService, as of the latest write (discovery shows an APIService as soon as its
    /// create is answered).
    async fn all(&self) -> Vec<APIService> {
        match &self.apiservices {
            Some(apiservices) => apiservices.cached_current("").await,
            None => Vec::new(),
        }
    }

    /// The service-backed APIService that claims `group/version`, if any (a local one is
    /// served by the server itself).
    async fn find_remote(&self, group: &str, version: &str) -> Option<APIService> {
        let object = self
            .apiservices
            .as_ref()?
            .get("", &format!("{version}.{group}"), ReadAt::Any)
            .await
            .ok()?;
        serde_json::from_value::<APIService>(object)
            .ok()
            .filter(|apiservice| !is_local(apiservice))
    }

    /// The APIServices of non-core groups, ordered as legacy discovery walks them:
    /// groupPriorityMinimum descending, then name.
    async fn sorted(&self) -> Vec<APIService> {
        let mut all: Vec<APIService> = self
            .all()
            .await
            .into_iter()
            .filter(|a| !group_of(a).is_empty())
            .collect();
        all.sort_by(|a, b| {
            spec(b)
                .group_priority_minimum
                .cmp(&spec(a).group_priority_minimum)
                .then_with(|| name_of(a).cmp(name_of(b)))
        });
        all
    }

    /// Groups and their versions in legacy order, local groups left out.
    async fn groups(&self) -> Vec<(String, Vec<APIService>)> {
        let mut groups: Vec<(String, Vec<APIService>)> = Vec::new();
        for apiservice in self.sorted().await {
            let group = group_of(&apiservice).to_string();
            if self.local_groups.contains(&&*group) {
                continue;
            }
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, versions)) => versions.push(apiservice),
                None => groups.push((group, vec![apiservice])),
            }
        }
        for (_, versions) in groups.iter_mut() {
            versions.sort_by(|a, b| {
                spec(b)
                    .version_priority
                    .cmp(&spec(a).version_priority)
                    .then_with(|| discovery::version_order(version_of(a), version_of(b)))
            });
        }
        groups
    }

    /// The `APIGroup` entries legacy `/apis` adds for APIService groups.
    async fn legacy_groups_of_apiservices(&self) -> Vec<Value> {
        self.groups()
            .await
            .into_iter()
            .map(|(group, versions)| {
                let versions: Vec<String> =
                    versions.iter().map(|a| version_of(a).to_string()).collect();
                discovery::api_group(&group, &versions)
            })
            .collect()
    }

    /// `/apis/<group>` for a group APIServices claim.
    async fn legacy_group_of_apiservices(&self, group: &str) -> Option<Value> {
        let entry = self
            .legacy_groups_of_apiservices()
            .await
            .into_iter()
            .find(|g| g.get("name").and_then(Value::as_str) == Some(group))?;
        Some(discovery::with_group_type(entry))
    }

    /// Aggregated discovery of the APIService groups: `(priority, group, discovery)`.
    /// Remote versions are fetched from their backends (reused for a minute, or until the
    /// APIService changes); a backend that cannot answer leaves its version `Stale`.
    async fn aggregated_groups_of_apiservices(&self) -> Vec<(i64, String, Value)> {
        let mut out = Vec::new();
        let groups = self.groups().await;
        // Discovery fetched for APIServices that no longer exist is forgotten.
        let names: std::collections::HashSet<String> = groups
            .iter()
            .flat_map(|(_, versions)| versions.iter().map(|a| name_of(a).to_string()))
            .collect();
        self.fetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| names.contains(name));
        self.backends.retain(&names);
        for (group, versions) in groups {
            let priority = versions
                .iter()
                .map(|a| i64::from(spec(a).group_priority_minimum))
                .max()
                .unwrap_or(1000);
            let mut entries = Vec::new();
            for apiservice in &versions {
                let version = version_of(apiservice);
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

    async fn version_discovery(
        &self,
        apiservice: &APIService,
        group: &str,
        version: &str,
    ) -> Value {
        let name = name_of(apiservice).to_string();
        let rv = apiservice
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
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
        apiservice: &APIService,
        group: &str,
        version: &str,
    ) -> Result<Value, String> {
        let request = Request::get(format!("/apis/{group}/{version}"))
            .header(header::ACCEPT, "application/json")
            .body(http_body_util::Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(DISCOVERY_TIMEOUT, async {
            let response = self.send(apiservice, request).await?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("bad status {}", status.as_u16()));
            }
            serde_json::from_slice::<Value>(&body).map_err(|e| e.to_string())
        })
        .await
        .map_err(|_| "timed out".to_string())??;
        Ok(response)
    }

    /// Sends a request to an APIService's backend (pooled, verified TLS), as the
    /// aggregator's identity.
    async fn send(
        &self,
        apiservice: &APIService,
        mut request: Request<http_body_util::Full<Bytes>>,
    ) -> Result<Response<Incoming>, String> {
        let target = service_ref(apiservice).ok_or_else(|| "local APIService".to_string())?;
        let (Some(services), Some(slices)) = (&self.services, &self.slices) else {
            return Err("no Services".into());
        };
        let service: Service = services
            .get(&target.namespace, &target.name, ReadAt::Any)
            .await
            .map_err(|e| e.message)
            .and_then(|s| serde_json::from_value(s).map_err(|e| e.to_string()))?;
        let slices = service_slices(slices, &target.namespace, &target.name);
        let headers = request.headers_mut();
        headers.insert("x-remote-user", HeaderValue::from_static(REMOTE_USER));
        for group in REMOTE_GROUPS {
            headers.append("x-remote-group", HeaderValue::from_static(group));
        }
        self.backends
            .send(apiservice, &service, &slices, request)
            .await
    }

    /// Proxies a request under `/apis/<group>/<version>` to the APIService's backend.
    async fn proxy_to(
        &self,
        apiservice: &APIService,
        request: Request<RequestBody>,
    ) -> Response<Body> {
        if !is_available(apiservice) {
            return unavailable("service unavailable");
        }
        if let Err(error) = self.backends.check_tls(apiservice) {
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
        let response = match response {
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
        let frames = futures_util::stream::unfold(BodyStream::new(body), |mut body| async move {
            match body.next().await {
                Some(Ok(frame)) => Some((Ok::<_, Infallible>(frame), body)),
                _ => None,
            }
        });
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

#[async_trait::async_trait]
impl RemoteGroups for Aggregator {
    async fn legacy_groups(&self) -> Vec<Value> {
        self.legacy_groups_of_apiservices().await
    }

    async fn legacy_group(&self, group: &str) -> Option<Value> {
        self.legacy_group_of_apiservices(group).await
    }

    async fn aggregated_groups(&self) -> Vec<(i64, String, Value)> {
        self.aggregated_groups_of_apiservices().await
    }

    async fn proxy(
        &self,
        group: &str,
        version: &str,
        request: Request<RequestBody>,
    ) -> Result<Response<Body>, Request<RequestBody>> {
        match self.find_remote(group, version).await {
            Some(apiservice) => Ok(self.proxy_to(&apiservice, request).await),
            None => Err(request),
        }
    }
}
