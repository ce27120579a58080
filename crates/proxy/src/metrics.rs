//! kube-proxy's metrics (`pkg/proxy/metrics`), under the same names, for the same events.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `ip_family` label: "IPv4" or "IPv6".
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IpFamily {
    /// The family.
    pub ip_family: String,
}

/// `traffic_policy` and `ip_family` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyFamily {
    /// "internal" or "external".
    pub traffic_policy: String,
    /// The family.
    pub ip_family: String,
}

/// `code` label of the health endpoints' counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Code {
    /// The HTTP status code.
    pub code: String,
}

fn exp15() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn programming_buckets() -> Histogram {
    let mut buckets = vec![0.25, 0.5];
    buckets.extend((1..=59).map(f64::from));
    buckets.extend((12..=23).map(|i| f64::from(i) * 5.0));
    buckets.extend((4..=10).map(|i| f64::from(i) * 30.0));
    Histogram::new(buckets)
}

type Hist = MetricFamily<IpFamily, Histogram, fn() -> Histogram>;

/// Every metric the proxy exports.
pub struct Metrics {
    /// The registry they are encoded from.
    pub registry: Registry,
    /// `kubeproxy_sync_proxy_rules_duration_seconds`.
    pub sync_duration: Hist,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds`.
    pub full_sync_duration: Hist,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds`.
    pub partial_sync_duration: Hist,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`.
    pub last_sync: MetricFamily<IpFamily, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`.
    pub last_queued: MetricFamily<IpFamily, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `kubeproxy_network_programming_duration_seconds`.
    pub programming: Hist,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_pending`.
    pub endpoint_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_total`.
    pub endpoint_changes: Counter,
    /// `kubeproxy_sync_proxy_rules_service_changes_pending`.
    pub service_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_service_changes_total`.
    pub service_changes: Counter,
    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
    pub no_local_endpoints: MetricFamily<PolicyFamily, Gauge>,
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`.
    pub sync_failures: MetricFamily<IpFamily, Counter>,
    /// `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total`.
    pub cleanup_failures: MetricFamily<IpFamily, Counter>,
    /// `kubeproxy_proxy_healthz_total`.
    pub healthz: MetricFamily<Code, Counter>,
    /// `kubeproxy_proxy_livez_total`.
    pub livez: MetricFamily<Code, Counter>,
    /// `kubeproxy_conntrack_reconciler_sync_duration_seconds`.
    pub conntrack_duration: Hist,
    /// `kubeproxy_conntrack_reconciler_deleted_entries_total`.
    pub conntrack_deleted: MetricFamily<IpFamily, Counter>,
    /// `capstan_proxy_nftables_rules`: rules, chains and set elements the table holds (kube-proxy
    /// 1.36 exports no such count; the issue asks for rule counts).
    pub table_size: MetricFamily<TableSize, Gauge>,
}

/// Labels of `capstan_proxy_nftables_rules`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableSize {
    /// The family.
    pub ip_family: String,
    /// "rules", "chains" or "elements".
    pub kind: String,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let sync_duration = Hist::new_with_constructor(exp15 as fn() -> Histogram);
        let full_sync_duration = Hist::new_with_constructor(exp15 as fn() -> Histogram);
        let partial_sync_duration = Hist::new_with_constructor(exp15 as fn() -> Histogram);
        let programming = Hist::new_with_constructor(programming_buckets as fn() -> Histogram);
        let conntrack_duration = Hist::new_with_constructor(exp15 as fn() -> Histogram);
        let m = Metrics {
            registry: Registry::default(),
            sync_duration,
            full_sync_duration,
            partial_sync_duration,
            last_sync: MetricFamily::default(),
            last_queued: MetricFamily::default(),
            programming,
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes: Counter::default(),
            no_local_endpoints: MetricFamily::default(),
            sync_failures: MetricFamily::default(),
            cleanup_failures: MetricFamily::default(),
            healthz: MetricFamily::default(),
            livez: MetricFamily::default(),
            conntrack_duration,
            conntrack_deleted: MetricFamily::default(),
            table_size: MetricFamily::default(),
        };
        let r = &mut registry;
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            m.full_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            m.partial_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last_sync.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            m.last_queued.clone(),
        );
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            m.programming.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            m.endpoint_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            m.endpoint_changes.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            m.service_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            m.service_changes.clone(),
        );
        // Counter-like in name only: upstream registers it as a gauge.
        r.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            m.no_local_endpoints.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            m.sync_failures.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures",
            m.cleanup_failures.clone(),
        );
        r.register(
            "kubeproxy_proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            m.healthz.clone(),
        );
        r.register(
            "kubeproxy_proxy_livez",
            "Cumulative proxy livez HTTP status",
            m.livez.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            m.conntrack_duration.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            m.conntrack_deleted.clone(),
        );
        r.register(
            "capstan_proxy_nftables_rules",
            "Rules, chains and set elements in the proxy's nftables tables",
            m.table_size.clone(),
        );
        // Every family's series exists from the start, observed or not.
        for family in [crate::state::Family::V4, crate::state::Family::V6] {
            let label = family_label(family);
            for histogram in [
                &m.sync_duration,
                &m.full_sync_duration,
                &m.partial_sync_duration,
                &m.programming,
                &m.conntrack_duration,
            ] {
                let _ = histogram.get_or_create(&label);
            }
            let _ = m.sync_failures.get_or_create(&label);
            let _ = m.cleanup_failures.get_or_create(&label);
        }
        Metrics { registry, ..m }
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The `ip_family` label of a family.
pub fn family_label(family: crate::state::Family) -> IpFamily {
    IpFamily {
        ip_family: match family {
            crate::state::Family::V4 => "IPv4",
            crate::state::Family::V6 => "IPv6",
        }
        .to_owned(),
    }
}
