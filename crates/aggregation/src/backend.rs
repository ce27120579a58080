//! An APIService's backend: where its requests go (its Service's port, a ready endpoint of its
//! EndpointSlices with that port's name) and how to reach it (TLS by the APIService's
//! `caBundle` or the system's roots, the proxy client certificate, connect and handshake
//! deadlines). The proxy and the availability controller both use it, so what the controller
//! reports is what the proxy does.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

/// How long connecting to a backend may take (upstream's proxy dialer: 30 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the TLS handshake with a backend may take (upstream's transport: 10 s).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a backend cannot be reached, as upstream words it.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The Service has no port with the APIService's number.
    #[error("no service port {port} found for service {service:?}")]
    NoPort {
        /// The Service's name.
        service: String,
        /// The port the APIService names.
        port: i32,
    },
    /// No ready address of that port's name.
    #[error("no endpoints available for service {0:?}")]
    NoEndpoints(String),
    /// The TLS configuration could not be built (bad caBundle, bad client certificate).
    #[error("{0}")]
    Tls(String),
    /// Connecting, or the handshake, failed (the text is Go's `net/http` wording).
    #[error("{0}")]
    Connect(String),
}

/// A proxy client certificate that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProxyClientError(String);

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
    pub fn load(cert: &std::path::Path, key: &std::path::Path) -> Result<Self, ProxyClientError> {
        use rustls::pki_types::pem::PemObject;
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| ProxyClientError(format!("{}: {e}", cert.display())))?;
        if chain.is_empty() {
            return Err(ProxyClientError(format!(
                "{}: no certificate found",
                cert.display()
            )));
        }
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key)
            .map_err(|e| ProxyClientError(format!("{}: {e}", key.display())))?;
        let client = ProxyClient { chain, key };
        // Refuse a mismatched pair at start, not at the first proxied request.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ProxyClientError(e.to_string()))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_client_auth_cert(client.chain.clone(), client.key.clone_key())
            .map_err(|e| ProxyClientError(format!("the proxy client certificate and key: {e}")))?;
        Ok(client)
    }
}

/// The Service an APIService names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The port (443 when unset).
    pub port: i32,
}

impl ServiceRef {
    /// The name its serving certificate must carry: `<service>.<namespace>.svc`.
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

/// The Service an APIService is served by; `None` for a local one.
pub fn service_ref(apiservice: &APIService) -> Option<ServiceRef> {
    let service = apiservice.spec.as_ref()?.service.as_ref()?;
    Some(ServiceRef {
        namespace: service.namespace.clone()?,
        name: service.name.clone()?,
        port: service.port.unwrap_or(443),
    })
}

/// The name of the Service port numbered `port` (`""` when unnamed), if there is one.
pub fn service_port_name(service: &Service, port: i32) -> Option<String> {
    service
        .spec
        .as_ref()?
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.port == port)
        .map(|p| p.name.clone().unwrap_or_default())
}

/// Whether any slice has a ready endpoint (`ready` unset counts as ready) and a port named
/// `port_name` with a number (upstream's `hasAvailableEndpoint`).
pub fn has_available_endpoint(slices: &[EndpointSlice], port_name: &str) -> bool {
    slices.iter().any(|slice| {
        slice.endpoints.iter().flatten().any(ready)
            && slice
                .ports
                .iter()
                .flatten()
                .any(|p| p.name.as_deref() == Some(port_name) && p.port.is_some())
    })
}

fn ready(endpoint: &Endpoint) -> bool {
    endpoint
        .conditions
        .as_ref()
        .and_then(|c| c.ready)
        .unwrap_or(true)
}

/// The ready addresses of the slices with a port named `port_name`, each with that port's
/// number: the Service's primary family first (upstream's `ResolveEndpoint` looks at those
/// slices first), then the others. Only an endpoint's first address is used.
pub fn endpoint_addresses(
    slices: &[EndpointSlice],
    port_name: &str,
    primary: Option<&str>,
) -> Vec<Vec<SocketAddr>> {
    let mut preferred = Vec::new();
    let mut others = Vec::new();
    for slice in slices {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port_name))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        let into = if primary.is_none_or(|f| f == slice.address_type) {
            &mut preferred
        } else {
            &mut others
        };
        for endpoint in slice.endpoints.iter().flatten().filter(|e| ready(e)) {
            if let Some(ip) = endpoint
                .addresses
                .first()
                .and_then(|a| a.parse::<IpAddr>().ok())
            {
                into.push(SocketAddr::new(ip, port));
            }
        }
    }
    [preferred, others]
        .into_iter()
        .filter(|list| !list.is_empty())
        .collect()
}

