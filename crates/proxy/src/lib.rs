//! `capstan proxy`: the node agent that makes cluster IPs, node ports, external IPs and load
//! balancer IPs carry traffic to a Service's endpoints, as kube-proxy's nftables mode does.
//!
//! It is a client of the Kubernetes API like any other (Services, EndpointSlices and its own
//! Node, through kube-rs watchers), so it runs against Capstan or any kube-apiserver, and it
//! programs one nftables table per address family (`ip capstan-proxy`, `ip6 capstan-proxy`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::Notify;

use capstan_agent::{Change, follow};

pub mod conntrack;
pub mod health;
pub mod metrics;
pub mod nft;
pub mod rules;
pub mod ruleset;
pub mod state;
pub mod sync;

use health::{HealthChecks, ProxyHealth};
use metrics::Metrics;
use state::{Family, SERVICE_NAME_LABEL};
use sync::{Shared, SyncConfig, Syncer, lock};

/// The table the proxy owns, in the `ip` and `ip6` families.
pub const TABLE: &str = "capstan-proxy";

/// What the Service and EndpointSlice watches select (upstream's informer selector): objects
/// meant for another proxy, and headless Services' slices, are not this proxy's.
const SELECTOR: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// `capstan proxy`'s flags, named as kube-proxy's.
#[derive(clap::Args, Clone, Debug)]
pub struct ProxyArgs {
    /// The kubeconfig of the API server to read (default: $KUBECONFIG, ~/.kube/config, or the
    /// in-cluster service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, as its Node object and EndpointSlices' `nodeName` spell it
    /// (default: the host name).
    #[arg(long)]
    pub hostname_override: Option<String>,
    /// The pods' CIDR ranges, comma separated: traffic from outside them to a cluster IP is
    /// masqueraded, and `externalTrafficPolicy: Local` lets pods reach every endpoint.
    #[arg(long, value_delimiter = ',')]
    pub cluster_cidr: Vec<IpNet>,
    /// Which local addresses answer on node ports: CIDRs, comma separated, or `primary` (the
    /// node's own addresses from its Node object; the default).
    #[arg(long, value_delimiter = ',', default_value = "primary")]
    pub nodeport_addresses: Vec<String>,
    /// Masquerade every connection to a cluster IP.
    #[arg(long)]
    pub masquerade_all: bool,
    /// Where `/metrics` is served (empty: nowhere).
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub metrics_bind_address: String,
    /// Where `/healthz` and `/livez` are served (empty: nowhere).
    #[arg(long, default_value = "0.0.0.0:10256")]
    pub healthz_bind_address: String,
    /// The shortest time between two syncs of the rules.
    #[arg(long, alias = "iptables-min-sync-period", default_value = "1s", value_parser = duration)]
    pub min_sync_period: Duration,
    /// How long after a failed sync the next is tried; twice this without a sync makes
    /// `/healthz` fail.
    #[arg(long, alias = "iptables-sync-period", default_value = "30s", value_parser = duration)]
    pub sync_period: Duration,
    /// Only `nftables` is implemented.
    #[arg(long, default_value = "nftables")]
    pub proxy_mode: String,
    /// Delete the proxy's nftables tables and exit.
    #[arg(long)]
    pub cleanup: bool,
}

fn duration(text: &str) -> Result<Duration, String> {
    capstan_gostd::duration::parse_flag_duration(text)
}

impl ProxyArgs {
    /// The flags' defaults, for `capstan serve --proxy`.
    pub fn in_process(kubeconfig: PathBuf) -> ProxyArgs {
        ProxyArgs {
            kubeconfig: Some(kubeconfig),
            hostname_override: None,
            cluster_cidr: Vec::new(),
            nodeport_addresses: vec!["primary".to_owned()],
            masquerade_all: false,
            metrics_bind_address: "127.0.0.1:10249".to_owned(),
            healthz_bind_address: "0.0.0.0:10256".to_owned(),
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            proxy_mode: "nftables".to_owned(),
            cleanup: false,
        }
    }
}

/// The host's name, as kube-proxy defaults its node name (lower-cased).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".to_owned())
}

/// The host's addresses (from `ip -j addr`), for `--nodeport-addresses` CIDRs.
pub async fn local_addresses() -> Vec<IpAddr> {
    let Ok(out) = tokio::process::Command::new("ip")
        .args(["-j", "addr", "show"])
        .output()
        .await
    else {
        return Vec::new();
    };
    let Ok(links) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return Vec::new();
    };
    links
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| {
            l.get("addr_info")
                .and_then(|a| a.as_array())
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|a| a.get("local")?.as_str()?.parse().ok())
        .collect()
}

