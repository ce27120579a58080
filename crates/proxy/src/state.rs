//! What the proxy knows of the cluster: Services, EndpointSlices and its own Node, as the API
//! reported them, and the per-port view the rules are written from (upstream's
//! `pkg/proxy/serviceport.go`, `endpoint.go` and `topology.go`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that names the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The zone label read from the Node for topology hints.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// A Service, by namespace and name.
pub type ServiceName = (String, String);

/// An address family: the proxy writes one table per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4 (`table ip`).
    V4,
    /// IPv6 (`table ip6`).
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The EndpointSlice `addressType` of this family.
    fn address_type(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// A transport protocol a Service port can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The lower-case name nftables and chain names use.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// One endpoint of a Service port, as upstream's `BaseEndpointInfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The endpoint's address (the first of its slice entry's addresses).
    pub ip: IpAddr,
    /// The port traffic goes to.
    pub port: u16,
    /// `conditions.ready` (absent counts as ready).
    pub ready: bool,
    /// `conditions.serving` (absent: as ready).
    pub serving: bool,
    /// `conditions.terminating` (absent: false).
    pub terminating: bool,
    /// Whether the endpoint runs on this node (`nodeName`).
    pub local: bool,
    /// `hints.forZones`, when the slice gives hints.
    pub zone_hints: Option<BTreeSet<String>>,
}

