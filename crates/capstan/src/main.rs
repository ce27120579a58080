//! `capstan`: a Kubernetes-compatible control plane for service networking.
//!
//! `capstan serve` opens the store, loads the watch cache, creates first-start credentials and
//! the built-in objects, and serves the Kubernetes API over HTTPS.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use capstan_apiserver::ApiServer;
use capstan_registry::Registry;
use capstan_registry::cache::CacheSet;
use capstan_resources::core::service::{IpRange, PortRange, ServiceAllocator, ServiceStrategy};
use capstan_storage::{Compactor, EmbeddedOptions, EmbeddedStore, Storage};
use clap::{Parser, Subcommand, ValueEnum};

mod bootstrap;
mod controllers;

/// mimalloc returns freed memory to the system and fragments less than glibc's malloc under
/// many threads: the server's resident size tracks its live data.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "capstan", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start Capstan.
    Serve(Box<ServeArgs>),
    /// Run the node agent that makes Services carry traffic (nftables), against any API server.
    Proxy(capstan_proxy::ProxyArgs),
    /// Answer Kubernetes DNS (the service discovery specification) from any API server.
    Dns(capstan_dns::DnsArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StorageKind {
    /// The crash-safe embedded store in --data-dir (the default; one machine).
    Embedded,
    /// etcd v3 at --etcd-servers (several replicas sharing one cluster state).
    Etcd,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where the embedded store, certificates, admin token and kubeconfig live.
    #[arg(long, default_value = "./capstan-data")]
    data_dir: PathBuf,
    /// Which storage engine to use.
    #[arg(long, value_enum, default_value_t = StorageKind::Embedded)]
    storage: StorageKind,
    /// Embedded store: how long a group commit waits for more writes when the last one took
    /// four or more (a lone writer never waits). 0 disables it. [default: 300us]
    #[arg(long, value_parser = parse_duration)]
    storage_commit_delay: Option<Duration>,
    /// etcd client URLs, comma separated (with --storage etcd).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    etcd_servers: Vec<String>,
    /// The CA bundle etcd's serving certificates are checked against (`https://` servers).
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// The client certificate Capstan presents to etcd (`--client-cert-auth`).
    #[arg(long, requires = "etcd_keyfile")]
    etcd_certfile: Option<PathBuf>,
    /// The key of --etcd-certfile.
    #[arg(long, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    /// Key prefix in etcd, so one etcd can host several Capstan clusters.
    #[arg(long, default_value = "/registry/")]
    etcd_prefix: String,
    /// How often storage history is compacted (kube-apiserver's default: 5m). 0 disables it.
    #[arg(long, alias = "compaction-interval", default_value = "5m", value_parser = parse_duration)]
    etcd_compaction_interval: Duration,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: std::net::IpAddr,
    /// The HTTPS port.
    #[arg(long, alias = "secure-port", default_value_t = 6443)]
    port: u16,
    /// The address published in the `kubernetes` Endpoints (default: the bind address, or the
    /// host's primary address when binding all addresses; none when it is loopback, which
    /// Endpoints may not hold).
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// CIDR(s) cluster IPs are allocated from (one, or two of different families).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// Inclusive node port range (`a-b` or `a+n`).
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// Do not run the endpoints and EndpointSlice controllers (Endpoints and slices are then
    /// left entirely to clients).
    #[arg(long)]
    disable_endpoints_controller: bool,
    /// Also run `capstan proxy` in this process (its defaults; node name: the host name), so
    /// that this machine's Services carry traffic.
    #[arg(long)]
    proxy: bool,
    /// Also answer Kubernetes DNS at this address (UDP and TCP), as `capstan dns` with its
    /// defaults (zone `cluster.local`, the host's resolvers upstream).
    #[arg(long)]
    dns: Option<std::net::SocketAddr>,
    /// The most endpoints the EndpointSlice controller puts in one slice (1–1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    max_endpoints_per_slice: u16,
    /// Services whose Endpoints are synced at once.
    #[arg(long, default_value_t = 5)]
    concurrent_endpoint_syncs: usize,
    /// Services whose EndpointSlices are synced at once.
    #[arg(long, default_value_t = 5)]
    concurrent_service_endpoint_syncs: usize,
    /// Read-only requests served at once; more are refused with 429 (0: no limit). Watches
    /// and other long-running requests are not counted.
    #[arg(long, default_value_t = 400)]
    max_requests_inflight: usize,
    /// Mutating requests served at once; more are refused with 429 (0: no limit).
    #[arg(long, default_value_t = 200)]
    max_mutating_requests_inflight: usize,
    /// How long a request that is not long-running may take before it is answered 504
    /// (a Go duration; a request's smaller `timeout` parameter shortens it).
    #[arg(long, default_value = "1m0s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// A watch without timeoutSeconds ends after between this many seconds and twice as many.
    #[arg(long, default_value_t = 1800)]
    min_request_timeout: u64,
    /// Concurrent HTTP/2 streams per client connection (0: the default, 100).
    #[arg(long, default_value_t = 0)]
    http2_max_streams_per_connection: u32,
    /// Open client connections at once; further clients wait to be accepted (at most the
    /// process's file descriptor limit, less a reserve).
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
    /// The largest object stored (etcd's flag and default, 1.5 MiB); larger writes fail
    /// with etcd's `request is too large`.
    #[arg(long, default_value_t = capstan_registry::MAX_OBJECT_BYTES)]
    max_request_bytes: usize,
    /// Client certificate (PEM) the aggregation proxy and the availability checks present to
    /// APIService backends, so they can tell the aggregator's requests from anyone else's.
    #[arg(long, requires = "proxy_client_key_file")]
    proxy_client_cert_file: Option<PathBuf>,
    /// The key of --proxy-client-cert-file (PEM).
    #[arg(long, requires = "proxy_client_cert_file")]
    proxy_client_key_file: Option<PathBuf>,
    /// The most bytes of recent changes one kind's watch cache keeps for resuming watches
    /// (besides at most 102,400 changes and 75 s); a watcher further behind is ended.
    #[arg(long, default_value_t = 128 * 1024 * 1024)]
    watch_cache_history_bytes: usize,
    /// Run the controllers only while this replica holds the controllers' Lease
    /// (`--leader-elect=false`: always; for one replica only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
    /// How long a leader's Lease holds without renewal; others wait this long to take it.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops its controllers.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: Duration,
    /// How often candidates try to acquire the Lease, and the leader renews it.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: Duration,
    /// The name of the controllers' Lease.
    #[arg(long, default_value = "capstan-controllers")]
    leader_elect_resource_name: String,
    /// The namespace of the controllers' Lease.
    #[arg(long, default_value = "kube-system")]
    leader_elect_resource_namespace: String,
    /// Feature gates, `Name=true|false,…`, as kube-apiserver's. Known here:
    /// `APIResponseCompression` (default true: responses over 128 KiB are gzipped for
    /// clients that accept it).
    #[arg(long, value_delimiter = ',', value_parser = parse_feature_gate)]
    feature_gates: Vec<(FeatureGate, bool)>,
}

/// The feature gates `--feature-gates` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FeatureGate {
    ApiResponseCompression,
}