/// Starts the server `serve` makes at the address a flag names (none when it is empty).
fn spawn_server<F, Fut>(flag: &str, address: &str, serve: F) -> anyhow::Result<()>
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    if address.is_empty() {
        return Ok(());
    }
    let addr: SocketAddr = address.parse().with_context(|| flag.to_owned())?;
    let serving = serve(addr);
    let flag = flag.to_owned();
    tokio::spawn(async move {
        if let Err(err) = serving.await {
            tracing::error!(%err, %addr, "serving at {flag}");
        }
    });
    Ok(())
}

/// Runs the proxy until the process ends.
pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.proxy_mode == "nftables",
        "--proxy-mode {}: only nftables is implemented",
        args.proxy_mode
    );
    if args.cleanup {
        for family in [Family::V4, Family::V6] {
            nft::Nft::new().delete_table(family, TABLE).await?;
        }
        return Ok(());
    }
    // Each family the kernel can take (a host without IPv6 NAT cannot make the ip6 table,
    // and one failing family must not fail the other's every sync).
    let mut families = Vec::new();
    for family in [Family::V4, Family::V6] {
        let config = rules::BaseConfig {
            nodeport_match_all: true,
            ..rules::BaseConfig::default()
        };
        let mut tx = ruleset::Transaction::new(family.nft(), TABLE);
        tx.partial(
            &ruleset::Rules::default(),
            &rules::base(family, &config),
            &mut ruleset::ElementRefs::new(),
        );
        match nft::Nft::new().check(&tx.finish()).await {
            Ok(()) => families.push(family),
            Err(err) => {
                tracing::warn!(family = family.nft(), %err, "this family cannot be programmed; skipping it")
            }
        }
    }
    anyhow::ensure!(
        !families.is_empty(),
        "nftables takes neither the ip nor the ip6 table (root or CAP_NET_ADMIN, nft 1.0.1+, kernel 5.13+)"
    );
    let node_name = args.hostname_override.clone().unwrap_or_else(hostname);
    let mut nodeport_cidrs = Vec::new();
    for value in &args.nodeport_addresses {
        if value == "primary" || value.is_empty() {
            continue;
        }
        nodeport_cidrs.push(
            value
                .parse::<IpNet>()
                .with_context(|| format!("--nodeport-addresses {value}"))?,
        );
    }
    let client = capstan_agent::client(args.kubeconfig.as_deref()).await?;
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(ProxyHealth::new(
        &families,
        args.sync_period,
        metrics.clone(),
    ));
    let shared = Arc::new(Mutex::new(Shared::default()));
    let notify = Arc::new(Notify::new());
    let health_server = |addr| health::serve_proxy_health(addr, health.clone());
    spawn_server(
        "--healthz-bind-address",
        &args.healthz_bind_address,
        health_server,
    )?;
    let metrics_server = |addr| health::serve_metrics(addr, metrics.clone());
    spawn_server(
        "--metrics-bind-address",
        &args.metrics_bind_address,
        metrics_server,
    )?;
    let check_addresses = if nodeport_cidrs.is_empty() {
        Vec::new()
    } else {
        local_addresses()
            .await
            .into_iter()
            .filter(|ip| nodeport_cidrs.iter().any(|c| c.contains(ip)))
            .collect()
    };
    let config = SyncConfig {
        table: TABLE.to_owned(),
        families: families.clone(),
        node_name: node_name.clone(),
        cluster_cidrs: args.cluster_cidr.iter().map(IpNet::trunc).collect(),
        masquerade_all: args.masquerade_all,
        nodeport_cidrs,
        min_sync_period: args.min_sync_period,
        sync_period: args.sync_period,
    };
    tracing::info!(node = %node_name, table = TABLE, "capstan proxy starting (nftables)");
    let checks = HealthChecks::new(check_addresses, health.clone());
    let syncer = Syncer::new(
        config,
        shared.clone(),
        notify.clone(),
        metrics.clone(),
        health.clone(),
        checks,
    );
    let watches = Watches {
        shared,
        notify,
        metrics,
        health,
    };
    let services = tokio::spawn(watches.clone().services(Api::all(client.clone())));
    let slices = tokio::spawn(watches.clone().slices(Api::all(client.clone())));
    let node = tokio::spawn(watches.node(Api::all(client), node_name));
    tokio::select! {
        _ = syncer.run() => {}
        r = services => r.context("the Service watch")?,
        r = slices => r.context("the EndpointSlice watch")?,
        r = node => r.context("the Node watch")?,
    }
    Ok(())
}

