//! The subsets of an Endpoints: built from a Service's pods as upstream's controller builds
//! them (ports in its hash order, addresses grouped by port set, at most a thousand), and
//! repacked into canonical form.

use std::collections::BTreeMap;
use std::net::IpAddr;

use capstan_machinery::hash::{HashMap, HashMapExt};
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, ObjectReference, Pod, ServicePort, ServiceSpec,
};

use crate::service_pods::{canonical, target_port};

/// The most addresses an Endpoints holds (upstream's `maxCapacity`).
const MAX_ADDRESSES: usize = 1000;

/// One address as the repack sees it: ip, target uid, the address, ready.
type Entry = (String, String, EndpointAddress, bool);
/// Addresses of one port, keyed by (ip, target uid): the address and its ready flag.
type PortAddresses = BTreeMap<(String, String), (EndpointAddress, bool)>;

fn family_of(ip: &str) -> Option<&'static str> {
    ip.parse::<IpAddr>().ok().map(|ip| family(&ip))
}

fn family(ip: &IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    }
}

/// The address a pod gets in its Service's Endpoints, if it has one: of the
/// Service's family, not terminating (unless not-ready addresses are published), and one
/// Endpoints may hold.
fn pod_address(
    pod: &Pod,
    family: Option<&str>,
    publish: bool,
    service_name: &str,
) -> Option<(IpAddr, EndpointAddress)> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut ips: Vec<&str> = status.pod_ips.iter().flatten().map(|e| &*e.ip).collect();
    if ips.is_empty()
        && let Some(ip) = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())
    {
        ips.push(ip);
    }
    let first = *ips.first()?;
    if !publish && pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let wanted = family.or_else(|| family_of(first))?;
    let (ip, text) = ips
        .iter()
        .filter_map(|text| Some((text.parse::<IpAddr>().ok()?, text)))
        .find(|(ip, _)| self::family(ip) == wanted)?;
    let text = canonical(&ip, text);
    // An address Endpoints may not hold (loopback, link-local, unspecified) would make the
    // whole write fail validation and keep every other pod of the Service out too: such a
    // pod is left out instead.
    if capstan_machinery::ip::special_problem(ip, &text).is_some() {
        return None;
    }
    let spec = pod.spec.as_ref();
    let hostname = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .filter(|_| spec.and_then(|s| s.subdomain.as_deref()) == Some(service_name));
    let address = EndpointAddress {
        ip: text,
        hostname: hostname.map(str::to_string),
        node_name: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some(pod.metadata.namespace.clone().unwrap_or_default()),
            name: Some(pod.metadata.name.clone().unwrap_or_default()),
            uid: Some(pod.metadata.uid.clone().unwrap_or_default()),
            ..ObjectReference::default()
        }),
    };
    Some((ip, address))
}

/// A port's identity: port, protocol, name, app protocol.
type PortOrder = (i32, String, String, String);

/// A port's identity (what tells two ports apart; their order in a subset is upstream's hash
/// order, [`crate::gohash::endpoints_port_order`]).
fn port_order(port: &EndpointPort) -> PortOrder {
    (
        port.port,
        port.protocol.clone().unwrap_or_default(),
        port.name.clone().unwrap_or_default(),
        port.app_protocol.clone().unwrap_or_default(),
    )
}

/// The Endpoints port of a Service port, for one pod.
fn endpoint_port(service_port: &ServicePort, port: i32) -> EndpointPort {
    EndpointPort {
        name: service_port.name.clone().filter(|n| !n.is_empty()),
        port,
        protocol: Some(
            service_port
                .protocol
                .clone()
                .unwrap_or_else(|| "TCP".into()),
        ),
        app_protocol: service_port.app_protocol.clone(),
    }
}

/// A Service port as one pod resolves it: the port's index and the number (`None`: a
/// headless Service without ports).
type Resolved = Option<(usize, i32)>;