/// One `Name=bool` of `--feature-gates`; an unknown name is refused, as upstream refuses it.
fn parse_feature_gate(text: &str) -> Result<(FeatureGate, bool), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("missing bool value for {text}"))?;
    let enabled = value
        .trim()
        .parse::<bool>()
        .map_err(|_| format!("invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"))?;
    match name.trim() {
        "APIResponseCompression" => Ok((FeatureGate::ApiResponseCompression, enabled)),
        other => Err(format!("unrecognized feature gate: {other}")),
    }
}

impl ServeArgs {
    /// A feature gate's setting: the last `--feature-gates` entry for it, else its default.
    fn gate(&self, gate: FeatureGate, default: bool) -> bool {
        self.feature_gates
            .iter()
            .rev()
            .find(|(g, _)| *g == gate)
            .map_or(default, |(_, enabled)| *enabled)
    }

    /// The limits the API server enforces, from the flags.
    fn limits(&self) -> capstan_apiserver::limits::Limits {
        let defaults = capstan_apiserver::limits::Limits::default();
        capstan_apiserver::limits::Limits {
            max_requests_inflight: self.max_requests_inflight,
            max_mutating_requests_inflight: self.max_mutating_requests_inflight,
            request_timeout: self.request_timeout,
            min_request_timeout: Duration::from_secs(self.min_request_timeout.max(1)),
            http2_max_streams_per_connection: match self.http2_max_streams_per_connection {
                0 => defaults.http2_max_streams_per_connection,
                n => n,
            },
            max_connections: self.max_connections.clamp(1, descriptor_budget()),
        }
    }
}