/// One port of a Service in one family, with its endpoints: what one set of chains serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// The Service.
    pub service: ServiceName,
    /// The port's name (empty for an unnamed single port).
    pub port_name: String,
    /// The protocol.
    pub protocol: Protocol,
    /// The Service port.
    pub port: u16,
    /// The cluster IP of this family.
    pub cluster_ip: IpAddr,
    /// The node port, for NodePort and LoadBalancer Services.
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family.
    pub source_ranges: Vec<IpNet>,
    /// The ClientIP affinity timeout in seconds, when `sessionAffinity: ClientIP`.
    pub affinity_seconds: Option<i32>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local` (only meaningful with external addresses).
    pub external_local: bool,
    /// `spec.healthCheckNodePort` (a LoadBalancer Service with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<u16>,
    /// Every endpoint the slices list for this port, in order, without duplicates.
    pub endpoints: Vec<Endpoint>,
}

impl ServicePort {
    /// A port with no node port, external addresses, affinity, Local policy or endpoints.
    pub fn new(
        service: ServiceName,
        port_name: &str,
        protocol: Protocol,
        port: u16,
        cluster_ip: IpAddr,
    ) -> ServicePort {
        ServicePort {
            service,
            port_name: port_name.to_owned(),
            protocol,
            port,
            cluster_ip,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            affinity_seconds: None,
            internal_local: false,
            external_local: false,
            health_check_node_port: None,
            endpoints: Vec::new(),
        }
    }

    /// upstream's `ServicePortName.String()`: `ns/name:port` (or `ns/name` for an unnamed port).
    pub fn display_name(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.service.0, self.service.1)
        } else {
            format!("{}/{}:{}", self.service.0, self.service.1, self.port_name)
        }
    }

    /// Whether traffic from outside reaches this port (node port, external or LB IPs).
    pub fn has_external(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }
}

/// Which endpoints serve which traffic: upstream's `CategorizeEndpoints`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// Endpoints for traffic that may go anywhere in the cluster.
    pub cluster: Vec<Endpoint>,
    /// This node's endpoints, for a `Local` policy.
    pub local: Vec<Endpoint>,
    /// Whether any endpoint exists at all (ready or not); upstream drops (not rejects)
    /// policy-filtered traffic when endpoints exist elsewhere.
    pub has_any: bool,
}

/// Sorts endpoints into the sets the rules use.
///
/// Cluster traffic uses the ready endpoints (narrowed to the node's zone when every ready
/// endpoint carries zone hints and one names this zone), or, when none is ready, the ones
/// still serving while terminating. Local traffic does the same among this node's endpoints.
pub fn categorize(port: &ServicePort, node_zone: Option<&str>) -> Categorized {
    let endpoints = &port.endpoints;
    let has_any = endpoints
        .iter()
        .any(|e| e.ready || (e.serving && e.terminating));
    let mut out = Categorized {
        has_any,
        ..Categorized::default()
    };
    let need_cluster = !port.internal_local || port.has_external();
    let need_local = port.internal_local || (port.has_external() && port.external_local);
    if need_cluster {
        let use_zone = node_zone.filter(|zone| can_use_zones(endpoints, zone));
        out.cluster = pick(endpoints, |e| match use_zone {
            Some(zone) => e.zone_hints.as_ref().is_some_and(|z| z.contains(zone)),
            None => true,
        });
    }
    if need_local {
        out.local = pick(endpoints, |e| e.local);
    }
    out
}

/// The ready endpoints that pass `filter`, or failing that the serving-and-terminating ones.
fn pick(endpoints: &[Endpoint], filter: impl Fn(&Endpoint) -> bool) -> Vec<Endpoint> {
    let ready: Vec<Endpoint> = endpoints
        .iter()
        .filter(|e| e.ready && filter(e))
        .cloned()
        .collect();
    if !ready.is_empty() {
        return ready;
    }
    endpoints
        .iter()
        .filter(|e| e.serving && e.terminating && filter(e))
        .cloned()
        .collect()
}

/// upstream's `canUseTopology`: every ready endpoint has zone hints, and some name this zone.
fn can_use_zones(endpoints: &[Endpoint], zone: &str) -> bool {
    let mut any_here = false;
    for e in endpoints.iter().filter(|e| e.ready) {
        match &e.zone_hints {
            None => return false,
            Some(zones) if zones.is_empty() => return false,
            Some(zones) => any_here |= zones.contains(zone),
        }
    }
    any_here
}

/// The cluster as the proxy sees it.
#[derive(Default)]
pub struct ClusterState {
    /// Services by namespace and name.
    pub services: BTreeMap<ServiceName, Service>,
    /// EndpointSlices by namespace and slice name.
    pub slices: BTreeMap<ServiceName, EndpointSlice>,
    /// The slices of each Service, by slice name.
    by_service: BTreeMap<ServiceName, BTreeSet<String>>,
    /// This node, once seen.
    pub node: Option<Node>,
}

fn key_of(namespace: Option<&String>, name: Option<&String>) -> ServiceName {
    (
        namespace.cloned().unwrap_or_default(),
        name.cloned().unwrap_or_default(),
    )
}

impl ClusterState {
    /// Stores a Service; returns its name.
    pub fn put_service(&mut self, service: Service) -> ServiceName {
        let key = key_of(
            service.metadata.namespace.as_ref(),
            service.metadata.name.as_ref(),
        );
        self.services.insert(key.clone(), service);
        key
    }

    /// Forgets a Service; returns its name.
    pub fn remove_service(&mut self, service: &Service) -> ServiceName {
        let key = key_of(
            service.metadata.namespace.as_ref(),
            service.metadata.name.as_ref(),
        );
        self.services.remove(&key);
        key
    }

    /// Stores a slice; returns the Services whose endpoints it changed (its old and new owner).
    pub fn put_slice(&mut self, slice: EndpointSlice) -> Vec<ServiceName> {
        let mut touched = self.remove_slice(&slice);
        let key = key_of(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        );
        if let Some(service) = owner_of(&slice) {
            self.by_service
                .entry(service.clone())
                .or_default()
                .insert(key.1.clone());
            if !touched.contains(&service) {
                touched.push(service);
            }
        }
        self.slices.insert(key, slice);
        touched
    }

    /// Forgets a slice; returns the Service it belonged to.
    pub fn remove_slice(&mut self, slice: &EndpointSlice) -> Vec<ServiceName> {
        let key = key_of(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        );
        let Some(old) = self.slices.remove(&key) else {
            return Vec::new();
        };
        let Some(service) = owner_of(&old) else {
            return Vec::new();
        };
        if let Some(names) = self.by_service.get_mut(&service) {
            names.remove(&key.1);
            if names.is_empty() {
                self.by_service.remove(&service);
            }
        }
        vec![service]
    }

    /// Replaces every Service (after a relist).
    pub fn replace_services(&mut self, services: Vec<Service>) {
        self.services.clear();
        for service in services {
            self.put_service(service);
        }
    }

    /// Replaces every slice (after a relist).
    pub fn replace_slices(&mut self, slices: Vec<EndpointSlice>) {
        self.slices.clear();
        self.by_service.clear();
        for slice in slices {
            self.put_slice(slice);
        }
    }

    /// Every Service name the state knows of, with or without slices.
    pub fn service_names(&self) -> BTreeSet<ServiceName> {
        self.services
            .keys()
            .chain(self.by_service.keys())
            .cloned()
            .collect()
    }

    /// The node's name-independent facts: its zone label.
    pub fn node_zone(&self) -> Option<&str> {
        self.node
            .as_ref()?
            .metadata
            .labels
            .as_ref()?
            .get(ZONE_LABEL)
            .map(String::as_str)
    }

    /// The node's addresses (InternalIP, then ExternalIP), for node ports.
    pub fn node_ips(&self) -> Vec<IpAddr> {
        let Some(addresses) = self
            .node
            .as_ref()
            .and_then(|n| n.status.as_ref()?.addresses.as_ref())
        else {
            return Vec::new();
        };
        let mut ips: Vec<IpAddr> = Vec::new();
        for kind in ["InternalIP", "ExternalIP"] {
            for a in addresses.iter().filter(|a| a.type_ == kind) {
                if let Ok(ip) = a.address.parse::<IpAddr>()
                    && !ips.contains(&ip)
                {
                    ips.push(ip);
                }
            }
        }
        ips
    }

    /// The ports of a Service in one family, each with its endpoints; empty when the Service
    /// is gone, headless, an ExternalName, or has no cluster IP of this family.
    pub fn ports(&self, name: &ServiceName, family: Family, node_name: &str) -> Vec<ServicePort> {
        let Some(service) = self.services.get(name) else {
            return Vec::new();
        };
        let Some(spec) = service.spec.as_ref() else {
            return Vec::new();
        };
        if spec.type_.as_deref() == Some("ExternalName") {
            return Vec::new();
        }
        let cluster_ips = capstan_agent::cluster_ips(spec);
        let Some(cluster_ip) = cluster_ips.into_iter().find(|ip| Family::of(ip) == family) else {
            return Vec::new();
        };
        let of_family = |ips: &mut dyn Iterator<Item = &String>| -> Vec<IpAddr> {
            ips.filter_map(|ip| ip.parse::<IpAddr>().ok())
                .filter(|ip| Family::of(ip) == family)
                .collect()
        };
        let external_ips = of_family(&mut spec.external_ips.iter().flatten());
        let load_balancer_ips = of_family(
            &mut service
                .status
                .iter()
                .filter_map(|s| s.load_balancer.as_ref()?.ingress.as_ref())
                .flatten()
                // `ipMode: Proxy` ingress is the load balancer's own business.
                .filter(|i| i.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
                .filter_map(|i| i.ip.as_ref()),
        );
        let source_ranges = spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .filter_map(|r| r.trim().parse::<IpNet>().ok())
            .map(|net| net.trunc())
            .filter(|net| Family::of(&net.addr()) == family)
            .collect::<Vec<_>>();
        let affinity_seconds = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref()?.timeout_seconds)
                .unwrap_or(10_800)
        });
        let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
        let mut out = Vec::new();
        for port in spec.ports.iter().flatten() {
            let Some(protocol) = Protocol::parse(port.protocol.as_deref()) else {
                continue;
            };
            let Ok(number) = u16::try_from(port.port) else {
                continue;
            };
            let port_name = port.name.clone().unwrap_or_default();
            let mut sp = ServicePort {
                node_port: port
                    .node_port
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p > 0),
                external_ips: external_ips.clone(),
                load_balancer_ips: if is_lb {
                    load_balancer_ips.clone()
                } else {
                    Vec::new()
                },
                source_ranges: if is_lb {
                    source_ranges.clone()
                } else {
                    Vec::new()
                },
                affinity_seconds,
                internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
                external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
                health_check_node_port: spec
                    .health_check_node_port
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p > 0 && is_lb),
                ..ServicePort::new(name.clone(), &port_name, protocol, number, cluster_ip)
            };
            sp.endpoints = self.endpoints(name, family, &port_name, protocol, node_name);
            out.push(sp);
        }
        out
    }

    /// Every endpoint the Service's slices of this family list for a port, by name and
    /// protocol; the first slice to name an address and port wins.
    fn endpoints(
        &self,
        name: &ServiceName,
        family: Family,
        port_name: &str,
        protocol: Protocol,
        node_name: &str,
    ) -> Vec<Endpoint> {
        let mut out: Vec<Endpoint> = Vec::new();
        let Some(slice_names) = self.by_service.get(name) else {
            return out;
        };
        for slice_name in slice_names {
            let Some(slice) = self.slices.get(&(name.0.clone(), slice_name.clone())) else {
                continue;
            };
            if slice.address_type != family.address_type() {
                continue;
            }
            let Some(number) = slice.ports.iter().flatten().find_map(|p| {
                // upstream skips ports without a name or number
                let same_name = p.name.as_deref() == Some(port_name);
                let same_protocol = Protocol::parse(p.protocol.as_deref()) == Some(protocol);
                (same_name && same_protocol)
                    .then_some(p.port)
                    .flatten()
                    .filter(|n| *n != 0)
            }) else {
                continue;
            };
            let Ok(number) = u16::try_from(number) else {
                continue;
            };
            for e in slice.endpoints.iter().flatten() {
                let Some(ip) = e.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                    continue;
                };
                let conditions = e.conditions.as_ref();
                let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
                let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
                // The same address in two slices: the copy that is not terminating wins.
                if let Some(i) = out.iter().position(|o| o.ip == ip && o.port == number) {
                    if terminating || !out[i].terminating {
                        continue;
                    }
                    out.remove(i);
                }
                out.push(Endpoint {
                    ip,
                    port: number,
                    ready,
                    serving: conditions.and_then(|c| c.serving).unwrap_or(true),
                    terminating,
                    local: e.node_name.as_deref() == Some(node_name),
                    zone_hints: e
                        .hints
                        .as_ref()
                        .and_then(|h| h.for_zones.as_ref())
                        .map(|zones| {
                            zones
                                .iter()
                                .map(|z| z.name.clone())
                                .collect::<BTreeSet<String>>()
                        }),
                });
            }
        }
        out
    }
}

/// The Service a slice belongs to, by its `kubernetes.io/service-name` label.
fn owner_of(slice: &EndpointSlice) -> Option<ServiceName> {
    let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((
        slice.metadata.namespace.clone().unwrap_or_default(),
        service.clone(),
    ))
}