/// Subsets for a Service and its selected pods; `true` when
/// truncated to 1000 addresses.
pub fn build_subsets<P: std::borrow::Borrow<Pod>>(
    spec: &ServiceSpec,
    service_name: &str,
    pods: &[P],
) -> (Vec<EndpointSubset>, bool) {
    let publish = spec.publish_not_ready_addresses == Some(true);
    let cluster_ip = spec.cluster_ip.as_deref().unwrap_or_default();
    let family = spec
        .ip_families
        .as_ref()
        .and_then(|f| f.first())
        .map(String::as_str)
        .or_else(|| family_of(cluster_ip));
    let service_ports = spec.ports.as_deref().unwrap_or_default();
    // Per port as first resolved (a pod's: the Service port's index and the number), its
    // addresses keyed by (ip, uid) with their ready flag. A Service has a few ports, so they
    // are found by a scan, and each is built once, not once per pod.
    let mut by_port: Vec<(Resolved, Option<EndpointPort>, PortAddresses)> = Vec::new();
    let mut resolved: Vec<Resolved> = Vec::with_capacity(service_ports.len());
    for pod in pods {
        let pod: &Pod = pod.borrow();
        let Some((_, address)) = pod_address(pod, family, publish, service_name) else {
            continue;
        };
        resolved.clear();
        if service_ports.is_empty() {
            if cluster_ip == "None" {
                resolved.push(None);
            }
        } else {
            resolved.extend(
                service_ports
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| target_port(p, pod).map(|number| Some((i, number)))),
            );
        }
        let is_ready = publish || capstan_resources::core::pod::is_ready(pod);
        let key = (
            address.ip.clone(),
            pod.metadata.uid.clone().unwrap_or_default(),
        );
        // The last port takes the key and address, the others copies.
        let mut entry = Some((key, address));
        for (n, port) in resolved.iter().enumerate() {
            let at = match by_port.iter().position(|(p, _, _)| p == port) {
                Some(at) => at,
                None => {
                    let built = port.map(|(i, number)| endpoint_port(&service_ports[i], number));
                    by_port.push((*port, built, BTreeMap::new()));
                    by_port.len() - 1
                }
            };
            let (key, address) = match (&entry, n + 1 == resolved.len()) {
                (Some(_), true) => match entry.take() {
                    Some(taken) => taken,
                    None => break,
                },
                (Some((key, address)), false) => (key.clone(), address.clone()),
                (None, _) => break,
            };
            let slot = by_port[at].2.entry(key).or_insert((address, is_ready));
            slot.1 &= is_ready; // not-ready wins
        }
    }
    // Ports the same once resolved (two Service ports naming one container port) are one.
    let mut merged: BTreeMap<Option<PortOrder>, (Option<EndpointPort>, PortAddresses)> =
        BTreeMap::new();
    for (_, port, addresses) in by_port {
        match merged.entry(port.as_ref().map(port_order)) {
            std::collections::btree_map::Entry::Vacant(vacant) => {
                vacant.insert((port, addresses));
            }
            std::collections::btree_map::Entry::Occupied(mut occupied) => {
                for (key, (address, ready)) in addresses {
                    let slot = occupied.get_mut().1.entry(key).or_insert((address, ready));
                    slot.1 &= ready;
                }
            }
        }
    }
    let mut subsets = group_by_addresses(merged);
    let truncated = truncate(&mut subsets);
    let subsets = subsets
        .into_iter()
        .filter(|(r, n, _)| !r.is_empty() || !n.is_empty())
        .map(|(ready, not_ready, ports)| EndpointSubset {
            addresses: (!ready.is_empty()).then_some(ready),
            not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
            ports: (!ports.is_empty()).then_some(ports),
        })
        .collect();
    (subsets, truncated)
}

/// One subset before it is written: ready addresses, not-ready addresses, ports.
pub(crate) type Subset = (
    Vec<EndpointAddress>,
    Vec<EndpointAddress>,
    Vec<EndpointPort>,
);

