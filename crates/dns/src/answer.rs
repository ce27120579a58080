//! The answer to one question, by the Kubernetes DNS-Based Service Discovery specification
//! (1.1.0), with CoreDNS's `kubernetes` plugin where the specification leaves room.

use std::collections::HashSet;
use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::index::{Entry, HeadlessEndpoint, Index, Kind, NamedPort};

/// The specification's version, answered at `dns-version.<zone>`.
pub const SCHEMA_VERSION: &str = "1.1.0";
/// The version record's TTL (CoreDNS's, fixed).
const VERSION_TTL: u32 = 28_800;

/// The zone's settings.
#[derive(Clone, Debug)]
pub struct Zone {
    /// The cluster domain, lower-case, without the trailing dot (`cluster.local`).
    pub domain: String,
    /// The records' TTL (and the SOA's minimum, for negative answers).
    pub ttl: u32,
    /// Whether `<a-b-c-d>.<ns>.pod.<zone>` answers (CoreDNS's `pods insecure`).
    pub pods: bool,
}

/// What the zone answers, or that the name is not the zone's.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An authoritative answer: NOERROR with records, NODATA, or NXDOMAIN.
    Answer {
        /// NoError or NXDomain.
        code: ResponseCode,
        /// The answer section.
        answers: Vec<Record>,
        /// The additional section (SRV targets' addresses).
        additionals: Vec<Record>,
        /// An ExternalName's target, whose own records the server adds when it can resolve them.
        cname: Option<Name>,
    },
    /// Not this zone's: forward it, or refuse.
    Elsewhere,
}

fn name(text: &str) -> Option<Name> {
    Name::from_ascii(format!("{text}.")).ok()
}

