//! Services and EndpointSlices as DNS data: what each Service name answers, kept current by
//! the watches, and the reverse (PTR) index.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A Service, by namespace and name.
pub type ServiceKey = (String, String);

/// One port, as SRV records name it: `_<name>._<protocol>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPort {
    /// The port's name (lower-case); unnamed ports have no SRV record.
    pub name: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The port number.
    pub port: u16,
}

/// One endpoint a headless Service's name answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadlessEndpoint {
    /// The address.
    pub ip: IpAddr,
    /// The endpoint's `hostname`, if it has one.
    pub hostname: Option<String>,
    /// The label its own name has: the hostname, or the address with dashes.
    pub label: String,
    /// The ports its slice lists.
    pub ports: Vec<NamedPort>,
}

/// What a Service's name stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A cluster IP per family.
    ClusterIp(Vec<IpAddr>),
    /// No cluster IP: the endpoints themselves.
    Headless(Vec<HeadlessEndpoint>),
    /// A CNAME to `spec.externalName`.
    ExternalName(String),
}

/// A Service as DNS sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What its name answers.
    pub kind: Kind,
    /// Its ports (for a ClusterIP Service's SRV records).
    pub ports: Vec<NamedPort>,
}

/// Every Service and slice, with the answers derived from them.
#[derive(Default)]
pub struct Index {
    /// Whether Services and slices have each been listed once (until then: SERVFAIL).
    pub synced: (bool, bool),
    services: HashMap<ServiceKey, Service>,
    slices: HashMap<ServiceKey, EndpointSlice>,
    by_service: HashMap<ServiceKey, BTreeSet<String>>,
    entries: HashMap<ServiceKey, Entry>,
    namespaces: BTreeMap<String, usize>,
    reverse: HashMap<IpAddr, BTreeSet<(String, ServiceKey)>>,
}

fn key(namespace: Option<&String>, name: Option<&String>) -> ServiceKey {
    (
        namespace.cloned().unwrap_or_default(),
        name.cloned().unwrap_or_default(),
    )
}

fn owner(slice: &EndpointSlice) -> Option<ServiceKey> {
    let service = slice
        .metadata
        .labels
        .as_ref()?
        .get("kubernetes.io/service-name")?;
    Some((
        slice.metadata.namespace.clone().unwrap_or_default(),
        service.clone(),
    ))
}

/// A port as DNS names it (its name in lower case); none without a number that fits.
fn named_port(name: Option<&str>, protocol: Option<&str>, port: Option<i32>) -> Option<NamedPort> {
    Some(NamedPort {
        name: name.unwrap_or_default().to_ascii_lowercase(),
        protocol: self::protocol(protocol),
        port: u16::try_from(port?).ok()?,
    })
}

fn protocol(p: Option<&str>) -> String {
    p.unwrap_or("TCP").to_ascii_lowercase()
}

impl Index {
    /// Stores a Service (what DNS reads of it).
    pub fn put_service(&mut self, mut service: Service) {
        service.metadata = ObjectMeta {
            namespace: service.metadata.namespace.take(),
            name: service.metadata.name.take(),
            ..Default::default()
        };
        service.status = None;
        let k = key(
            service.metadata.namespace.as_ref(),
            service.metadata.name.as_ref(),
        );
        if self.services.insert(k.clone(), service).is_none() {
            *self.namespaces.entry(k.0.clone()).or_default() += 1;
        }
        self.rebuild(&k);
    }

    /// Forgets a Service.
    pub fn remove_service(&mut self, service: &Service) {
        let k = key(
            service.metadata.namespace.as_ref(),
            service.metadata.name.as_ref(),
        );
        if self.services.remove(&k).is_some()
            && let Some(count) = self.namespaces.get_mut(&k.0)
        {
            *count -= 1;
            if *count == 0 {
                self.namespaces.remove(&k.0);
            }
        }
        self.rebuild(&k);
    }

    /// Stores a slice (what DNS reads of it).
    pub fn put_slice(&mut self, mut slice: EndpointSlice) {
        let service = owner(&slice);
        slice.metadata = ObjectMeta {
            namespace: slice.metadata.namespace.take(),
            name: slice.metadata.name.take(),
            labels: slice.metadata.labels.take(),
            ..ObjectMeta::default()
        };
        for e in slice.endpoints.iter_mut().flatten() {
            e.target_ref = None;
            e.deprecated_topology = None;
        }
        let k = key(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        );
        let old_owner = self.slices.get(&k).and_then(owner);
        if old_owner.is_some() && old_owner != service {
            // The slice moved to another Service: the old one loses it.
            if let Some(old) = self.slices.get(&k).cloned() {
                self.remove_slice(&old);
            }
        }
        self.slices.insert(k.clone(), slice);
        if let Some(service) = service {
            self.by_service
                .entry(service.clone())
                .or_default()
                .insert(k.1);
            self.rebuild(&service);
        }
    }

    /// Forgets a slice.
    pub fn remove_slice(&mut self, slice: &EndpointSlice) {
        let k = key(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        );
        let Some(old) = self.slices.remove(&k) else {
            return;
        };
        if let Some(service) = owner(&old) {
            if let Some(names) = self.by_service.get_mut(&service) {
                names.remove(&k.1);
                if names.is_empty() {
                    self.by_service.remove(&service);
                }
            }
            self.rebuild(&service);
        }
    }

    /// Replaces every Service (after a relist).
    pub fn replace_services(&mut self, services: Vec<Service>) {
        self.namespaces.clear();
        let gone = std::mem::take(&mut self.services).into_keys();
        self.rebuild_all(gone);
        services.into_iter().for_each(|s| self.put_service(s));
        self.synced.0 = true;
    }

