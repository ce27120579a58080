//! CoreDNS's request metrics (`plugin/metrics`), under the same names and labels.

use std::time::Duration;

use hickory_proto::op::ResponseCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `coredns_dns_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `dns://<listen address>`.
    pub server: String,
    /// The zone that answered (`cluster.local.`, or `.` for forwarded names).
    pub zone: String,
    /// CoreDNS's view (always empty here).
    pub view: String,
    /// `udp` or `tcp`.
    pub proto: String,
    /// `1` (IPv4) or `2` (IPv6).
    pub family: String,
    /// The query type.
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    server: String,
    zone: String,
    view: String,
    rcode: String,
    plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    server: String,
    zone: String,
    view: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SizeLabels {
    server: String,
    zone: String,
    view: String,
    proto: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

fn durations() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

fn sizes() -> Histogram {
    Histogram::new([
        0.0, 100.0, 200.0, 300.0, 400.0, 511.0, 1023.0, 2047.0, 4095.0, 8291.0, 16e3, 32e3, 48e3,
        64e3,
    ])
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    /// The address the server listens on (the `server` label).
    pub listen: String,
    requests: Family<RequestLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    duration: Hist<DurationLabels>,
    request_size: Hist<SizeLabels>,
}

impl Metrics {
    /// Registers every metric.
    pub fn new(listen: String) -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let responses = Family::<ResponseLabels, Counter>::default();
        let duration = Hist::<DurationLabels>::new_with_constructor(durations as fn() -> Histogram);
        let request_size = Hist::<SizeLabels>::new_with_constructor(sizes as fn() -> Histogram);
        registry.register(
            "coredns_dns_requests",
            "Counter of DNS requests made per zone, protocol and family.",
            requests.clone(),
        );
        registry.register(
            "coredns_dns_responses",
            "Counter of response status codes.",
            responses.clone(),
        );
        registry.register(
            "coredns_dns_request_duration_seconds",
            "Histogram of the time (in seconds) each request took per zone.",
            duration.clone(),
        );
        registry.register(
            "coredns_dns_request_size_bytes",
            "Size of the EDNS0 UDP buffer in bytes (64K for TCP) per zone and protocol.",
            request_size.clone(),
        );

        Metrics {
            registry,
            listen,
            requests,
            responses,
            duration,
            request_size,
        }
    }

    /// Counts one answered request.
    pub fn observe(&self, labels: &RequestLabels, code: ResponseCode, took: Duration, size: usize) {
        self.requests.get_or_create(labels).inc();
        let rcode = match code {
            ResponseCode::NoError => "NOERROR".to_owned(),
            ResponseCode::NXDomain => "NXDOMAIN".to_owned(),
            ResponseCode::ServFail => "SERVFAIL".to_owned(),
            ResponseCode::Refused => "REFUSED".to_owned(),
            ResponseCode::FormErr => "FORMERR".to_owned(),
            other => other.to_str().to_ascii_uppercase(),
        };
        let plugin = if labels.zone == "." {
            "forward"
        } else {
            "kubernetes"
        };
        self.responses
            .get_or_create(&ResponseLabels {
                server: labels.server.clone(),
                zone: labels.zone.clone(),
                view: String::new(),
                rcode,
                plugin: plugin.to_owned(),
            })
            .inc();
        self.duration
            .get_or_create(&DurationLabels {
                server: labels.server.clone(),
                zone: labels.zone.clone(),
                view: String::new(),
            })
            .observe(took.as_secs_f64());
        let size_labels = SizeLabels {
            server: labels.server.clone(),
            zone: labels.zone.clone(),
            view: String::new(),
            proto: labels.proto.clone(),
        };
        self.request_size
            .get_or_create(&size_labels)
            .observe(size as f64);
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
