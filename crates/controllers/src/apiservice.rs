//! APIService availability (`spec/apiservice.md` §5–§7) and what the aggregation proxy shares
//! with it: resolving an APIService's backend address through its Service's Endpoints, and
//! TLS connections to it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::watch_all;
use base64::Engine;
use bytes::Bytes;
use capstan_machinery::meta;
use capstan_registry::cache::EventType;
use capstan_registry::watch::WatchItem;
use capstan_registry::{ReadAt, Registry, WriteOptions};
use capstan_resources::apiservice::{LOCAL_MESSAGE, is_local, set_available};
use http_body_util::BodyExt;
use serde_json::Value;

/// How many APIServices are checked at once.
const WORKERS: usize = 5;
/// How often every APIService is checked again, changes or not (upstream's period).
const RESYNC: Duration = Duration::from_secs(30);
/// How often service-backed APIServices are probed again: a backend that stops (or starts)
/// answering shows in the condition within seconds, not only at the next 30 s resync.
const REPROBE: Duration = Duration::from_secs(5);
/// The system trust anchors used when an APIService has no caBundle.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The discovery probe's timeout per attempt.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to a backend may take (upstream's proxy dialer: 30 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the TLS handshake with a backend may take (upstream's transport: 10 s).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a probe's response body that is read (the status is what counts).
const PROBE_BODY_LIMIT: usize = 1024 * 1024;

/// The client certificate the aggregator presents to backends (upstream's
/// `--proxy-client-cert-file` / `--proxy-client-key-file`), so a backend can tell requests
/// from the aggregator — whose `X-Remote-User` and `X-Remote-Group` it may then trust — from
/// anyone else's.
pub struct ProxyClient {
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
}

impl ProxyClient {
    /// Loads the certificate chain and key (PEM files).
    pub fn load(cert: &std::path::Path, key: &std::path::Path) -> Result<Self, String> {
        use rustls::pki_types::pem::PemObject;
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no certificate found", cert.display()));
        }
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key)
            .map_err(|e| format!("{}: {e}", key.display()))?;
        let client = ProxyClient { chain, key };
        // Refuse a mismatched pair at start, not at the first proxied request.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_client_auth_cert(client.chain.clone(), client.key.clone_key())
            .map_err(|e| format!("the proxy client certificate and key: {e}"))?;
        Ok(client)
    }
}

/// The Service an APIService names: `(namespace, name, port)`.
pub fn service_ref(apiservice: &Value) -> Option<(String, String, i64)> {
    let service = apiservice
        .pointer("/spec/service")
        .filter(|s| !s.is_null())?;
    Some((
        service.get("namespace")?.as_str()?.to_string(),
        service.get("name")?.as_str()?.to_string(),
        service.get("port").and_then(Value::as_i64).unwrap_or(443),
    ))
}

/// Endpoint routing (§10.1, `--enable-aggregator-routing=true`: Capstan has no kube-proxy data
/// plane): the Service port numbered `port`, then a random Endpoints subset with addresses and
/// a port of that port's name, then a random address.
pub fn resolve(
    service_name: &str,
    port: i64,
    service: &Value,
    endpoints: Option<&Value>,
) -> Result<SocketAddr, String> {
    let port_name = service_port_name(service, port)
        .ok_or_else(|| format!("no service port {port} found for service {service_name:?}"))?;
    let candidates = endpoint_addresses(endpoints, &port_name);
    if candidates.is_empty() {
        return Err(format!(
            "no endpoints available for service {service_name:?}"
        ));
    }
    let (ip, port) = candidates[fastrand::usize(..candidates.len())];
    Ok(SocketAddr::new(ip, port))
}