/// Endpoint routing (`--enable-aggregator-routing=true`: Capstan has no kube-proxy data
/// plane), through the Service's EndpointSlices as 1.36's aggregator routes: the Service port
/// numbered `port`, then a random ready endpoint of a slice with a port of that port's name,
/// of the Service's primary family when it has one.
pub fn resolve(
    service_name: &str,
    port: i32,
    service: &Service,
    slices: &[EndpointSlice],
) -> Result<SocketAddr, BackendError> {
    let port_name = service_port_name(service, port).ok_or_else(|| BackendError::NoPort {
        service: service_name.to_string(),
        port,
    })?;
    let primary = service
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .and_then(|f| f.first())
        .map(String::as_str);
    let candidates = endpoint_addresses(slices, &port_name, primary);
    let Some(first) = candidates.first() else {
        return Err(BackendError::NoEndpoints(service_name.to_string()));
    };
    Ok(first[fastrand::usize(..first.len())])
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

/// The system's trust anchors (read once), for APIServices without a `caBundle`.
static SYSTEM_ROOTS: LazyLock<Vec<rustls::pki_types::CertificateDer<'static>>> =
    LazyLock::new(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!(%error, "reading the system trust anchors");
        }
        found.certs
    });

/// The TLS client configuration for an APIService's backend: its `caBundle` as the only
/// trust anchors (the system's when it has none), or no verification at all when `verify`
/// is false or the APIService says `insecureSkipTLSVerify`; presenting the proxy client
/// certificate when there is one.
pub fn tls_config(
    apiservice: &APIService,
    verify: bool,
    client: Option<&ProxyClient>,
) -> Result<Arc<rustls::ClientConfig>, BackendError> {
    let tls = |e: &dyn std::fmt::Display| BackendError::Tls(e.to_string());
    let authenticate = |builder: rustls::ConfigBuilder<
        rustls::ClientConfig,
        rustls::client::WantsClientCert,
    >| match client {
        Some(client) => builder
            .with_client_auth_cert(client.chain.clone(), client.key.clone_key())
            .map_err(|e| tls(&e)),
        None => Ok(builder.with_no_client_auth()),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?;
    let spec = apiservice.spec.clone().unwrap_or_default();
    let mut config = if !verify || spec.insecure_skip_tls_verify == Some(true) {
        authenticate(
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider))),
        )?
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let bundle = spec.ca_bundle.map(|b| b.0).unwrap_or_default();
        let unloadable = |e: &dyn std::fmt::Display| {
            BackendError::Tls(format!("unable to load root certificates: {e}"))
        };
        if bundle.is_empty() {
            roots.add_parsable_certificates(SYSTEM_ROOTS.iter().cloned());
        } else {
            use rustls::pki_types::pem::PemObject;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&bundle) {
                let cert = cert.map_err(|e| unloadable(&e))?;
                roots.add(cert).map_err(|e| unloadable(&e))?;
            }
            if roots.is_empty() {
                return Err(unloadable(&"no certificates found in caBundle"));
            }
        }
        authenticate(builder.with_root_certificates(roots))?
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Opens a TCP connection to a backend within [`CONNECT_TIMEOUT`].
pub(crate) async fn dial(addr: SocketAddr) -> Result<tokio::net::TcpStream, BackendError> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| BackendError::Connect(format!("dial tcp {addr}: i/o timeout")))?
        .map_err(|e| {
            BackendError::Connect(format!(
                "dial tcp {addr}: connect: {}",
                e.kind().to_string().to_lowercase()
            ))
        })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// The TLS handshake with a backend, within [`TLS_HANDSHAKE_TIMEOUT`].
pub(crate) async fn handshake(
    stream: tokio::net::TcpStream,
    name: rustls::pki_types::ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, BackendError> {
    let handshake = tokio_rustls::TlsConnector::from(config).connect(name, stream);
    tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| BackendError::Connect("net/http: TLS handshake timeout".into()))?
        .map_err(|e| BackendError::Connect(format!("tls: {e}")))
}

/// Opens an HTTP/1.1 connection over TLS to `addr`, verifying the certificate for
/// `server_name` (`<service>.<namespace>.svc`): a fresh connection, as the availability
/// probe wants (the proxy uses the pooled [`Backends`]).
pub async fn connect(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>, BackendError> {
    let stream = dial(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| BackendError::Connect(e.to_string()))?;
    let tls = handshake(stream, name, config).await?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| BackendError::Connect(e.to_string()))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}
