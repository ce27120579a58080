//! The nftables rules, as upstream kube-proxy 1.36's nftables mode writes them
//! (`pkg/proxy/nftables/proxier.go`): a fixed part per family, and per Service the chains that
//! balance its ports over their endpoints and the map elements that lead to them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::ruleset::{Chain, Rules};
use crate::state::{Endpoint, Family, ServicePort, categorize};

/// The packet mark that asks `masquerading` to SNAT a connection (kube-proxy's default bit 14).
pub const MASQUERADE_MARK: &str = "0x4000";

/// What the fixed part of a family's table depends on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BaseConfig {
    /// `--cluster-cidr` of this family: traffic from outside it to a cluster IP is masqueraded.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// The addresses node ports answer on.
    pub nodeport_ips: Vec<IpAddr>,
    /// Node ports answer on every local address instead.
    pub nodeport_match_all: bool,
}

impl Family {
    fn ip(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    fn addr_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }

    fn no_localhost(self) -> &'static str {
        match self {
            Family::V4 => "ip daddr != 127.0.0.0/8",
            Family::V6 => "ip6 daddr != ::1",
        }
    }
}

fn cidrs(nets: &[IpNet]) -> String {
    match nets {
        [one] => one.to_string(),
        _ => format!(
            "{{ {} }}",
            nets.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The fixed part of a family's table: base chains, the dispatch chains, sets and maps.
pub fn base(family: Family, config: &BaseConfig) -> Rules {
    let ip = family.ip();
    let addr = family.addr_type();
    let mut r = Rules::default();
    let sets: [(&str, String); 8] = [
        ("cluster-ips", format!("type {addr} ; comment \"Active ClusterIPs\" ;")),
        ("nodeport-ips", format!("type {addr} ; comment \"IPs that accept NodePort traffic\" ;")),
        (
            "hairpin-connections",
            format!(
                "type {addr} . {addr} . inet_proto . inet_service ; comment \"service hairpin connections\" ;"
            ),
        ),
        (
            "firewall-ips",
            format!(
                "type {addr} . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ;"
            ),
        ),
        (
            "no-endpoint-nodeports",
            "type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ;".to_owned(),
        ),
        (
            "no-endpoint-services",
            format!(
                "type {addr} . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ;"
            ),
        ),
        (
            "service-ips",
            format!(
                "type {addr} . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ;"
            ),
        ),
        (
            "service-nodeports",
            "type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ;".to_owned(),
        ),
    ];
    let match_all = config.nodeport_match_all;
    for (name, body) in sets {
        if name == "nodeport-ips" && match_all {
            continue;
        }
        r.sets.insert(name.to_owned(), body);
    }
    let hooks = [
        (
            "filter-prerouting-pre-dnat",
            "type filter hook prerouting priority -110",
        ),
        (
            "filter-output-pre-dnat",
            "type filter hook output priority -110",
        ),
        ("filter-input", "type filter hook input priority 0"),
        ("filter-forward", "type filter hook forward priority 0"),
        ("filter-output", "type filter hook output priority 0"),
        ("nat-prerouting", "type nat hook prerouting priority -100"),
        ("nat-output", "type nat hook output priority -100"),
        ("nat-postrouting", "type nat hook postrouting priority 100"),
    ];
    let jumps: BTreeMap<&str, Vec<&str>> = BTreeMap::from([
        (
            "filter-input",
            vec![
                "ct state new jump nodeport-endpoints-check",
                "ct state new jump service-endpoints-check",
            ],
        ),
        (
            "filter-forward",
            vec![
                "ct state new jump service-endpoints-check",
                "ct state new jump cluster-ips-check",
            ],
        ),
        (
            "filter-output",
            vec![
                "ct state new jump service-endpoints-check",
                "ct state new jump cluster-ips-check",
            ],
        ),
        (
            "filter-prerouting-pre-dnat",
            vec!["ct state new jump firewall-check"],
        ),
        (
            "filter-output-pre-dnat",
            vec!["ct state new jump firewall-check"],
        ),
        ("nat-output", vec!["jump services"]),
        ("nat-prerouting", vec!["jump services"]),
        ("nat-postrouting", vec!["jump masquerading"]),
    ]);
    for (name, hook) in hooks {
        let rules = jumps
            .get(name)
            .into_iter()
            .flatten()
            .map(|s| (*s).to_owned())
            .collect();
        r.chains.insert(
            name.to_owned(),
            Chain {
                hook: Some(hook.to_owned()),
                rules,
            },
        );
    }
    let mut services = Vec::new();
    if config.masquerade_all {
        services.push(format!(
            "{ip} daddr @cluster-ips mark set mark or {MASQUERADE_MARK} comment \"masquerade all clusterIP traffic\""
        ));
    } else if !config.cluster_cidrs.is_empty() {
        services.push(format!(
            "{ip} daddr @cluster-ips {ip} saddr != {} mark set mark or {MASQUERADE_MARK} comment \"masquerade clusterIP traffic from outside cluster\"",
            cidrs(&config.cluster_cidrs)
        ));
    }
    services.push(format!(
        "{ip} daddr . meta l4proto . th dport vmap @service-ips"
    ));
    let (nodeport_match, nodeport_check) = if match_all {
        let no_localhost = family.no_localhost();
        (
            format!("fib daddr type local {no_localhost}"),
            no_localhost.to_owned(),
        )
    } else {
        (
            format!("{ip} daddr @nodeport-ips"),
            format!("{ip} daddr @nodeport-ips"),
        )
    };
    services.push(format!(
        "{nodeport_match} meta l4proto . th dport vmap @service-nodeports"
    ));
    r.chain("services", services);
    r.chain(
        "masquerading",
        vec![
            format!(
                "mark and {MASQUERADE_MARK} != 0 mark set mark xor {MASQUERADE_MARK} masquerade fully-random"
            ),
            format!(
                "ct status dnat {ip} saddr . {ip} daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"
            ),
        ],
    );
    r.chain(
        "cluster-ips-check",
        vec![format!(
            "{ip} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
        )],
    );
    r.chain(
        "firewall-check",
        vec![format!(
            "{ip} daddr . meta l4proto . th dport vmap @firewall-ips"
        )],
    );
    r.chain(
        "service-endpoints-check",
        vec![format!(
            "{ip} daddr . meta l4proto . th dport vmap @no-endpoint-services"
        )],
    );
    r.chain(
        "nodeport-endpoints-check",
        vec![format!(
            "{nodeport_check} meta l4proto . th dport vmap @no-endpoint-nodeports"
        )],
    );
    r.chain("reject-chain", vec!["reject".to_owned()]);
    for node_ip in &config.nodeport_ips {
        r.element("nodeport-ips", node_ip.to_string());
    }
    r
}

/// upstream's `hashAndTruncate`: the first 8 characters of the name's SHA-256 in base32, a dash,
/// and the name, cut to fit nftables' 256-byte names with room for a 16-byte prefix.
pub fn hash_and_truncate(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let encoded = data_encoding::BASE32.encode(&digest);
    let mut out = format!("{}-{name}", &encoded[..8]);
    if out.len() > 240 {
        let mut cut = 237;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// The name part every chain of a Service port shares: `ns/name/proto/port`, hashed.
fn port_base(port: &ServicePort) -> String {
    let (ns, name) = &port.service;
    hash_and_truncate(&format!(
        "{ns}/{name}/{}/{}",
        port.protocol.lower(),
        port.port_name
    ))
}

/// The name part of an endpoint's chain and affinity set.
fn endpoint_base(port: &ServicePort, endpoint: &Endpoint) -> String {
    let (ns, name) = &port.service;
    let ip = endpoint.ip.to_string().replace(':', ".");
    hash_and_truncate(&format!(
        "{ns}/{name}/{}/{}__{ip}/{}",
        port.protocol.lower(),
        port.port_name,
        endpoint.port
    ))
}

/// `ip:port` as Go's `net.JoinHostPort` writes it; upstream sorts endpoints by this string.
fn host_port(endpoint: &Endpoint) -> String {
    match endpoint.ip {
        IpAddr::V4(ip) => format!("{ip}:{}", endpoint.port),
        IpAddr::V6(ip) => format!("[{ip}]:{}", endpoint.port),
    }
}

fn sorted(mut endpoints: Vec<Endpoint>) -> Vec<Endpoint> {
    endpoints.sort_by_key(host_port);
    endpoints
}

/// How the proxy tells pod traffic apart from the rest (`--cluster-cidr`), per family.
pub struct Detector<'a> {
    /// The family's cluster CIDRs; empty: no detector.
    pub cluster_cidrs: &'a [IpNet],
}

/// Everything one Service contributes to a family's table.
pub fn service(
    family: Family,
    ports: &[ServicePort],
    node_zone: Option<&str>,
    detector: &Detector<'_>,
) -> Rules {
    let mut r = Rules::default();
    for port in ports {
        write_port(&mut r, family, port, node_zone, detector);
    }
    r
}

fn write_port(
    r: &mut Rules,
    family: Family,
    port: &ServicePort,
    node_zone: Option<&str>,
    detector: &Detector<'_>,
) {
    let ip = family.ip();
    let proto = port.protocol.lower();
    let base = port_base(port);
    let cluster_chain = format!("service-{base}");
    let local_chain = format!("local-{base}");
    let external_chain = format!("external-{base}");
    let firewall_chain = format!("firewall-{base}");
    let categorized = categorize(port, node_zone);
    let cluster = sorted(categorized.cluster);
    let local = sorted(categorized.local);
    let has_endpoints = categorized.has_any;
    let externally = port.has_external();
    let uses_cluster = !port.internal_local || externally;
    let uses_local = port.internal_local || (externally && port.external_local);
    let internal_chain = if port.internal_local {
        &local_chain
    } else {
        &cluster_chain
    };
    let has_internal = has_endpoints && !(port.internal_local && local.is_empty());
    let external_local = externally && port.external_local;
    let has_external = has_endpoints && !(external_local && local.is_empty());
    let comment = port.display_name().replace('"', "");
    let (internal_verdict, external_verdict) = if !has_endpoints {
        ("goto reject-chain", "goto reject-chain")
    } else {
        (
            if has_internal { "" } else { "drop" },
            if has_external { "" } else { "drop" },
        )
    };

    if uses_cluster && !cluster.is_empty() {
        balance(r, family, port, &cluster_chain, &cluster);
    }
    if uses_local && !local.is_empty() {
        balance(r, family, port, &local_chain, &local);
    }
    if has_endpoints && externally {
        let mut rules = Vec::new();
        if external_local {
            if !detector.cluster_cidrs.is_empty() {
                rules.push(format!(
                    "{ip} saddr {} goto {cluster_chain} comment \"short-circuit pod traffic\"",
                    cidrs(detector.cluster_cidrs)
                ));
            }
            rules.push(format!(
                "fib saddr type local mark set mark or {MASQUERADE_MARK} comment \"masquerade local traffic\""
            ));
            rules.push(format!(
                "fib saddr type local goto {cluster_chain} comment \"short-circuit local traffic\""
            ));
            if has_external {
                rules.push(format!("goto {local_chain}"));
            }
        } else {
            rules.push(format!(
                "mark set mark or {MASQUERADE_MARK} comment \"masquerade\""
            ));
            rules.push(format!("goto {cluster_chain}"));
        }
        r.chain(external_chain.clone(), rules);
    }

    r.element("cluster-ips", port.cluster_ip.to_string());
    let key = |vip: &IpAddr| format!("{vip} . {proto} . {}", port.port);
    if has_internal {
        r.element(
            "service-ips",
            format!("{} : goto {internal_chain}", key(&port.cluster_ip)),
        );
    } else {
        r.element(
            "no-endpoint-services",
            format!(
                "{} comment \"{comment}\" : {internal_verdict}",
                key(&port.cluster_ip)
            ),
        );
    }
    for vip in port.external_ips.iter().chain(&port.load_balancer_ips) {
        if has_endpoints {
            r.element(
                "service-ips",
                format!("{} : goto {external_chain}", key(vip)),
            );
        }
        if !has_external {
            r.element(
                "no-endpoint-services",
                format!("{} comment \"{comment}\" : {external_verdict}", key(vip)),
            );
        }
    }
    let ranges: Vec<IpNet> = if port.source_ranges.iter().any(|n| n.prefix_len() == 0) {
        Vec::new()
    } else {
        port.source_ranges.clone()
    };
    if !port.load_balancer_ips.is_empty() && !ranges.is_empty() {
        for vip in &port.load_balancer_ips {
            r.element(
                "firewall-ips",
                format!("{} : goto {firewall_chain}", key(vip)),
            );
        }
        let allowed = ranges
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        r.chain(
            firewall_chain,
            vec![format!("{ip} saddr != {{ {allowed} }} drop")],
        );
    }
    if let Some(node_port) = port.node_port {
        if has_endpoints {
            r.element(
                "service-nodeports",
                format!("{proto} . {node_port} : goto {external_chain}"),
            );
        }
        if !has_external {
            r.element(
                "no-endpoint-nodeports",
                format!("{proto} . {node_port} comment \"{comment}\" : {external_verdict}"),
            );
        }
    }
    let mut reachable: Vec<&Endpoint> = Vec::new();
    for e in cluster.iter().chain(&local) {
        if !reachable.iter().any(|o| o.ip == e.ip && o.port == e.port) {
            reachable.push(e);
        }
    }
    for e in reachable.iter().filter(|e| e.local) {
        r.element(
            "hairpin-connections",
            format!("{ip} . {ip} . {proto} . {port}", ip = e.ip, port = e.port),
        );
    }
}

/// One balancing chain: a single DNAT through a random map, or, with ClientIP affinity, an
/// affinity lookup per endpoint in front of a random jump to endpoint chains.
fn balance(r: &mut Rules, family: Family, port: &ServicePort, chain: &str, endpoints: &[Endpoint]) {
    let ip = family.ip();
    let proto = port.protocol.lower();
    let n = endpoints.len();
    let Some(timeout) = port.affinity_seconds else {
        let targets = endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| format!("{i} : {} . {}", e.ip, e.port))
            .collect::<Vec<_>>()
            .join(" , ");
        r.chain(
            chain.to_owned(),
            vec![format!("meta l4proto {proto} dnat {ip} addr . port to numgen random mod {n} map {{ {targets} }}")],
        );
        return;
    };
    let mut rules = Vec::new();
    let mut jumps = Vec::new();
    for (i, e) in endpoints.iter().enumerate() {
        let eb = endpoint_base(port, e);
        let endpoint_chain = format!("endpoint-{eb}");
        let set = format!("affinity-{eb}");
        rules.push(format!("{ip} saddr @{set} goto {endpoint_chain}"));
        jumps.push(format!("{i} : goto {endpoint_chain}"));
        r.sets.insert(
            set.clone(),
            format!(
                "type {} ; flags dynamic,timeout ; timeout {timeout}s ;",
                family.addr_type()
            ),
        );
        r.chain(
            endpoint_chain,
            vec![
                format!("update @{set} {{ {ip} saddr }}"),
                format!("meta l4proto {proto} dnat to {}", host_port(e)),
            ],
        );
    }
    rules.push(format!(
        "numgen random mod {n} vmap {{ {} }}",
        jumps.join(" , ")
    ));
    r.chain(chain.to_owned(), rules);
}

#[cfg(test)]
mod tests {
    //! The expected lines are upstream's (`pkg/proxy/nftables/proxier_test.go`,
    //! `TestOverallNFTablesRules`, 1.36), with the table renamed.
    use std::collections::BTreeSet;

    use super::*;
    use crate::ruleset::{ElementRefs, Transaction};
    use crate::state::Protocol;

    fn ep(ip: &str, local: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().expect("ip"),
            port: 80,
            ready: true,
            serving: true,
            terminating: false,
            local,
            zone_hints: None,
        }
    }

    fn port(ns: &str, name: &str, cluster_ip: &str, endpoints: Vec<Endpoint>) -> ServicePort {
        ServicePort {
            endpoints,
            ..ServicePort::new(
                (ns.into(), name.into()),
                "p80",
                Protocol::Tcp,
                80,
                cluster_ip.parse().expect("ip"),
            )
        }
    }

    /// The lines a Service adds to an empty table, without the table and flush lines.
    /// One Service port's rules as text, a line each.
    fn rules_text(port: ServicePort) -> String {
        lines(&[port], &[])
            .into_iter()
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn lines(ports: &[ServicePort], cluster_cidrs: &[IpNet]) -> BTreeSet<String> {
        let rules = service(Family::V4, ports, None, &Detector { cluster_cidrs });
        let mut tx = Transaction::new("ip", "kube-proxy");
        tx.partial(&Rules::default(), &rules, &mut ElementRefs::new());
        tx.finish()
            .lines()
            .filter(|l| !l.starts_with("add table") && !l.starts_with("flush chain"))
            .map(str::to_owned)
            .collect()
    }

    fn expect(text: &str) -> BTreeSet<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn chain_names_hash_as_upstream() {
        assert_eq!(
            hash_and_truncate("ns1/svc1/tcp/p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert!(hash_and_truncate("testing/service/tcp/http").starts_with("P4ZYZVCF-"));
        assert!(hash_and_truncate("ns1/svc1/tcp/p80__10.180.0.1/80").starts_with("5OJB2KTY-"));
        let long = hash_and_truncate(&"x".repeat(300));
        assert_eq!(long.len(), 240);
        assert!(long.ends_with("..."));
        assert_eq!(
            hash_and_truncate("testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"),
            "U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"
        );
        // Addresses are written as Go writes them (RFC 5952: one zero group stays), colons as dots.
        let v6 = port("testing", "service", "fd00::1", Vec::new());
        let v6 = ServicePort {
            port_name: "http".into(),
            ..v6
        };
        let endpoint = Endpoint {
            ip: "fd80:abcd:12:0:a1b2:c3d4:e5f6:9999".parse().expect("ip"),
            ..ep("1.1.1.1", false)
        };
        assert!(endpoint_base(&v6, &endpoint).ends_with("__fd80.abcd.12.0.a1b2.c3d4.e5f6.9999/80"));
    }

    #[test]
    fn a_cluster_ip_service_with_a_local_endpoint() {
        let svc1 = port("ns1", "svc1", "172.30.0.41", vec![ep("10.180.0.1", true)]);
        assert_eq!(
            lines(&[svc1], &[]),
            expect(
                "add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
                 add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.180.0.1 . 80 }
                 add element ip kube-proxy cluster-ips { 172.30.0.41 }
                 add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
                 add element ip kube-proxy hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 }"
            )
        );
    }

    #[test]
    fn a_local_policy_load_balancer_whose_endpoint_is_elsewhere() {
        let mut svc2 = port("ns2", "svc2", "172.30.0.42", vec![ep("10.180.0.2", false)]);
        svc2.external_local = true;
        svc2.node_port = Some(3001);
        svc2.external_ips = vec!["192.168.99.22".parse().expect("ip")];
        svc2.load_balancer_ips = vec!["1.2.3.4".parse().expect("ip")];
        let cidr: IpNet = "10.0.0.0/8".parse().expect("cidr");
        assert_eq!(
            lines(&[svc2], &[cidr]),
            expect(
                r#"add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
                add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.180.0.2 . 80 }
                add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
                add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
                add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local mark set mark or 0x4000 comment "masquerade local traffic"
                add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
                add element ip kube-proxy cluster-ips { 172.30.0.42 }
                add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
                add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
                add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
                add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
                add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
                add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }
                add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }"#
            )
        );
    }

    #[test]
    fn a_node_port_service_masquerades_external_traffic() {
        let mut svc3 = port("ns3", "svc3", "172.30.0.43", vec![ep("10.180.0.3", true)]);
        svc3.node_port = Some(3003);
        assert_eq!(
            lines(&[svc3], &[]),
            expect(
                r#"add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
                add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.180.0.3 . 80 }
                add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
                add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 mark set mark or 0x4000 comment "masquerade"
                add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
                add element ip kube-proxy cluster-ips { 172.30.0.43 }
                add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
                add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }
                add element ip kube-proxy hairpin-connections { 10.180.0.3 . 10.180.0.3 . tcp . 80 }"#
            )
        );
    }

    #[test]
    fn client_ip_affinity_and_source_ranges() {
        let mut svc5 = port("ns5", "svc5", "172.30.0.45", vec![ep("10.180.0.3", true)]);
        svc5.node_port = Some(3002);
        svc5.load_balancer_ips = vec!["5.6.7.8".parse().expect("ip")];
        svc5.source_ranges = vec!["203.0.113.0/25".parse().expect("cidr")];
        svc5.affinity_seconds = Some(10800);
        assert_eq!(
            lines(&[svc5], &[]),
            expect(
                r#"add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
                add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
                add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
                add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
                add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
                add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 mark set mark or 0x4000 comment "masquerade"
                add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
                add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
                add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
                add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
                add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
                add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
                add element ip kube-proxy cluster-ips { 172.30.0.45 }
                add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
                add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
                add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
                add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
                add element ip kube-proxy hairpin-connections { 10.180.0.3 . 10.180.0.3 . tcp . 80 }"#
            )
        );
    }

    #[test]
    fn no_endpoints_rejects() {
        let svc6 = port("ns6", "svc6", "172.30.0.46", Vec::new());
        assert_eq!(
            lines(&[svc6], &[]),
            expect(
                r#"add element ip kube-proxy cluster-ips { 172.30.0.46 }
                add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }"#
            )
        );
    }

    #[test]
    fn endpoints_are_ordered_as_strings_and_terminating_ones_are_a_fallback() {
        let mut svc = port(
            "ns4",
            "svc4",
            "172.30.0.44",
            vec![ep("10.180.0.5", false), ep("10.180.0.10", false)],
        );
        let text = rules_text(svc.clone());
        assert!(
            text.contains("numgen random mod 2 map { 0 : 10.180.0.10 . 80 , 1 : 10.180.0.5 . 80 }"),
            "{text}"
        );
        svc.endpoints = vec![
            Endpoint {
                ready: false,
                serving: true,
                terminating: true,
                ..ep("10.180.0.7", false)
            },
            Endpoint {
                ready: false,
                serving: false,
                terminating: true,
                ..ep("10.180.0.8", false)
            },
        ];
        let text = rules_text(svc.clone());
        assert!(
            text.contains("numgen random mod 1 map { 0 : 10.180.0.7 . 80 }"),
            "{text}"
        );
        svc.endpoints.push(ep("10.180.0.9", false));
        let text = rules_text(svc);
        assert!(
            text.contains("numgen random mod 1 map { 0 : 10.180.0.9 . 80 }"),
            "{text}"
        );
    }

    #[test]
    fn internal_local_without_local_endpoints_drops() {
        let mut svc = port("ns7", "svc7", "172.30.0.47", vec![ep("10.180.0.2", false)]);
        svc.internal_local = true;
        let text = rules_text(svc);
        assert!(
            text.contains(
                r#"no-endpoint-services { 172.30.0.47 . tcp . 80 comment "ns7/svc7:p80" : drop }"#
            ),
            "{text}"
        );
        assert!(!text.contains("add chain"), "{text}");
    }

    #[test]
    fn the_fixed_part_matches_upstream() {
        let config = BaseConfig {
            cluster_cidrs: vec!["10.0.0.0/8".parse().expect("cidr")],
            masquerade_all: false,
            nodeport_ips: vec!["192.168.0.2".parse().expect("ip")],
            nodeport_match_all: false,
        };
        let rules = base(Family::V4, &config);
        let mut tx = Transaction::new("ip", "kube-proxy");
        tx.partial(&Rules::default(), &rules, &mut ElementRefs::new());
        let text = tx.finish();
        for line in [
            r#"add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x4000 comment "masquerade clusterIP traffic from outside cluster""#,
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
            "add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
            "add rule ip kube-proxy masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random",
            "add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
            "add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
            "add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }",
            "add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }",
            "add element ip kube-proxy nodeport-ips { 192.168.0.2 }",
            r#"add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing: {line}\n{text}");
        }
        // Every chain is declared before any rule jumps to it.
        let first_rule = text.find("add rule").expect("rules");
        assert!(!text[first_rule..].contains("add chain"), "{text}");
    }
}