    /// Replaces every slice (after a relist).
    pub fn replace_slices(&mut self, slices: Vec<EndpointSlice>) {
        let emptied = std::mem::take(&mut self.by_service);
        self.slices.clear();
        self.rebuild_all(emptied.into_keys());
        slices.into_iter().for_each(|s| self.put_slice(s));
        self.synced.1 = true;
    }

    fn rebuild_all(&mut self, services: impl IntoIterator<Item = ServiceKey>) {
        for k in services {
            self.rebuild(&k);
        }
    }

    /// A Service's answers.
    pub fn entry(&self, namespace: &str, name: &str) -> Option<&Entry> {
        self.entries.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Whether any Service lives in the namespace.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains_key(namespace)
    }

    /// The names an address maps back to: (the label before the Service's name, or "" for the
    /// Service's own name, Service).
    pub fn reverse(&self, ip: &IpAddr) -> Option<&BTreeSet<(String, ServiceKey)>> {
        self.reverse.get(ip).filter(|names| !names.is_empty())
    }

    fn unindex(&mut self, k: &ServiceKey) {
        let Some(old) = self.entries.remove(k) else {
            return;
        };
        let mut drop = |ip: &IpAddr, label: String| {
            if let Some(names) = self.reverse.get_mut(ip) {
                names.remove(&(label, k.clone()));
                if names.is_empty() {
                    self.reverse.remove(ip);
                }
            }
        };
        match &old.kind {
            Kind::ClusterIp(ips) => ips.iter().for_each(|ip| drop(ip, String::new())),
            Kind::Headless(endpoints) => {
                for e in endpoints {
                    drop(&e.ip, e.label.clone());
                }
            }
            Kind::ExternalName(_) => {}
        }
    }

    /// Derives a Service's answers again from it and its slices.
    fn rebuild(&mut self, k: &ServiceKey) {
        self.unindex(k);
        let Some(entry) = self.derive(k) else { return };
        match &entry.kind {
            Kind::ClusterIp(ips) => {
                for ip in ips {
                    self.reverse
                        .entry(*ip)
                        .or_default()
                        .insert((String::new(), k.clone()));
                }
            }
            Kind::Headless(endpoints) => {
                // The spec gives PTR records to the endpoints that have a hostname.
                for e in endpoints.iter().filter(|e| e.hostname.is_some()) {
                    self.reverse
                        .entry(e.ip)
                        .or_default()
                        .insert((e.label.clone(), k.clone()));
                }
            }
            Kind::ExternalName(_) => {}
        }
        self.entries.insert(k.clone(), entry);
    }

    fn derive(&self, k: &ServiceKey) -> Option<Entry> {
        let service = self.services.get(k)?;
        let spec = service.spec.as_ref()?;
        let ports: Vec<NamedPort> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), Some(p.port)))
            .collect();
        if spec.type_.as_deref() == Some("ExternalName") {
            let target = spec.external_name.clone().unwrap_or_default();
            return Some(Entry {
                kind: Kind::ExternalName(target),
                ports,
            });
        }
        let cluster_ips = capstan_agent::cluster_ips(spec);
        let headless = spec.cluster_ip.as_deref() == Some("None");
        if !headless {
            return Some(Entry {
                kind: Kind::ClusterIp(cluster_ips),
                ports,
            });
        }
        let mut endpoints: Vec<HeadlessEndpoint> = Vec::new();
        let mut by_ip: HashMap<IpAddr, usize> = HashMap::new();
        for slice_name in self.by_service.get(k).into_iter().flatten() {
            let Some(slice) = self.slices.get(&(k.0.clone(), slice_name.clone())) else {
                continue;
            };
            if slice.address_type == "FQDN" {
                continue;
            }
            let slice_ports: Vec<NamedPort> = slice
                .ports
                .iter()
                .flatten()
                .filter_map(|p| named_port(p.name.as_deref(), p.protocol.as_deref(), p.port))
                .collect();
            for e in slice.endpoints.iter().flatten() {
                // As CoreDNS: `ready` nil or true. The EndpointSlice controller already marks
                // every endpoint ready for a Service with `publishNotReadyAddresses`.
                if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                    continue;
                }
                for address in &e.addresses {
                    let Ok(ip) = address.parse::<IpAddr>() else {
                        continue;
                    };
                    if let Some(i) = by_ip.get(&ip) {
                        // The same address in two slices: one endpoint with both port sets.
                        for p in &slice_ports {
                            if !endpoints[*i].ports.contains(p) {
                                endpoints[*i].ports.push(p.clone());
                            }
                        }
                        continue;
                    }
                    by_ip.insert(ip, endpoints.len());
                    let hostname = e.hostname.clone().map(|h| h.to_ascii_lowercase());
                    let label = hostname.clone().unwrap_or_else(|| dashed(&ip));
                    endpoints.push(HeadlessEndpoint {
                        ip,
                        hostname,
                        label,
                        ports: slice_ports.clone(),
                    });
                }
            }
        }
        Some(Entry {
            kind: Kind::Headless(endpoints),
            ports,
        })
    }
}

/// An address as a DNS label: dots (or colons) as dashes, as CoreDNS names endpoints without
/// a hostname.
pub fn dashed(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => {
            let dashed = v6.to_string().replace(':', "-");
            if dashed.ends_with('-') {
                format!("{dashed}0")
            } else {
                dashed
            }
        }
    }
}
