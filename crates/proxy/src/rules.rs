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
    /// The addresses node ports answer on; empty means every local address.
    pub nodeport_ips: Vec<IpAddr>,
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
    let match_all = config.nodeport_ips.is_empty();
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
    let has_endpoints = !cluster.is_empty() || !local.is_empty();
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
