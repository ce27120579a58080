//! Stale UDP conntrack entries (upstream's `conntrack.CleanStaleEntries`): a UDP flow keeps its
//! NAT decision for as long as packets keep coming, so a client talking to an endpoint that
//! went away would talk into the void forever. After a sync that changed a UDP Service's
//! endpoints, every UDP entry aimed at one of its addresses whose reply does not come from a
//! current serving endpoint is deleted. Done with the `conntrack` tool (conntrack-tools).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::process::Stdio;

use tokio::process::Command;

use crate::state::{Family, ServicePort};

/// One UDP flow, as `conntrack -L` prints it.
#[derive(Debug, PartialEq, Eq)]
struct Flow {
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    reply_src: IpAddr,
    reply_sport: u16,
}

/// Parses one line of `conntrack -L -p udp`: the first src/dst/sport/dport are the original
/// direction, the second the reply.
fn parse(line: &str) -> Option<Flow> {
    let mut src = Vec::new();
    let mut dst = Vec::new();
    let mut sport = Vec::new();
    let mut dport = Vec::new();
    for field in line.split_whitespace() {
        let Some((key, value)) = field.split_once('=') else {
            continue;
        };
        match key {
            "src" => src.push(value.parse::<IpAddr>().ok()?),
            "dst" => dst.push(value.parse::<IpAddr>().ok()?),
            "sport" => sport.push(value.parse::<u16>().ok()?),
            "dport" => dport.push(value.parse::<u16>().ok()?),
            _ => {}
        }
    }
    Some(Flow {
        src: *src.first()?,
        dst: *dst.first()?,
        sport: *sport.first()?,
        dport: *dport.first()?,
        reply_src: *src.get(1)?,
        reply_sport: *sport.get(1)?,
    })
}

/// The flows to delete: aimed at a Service address and port (or any address on a node port)
/// of a port with serving endpoints, answered by something that is not one of them.
fn stale(flows: &[Flow], ports: &[ServicePort]) -> Vec<usize> {
    let mut by_address: HashMap<(IpAddr, u16), HashSet<(IpAddr, u16)>> = HashMap::new();
    let mut by_node_port: HashMap<u16, HashSet<(IpAddr, u16)>> = HashMap::new();
    for port in ports {
        let serving: HashSet<(IpAddr, u16)> = port
            .endpoints
            .iter()
            .filter(|e| e.serving)
            .map(|e| (e.ip, e.port))
            .collect();
        if serving.is_empty() {
            continue;
        }
        for vip in std::iter::once(&port.cluster_ip)
            .chain(&port.external_ips)
            .chain(&port.load_balancer_ips)
        {
            by_address
                .entry((*vip, port.port))
                .or_default()
                .extend(serving.iter().copied());
        }
        if let Some(node_port) = port.node_port {
            by_node_port
                .entry(node_port)
                .or_default()
                .extend(serving.iter().copied());
        }
    }
    let mut out = Vec::new();
    for (i, flow) in flows.iter().enumerate() {
        let allowed = by_address
            .get(&(flow.dst, flow.dport))
            .or_else(|| by_node_port.get(&flow.dport));
        if let Some(allowed) = allowed
            && !allowed.contains(&(flow.reply_src, flow.reply_sport))
        {
            out.push(i);
        }
    }
    out
}

/// Deletes the stale UDP flows of `ports`; returns how many went.
pub async fn clean_udp(family: Family, ports: &[ServicePort]) -> u64 {
    if ports.is_empty() {
        return 0;
    }
    let f = match family {
        Family::V4 => "ipv4",
        Family::V6 => "ipv6",
    };
    let listed = Command::new("conntrack")
        .args(["-L", "-p", "udp", "-f", f])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await;
    let out = match listed {
        Ok(out) => out,
        Err(err) => {
            tracing::debug!(%err, "conntrack is not available; stale UDP flows stay");
            return 0;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let flows: Vec<Flow> = text.lines().filter_map(parse).collect();
    let mut deleted = 0;
    for i in stale(&flows, ports) {
        let flow = &flows[i];
        let status = Command::new("conntrack")
            .args(["-D", "-p", "udp", "-f", f])
            .args([
                "--orig-src",
                &flow.src.to_string(),
                "--orig-dst",
                &flow.dst.to_string(),
            ])
            .args([
                "--orig-port-src",
                &flow.sport.to_string(),
                "--orig-port-dst",
                &flow.dport.to_string(),
            ])
            .args(["--reply-src", &flow.reply_src.to_string()])
            .args(["--reply-port-src", &flow.reply_sport.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await;
        if status.is_ok_and(|s| s.success()) {
            deleted += 1;
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Endpoint, Protocol};

    fn port(endpoints: &[(&str, bool)]) -> ServicePort {
        ServicePort {
            node_port: Some(30053),
            endpoints: endpoints
                .iter()
                .map(|(ip, serving)| Endpoint {
                    ip: ip.parse().expect("ip"),
                    port: 5353,
                    ready: *serving,
                    serving: *serving,
                    terminating: false,
                    local: true,
                    zone_hints: None,
                })
                .collect(),
            ..ServicePort::new(
                ("ns".into(), "dns".into()),
                "dns",
                Protocol::Udp,
                53,
                "10.96.0.10".parse().expect("ip"),
            )
        }
    }

    #[test]
    fn flows_answered_by_a_gone_endpoint_or_never_nated_are_stale() {
        let lines = [
            // to the cluster IP, answered by a current endpoint: kept
            "udp      17 28 src=10.244.2.50 dst=10.96.0.10 sport=40000 dport=53 src=10.244.1.11 dst=10.244.2.50 sport=5353 dport=40000 mark=0 use=1",
            // answered by an endpoint that went: deleted
            "udp      17 28 src=10.244.2.50 dst=10.96.0.10 sport=40001 dport=53 src=10.244.1.12 dst=10.244.2.50 sport=5353 dport=40001 mark=0 use=1",
            // created while the Service had no endpoints (never DNATed): deleted
            "udp      17 28 src=10.244.2.50 dst=10.96.0.10 sport=40002 dport=53 [UNREPLIED] src=10.96.0.10 dst=10.244.2.50 sport=53 dport=40002 mark=0 use=1",
            // to the node port on a node address, answered by the gone endpoint: deleted
            "udp      17 28 src=10.244.2.50 dst=10.244.2.1 sport=40003 dport=30053 src=10.244.1.12 dst=10.244.2.50 sport=5353 dport=40003 mark=0 use=1",
            // unrelated traffic: kept
            "udp      17 28 src=10.244.2.50 dst=8.8.8.8 sport=40004 dport=53 src=8.8.8.8 dst=10.244.2.50 sport=53 dport=40004 mark=0 use=1",
        ];
        let flows: Vec<Flow> = lines.iter().filter_map(|l| parse(l)).collect();
        assert_eq!(flows.len(), 5);
        assert_eq!(
            stale(&flows, &[port(&[("10.244.1.11", true)])]),
            vec![1, 2, 3]
        );
        // a port without serving endpoints is left alone
        assert!(stale(&flows, &[port(&[("10.244.1.11", false)])]).is_empty());
    }
}