impl Zone {
    /// The zone's SOA record, for the authority section of negative answers.
    pub fn soa(&self) -> Option<Record> {
        let zone = name(&self.domain)?;
        let mname = name(&format!("ns.dns.{}", self.domain))?;
        let rname = name(&format!("hostmaster.{}", self.domain))?;
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| (d.as_secs() % u64::from(u32::MAX)) as u32)
            .unwrap_or(1);
        let soa = SOA::new(mname, rname, serial, 7200, 1800, 86400, self.ttl);
        Some(Record::from_rdata(zone, self.ttl.min(300), RData::SOA(soa)))
    }

    fn record(&self, owner: &str, data: RData) -> Option<Record> {
        Some(Record::from_rdata(name(owner)?, self.ttl, data))
    }

    fn address(&self, owner: &str, ip: IpAddr) -> Option<Record> {
        match ip {
            IpAddr::V4(v4) => self.record(owner, RData::A(A(v4))),
            IpAddr::V6(v6) => self.record(owner, RData::AAAA(AAAA(v6))),
        }
    }

    /// Answers `qname` (lower-case, no trailing dot) of type `qtype`.
    pub fn answer(&self, index: &Index, qname: &str, qtype: RecordType) -> Outcome {
        if let Some(ip) = reverse_ip(qname) {
            return self.answer_reverse(index, qname, &ip, qtype);
        }
        let Some(rest) = strip_zone(qname, &self.domain) else {
            return Outcome::Elsewhere;
        };
        let labels: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('.').collect()
        };
        let mut out = Answers::default();
        let exists = match labels.as_slice() {
            [] => {
                match qtype {
                    RecordType::SOA => out.push(self.soa()),
                    RecordType::NS => {
                        if let Some(ns) = name(&format!("ns.dns.{}", self.domain)) {
                            out.push(self.record(&self.domain, RData::NS(NS(ns))));
                        }
                    }
                    _ => {}
                }
                true
            }
            ["dns-version"] => {
                if qtype == RecordType::TXT {
                    let txt = RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_owned()]));
                    out.answers
                        .extend(name(qname).map(|n| Record::from_rdata(n, VERSION_TTL, txt)));
                }
                true
            }
            ["svc"] | ["pod"] => true,
            [namespace, "svc"] => index.has_namespace(namespace),
            [service, namespace, "svc"] => match index.entry(namespace, service) {
                Some(entry) => self.service(&mut out, qname, entry, qtype),
                None => false,
            },
            [port, proto, service, namespace, "svc"]
                if port.starts_with('_') && proto.starts_with('_') =>
            {
                match index.entry(namespace, service) {
                    Some(entry) => {
                        self.srv(&mut out, qname, entry, (&port[1..], &proto[1..]), qtype)
                    }
                    None => false,
                }
            }
            [label, service, namespace, "svc"] => match index.entry(namespace, service) {
                Some(Entry {
                    kind: Kind::Headless(endpoints),
                    ..
                }) => {
                    let found: Vec<_> = endpoints.iter().filter(|e| e.label == *label).collect();
                    for e in &found {
                        if wants(qtype, e.ip) {
                            out.push(self.address(qname, e.ip));
                        }
                    }
                    !found.is_empty()
                }
                _ => false,
            },
            [pod, namespace, "pod"] if self.pods => match pod_ip(pod) {
                Some(ip) if index.has_namespace(namespace) => {
                    if wants(qtype, ip) {
                        out.push(self.address(qname, ip));
                    }
                    true
                }
                _ => false,
            },
            [_namespace, "pod"] if self.pods => true,
            _ => false,
        };
        out.finish(exists)
    }

    /// `<service>.<ns>.svc.<zone>`: whether the name exists.
    fn service(&self, out: &mut Answers, qname: &str, entry: &Entry, qtype: RecordType) -> bool {
        match &entry.kind {
            Kind::ExternalName(target) => {
                // CoreDNS: an ExternalName that is an address names nothing.
                if target.parse::<IpAddr>().is_ok() {
                    return false;
                }
                // An alias whatever the type asked, but SRV (CoreDNS answers it with no data).
                if qtype != RecordType::SRV
                    && let Some(target) = name(target.trim_end_matches('.'))
                {
                    out.cname = Some(target.clone());
                    out.push(self.record(qname, RData::CNAME(CNAME(target))));
                }
                true
            }
            Kind::ClusterIp(ips) => {
                for ip in ips.iter().filter(|ip| wants(qtype, **ip)) {
                    out.push(self.address(qname, *ip));
                }
                if qtype == RecordType::SRV {
                    let ports: Vec<&NamedPort> = entry.ports.iter().collect();
                    self.cluster_srv(out, qname, qname, ips, &ports);
                }
                true
            }
            Kind::Headless(endpoints) => {
                // The index holds each address once.
                for e in endpoints.iter().filter(|e| wants(qtype, e.ip)) {
                    out.push(self.address(qname, e.ip));
                }
                if qtype == RecordType::SRV {
                    let found: Vec<_> = endpoints
                        .iter()
                        .flat_map(|e| e.ports.iter().map(move |p| (e, p.port)))
                        .collect();
                    self.endpoint_srv(out, qname, qname, &found);
                }
                // The specification: a headless Service without ready endpoints does not exist.
                !endpoints.is_empty()
            }
        }
    }

    /// SRV records of a ClusterIP Service's ports, one per port and cluster IP before the
    /// (target, port) duplicates go, which is what CoreDNS shares the weight by.
    fn cluster_srv(
        &self,
        out: &mut Answers,
        owner: &str,
        base: &str,
        ips: &[IpAddr],
        ports: &[&NamedPort],
    ) {
        let results = ports.len() * ips.len().max(1);
        let mut seen = Vec::new();
        for p in ports {
            if seen.contains(&p.port) {
                continue;
            }
            seen.push(p.port);
            out.push(self.record(
                owner,
                RData::SRV(SRV::new(0, weight(results), p.port, target(base))),
            ));
        }
        for ip in ips {
            out.additional(self.address(base, *ip));
        }
    }

    /// SRV records of endpoints: one per endpoint and port, to `<label>.<service>…`.
    fn endpoint_srv(
        &self,
        out: &mut Answers,
        owner: &str,
        base: &str,
        found: &[(&HeadlessEndpoint, u16)],
    ) {
        let mut seen: HashSet<(&str, u16)> = HashSet::new();
        let mut glued: HashSet<IpAddr> = HashSet::new();
        for (e, port) in found {
            let host = format!("{}.{base}", e.label);
            if seen.insert((e.label.as_str(), *port)) {
                out.push(self.record(
                    owner,
                    RData::SRV(SRV::new(0, weight(found.len()), *port, target(&host))),
                ));
            }
            if glued.insert(e.ip) {
                out.additional(self.address(&host, e.ip));
            }
        }
    }

    /// `_<port>._<proto>.<service>.<ns>.svc.<zone>`: whether the name exists. SRV asks for
    /// the records; A and AAAA get the addresses behind them (as CoreDNS answers).
    fn srv(
        &self,
        out: &mut Answers,
        qname: &str,
        entry: &Entry,
        (port, proto): (&str, &str),
        qtype: RecordType,
    ) -> bool {
        let base = qname.splitn(3, '.').nth(2).unwrap_or(qname).to_owned();
        let matches = |p: &NamedPort| !p.name.is_empty() && p.name == port && p.protocol == proto;
        match &entry.kind {
            Kind::ExternalName(_) => false,
            Kind::ClusterIp(ips) => {
                let found: Vec<&NamedPort> = entry.ports.iter().filter(|p| matches(p)).collect();
                if found.is_empty() {
                    return false;
                }
                match qtype {
                    RecordType::SRV => self.cluster_srv(out, qname, &base, ips, &found),
                    _ => ips
                        .iter()
                        .filter(|ip| wants(qtype, **ip))
                        .for_each(|ip| out.push(self.address(qname, *ip))),
                }
                true
            }
            Kind::Headless(endpoints) => {
                let found: Vec<(&HeadlessEndpoint, u16)> = endpoints
                    .iter()
                    .flat_map(|e| {
                        e.ports
                            .iter()
                            .filter(|p| matches(p))
                            .map(move |p| (e, p.port))
                    })
                    .collect();
                match qtype {
                    RecordType::SRV => self.endpoint_srv(out, qname, &base, &found),
                    _ => {
                        let mut answered: HashSet<IpAddr> = HashSet::new();
                        for (e, _) in &found {
                            if wants(qtype, e.ip) && answered.insert(e.ip) {
                                out.push(self.address(qname, e.ip));
                            }
                        }
                    }
                }
                !found.is_empty()
            }
        }
    }

    fn answer_reverse(
        &self,
        index: &Index,
        qname: &str,
        ip: &IpAddr,
        qtype: RecordType,
    ) -> Outcome {
        let Some(names) = index.reverse(ip) else {
            return Outcome::Elsewhere;
        };
        let mut out = Answers::default();
        if qtype == RecordType::PTR {
            // A cluster IP names its one Service; an endpoint names itself under each of its
            // Services.
            let service_name = names.iter().find(|(label, _)| label.is_empty());
            let chosen: Vec<_> = match service_name {
                Some(one) => vec![one],
                None => names.iter().collect(),
            };
            for (label, (namespace, service)) in chosen {
                let base = format!("{service}.{namespace}.svc.{}", self.domain);
                let host = if label.is_empty() {
                    base
                } else {
                    format!("{label}.{base}")
                };
                if let Some(host) = name(&host) {
                    out.push(self.record(qname, RData::PTR(PTR(host))));
                }
            }
        }
        out.finish(true)
    }
}