/// Raises the soft open-file limit to the hard one (as Go programs, kube-apiserver among
/// them, do at start) and returns how many connections that leaves room for, keeping a
/// reserve for the store, etcd clients, backends and logs.
fn descriptor_budget() -> usize {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    usize::try_from(soft.saturating_sub(256))
        .unwrap_or(usize::MAX)
        .max(1)
}

/// Parses Go durations as kube-apiserver flags take them: `300ms`, `90s`, `5m`, `1m0s`, `0`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    capstan_gostd::duration::parse_flag_duration(text)
}

async fn open_storage(args: &ServeArgs) -> anyhow::Result<Arc<dyn Storage>> {
    match args.storage {
        StorageKind::Embedded => {
            let mut options = EmbeddedOptions::new(&args.data_dir);
            if let Some(delay) = args.storage_commit_delay {
                options.commit_delay = delay;
            }
            let store = EmbeddedStore::open(options)
                .with_context(|| format!("opening the store in {}", args.data_dir.display()))?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "etcd")]
        StorageKind::Etcd => {
            let mut options = capstan_storage::EtcdOptions::new(args.etcd_servers.clone());
            options.prefix = args.etcd_prefix.clone();
            options.request_timeout = args.request_timeout;
            if args.etcd_cafile.is_some() || args.etcd_certfile.is_some() {
                options.tls = Some(capstan_storage::EtcdTls {
                    ca_file: args.etcd_cafile.clone(),
                    cert_file: args.etcd_certfile.clone(),
                    key_file: args.etcd_keyfile.clone(),
                });
            }
            let store = capstan_storage::EtcdStore::connect(options)
                .await
                .with_context(|| format!("connecting to etcd at {:?}", args.etcd_servers))?;
            Ok(Arc::new(store))
        }
        #[cfg(not(feature = "etcd"))]
        StorageKind::Etcd => anyhow::bail!(
            "this capstan was built without the etcd engine; rebuild with `--features etcd`"
        ),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let ranges = args
        .service_cluster_ip_range
        .split(',')
        .map(|r| IpRange::parse(r.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--service-cluster-ip-range: {e}"))?;
    if ranges.is_empty() || ranges.len() > 2 {
        anyhow::bail!("--service-cluster-ip-range takes one or two CIDRs");
    }
    let ports = PortRange::parse(&args.service_node_port_range)
        .map_err(|e| anyhow::anyhow!("--service-node-port-range: {e}"))?;
    let listener = tokio::net::TcpListener::bind((args.bind_address, args.port))
        .await
        .with_context(|| format!("listening on {}:{}", args.bind_address, args.port))?;
    let store = open_storage(&args).await?;
    let _compactor = (!args.etcd_compaction_interval.is_zero())
        .then(|| Compactor::start(store.clone(), args.etcd_compaction_interval));
    let service_strategy = Arc::new(ServiceStrategy::new(ServiceAllocator::new(ranges, ports)));
    let strategies = capstan_resources::registered(service_strategy.clone());
    let caches = Arc::new(CacheSet::for_kinds(
        store.clone(),
        strategies
            .iter()
            .map(|kind| kind.clone() as Arc<dyn capstan_registry::cache::Project>),
        capstan_registry::cache::HistoryLimits {
            events: 102_400,
            bytes: args.watch_cache_history_bytes,
        },
    ));
    caches.start().await.context("loading the watch cache")?;
    let registries: Vec<Arc<Registry>> = strategies
        .iter()
        .map(|strategy| {
            let info = strategy.info();
            let cache = caches
                .cache(&info.list_prefix(""))
                .expect("a cache exists for every registered prefix");
            Arc::new(
                Registry::new(
                    strategy.clone(),
                    store.clone(),
                    cache,
                    info.namespaced
                        .then(|| capstan_resources::core::namespace::NAMESPACE_PREFIX.to_string()),
                )
                .with_max_object_bytes(args.max_request_bytes),
            )
        })
        .collect();
    // Every replica checks the allocations before it serves (upstream's repair post-start
    // hook); the elected controllers repeat the check periodically. Other replicas may be
    // writing meanwhile, which the check allows for.
    match service_strategy.allocator().repair(store.as_ref()).await {
        Ok(0) => {}
        Ok(repaired) => tracing::warn!(repaired, "allocation repair fixed mismatches"),
        Err(error) => tracing::warn!(error = %error.message, "checking allocations"),
    }
    service_strategy
        .allocator()
        .start(store.clone())
        .await
        .map_err(|e| anyhow::anyhow!("loading allocations: {}", e.message))?;
    // This replica's record among the `kubernetes` Service's endpoints, kept until shutdown.
    let (stop_electing, shutdown) = tokio::sync::watch::channel(false);
    let masters = capstan_controllers::masters::MasterLeases::new(store.clone());
    let mut recorded = None;
    if let Some(address) = advertise_address(&args) {
        masters
            .renew(address)
            .await
            .context("recording this replica's address")?;
        let (masters, shutdown) = (masters.clone(), shutdown.clone());
        recorded = Some(tokio::spawn(async move {
            masters.keep(address, shutdown).await
        }));
    }
    bootstrap::bootstrap(
        &registries,
        &service_strategy,
        (args.port, advertise_address(&args)),
        &masters,
    )
    .await?;
    let proxy_client = match (&args.proxy_client_cert_file, &args.proxy_client_key_file) {
        (Some(cert), Some(key)) => Some(Arc::new(
            capstan_aggregation::ProxyClient::load(cert, key)
                .map_err(|e| anyhow::anyhow!("--proxy-client-cert-file: {e}"))?,
        )),
        _ => None,
    };
    let controllers = controllers::Controllers {
        registries: registries.clone(),
        services: service_strategy.clone(),
        store: store.clone(),
        endpoints: !args.disable_endpoints_controller,
        max_endpoints_per_slice: usize::from(args.max_endpoints_per_slice),
        workers: (
            args.concurrent_endpoint_syncs,
            args.concurrent_service_endpoint_syncs,
        ),
        proxy_client: proxy_client.clone(),
        port: args.port,
        advertise: advertise_address(&args),
        masters: masters.clone(),
    };
    tokio::spawn(
        capstan_controllers::identity::IdentityLease::new(registry_for(&registries, "leases")?)
            .run(shutdown.clone()),
    );
    let elected = elect(&args, &registries, controllers, shutdown)?;
    let host = if args.bind_address.is_unspecified() {
        "127.0.0.1".to_string()
    } else if args.bind_address.is_ipv6() {
        format!("[{}]", args.bind_address)
    } else {
        args.bind_address.to_string()
    };
    let server_url = format!("https://{host}:{}", args.port);
    let credentials =
        capstan_apiserver::pki::ensure(&args.data_dir, args.bind_address, &server_url)
            .context("setting up certificates and the admin token")?;
    // Backends have a second past the request deadline to answer: a plain request gets the
    // deadline's 504, a proxied watch (which has no deadline) the proxy's 503.
    let limits = args.limits();
    let aggregator = capstan_aggregation::Aggregator::new(
        &registries,
        limits.request_timeout + std::time::Duration::from_secs(1),
        proxy_client,
    );
    let server = Arc::new(
        ApiServer::new(
            registries,
            credentials.token.clone(),
            format!("{host}:{}", args.port),
            limits,
        )
        .with_remote_groups(Arc::new(aggregator))
        .with_response_compression(args.gate(FeatureGate::ApiResponseCompression, true)),
    );
    tracing::info!(
        storage = ?args.storage,
        revision = caches.revision(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "serving on {server_url}"
    );
    println!(
        "Capstan is serving on {server_url}. Use it with: kubectl --kubeconfig {} get services",
        credentials.kubeconfig.display()
    );
    if args.proxy {
        let proxy = capstan_proxy::ProxyArgs::in_process(credentials.kubeconfig.clone());
        tokio::spawn(async move {
            if let Err(err) = capstan_proxy::run(proxy).await {
                tracing::error!(%err, "the in-process proxy stopped");
            }
        });
    }
    if let Some(listen) = args.dns {
        let dns = capstan_dns::DnsArgs::in_process(credentials.kubeconfig.clone(), listen);
        tokio::spawn(async move {
            if let Err(err) = capstan_dns::run(dns).await {
                tracing::error!(%err, "the in-process DNS server stopped");
            }
        });
    }
    let stopping = async move {
        shutdown_signal().await;
        stop_electing.send_replace(true);
    };
    capstan_apiserver::serve(
        server,
        listener,
        credentials.tls,
        stopping,
        Duration::from_secs(30),
    )
    .await;
    // The controllers stop and the Lease is released, so another replica takes over at once.
    if tokio::time::timeout(Duration::from_secs(10), elected)
        .await
        .is_err()
    {
        tracing::warn!("the controllers did not stop within 10s");
    }
    // Its address leaves the `kubernetes` endpoints with it.
    if let Some(recorded) = recorded {
        let _ = tokio::time::timeout(Duration::from_secs(5), recorded).await;
    }
    tracing::info!("shut down");
    Ok(())
}

/// Runs the controllers: while this replica holds the controllers' Lease (`--leader-elect`,
/// the default), else from now on. Ends once `shutdown` turns true and they have stopped.
fn elect(
    args: &ServeArgs,
    registries: &[Arc<Registry>],
    controllers: controllers::Controllers,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    if !args.leader_elect {
        let group = controllers.start();
        return Ok(tokio::spawn(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
            group.stop().await;
        }));
    }
    let timings = capstan_controllers::leader::Timings {
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    timings
        .check()
        .map_err(|e| anyhow::anyhow!("leader election: {e}"))?;
    let identity = capstan_controllers::leader::identity();
    let mut elector = capstan_controllers::leader::Elector::new(
        registry_for(registries, "leases")?,
        &args.leader_elect_resource_namespace,
        &args.leader_elect_resource_name,
        &identity,
        timings,
    );
    if args.storage == StorageKind::Embedded {
        // Only this process can open the store: whoever held the Lease before is gone.
        elector = elector.exclusive();
    }
    tracing::info!(%identity, "leader election identity");
    Ok(tokio::spawn(
        elector.run(move || controllers.start(), shutdown),
    ))
}

/// The address the `kubernetes` Endpoints publish (`--advertise-address`), if any can be.
fn advertise_address(args: &ServeArgs) -> Option<std::net::IpAddr> {
    let address = match args.advertise_address {
        Some(address) => address,
        None if args.bind_address.is_unspecified() => {
            // The address the host would use towards the outside (a UDP "connect" only looks
            // up the route; nothing is sent).
            let socket = std::net::UdpSocket::bind(("0.0.0.0", 0)).ok()?;
            socket.connect(("203.0.113.1", 9)).ok()?;
            socket.local_addr().ok()?.ip()
        }
        None => args.bind_address,
    };
    (!address.is_loopback() && !address.is_unspecified()).then_some(address)
}

/// The registry of a kind, by plural resource name.
pub(crate) fn registry_for(
    registries: &[Arc<Registry>],
    plural: &str,
) -> anyhow::Result<Arc<Registry>> {
    registries
        .iter()
        .find(|r| r.strategy().info().plural == plural)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no {plural} registry"))
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

/// How many tasks a runtime worker runs, while it has tasks queued, between two looks at the
/// network (tokio's default is 61). One change to a Service wakes a task per watcher at once.
/// With the default, a busy worker takes in new requests — among them the next write, whose
/// events then queue behind the fan-out in progress — sixteen times during a fan-out to 1,000
/// watchers, and the fan-outs of back-to-back writes overlap. At 1,024 a worker finishes the
/// fan-out in hand first, and a new request waits for at most ~1,024 short tasks (about 10 ms)
/// when every worker is busy: Go's scheduler, and so kube-apiserver, behaves much the same (its
/// network poller runs when a processor has nothing queued, and at least every 10 ms).
/// `capstan-bench watch --watchers 1000 --updates 100`: delivery p99 20–23 ms → 17–19 ms.
const EVENT_INTERVAL: u32 = 1024;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,hickory_server=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .event_interval(EVENT_INTERVAL)
        .build()
        .context("starting the async runtime")?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(*args)),
        Command::Proxy(args) => runtime.block_on(capstan_proxy::run(args)),
        Command::Dns(args) => runtime.block_on(capstan_dns::run(args)),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_like_kube_apiserver_flags() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1m0s"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("-5s").is_err());
    }
}