/// The watches, each feeding the shared state and waking the sync loop.
#[derive(Clone)]
struct Watches {
    shared: Arc<Mutex<Shared>>,
    notify: Arc<Notify>,
    metrics: Arc<Metrics>,
    health: Arc<ProxyHealth>,
}

impl Watches {
    /// Marks a sync as wanted (readiness and the queued-time metric) and wakes the syncer.
    fn changed(&self) {
        self.health.queued();
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        for family in [Family::V4, Family::V6] {
            self.metrics
                .last_queued
                .get_or_create(&metrics::family_label(family))
                .set(epoch);
        }
        self.notify.notify_one();
    }

    async fn services(self, api: Api<capstan_agent::ServiceView>) {
        let config = watcher::Config::default().labels(SELECTOR);
        follow(api, config, "Services", |change| {
            let mut shared = lock(&self.shared);
            let name = match change.map(Service::from) {
                Change::Listed(services) => {
                    shared.services_listed(services);
                    None
                }
                Change::Applied(service) => Some(shared.state.put_service(service)),
                Change::Deleted(service) => Some(shared.state.remove_service(&service)),
            };
            if let Some(name) = name {
                shared.dirty.insert(name);
                self.metrics.service_changes.inc();
                self.metrics.service_changes_pending.inc();
            }
            self.changed();
        })
        .await;
    }

    async fn slices(self, api: Api<EndpointSlice>) {
        let config = watcher::Config::default().labels(&format!("{SELECTOR},{SERVICE_NAME_LABEL}"));
        follow(api, config, "EndpointSlices", |change| {
            let mut shared = lock(&self.shared);
            let touched = match change {
                Change::Listed(slices) => {
                    shared.slices_listed(slices);
                    self.changed();
                    return;
                }
                Change::Applied(slice) => {
                    let trigger = trigger_time(&slice);
                    let touched = shared.state.put_slice(slice);
                    if let (Some(t), Some(name)) = (trigger, touched.last()) {
                        shared
                            .trigger_times
                            .entry(name.clone())
                            .or_default()
                            .push(t);
                    }
                    touched
                }
                Change::Deleted(slice) => shared.state.remove_slice(&slice),
            };
            self.metrics.endpoint_changes.inc();
            self.metrics.endpoint_changes_pending.inc();
            for name in touched {
                shared.dirty.insert(name.clone());
                shared.endpoints_changed.insert(name);
            }
            self.changed();
        })
        .await;
    }

    async fn node(self, api: Api<Node>, name: String) {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        follow(api, config, "this node", |change| {
            let node = match change {
                Change::Listed(mut nodes) => nodes.pop(),
                Change::Applied(node) => Some(node),
                Change::Deleted(_) => None,
            };
            let mut shared = lock(&self.shared);
            self.health
                .set_node_eligible(node.as_ref().is_some_and(eligible));
            let before = (
                shared.state.node_ips(),
                shared.state.node_zone().map(str::to_owned),
            );
            shared.state.node = node;
            let after = (
                shared.state.node_ips(),
                shared.state.node_zone().map(str::to_owned),
            );
            // The node's addresses and zone change the fixed rules or every Service's.
            shared.need_full |= before != after;
            self.notify.notify_one();
        })
        .await;
    }
}

/// upstream's `NodeEligibleHandler`: not being deleted, not marked for deletion by the cluster
/// autoscaler.
fn eligible(node: &Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "ToBeDeletedByClusterAutoscaler"));
    node.metadata.deletion_timestamp.is_none() && !tainted
}

/// The slice's `endpoints.kubernetes.io/last-change-trigger-time`.
fn trigger_time(slice: &EndpointSlice) -> Option<std::time::SystemTime> {
    let value = slice
        .metadata
        .annotations
        .as_ref()?
        .get("endpoints.kubernetes.io/last-change-trigger-time")?;
    let ts: jiff::Timestamp = value.parse().ok()?;
    Some(std::time::SystemTime::from(ts))
}