/// Answers being gathered.
#[derive(Default)]
struct Answers {
    answers: Vec<Record>,
    additionals: Vec<Record>,
    cname: Option<Name>,
}

impl Answers {
    fn push(&mut self, record: Option<Record>) {
        self.answers.extend(record);
    }

    fn additional(&mut self, record: Option<Record>) {
        self.additionals.extend(record);
    }

    fn finish(self, exists: bool) -> Outcome {
        let code = if exists || !self.answers.is_empty() {
            ResponseCode::NoError
        } else {
            ResponseCode::NXDomain
        };
        Outcome::Answer {
            code,
            answers: self.answers,
            additionals: self.additionals,
            cname: self.cname,
        }
    }
}

/// Whether an address answers a question of this type.
fn wants(qtype: RecordType, ip: IpAddr) -> bool {
    matches!(
        (qtype, ip),
        (RecordType::A | RecordType::ANY, IpAddr::V4(_))
            | (RecordType::AAAA | RecordType::ANY, IpAddr::V6(_))
    )
}

/// CoreDNS's SRV weight: 100 shared among the records of one answer.
fn weight(records: usize) -> u16 {
    let share = 100usize.checked_div(records).unwrap_or(100).max(1);
    u16::try_from(share).unwrap_or(100)
}

fn target(host: &str) -> Name {
    name(host).unwrap_or_else(Name::root)
}

