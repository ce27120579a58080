//! APIService availability: the `Available` condition of every
//! APIService, from its Service, Endpoints and a discovery probe of its backend, reached
//! exactly as the aggregation proxy reaches it (`capstan-aggregation`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capstan_controllers::runtime::{Backoff, Controller, Informer};
use capstan_resources::discovery::endpointslice::of_service as service_slices;

use crate::backend::{
    BackendError, ProxyClient, ServiceRef, connect, has_available_endpoint, resolve,
    service_port_name, service_ref, tls_config,
};
use capstan_machinery::ApiError;
use capstan_registry::cache::ByRevision;
use capstan_registry::object::{from_typed, to_typed};
use capstan_registry::{ReadAt, Registry, Subresource, WriteOptions};
use capstan_resources::apiregistration::apiservice::{LOCAL_MESSAGE, is_local, set_available};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{APIService, APIServiceSpec};

/// How many APIServices are checked at once.
const WORKERS: usize = 5;
/// How often every APIService is checked again, changes or not (upstream's period).
const RESYNC: Duration = Duration::from_secs(30);
/// How often service-backed APIServices are probed again: a backend that stops (or starts)
/// answering shows in the condition within seconds, not only at the next 30 s resync.
const REPROBE: Duration = Duration::from_secs(5);
/// The discovery probe's timeout per attempt.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a probe's response body that is read (the status is what counts).
const PROBE_BODY_LIMIT: usize = 1024 * 1024;

/// A check that did not complete (it is retried with back-off).
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The registry refused a read or write.
    #[error("{}", .0.message)]
    Api(#[from] ApiError),
    /// The stored APIService did not decode.
    #[error("undecodable APIService: {0}")]
    Undecodable(String),
}

/// Keeps the `Available` condition of every APIService.
pub struct AvailabilityController {
    apiservices: Arc<Registry>,
    services: Arc<Registry>,
    slices: Arc<Registry>,
    client: Option<Arc<ProxyClient>>,
    /// [`AvailabilityController::each`]'s APIServices as decoded (None: undecodable), by
    /// revision.
    decoded: ByRevision<Option<Arc<APIService>>>,
}

/// At most this many decoded APIServices are kept (a cluster has tens).
const KEPT_APISERVICES: usize = 1024;

/// The outcome of one check: status, reason, message.
type Verdict = (&'static str, &'static str, String);

impl AvailabilityController {
    /// A controller over these registries.
    pub fn new(apiservices: Arc<Registry>, services: Arc<Registry>, slices: Arc<Registry>) -> Self {
        AvailabilityController {
            apiservices,
            services,
            slices,
            client: None,
            decoded: ByRevision::new(KEPT_APISERVICES),
        }
    }

    /// Probes present this client certificate, as the proxy does.
    pub fn with_proxy_client(mut self, client: Option<Arc<ProxyClient>>) -> Self {
        self.client = client;
        self
    }

    /// Runs in background tasks for the life of the process.
    pub fn start(self) {
        let controller = Arc::new(self);
        // APIService changes check that APIService; failures are retried with exponential
        // back-off, 5 ms doubling to 30 s. Workers over a per-key queue: a slow probe holds
        // up only its own APIService.
        let apiservices = controller.apiservices.clone();
        let work = Controller::of_kind("apiservice check", apiservices, Backoff::NEVER_DROPPED)
            .workers(WORKERS);
        // Service and EndpointSlice changes check every APIService that names that Service.
        for (registry, by_label) in [
            (controller.services.clone(), false),
            (controller.slices.clone(), true),
        ] {
            let (controller, queue) = (controller.clone(), work.queue().clone());
            Informer::new(registry)
                .on_change(move |_, object, _| {
                    let s = &object.selectable;
                    let label = capstan_resources::discovery::endpointslice::SERVICE_NAME_LABEL;
                    let service = if by_label {
                        s.label(label)
                    } else {
                        Some(s.name())
                    };
                    for name in service
                        .map(|service| controller.referencing(s.namespace(), service))
                        .unwrap_or_default()
                    {
                        queue.add(name);
                    }
                })
                .start();
        }
        // Periodic checks: service-backed APIServices every few seconds, all every 30 s.
        let (checked, mut last_full) = (controller.clone(), tokio::time::Instant::now());
        work.every(REPROBE, move || {
            let full = last_full.elapsed() >= RESYNC;
            if full {
                last_full = tokio::time::Instant::now();
            }
            let all = checked.all().into_iter();
            all.filter(|apiservice| full || service_ref(apiservice).is_some())
                .filter_map(|apiservice| apiservice.metadata.name)
                .collect()
        })
        .run(move |name: String| {
            let controller = controller.clone();
            async move { controller.sync(&name).await }
        });
    }

