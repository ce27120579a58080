//! `apiservice-proxy`: what the aggregation proxy adds to a request. The bench runs a small
//! TLS backend itself (a test CA, a certificate for the backend's address), registers it with
//! a Service, Endpoints and an APIService, waits until the server reports it Available, then
//! sends the same GET at a fixed rate once straight to the backend and once through the
//! server, with the same client, and reports both latency distributions and the difference.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use bytes::Bytes;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::{Bench, histogram, latency_json};

const GROUP: &str = "bench.capstan.dev";
const VERSION: &str = "v1alpha1";
const NAME: &str = "capstan-bench-backend";

fn apiservice_name() -> String {
    format!("{VERSION}.{GROUP}")
}

async fn answer(
    request: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<http_body_util::Full<Bytes>>, Infallible> {
    let body = match request.uri().path() {
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        p if p == format!("/apis/{GROUP}/{VERSION}") => json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
            "resources": [{"name": "widgets", "singularName": "widget", "namespaced": false,
                           "kind": "Widget", "verbs": ["get", "list"]}]}),
        _ => json!({"kind": "WidgetList", "apiVersion": format!("{GROUP}/{VERSION}"),
                    "metadata": {}, "items": [{"metadata": {"name": "w1"}}]}),
    };
    Ok(http::Response::builder()
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap_or_default())
}

/// Starts the backend; returns the CA certificate (PEM) that signed its certificate.
async fn start_backend(addr: SocketAddr, server_name: &str) -> anyhow::Result<String> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let params =
        rcgen::CertificateParams::new(vec![server_name.to_string(), addr.ip().to_string()])?;
    let key = rcgen::KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let chain = vec![cert.der().clone()];
    let private = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, private)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(tls),
                        hyper::service::service_fn(answer),
                    )
                    .await;
            });
        }
    });
    Ok(ca.pem())
}

/// Sends `GET path` through `client` at `rate` per second for `seconds`; latencies in µs.
async fn drive(
    label: &str,
    client: kube::Client,
    path: String,
    rate: u64,
    seconds: u64,
    concurrency: usize,
) -> (hdrhistogram::Histogram<u64>, usize) {
    let tally = Arc::new((Mutex::new(histogram()), AtomicUsize::new(0)));
    let task = || {
        let (client, path, tally) = (client.clone(), path.clone(), tally.clone());
        async move {
            let t = Instant::now();
            let (latencies, errors) = &*tally;
            if get_ok(&client, &path).await {
                let _ = latencies
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record(t.elapsed().as_micros().max(1) as u64);
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    crate::open_loop((label, rate, seconds), concurrency, task).await;
    let (latencies, errors) = &*tally;
    let histogram = latencies.lock().unwrap_or_else(|e| e.into_inner()).clone();
    (histogram, errors.load(Ordering::Relaxed))
}

/// Whether `GET path` succeeds, its body read whole.
async fn get_ok(client: &kube::Client, path: &str) -> bool {
    let Ok(request) = http::Request::get(path).body(kube::client::Body::empty()) else {
        return false;
    };
    match client.send(request).await {
        Ok(response) => {
            let status = response.status();
            response.into_body().collect().await.is_ok() && status.is_success()
        }
        Err(_) => false,
    }
}

fn row(what: &str, h: &hdrhistogram::Histogram<u64>, errors: usize) {
    println!(
        "{what:<26} {:>7} req  {errors} errors   p50 {:>7.2} ms  p90 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
        h.len(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.9) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0,
    );
}

impl Bench {
    pub(crate) async fn apiservice_proxy(&self) -> anyhow::Result<Value> {
        let args = &self.args;
        let backend: SocketAddr = args
            .backend_address
            .as_deref()
            .context("apiservice-proxy needs --backend-address IP:PORT (an address of this machine the server can reach; not loopback for Capstan, whose Endpoints refuse it)")?
            .parse()
            .context("--backend-address must be IP:PORT")?;
        let server_name = format!("{NAME}.{}.svc", self.namespace);
        let ca = start_backend(backend, &server_name).await?;
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let endpoints: Api<Endpoints> = Api::namespaced(self.client.clone(), &self.namespace);
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": NAME, "labels": {"app": "capstan-bench"}},
                    "spec": {"ports": [{"port": 443, "targetPort": backend.port()}]}}),
                )?,
            )
            .await?;
        endpoints
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NAME},
                    "subsets": [{"addresses": [{"ip": backend.ip().to_string()}], "ports": [{"port": backend.port()}]}]}))?,
            )
            .await?;
        let apiservices = self.apiservices();
        let registration: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": apiservice_name()},
            "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 1000, "versionPriority": 15,
                     "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca),
                     "service": {"namespace": self.namespace, "name": NAME, "port": 443}}}))?;
        apiservices
            .create(&PostParams::default(), &registration)
            .await?;
        let outcome = self.measure_proxy(&apiservices, backend, &ca).await;
        let _ = apiservices
            .delete(&apiservice_name(), &DeleteParams::default())
            .await;
        let _ = endpoints.delete(NAME, &DeleteParams::default()).await;
        outcome
    }

    async fn measure_proxy(
        &self,
        apiservices: &Api<kube::api::DynamicObject>,
        backend: SocketAddr,
        ca: &str,
    ) -> anyhow::Result<Value> {
        let args = &self.args;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let object = apiservices.get(&apiservice_name()).await?;
            let conditions = object.data["status"]["conditions"].clone();
            let available = conditions
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Available" && c["status"] == "True");
            if available {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the APIService never became Available: {conditions}"
            );
            eprint!("\rapiservice-proxy: waiting for Available        ");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let path = format!("/apis/{GROUP}/{VERSION}/widgets");
        let mut direct_config = kube::Config::new(format!("https://{backend}").parse()?);
        direct_config.root_cert = Some(vec![
            rustls::pki_types::CertificateDer::from_pem_slice(ca.as_bytes())
                .map(|c| c.to_vec())
                .map_err(|e| anyhow::anyhow!("CA: {e}"))?,
        ]);
        let direct_client = kube::Client::try_from(direct_config)?;
        let (rate, seconds) = (args.rate, args.duration);
        let (direct, direct_errors) = drive(
            "direct",
            direct_client,
            path.clone(),
            rate,
            seconds,
            args.concurrency,
        )
        .await;
        let (proxied, proxied_errors) = drive(
            "proxied",
            self.client.clone(),
            path,
            rate,
            seconds,
            args.concurrency,
        )
        .await;
        println!(
            "apiservice-proxy: GET /apis/{GROUP}/{VERSION}/widgets at {rate}/s for {seconds} s, each path"
        );
        row("straight to the backend", &direct, direct_errors);
        row("through the server", &proxied, proxied_errors);
        let added = |q: f64| {
            (proxied.value_at_quantile(q) as f64 - direct.value_at_quantile(q) as f64) / 1000.0
        };
        println!(
            "added by the proxy          p50 {:.2} ms  p99 {:.2} ms",
            added(0.5),
            added(0.99)
        );
        Ok(json!({
            "rate": rate,
            "duration_seconds": seconds,
            "direct": {"latency_ms": latency_json(&direct), "errors": direct_errors},
            "proxied": {"latency_ms": latency_json(&proxied), "errors": proxied_errors},
            "added_ms": {"p50": added(0.5), "p99": added(0.99)},
        }))
    }
}

use rustls::pki_types::pem::PemObject;