/// The labels of `qname` before `.<zone>`, or `""` for the zone itself.
fn strip_zone<'a>(qname: &'a str, zone: &str) -> Option<&'a str> {
    if qname == zone {
        return Some("");
    }
    qname.strip_suffix(zone)?.strip_suffix('.')
}

/// `a-b-c-d` (or an IPv6 address with dashes) as an address.
fn pod_ip(label: &str) -> Option<IpAddr> {
    if label.contains('-') && label.matches('-').count() == 3 && !label.contains(':') {
        return label.replace('-', ".").parse().ok();
    }
    label.replace('-', ":").parse().ok()
}

/// The address a reverse name (`4.3.2.1.in-addr.arpa`, nibbles `.ip6.arpa`) stands for.
fn reverse_ip(qname: &str) -> Option<IpAddr> {
    if let Some(rest) = qname.strip_suffix(".in-addr.arpa") {
        let mut octets: Vec<&str> = rest.split('.').collect();
        if octets.len() != 4 {
            return None;
        }
        octets.reverse();
        return octets.join(".").parse().ok();
    }
    let rest = qname.strip_suffix(".ip6.arpa")?;
    let nibbles: Vec<&str> = rest.split('.').collect();
    if nibbles.len() != 32 || nibbles.iter().any(|n| n.len() != 1) {
        return None;
    }
    let hex: String = nibbles.iter().rev().copied().collect();
    let groups: Vec<&str> = (0..8).map(|i| &hex[i * 4..i * 4 + 4]).collect();
    groups.join(":").parse().ok()
}

#[cfg(test)]
mod tests {
    //! The specification's records (kubernetes/dns `docs/specification.md`, 1.1.0) and CoreDNS's
    //! answers where it is silent.
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{
        Endpoint, EndpointConditions, EndpointPort, EndpointSlice,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn meta(ns: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            ..ObjectMeta::default()
        }
    }

    fn service(name: &str, spec: ServiceSpec) -> Service {
        Service {
            metadata: meta("ns", name),
            spec: Some(spec),
            ..Service::default()
        }
    }

    fn http() -> Vec<ServicePort> {
        vec![ServicePort {
            name: Some("http".into()),
            port: 80,
            ..ServicePort::default()
        }]
    }

