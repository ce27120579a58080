//! `capstan dns`: Kubernetes DNS-based service discovery (the specification's version 1.1.0,
//! with CoreDNS's `kubernetes` plugin where the specification leaves room), answered from
//! Services and EndpointSlices read through the API, so it works against any kube-apiserver.
//! hickory-server does the wire format, UDP and TCP, and truncation.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use http_body_util::Full;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::watcher;
use tokio::net::{TcpListener, UdpSocket};

pub mod answer;
pub mod index;
pub mod metrics;
pub mod server;

use answer::Zone;
use capstan_agent::{Change, follow};
use index::Index;
use metrics::Metrics;

/// `capstan dns`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct DnsArgs {
    /// The kubeconfig of the API server to read (default: $KUBECONFIG, ~/.kube/config, or the
    /// in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The address to answer on, over UDP and TCP.
    #[arg(long, default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Resolvers for names outside the cluster domain, as `ADDR[:PORT]` (repeatable; default:
    /// the nameservers of /etc/resolv.conf). `none`: refuse such names.
    #[arg(long)]
    pub upstream: Vec<String>,
    /// The TTL of every record, in seconds.
    #[arg(long, default_value_t = 5)]
    pub ttl: u32,
    /// Where `/metrics` is served (empty: nowhere).
    #[arg(long, default_value = "127.0.0.1:9153")]
    pub metrics_bind_address: String,
    /// `<a-b-c-d>.<ns>.pod.<zone>` records: `insecure` answers the address for any namespace
    /// with Services (CoreDNS's `pods insecure`), `disabled` (the default) does not.
    #[arg(long, default_value = "disabled", value_parser = ["disabled", "insecure"])]
    pub pods: String,
}

impl DnsArgs {
    /// The defaults, for `capstan serve --dns ADDR:PORT`.
    pub fn in_process(kubeconfig: PathBuf, listen: SocketAddr) -> DnsArgs {
        DnsArgs {
            kubeconfig: Some(kubeconfig),
            listen,
            cluster_domain: "cluster.local".to_owned(),
            upstream: Vec::new(),
            ttl: 5,
            metrics_bind_address: String::new(),
            pods: "disabled".to_owned(),
        }
    }
}

/// The nameservers of a resolv.conf, on port 53.
fn resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

fn upstreams(args: &DnsArgs) -> anyhow::Result<Vec<SocketAddr>> {
    if args.upstream.iter().any(|u| u == "none") {
        return Ok(Vec::new());
    }
    if args.upstream.is_empty() {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        return Ok(resolv_conf(&text)
            .into_iter()
            .filter(|a| a != &args.listen)
            .collect());
    }
    args.upstream
        .iter()
        .map(|u| {
            u.parse::<SocketAddr>()
                .or_else(|_| {
                    u.parse::<std::net::IpAddr>()
                        .map(|ip| SocketAddr::new(ip, 53))
                })
                .with_context(|| format!("--upstream {u}"))
        })
        .collect()
}

/// Runs the DNS server until the process ends.
pub async fn run(args: DnsArgs) -> anyhow::Result<()> {
    let domain = args
        .cluster_domain
        .trim_end_matches('.')
        .to_ascii_lowercase();
    anyhow::ensure!(!domain.is_empty(), "--cluster-domain must not be empty");
    let zone = Zone {
        domain,
        ttl: args.ttl,
        pods: args.pods == "insecure",
    };
    let upstreams = upstreams(&args)?;
    let client = capstan_agent::client(args.kubeconfig.as_deref()).await?;
    let index = Arc::new(RwLock::new(Index::default()));
    let metrics = Arc::new(Metrics::new(args.listen.to_string()));
    let services = tokio::spawn(into_index(
        Api::all(client.clone()),
        watcher::Config::default(),
        ("Services", index.clone()),
        service_change,
    ));
    let slices_config = watcher::Config::default().labels("kubernetes.io/service-name");
    let slices = tokio::spawn(into_index(
        Api::all(client),
        slices_config,
        ("EndpointSlices", index.clone()),
        slice_change,
    ));
    if !args.metrics_bind_address.is_empty() {
        let addr: SocketAddr = args
            .metrics_bind_address
            .parse()
            .context("--metrics-bind-address")?;
        tokio::spawn(serve_metrics(addr, metrics.clone()));
    }
    let handler = server::Handler {
        zone: zone.clone(),
        index,
        upstreams: upstreams.clone(),
        metrics,
    };
    let mut server = hickory_server::Server::new(handler);
    let udp = UdpSocket::bind(args.listen)
        .await
        .with_context(|| format!("listening on udp {}", args.listen))?;
    let tcp = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on tcp {}", args.listen))?;
    server.register_socket(udp);
    server.register_listener(tcp, Duration::from_secs(5), 64 * 1024);
    tracing::info!(listen = %args.listen, zone = %zone.domain, ?upstreams, "capstan dns serving");
    tokio::select! {
        r = server.block_until_done() => r.context("the DNS server stopped")?,
        r = services => r.context("the Service watch")?,
        r = slices => r.context("the EndpointSlice watch")?,
    }
    Ok(())
}

/// Follows a watch into the index.
async fn into_index<K>(
    api: Api<K>,
    config: watcher::Config,
    (what, index): (&str, Arc<RwLock<Index>>),
    apply: fn(&mut Index, Change<K>),
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    follow(api, config, what, |change| {
        apply(
            &mut index.write().unwrap_or_else(|p| p.into_inner()),
            change,
        )
    })
    .await
}

fn service_change(index: &mut Index, change: Change<capstan_agent::ServiceView>) {
    match change.map(Service::from) {
        Change::Listed(all) => index.replace_services(all),
        Change::Applied(service) => index.put_service(service),
        Change::Deleted(service) => index.remove_service(&service),
    }
}

fn slice_change(index: &mut Index, change: Change<EndpointSlice>) {
    match change {
        Change::Listed(all) => index.replace_slices(all),
        Change::Applied(slice) => index.put_slice(slice),
        Change::Deleted(slice) => index.remove_slice(&slice),
    }
}

async fn serve_metrics(addr: SocketAddr, metrics: Arc<Metrics>) {
    let listener = match TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(%err, %addr, "serving /metrics");
            return;
        }
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (code, body) = match req.uri().path() {
                        "/metrics" => (http::StatusCode::OK, metrics.encode()),
                        _ => (
                            http::StatusCode::NOT_FOUND,
                            "404 page not found\n".to_owned(),
                        ),
                    };
                    let response = http::Response::builder()
                        .status(code)
                        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                        .body(Full::new(hyper::body::Bytes::from(body)))
                        .unwrap_or_else(|_| http::Response::new(Full::default()));
                    async move { Ok::<_, Infallible>(response) }
                });
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let _ = builder
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::resolv_conf;

    #[test]
    fn nameservers_come_from_resolv_conf() {
        let text = "# generated\nsearch example.org\nnameserver 10.0.0.2\nnameserver  2001:db8::53\noptions ndots:5\n";
        let addrs: Vec<String> = resolv_conf(text).iter().map(|a| a.to_string()).collect();
        assert_eq!(addrs, ["10.0.0.2:53", "[2001:db8::53]:53"]);
    }
}