/// The name of the Service port numbered `port` (`""` when unnamed), if there is one.
fn service_port_name(service: &Value, port: i64) -> Option<String> {
    service
        .pointer("/spec/ports")
        .and_then(Value::as_array)?
        .iter()
        .find(|p| p.get("port").and_then(Value::as_i64) == Some(port))
        .map(|p| {
            p.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
}

/// The ready addresses of the Endpoints subsets that have a port named `port_name`, each with
/// that port's number.
fn endpoint_addresses(endpoints: Option<&Value>, port_name: &str) -> Vec<(IpAddr, u16)> {
    let mut candidates = Vec::new();
    for subset in endpoints
        .and_then(|e| e.get("subsets"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(endpoint_port) = subset
            .get("ports")
            .and_then(Value::as_array)
            .and_then(|ports| {
                ports
                    .iter()
                    .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            })
            .and_then(|p| p.get("port").and_then(Value::as_u64))
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for address in subset
            .get("addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(ip) = address
                .get("ip")
                .and_then(Value::as_str)
                .and_then(|ip| ip.parse().ok())
            {
                candidates.push((ip, endpoint_port));
            }
        }
    }
    candidates
}

/// Accepts any server certificate (the availability probe, and `insecureSkipTLSVerify`).
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS client configuration for an APIService's backend (§10.2): its `caBundle` as the
/// only trust anchors, or no verification at all when `verify` is false or the APIService
/// says `insecureSkipTLSVerify`; presenting the proxy client certificate when there is one.
pub fn tls_config(
    apiservice: &Value,
    verify: bool,
    client: Option<&ProxyClient>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let authenticate = |builder: rustls::ConfigBuilder<
        rustls::ClientConfig,
        rustls::client::WantsClientCert,
    >| match client {
        Some(client) => builder
            .with_client_auth_cert(client.chain.clone(), client.key.clone_key())
            .map_err(|e| e.to_string()),
        None => Ok(builder.with_no_client_auth()),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let insecure = apiservice
        .pointer("/spec/insecureSkipTLSVerify")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut config = if !verify || insecure {
        authenticate(
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider))),
        )?
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let bundle = apiservice
            .pointer("/spec/caBundle")
            .and_then(Value::as_str)
            .unwrap_or("");
        // Without a caBundle the system's trust anchors apply (Debian's bundle file).
        let pem = if bundle.is_empty() {
            std::fs::read(SYSTEM_ROOTS).unwrap_or_default()
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(bundle)
                .map_err(|e| format!("unable to load root certificates: {e}"))?
        };
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("unable to load root certificates: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("unable to load root certificates: {e}"))?;
        }
        if roots.is_empty() && !bundle.is_empty() {
            return Err(
                "unable to load root certificates: no certificates found in caBundle".into(),
            );
        }
        authenticate(builder.with_root_certificates(roots))?
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Opens an HTTP/1.1 connection over TLS to `addr`, verifying the certificate for
/// `server_name` (`<service>.<namespace>.svc`).
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| format!("dial tcp {addr}: i/o timeout"))?
        .map_err(|e| {
            format!(
                "dial tcp {addr}: connect: {}",
                e.kind().to_string().to_lowercase()
            )
        })?;
    let _ = stream.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| e.to_string())?;
    let handshake = tokio_rustls::TlsConnector::from(config).connect(name, stream);
    let tls = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| "net/http: TLS handshake timeout".to_string())?
        .map_err(|e| format!("tls: {e}"))?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Keeps the `Available` condition of every APIService (§6, §7).
pub struct AvailabilityController {
    apiservices: Arc<Registry>,
    services: Arc<Registry>,
    endpoints: Arc<Registry>,
    client: Option<Arc<ProxyClient>>,
}

/// The outcome of one check: status, reason, message.
type Verdict = (&'static str, &'static str, String);