/// Ports with identical address sets share a subset; subsets, their ports and their
/// addresses in upstream's order (`SortSubsets`: addresses by IP and UID, ports and subsets
/// by hash).
fn group_by_addresses<K>(
    by_port: BTreeMap<K, (Option<EndpointPort>, PortAddresses)>,
) -> Vec<Subset> {
    let mut groups: Vec<(Vec<EndpointPort>, Vec<Entry>)> = Vec::new();
    for (_, (port, addresses)) in by_port {
        let list: Vec<Entry> = addresses
            .into_iter()
            .map(|((ip, uid), (address, ready))| (ip, uid, address, ready))
            .collect();
        let same_addresses = |l: &Vec<Entry>| {
            l.len() == list.len()
                && l.iter()
                    .zip(list.iter())
                    .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && a.3 == b.3)
        };
        match groups.iter_mut().find(|(_, l)| same_addresses(l)) {
            Some(group) => group.0.extend(port),
            None => groups.push((port.into_iter().collect(), list)),
        }
    }
    let mut subsets: Vec<Subset> = groups
        .into_iter()
        .map(|(mut ports, mut list)| {
            ports.sort_by_cached_key(crate::gohash::endpoints_port_order);
            list.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()).then(a.1.cmp(&b.1)));
            let (ready, not_ready): (Vec<Entry>, Vec<Entry>) = list.into_iter().partition(|e| e.3);
            let ready = ready.into_iter().map(|e| e.2).collect();
            let not_ready = not_ready.into_iter().map(|e| e.2).collect();
            (ready, not_ready, ports)
        })
        .collect();
    subsets.sort_by_cached_key(|(ready, not_ready, ports)| {
        crate::gohash::subset_order(ready, not_ready, ports)
    });
    subsets
}

/// Upstream's `RepackSubsets`: the subsets of an Endpoints in canonical form (each address
/// once per port, not-ready winning over ready, ports with the same addresses together). An
/// address (an IP and its target's UID) is given as it first appears anywhere in the
/// Endpoints, whichever port it is listed under later.
pub(crate) fn repack(subsets: &[EndpointSubset]) -> Vec<Subset> {
    let mut by_port: BTreeMap<Option<PortOrder>, (Option<EndpointPort>, PortAddresses)> =
        BTreeMap::new();
    let mut first: HashMap<(String, String), EndpointAddress> = HashMap::new();
    for subset in subsets {
        let ports: Vec<Option<EndpointPort>> = match subset.ports.as_deref() {
            Some(ports) if !ports.is_empty() => ports.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        let addresses = subset.addresses.iter().flatten().map(|a| (a, true)).chain(
            subset
                .not_ready_addresses
                .iter()
                .flatten()
                .map(|a| (a, false)),
        );
        for (address, ready) in addresses {
            let uid = address
                .target_ref
                .as_ref()
                .and_then(|t| t.uid.clone())
                .unwrap_or_default();
            let key = (address.ip.clone(), uid);
            let address = first.entry(key.clone()).or_insert_with(|| address.clone());
            for port in &ports {
                let entry = by_port
                    .entry(port.as_ref().map(port_order))
                    .or_insert_with(|| (port.clone(), BTreeMap::new()));
                let slot = entry
                    .1
                    .entry(key.clone())
                    .or_insert_with(|| (address.clone(), ready));
                slot.1 &= ready;
            }
        }
    }
    group_by_addresses(by_port)
}

/// More than 1000 addresses are cut down, each subset keeping its share (ready
/// addresses first); `true` when anything was cut.
fn truncate(subsets: &mut [Subset]) -> bool {
    let total: usize = subsets.iter().map(|(r, n, _)| r.len() + n.len()).sum();
    if total <= MAX_ADDRESSES {
        return false;
    }
    let ready_total: usize = subsets.iter().map(|(r, _, _)| r.len()).sum();
    let mut budget = MAX_ADDRESSES;
    if ready_total > MAX_ADDRESSES {
        for (ready, not_ready, _) in subsets.iter_mut() {
            let share = (ready.len() * MAX_ADDRESSES)
                .div_ceil(ready_total)
                .min(budget);
            ready.truncate(share);
            budget -= ready.len();
            not_ready.clear();
        }
    } else {
        let not_ready_total: usize = subsets.iter().map(|(_, n, _)| n.len()).sum();
        budget -= ready_total;
        for (_, not_ready, _) in subsets.iter_mut() {
            let share = (not_ready.len() * (MAX_ADDRESSES - ready_total))
                .div_ceil(not_ready_total.max(1))
                .min(budget);
            not_ready.truncate(share);
            budget -= not_ready.len();
        }
    }
    true
}