    /// Every APIService's name and spec (what finding the backing Service needs).
    fn all(&self) -> Vec<APIService> {
        let mut all = Vec::new();
        self.each(|apiservice| all.push(apiservice.clone()));
        all
    }

    /// Runs `f` over every APIService's name and spec (the status and managedFields are not
    /// decoded: this runs on every Service and EndpointSlice change). Each is decoded once per
    /// revision: the decoded ones are kept by key with the revision they were read at.
    fn each(&self, mut f: impl FnMut(&APIService)) {
        /// The part of an APIService read here.
        #[derive(serde::Deserialize)]
        struct Backing {
            metadata: Name,
            spec: Option<APIServiceSpec>,
        }
        #[derive(serde::Deserialize)]
        struct Name {
            name: Option<String>,
        }
        let mut objects = Vec::new();
        let prefix = self.apiservices.strategy().info().list_prefix("");
        self.apiservices.cache().scan(&prefix, None, |object| {
            objects.push(object.clone());
            true
        });
        let decode = |json: &[u8]| {
            let backing: Backing = serde_json::from_slice(json).ok()?;
            let metadata = ObjectMeta {
                name: backing.metadata.name,
                ..ObjectMeta::default()
            };
            let (spec, status) = (backing.spec, None);
            Some(Arc::new(APIService {
                metadata,
                spec,
                status,
            }))
        };
        for object in &objects {
            let apiservice = match self.decoded.get(&object.key, object.revision) {
                Some(apiservice) => apiservice,
                None => {
                    let apiservice = decode(&object.lean_json());
                    let (key, revision) = (object.key.clone(), object.revision);
                    self.decoded.put(key, revision, apiservice.clone());
                    apiservice
                }
            };
            if let Some(apiservice) = apiservice {
                f(&apiservice);
            }
        }
    }

    fn referencing(&self, namespace: &str, name: &str) -> Vec<String> {
        let mut names = Vec::new();
        self.each(|a| {
            if service_ref(a).is_some_and(|s| s.namespace == namespace && s.name == name)
                && let Some(name) = &a.metadata.name
            {
                names.push(name.clone());
            }
        });
        names
    }