impl AvailabilityController {
    /// A controller over these registries.
    pub fn new(
        apiservices: Arc<Registry>,
        services: Arc<Registry>,
        endpoints: Arc<Registry>,
    ) -> Self {
        AvailabilityController {
            apiservices,
            services,
            endpoints,
            client: None,
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
        let queue = Arc::new(crate::queue::WorkQueue::<String>::with_backoff(
            crate::queue::Backoff {
                max: Duration::from_secs(30),
                max_retries: None,
                ..crate::queue::Backoff::CONTROLLER
            },
        ));
        // APIService changes check that APIService.
        {
            let (controller, queue) = (controller.clone(), queue.clone());
            tokio::spawn(async move {
                loop {
                    let mut watcher = watch_all(&controller.apiservices, false);
                    while let Some(item) = watcher.next().await {
                        if let WatchItem::Event(kind, object) = item
                            && kind != EventType::Deleted
                        {
                            queue.add(object.selectable.name().to_string());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
        // Service and Endpoints changes check every APIService that names that Service.
        for registry in [controller.services.clone(), controller.endpoints.clone()] {
            let (controller, queue) = (controller.clone(), queue.clone());
            tokio::spawn(async move {
                loop {
                    let mut watcher = watch_all(&registry, false);
                    while let Some(item) = watcher.next().await {
                        if let WatchItem::Event(_, object) = item {
                            let s = &object.selectable;
                            for name in controller.referencing(s.namespace(), s.name()).await {
                                queue.add(name);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
        // Periodic checks: service-backed APIServices every few seconds, all every 30 s.
        {
            let (controller, queue) = (controller.clone(), queue.clone());
            tokio::spawn(async move {
                let mut last_full = tokio::time::Instant::now();
                loop {
                    tokio::time::sleep(REPROBE).await;
                    let full = last_full.elapsed() >= RESYNC;
                    if full {
                        last_full = tokio::time::Instant::now();
                    }
                    for apiservice in controller.all().await {
                        if full || service_ref(&apiservice).is_some() {
                            queue.add(meta::name(&apiservice).to_string());
                        }
                    }
                }
            });
        }
        // Workers over a per-key queue: a slow probe holds up only its own APIService.
        // Failures are retried with exponential back-off, 5 ms doubling to 30 s (spec §7).
        for _ in 0..WORKERS {
            let (controller, queue) = (controller.clone(), queue.clone());
            tokio::spawn(async move {
                loop {
                    let name = queue.next().await;
                    let result = controller.sync(&name).await;
                    queue.done(&name);
                    match result {
                        Ok(()) => queue.forget(&name),
                        Err(error) => {
                            let delay = queue.retry_later(name.clone());
                            tracing::debug!(%name, %error, ?delay, "apiservice check failed; retrying");
                        }
                    }
                }
            });
        }
    }

    async fn all(&self) -> Vec<Value> {
        self.apiservices
            .list(
                "",
                &capstan_registry::ListOptions {
                    read_at: ReadAt::Any,
                    ..Default::default()
                },
            )
            .await
            .map(|list| list.items.iter().map(|o| o.object()).collect())
            .unwrap_or_default()
    }

    async fn referencing(&self, namespace: &str, name: &str) -> Vec<String> {
        self.all()
            .await
            .iter()
            .filter(|a| service_ref(a).is_some_and(|(ns, n, _)| ns == namespace && n == name))
            .map(|a| meta::name(a).to_string())
            .collect()
    }

    async fn sync(&self, name: &str) -> Result<(), String> {
        let apiservice = match self.apiservices.get("", name, ReadAt::Latest).await {
            Ok(object) => object,
            Err(e) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e.message),
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
            .update("", name, updated, &options, true)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(e.message),
        }
    }

    /// §7: the Service, its port and Endpoints, then the discovery probe.
    async fn check(&self, apiservice: &Value) -> Verdict {
        let Some((namespace, name, port)) = service_ref(apiservice) else {
            return ("True", "Local", LOCAL_MESSAGE.to_string());
        };
        let service = match self.services.get(&namespace, &name, ReadAt::Latest).await {
            Ok(service) => service,
            Err(e) if e.code == 404 => {
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
        let endpoints = match self.endpoints.get(&namespace, &name, ReadAt::Latest).await {
            Ok(endpoints) => Some(endpoints),
            Err(e) if e.code == 404 => None,
            Err(e) => {
                return (
                    "Unknown",
                    "EndpointsAccessError",
                    format!(
                        "service/{name} in {namespace:?} cannot be checked due to: {}",
                        e.message
                    ),
                );
            }
        };
        let cluster_ip_type = service
            .pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            == "ClusterIP";
        if cluster_ip_type {
            let Some(port_name) = service_port_name(&service, port) else {
                return (
                    "False",
                    "ServicePortError",
                    format!("service/{name} in {namespace:?} is not listening on port {port}"),
                );
            };
            let Some(endpoints) = &endpoints else {
                return (
                    "False",
                    "EndpointsNotFound",
                    format!("cannot find endpoints for service/{name} in {namespace:?}"),
                );
            };
            let ready = !endpoint_addresses(Some(endpoints), &port_name).is_empty();
            if !ready {
                return (
                    "False",
                    "MissingEndpoints",
                    format!(
                        "endpoints for service/{name} in {namespace:?} have no addresses with port name {port_name:?}"
                    ),
                );
            }
        }
        match self
            .probe(
                apiservice,
                &service,
                endpoints.as_ref(),
                &namespace,
                &name,
                port,
            )
            .await
        {
            Ok(()) => ("True", "Passed", "all checks passed".to_string()),
            Err(error) => ("False", "FailedDiscoveryCheck", error),
        }
    }

    /// §7 step 3: five concurrent `GET /apis/<group>/<version>` attempts; any 2xx passes.
    /// Unlike upstream's probe (which skips certificate verification), the backend's
    /// certificate is verified exactly as the proxy verifies it (`caBundle`, server name
    /// `<service>.<namespace>.svc`, or `insecureSkipTLSVerify`): an APIService whose every
    /// proxied request would fail the TLS handshake is reported `FailedDiscoveryCheck`
    /// instead of `Available`, as the issue asks.
    async fn probe(
        &self,
        apiservice: &Value,
        service: &Value,
        endpoints: Option<&Value>,
        namespace: &str,
        name: &str,
        port: i64,
    ) -> Result<(), String> {
        let group = apiservice
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let version = apiservice
            .pointer("/spec/version")
            .and_then(Value::as_str)
            .unwrap_or("");
        let path = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let config = tls_config(apiservice, true, self.client.as_deref())?;
        let server_name = format!("{name}.{namespace}.svc");
        let mut attempts = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let addr = resolve(name, port, service, endpoints)?;
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
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last = e,
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }
}