// The tests' prerequisite checks, shared with capstan's tests (a test that cannot run fails in
// CI and skips visibly elsewhere). Declared here, at file level, because a `#[path]` inside the
// inline `mod kernel` would resolve under a `rules/kernel/` directory that does not exist; here
// it is relative to this file's directory, `crates/proxy/src`.
#[cfg(test)]
#[path = "../../capstan/tests/common/require.rs"]
mod require;

#[cfg(test)]
mod kernel {
    //! The rules of both families, every feature on, checked by nftables itself (`nft -c` in a
    //! network namespace of its own: nothing is changed). Root only; CI runs as root.
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    use super::require::{have, is_root, require};
    use super::*;
    use crate::ruleset::{ElementRefs, Transaction};
    use crate::state::Protocol;

    fn endpoints(ips: &[&str]) -> Vec<Endpoint> {
        ips.iter()
            .enumerate()
            .map(|(i, ip)| Endpoint {
                ip: ip.parse().expect("ip"),
                port: 8080,
                ready: true,
                serving: true,
                terminating: false,
                local: i == 0,
                zone_hints: None,
            })
            .collect()
    }

    fn script(family: Family, cluster_ip: &str, vip: &str, range: &str, ips: &[&str]) -> String {
        let base_config = BaseConfig {
            cluster_cidrs: vec![range.parse().expect("cidr")],
            masquerade_all: false,
            nodeport_ips: Vec::new(),
            nodeport_match_all: true,
        };
        let mut port = ServicePort::new(
            ("ns".into(), "svc".into()),
            "http",
            Protocol::Tcp,
            80,
            cluster_ip.parse().expect("ip"),
        );
        port.node_port = Some(30080);
        port.external_ips = vec![vip.parse().expect("ip")];
        port.load_balancer_ips = vec![vip.parse().expect("ip")];
        port.source_ranges = vec![range.parse().expect("cidr")];
        port.affinity_seconds = Some(600);
        port.external_local = true;
        port.endpoints = endpoints(ips);
        let mut udp = port.clone();
        udp.protocol = Protocol::Udp;
        udp.affinity_seconds = None;
        udp.port_name = "dns".into();
        let mut tx = Transaction::new(family.nft(), "capstan-proxy-check");
        let mut refs = ElementRefs::new();
        tx.partial(&Rules::default(), &base(family, &base_config), &mut refs);
        let detector = Detector {
            cluster_cidrs: &base_config.cluster_cidrs,
        };
        tx.partial(
            &Rules::default(),
            &service(family, &[port, udp], None, &detector),
            &mut refs,
        );
        tx.finish()
    }

    #[test]
    fn both_families_rules_are_valid_nftables() {
        if !(require("root, for a network namespace of its own", is_root())
            && require("nft (nftables)", have("nft", "--version"))
            && require("unshare (util-linux)", have("unshare", "--version")))
        {
            return;
        }
        let text = script(
            Family::V4,
            "10.96.0.10",
            "192.0.2.10",
            "10.244.0.0/16",
            &["10.244.1.1", "10.244.2.1"],
        ) + &script(
            Family::V6,
            "fd00::10",
            "2001:db8::10",
            "fd10::/64",
            &["fd10::1", "fd10::2"],
        );
        let mut child = Command::new("unshare")
            .args(["-n", "nft", "-c", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("nft");
        assert!(
            out.status.success(),
            "{}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