    async fn sync(&self, name: &str) -> Result<(), SyncError> {
        let apiservice: APIService = match self.apiservices.get("", name, ReadAt::Latest).await {
            Ok(object) => to_typed(&object).map_err(SyncError::Undecodable)?,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let (status, reason, message) = if is_local(&apiservice) {
            ("True", "Local", LOCAL_MESSAGE.to_string())
        } else {
            self.check(&apiservice).await
        };
        let mut updated = apiservice.clone();
        if !set_available(&mut updated, status, reason, &message) {
            return Ok(());
        }
        let options = WriteOptions {
            dry_run: false,
            field_manager: "kube-apiserver".into(),
            applied: false,
        };
        match self
            .apiservices
            .update(
                "",
                name,
                from_typed(&updated),
                &options,
                Subresource::Status,
            )
            .await
        {
            Err(e) if !e.is_not_found() => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// The Service, its port and Endpoints, then the discovery probe.
    async fn check(&self, apiservice: &APIService) -> Verdict {
        let Some(target) = service_ref(apiservice) else {
            return ("True", "Local", LOCAL_MESSAGE.to_string());
        };
        let ServiceRef {
            namespace,
            name,
            port,
        } = &target;
        let service: Service = match self
            .services
            .get_typed(namespace, name, ReadAt::Latest)
            .await
        {
            Ok(service) => service,
            Err(e) if e.is_not_found() => {
                return (
                    "False",
                    "ServiceNotFound",
                    format!("service/{name} in {namespace:?} is not present"),
                );
            }
            Err(e) => {
                return (
                    "Unknown",
                    "ServiceAccessError",
                    format!(
                        "service/{name} in {namespace:?} cannot be checked due to: {}",
                        e.message
                    ),
                );
            }
        };
        // The Service's EndpointSlices, as the watch shows them (1.36's aggregator reads its
        // EndpointSlice informer).
        let slices = service_slices(&self.slices, namespace, name);
        let service_type = service.spec.as_ref().and_then(|s| s.type_.as_deref());
        if service_type.unwrap_or("ClusterIP") == "ClusterIP" {
            let Some(port_name) = service_port_name(&service, *port) else {
                return (
                    "False",
                    "ServicePortError",
                    format!("service/{name} in {namespace:?} is not listening on port {port}"),
                );
            };
            if slices.is_empty() {
                return (
                    "False",
                    "EndpointsNotFound",
                    format!("cannot find endpointslices for service/{name} in {namespace:?}"),
                );
            }
            if !has_available_endpoint(&slices, &port_name) {
                return (
                    "False",
                    "MissingEndpoints",
                    format!(
                        "endpointslices for service/{name} in {namespace:?} have no addresses with port name {port_name:?}"
                    ),
                );
            }
        }
        match self.probe(apiservice, &service, &slices, &target).await {
            Ok(()) => ("True", "Passed", "all checks passed".to_string()),
            Err(error) => ("False", "FailedDiscoveryCheck", error),
        }
    }

    /// Five concurrent `GET /apis/<group>/<version>` attempts; any 2xx passes, and the first
    /// one answers.
    /// Unlike upstream's probe (which skips certificate verification), the backend's
    /// certificate is verified exactly as the proxy verifies it (`caBundle`, server name
    /// `<service>.<namespace>.svc`, or `insecureSkipTLSVerify`): an APIService whose every
    /// proxied request would fail the TLS handshake is reported `FailedDiscoveryCheck`
    /// instead of `Available`, as the issue asks.
    async fn probe(
        &self,
        apiservice: &APIService,
        service: &Service,
        slices: &[EndpointSlice],
        target: &ServiceRef,
    ) -> Result<(), String> {
        let spec = apiservice.spec.clone().unwrap_or_default();
        let group = spec.group.as_deref().unwrap_or_default();
        let version = spec.version.as_deref().unwrap_or_default();
        let path = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let config = tls_config(apiservice, true, self.client.as_deref())
            .map_err(|e: BackendError| e.to_string())?;
        let server_name = target.server_name();
        let mut attempts = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let addr =
                resolve(&target.name, target.port, service, slices).map_err(|e| e.to_string())?;
            let (config, server_name, path) = (config.clone(), server_name.clone(), path.clone());
            attempts.spawn(async move {
                let url = format!("https://{addr}{path}");
                let attempt = async {
                    let mut sender = connect(addr, &server_name, config)
                        .await
                        .map_err(|e| format!("Get {url:?}: {e}"))?;
                    let request = http::Request::get(&path)
                        .header(http::header::HOST, addr.to_string())
                        .header("X-Remote-User", "system:kube-aggregator")
                        .header("X-Remote-Group", "system:masters")
                        .body(http_body_util::Full::new(Bytes::new()))
                        .map_err(|e| e.to_string())?;
                    let response = sender
                        .send_request(request)
                        .await
                        .map_err(|e| format!("Get {url:?}: {e}"))?;
                    let status = response.status();
                    let _ = http_body_util::Limited::new(response.into_body(), PROBE_BODY_LIMIT)
                        .collect()
                        .await;
                    if status.is_success() {
                        Ok(())
                    } else {
                        Err(format!("bad status from {url}: {}", status.as_u16()))
                    }
                };
                match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(format!("failing or missing response from {url}: {e}")),
                    Err(_) => Err(format!("timed out waiting for {url}")),
                }
            });
        }
        let mut last = String::new();
        while let Some(result) = attempts.join_next().await {
            match result {
                Ok(Ok(())) => {
                    // The other attempts run to their end (each within its timeout), as
                    // upstream's goroutines do: cut off mid-request, they would leave the
                    // backend writing its answer to a closed connection.
                    attempts.detach_all();
                    return Ok(());
                }
                Ok(Err(e)) => last = e,
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }
}
