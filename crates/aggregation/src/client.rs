//! Pooled connections to APIService backends: hyper-util's client with a connector that
//! dials the resolved address and does the APIService's TLS. One client per APIService
//! version, so a changed `caBundle` (or any change) never reuses a connection made before it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

use crate::backend::{BackendError, ProxyClient, resolve, service_ref, tls_config};

/// Idle connections kept per backend address.
const IDLE_PER_BACKEND: usize = 32;
/// How long an idle backend connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A TLS connection to a backend, as hyper's client holds it.
pub struct TlsConnection(TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>);

impl Connection for TlsConnection {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Dials the address in a request's URI and does the APIService's TLS handshake, verifying
/// the certificate for `<service>.<namespace>.svc`, within the connect and handshake limits.
#[derive(Clone)]
pub struct Connector {
    config: Arc<rustls::ClientConfig>,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl tower::Service<Uri> for Connector {
    type Response = TlsConnection;
    type Error = BackendError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsConnection, BackendError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BackendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (config, name) = (self.config.clone(), self.server_name.clone());
        Box::pin(async move {
            let addr = uri
                .authority()
                .and_then(|a| a.as_str().parse().ok())
                .ok_or_else(|| BackendError::Connect(format!("no backend address in {uri}")))?;
            let stream = crate::backend::dial(addr).await?;
            let tls = crate::backend::handshake(stream, name, config).await?;
            Ok(TlsConnection(TokioIo::new(tls)))
        })
    }
}

type BackendHttp = Client<Connector, Full<Bytes>>;

/// Sends requests to APIService backends over pooled, verified TLS connections.
pub struct Backends {
    /// APIService name → (its resourceVersion, its client).
    clients: Mutex<HashMap<String, (String, BackendHttp)>>,
    proxy_client: Option<Arc<ProxyClient>>,
    response_header_timeout: Duration,
}

impl Backends {
    /// Presenting `proxy_client` (if any); a backend must send its response headers within
    /// `response_header_timeout`.
    pub fn new(proxy_client: Option<Arc<ProxyClient>>, response_header_timeout: Duration) -> Self {
        Backends {
            clients: Mutex::new(HashMap::new()),
            proxy_client,
            response_header_timeout,
        }
    }

    /// Whether the APIService's TLS configuration can be built (a bad `caBundle` cannot).
    pub fn check_tls(&self, apiservice: &APIService) -> Result<(), BackendError> {
        tls_config(apiservice, true, self.proxy_client.as_deref()).map(|_| ())
    }

    fn client(&self, apiservice: &APIService) -> Result<BackendHttp, BackendError> {
        let name = apiservice.metadata.name.clone().unwrap_or_default();
        let version = apiservice
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, client)) = clients.get(&name)
            && *seen == version
        {
            return Ok(client.clone());
        }
        let target = service_ref(apiservice)
            .ok_or_else(|| BackendError::Connect("local APIService".into()))?;
        let server_name = rustls::pki_types::ServerName::try_from(target.server_name())
            .map_err(|e| BackendError::Tls(e.to_string()))?;
        let connector = Connector {
            config: tls_config(apiservice, true, self.proxy_client.as_deref())?,
            server_name,
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_max_idle_per_host(IDLE_PER_BACKEND)
            .build(connector);
        clients.insert(name, (version, client.clone()));
        Ok(client)
    }

    /// Forgets the clients (and their idle connections) of APIServices not in `names`.
    pub fn retain(&self, names: &HashSet<String>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| names.contains(name));
    }

    /// Sends `request` (origin-form URI) to a ready address of the APIService's Service,
    /// with `Host` set to that address. Errors are worded as upstream's proxy words them.
    pub async fn send(
        &self,
        apiservice: &APIService,
        service: &Service,
        slices: &[EndpointSlice],
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, String> {
        let target = service_ref(apiservice).ok_or_else(|| "local APIService".to_string())?;
        let addr =
            resolve(&target.name, target.port, service, slices).map_err(|e| e.to_string())?;
        let client = self.client(apiservice).map_err(|e| e.to_string())?;
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        *request.uri_mut() = format!("https://{addr}{path}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| e.to_string())?;
        if let Ok(host) = http::HeaderValue::from_str(&addr.to_string()) {
            request.headers_mut().insert(http::header::HOST, host);
        }
        // A backend that takes the connection and never answers does not hold the request
        // (a proxied watch has no request deadline) for longer than this.
        tokio::time::timeout(self.response_header_timeout, client.request(request))
            .await
            .map_err(|_| "timeout awaiting response headers".to_string())?
            .map_err(|e| reason(&e))
    }
}

/// The innermost cause of a client error (the connector's own words, where it failed).
fn reason(error: &hyper_util::client::legacy::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    let mut text = error.to_string();
    while let Some(cause) = source {
        text = cause.to_string();
        source = cause.source();
    }
    text
}