    fn slice(service: &str, endpoints: &[(&str, Option<&str>, bool)]) -> EndpointSlice {
        let mut m = meta("ns", &format!("{service}-x"));
        m.labels = Some(BTreeMap::from([(
            "kubernetes.io/service-name".to_owned(),
            service.to_owned(),
        )]));
        EndpointSlice {
            metadata: m,
            address_type: "IPv4".into(),
            endpoints: Some(
                endpoints
                    .iter()
                    .map(|(ip, hostname, ready)| Endpoint {
                        addresses: vec![(*ip).to_owned()],
                        hostname: hostname.map(str::to_owned),
                        conditions: Some(EndpointConditions {
                            ready: Some(*ready),
                            ..Default::default()
                        }),
                        ..Endpoint::default()
                    })
                    .collect(),
            ),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                ..Default::default()
            }]),
        }
    }

    fn index() -> Index {
        let mut index = Index::default();
        for (name, cluster_ip) in [("web", "10.96.0.10"), ("hl", "None"), ("empty", "None")] {
            index.put_service(service(
                name,
                ServiceSpec {
                    cluster_ip: Some(cluster_ip.into()),
                    ports: Some(http()),
                    ..Default::default()
                },
            ));
        }
        index.put_slice(slice(
            "hl",
            &[
                ("10.244.0.1", Some("h1"), true),
                ("10.244.0.2", None, true),
                ("10.244.0.3", None, false),
            ],
        ));
        index.put_service(service(
            "ext",
            ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some("db.example.org".into()),
                ..Default::default()
            },
        ));
        index
    }

    fn zone() -> Zone {
        Zone {
            domain: "cluster.local".into(),
            ttl: 5,
            pods: true,
        }
    }

    /// (rcode, the answers as text).
    fn ask(name: &str, qtype: RecordType) -> (ResponseCode, Vec<String>) {
        match zone().answer(&index(), name, qtype) {
            Outcome::Answer { code, answers, .. } => (
                code,
                answers
                    .iter()
                    .map(|r| format!("{} {}", r.record_type(), r.data))
                    .collect(),
            ),
            Outcome::Elsewhere => (ResponseCode::Refused, Vec::new()),
        }
    }

    use RecordType::{A, AAAA, PTR, SRV, TXT};
    use ResponseCode::{NXDomain, NoError, Refused};

    /// Asks each name and type; the answer must be the code and the records (in any order).
    fn expect(cases: &[(&str, RecordType, ResponseCode, &[&str])]) {
        for (name, kind, code, records) in cases {
            let (got, mut answers) = ask(name, *kind);
            answers.sort();
            let mut want: Vec<String> = records.iter().map(|r| r.to_string()).collect();
            want.sort();
            assert_eq!((got, answers), (*code, want), "{name} {kind}");
        }
    }

    #[test]
    fn cluster_ip_services() {
        expect(&[
            ("web.ns.svc.cluster.local", A, NoError, &["A 10.96.0.10"]),
            // The name exists; it has no AAAA: NODATA.
            ("web.ns.svc.cluster.local", AAAA, NoError, &[]),
            (
                "_http._tcp.web.ns.svc.cluster.local",
                SRV,
                NoError,
                &["SRV 0 100 80 web.ns.svc.cluster.local."],
            ),
            ("_nope._tcp.web.ns.svc.cluster.local", SRV, NXDomain, &[]),
            (
                "10.0.96.10.in-addr.arpa",
                PTR,
                NoError,
                &["PTR web.ns.svc.cluster.local."],
            ),
        ]);
    }

    #[test]
    fn headless_services() {
        expect(&[
            (
                "hl.ns.svc.cluster.local",
                A,
                NoError,
                &["A 10.244.0.1", "A 10.244.0.2"],
            ),
            ("h1.hl.ns.svc.cluster.local", A, NoError, &["A 10.244.0.1"]),
            // Without a hostname an endpoint is named by its address with dashes, as CoreDNS
            // does.
            (
                "10-244-0-2.hl.ns.svc.cluster.local",
                A,
                NoError,
                &["A 10.244.0.2"],
            ),
            // Not ready: not there.
            ("10-244-0-3.hl.ns.svc.cluster.local", A, NXDomain, &[]),
            (
                "_http._tcp.hl.ns.svc.cluster.local",
                SRV,
                NoError,
                &[
                    "SRV 0 50 8080 10-244-0-2.hl.ns.svc.cluster.local.",
                    "SRV 0 50 8080 h1.hl.ns.svc.cluster.local.",
                ],
            ),
            (
                "1.0.244.10.in-addr.arpa",
                PTR,
                NoError,
                &["PTR h1.hl.ns.svc.cluster.local."],
            ),
            // The specification: no ready endpoints, NXDOMAIN.
            ("empty.ns.svc.cluster.local", A, NXDomain, &[]),
        ]);
    }

    #[test]
    fn external_names_version_namespaces_and_misses() {
        expect(&[
            (
                "ext.ns.svc.cluster.local",
                A,
                NoError,
                &["CNAME db.example.org."],
            ),
            ("ext.ns.svc.cluster.local", SRV, NoError, &[]),
            ("dns-version.cluster.local", TXT, NoError, &["TXT 1.1.0"]),
            ("ns.svc.cluster.local", A, NoError, &[]),
            ("other.svc.cluster.local", A, NXDomain, &[]),
            ("nope.ns.svc.cluster.local", A, NXDomain, &[]),
            ("a.b.web.ns.svc.cluster.local", A, NXDomain, &[]),
            ("svc.cluster.local", A, NoError, &[]),
            ("foo.cluster.local", A, NXDomain, &[]),
            ("1-2-3-4.ns.pod.cluster.local", A, NoError, &["A 1.2.3.4"]),
            // Not the zone's.
            ("example.org", A, Refused, &[]),
            // An unknown address is forwarded.
            ("9.9.9.9.in-addr.arpa", PTR, Refused, &[]),
        ]);
    }

    #[test]
    fn reverse_names_parse() {
        assert_eq!(
            reverse_ip("4.3.2.1.in-addr.arpa"),
            Some("1.2.3.4".parse().expect("ip"))
        );
        let v6 = "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.0.0.d.f.ip6.arpa";
        assert_eq!(reverse_ip(v6), Some("fd00:fd00::1".parse().expect("ip")));
        assert_eq!(reverse_ip("3.2.1.in-addr.arpa"), None);
    }
}
