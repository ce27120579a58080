//! The EndpointSlice controller's reconciler (upstream's `staging/src/k8s.io/endpointslice`):
//! from a Service, the pods it selects and the slices it has, the slices to create, update and
//! delete. The controller ([`super::EndpointSliceController`]) writes the plan.
//!
//! - One group of slices per address type (`spec.ipFamilies`) and per set of ports the pods
//!   resolve the Service's ports to; at most `--max-endpoints-per-slice` endpoints a slice.
//! - Minimal churn: endpoints stay in the slice that has them; new ones first fill slices
//!   that are written anyway (fullest first), then an unchanged slice they all fit in (best
//!   fit), then new slices; a slice goes only when it is empty.
//! - A placeholder slice (no ports, no endpoints) when an address type has nothing else.
//! - A create paired with a delete of the same address type becomes an update of that slice.

use std::collections::BTreeMap;

use capstan_machinery::hash::{HashMap, HashMapExt};
use std::sync::Arc;

use capstan_resources::discovery::endpointslice::{
    CONTROLLER_NAME, MANAGED_BY_LABEL, SERVICE_NAME_LABEL,
};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The Service label that marks it headless.
const HEADLESS: &str = "service.kubernetes.io/headless";

type Labels = BTreeMap<String, String>;
/// A set of ports as a key: sorted (name, port, protocol, appProtocol), unset apart from empty.
type PortKey = Vec<(Option<String>, Option<i32>, Option<String>, Option<String>)>;
/// An endpoint's identity: its sorted addresses, hostname and target's namespace and name, as
/// [`write_key`] writes them.
pub(crate) type EndpointKey = String;

/// What a sync decided to write.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub creates: Vec<EndpointSlice>,
    pub updates: Vec<EndpointSlice>,
    pub deletes: Vec<EndpointSlice>,
    /// Pods left out because their node is not known (the sync is retried).
    pub missing_nodes: Vec<String>,
    /// The Service's address types, each written on its own; slices of any other type are
    /// among the deletes.
    pub address_types: Vec<&'static str>,
    /// Of the updates, the slices as read (at the `resourceVersion` each holds), kept for the
    /// write: when still stored, its rules take them instead of decoding the stored JSON.
    pub read: Vec<EndpointSlice>,
}

/// What the reconciler reads.
pub(crate) struct Inputs<'a> {
    pub service: &'a Service,
    pub pods: &'a [Arc<Pod>],
    /// Node name → its zone label (`None`: a node without one); a node not here is unknown.
    pub zones: &'a HashMap<String, Option<String>>,
    /// The node watch has replayed and found no Node at all.
    pub nodeless: bool,
    pub max: usize,
}

fn port_key(ports: &[EndpointPort]) -> PortKey {
    let mut key: PortKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.port,
                p.protocol.clone(),
                p.app_protocol.clone(),
            )
        })
        .collect();
    key.sort();
    key
}

pub(crate) fn endpoint_key(endpoint: &Endpoint) -> EndpointKey {
    let mut key = String::new();
    write_key(endpoint, &mut key);
    key
}

/// `EndpointsEqualBeyondHash`: node, zone, conditions and target (less its resourceVersion).
pub(crate) fn equal_beyond_key(a: &Endpoint, b: &Endpoint) -> bool {
    let same_target = match (&a.target_ref, &b.target_ref) {
        (Some(a), Some(b)) => {
            a.kind == b.kind
                && a.namespace == b.namespace
                && a.name == b.name
                && a.uid == b.uid
                && a.api_version == b.api_version
                && a.field_path == b.field_path
        }
        (a, b) => a.is_none() && b.is_none(),
    };
    let none = EndpointConditions::default();
    a.node_name == b.node_name
        && a.zone == b.zone
        && a.conditions.as_ref().unwrap_or(&none) == b.conditions.as_ref().unwrap_or(&none)
        && same_target
}

/// The address types a Service's slices are of: its IP families (and both for a headless
/// Service without any).
fn address_types(spec: &ServiceSpec) -> Vec<&'static str> {
    let mut types = Vec::new();
    for family in spec.ip_families.iter().flatten() {
        match family.as_str() {
            "IPv4" if !types.contains(&"IPv4") => types.push("IPv4"),
            "IPv6" if !types.contains(&"IPv6") => types.push("IPv6"),
            _ => {}
        }
    }
    if !types.is_empty() {
        return types;
    }
    match spec.cluster_ip.as_deref().unwrap_or_default() {
        "" | "None" => vec!["IPv4", "IPv6"],
        ip if ip.contains(':') => vec!["IPv6"],
        _ => vec!["IPv4"],
    }
}

/// `ShouldPodBeInEndpoints` with terminating pods included.
fn included(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
        return false;
    }
    status.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty())
        || status.pod_ips.as_ref().is_some_and(|ips| !ips.is_empty())
}

/// `getEndpointPorts`: the Service's ports as this pod serves them (ports it cannot resolve
/// left out), in upstream's order (by hash, [`crate::gohash::slice_port_order`]).
fn endpoint_ports(spec: &ServiceSpec, pod: &Pod) -> Vec<EndpointPort> {
    let ports = spec.ports.as_deref().unwrap_or_default();
    let mut out: Vec<EndpointPort> = ports
        .iter()
        .filter_map(|p| {
            crate::service_pods::target_port(p, pod).map(|number| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(number),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: p.app_protocol.clone(),
            })
        })
        .collect();
    out.sort_by_cached_key(crate::gohash::slice_port_order);
    out
}

/// `podToEndpoint`: the pod's address of one family, its conditions and where it runs.
fn pod_endpoint(
    service: &Service,
    pod: &Pod,
    zone: Option<String>,
    address_type: &str,
) -> Endpoint {
    let serving = capstan_resources::core::pod::is_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let publish = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        == Some(true);
    let addresses = pod
        .status
        .iter()
        .flat_map(|s| s.pod_ips.iter().flatten())
        .filter_map(|entry| {
            let ip = capstan_machinery::ip::parse_sloppy(&entry.ip)?;
            (ip.is_ipv6() == (address_type == "IPv6"))
                .then(|| crate::service_pods::canonical(&ip, &entry.ip))
        })
        .collect();
    let pod_spec = pod.spec.as_ref();
    let hostname = pod_spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .filter(|_| {
            pod_spec.and_then(|s| s.subdomain.as_deref()) == service.metadata.name.as_deref()
                && pod.metadata.namespace == service.metadata.namespace
        });
    Endpoint {
        addresses,
        conditions: Some(EndpointConditions {
            ready: Some(publish || (serving && !terminating)),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname,
        node_name: pod_spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        zone,
        ..Endpoint::default()
    }
}

/// `setEndpointSliceLabels`: the Service's labels (less the reserved ones), the headless mark
/// and the slice's own two; and whether the slice's other labels differ from the Service's.
fn slice_labels(slice: Option<&EndpointSlice>, service: &Service) -> (Labels, bool) {
    let reserved = |k: &String| k == SERVICE_NAME_LABEL || k == MANAGED_BY_LABEL || k == HEADLESS;
    let others = |labels: Option<&Labels>| -> Labels {
        labels
            .into_iter()
            .flatten()
            .filter(|(k, _)| !reserved(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let service_labels = others(service.metadata.labels.as_ref());
    let changed = slice.is_some_and(|s| others(s.metadata.labels.as_ref()) != service_labels);
    let mut out = service_labels;
    let cluster_ip = service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or_default();
    if cluster_ip.is_empty() || cluster_ip == "None" {
        out.insert(HEADLESS.into(), String::new());
    }
    out.insert(
        SERVICE_NAME_LABEL.into(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    out.insert(MANAGED_BY_LABEL.into(), CONTROLLER_NAME.into());
    (out, changed)
}

/// The Service as a slice's owner.
pub(crate) fn owner_reference(service: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: service.metadata.name.clone().unwrap_or_default(),
        uid: service.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid && r.kind == "Service" && r.api_version == "v1")
}

/// `newEndpointSlice`: a slice to create (named by the server from `<service>-`).
fn new_slice(service: &Service, address_type: &str, ports: Vec<EndpointPort>) -> EndpointSlice {
    let name = service.metadata.name.clone().unwrap_or_default();
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: service.metadata.namespace.clone(),
            labels: Some(slice_labels(None, service).0),
            owner_references: Some(vec![owner_reference(service)]),
            ..ObjectMeta::default()
        },
        address_type: address_type.to_string(),
        endpoints: Some(Vec::new()),
        ports: Some(ports),
    }
}

fn len(slice: &EndpointSlice) -> usize {
    slice.endpoints.as_ref().map_or(0, Vec::len)
}

/// An endpoint's identity ([`EndpointKey`]) written into `out` (a buffer reused for lookups):
/// the number of addresses, then each part preceded by its length, so that no two identities
/// write the same text.
fn write_key(endpoint: &Endpoint, out: &mut String) {
    use std::fmt::Write;
    out.clear();
    let _ = write!(out, "{}:", endpoint.addresses.len());
    let mut part = |text: &str| {
        let _ = write!(out, "{}:", text.len());
        out.push_str(text);
    };
    if endpoint.addresses.is_sorted() {
        endpoint.addresses.iter().for_each(|a| part(a));
    } else {
        let mut sorted: Vec<&String> = endpoint.addresses.iter().collect();
        sorted.sort();
        sorted.into_iter().for_each(|a| part(a));
    }
    part(endpoint.hostname.as_deref().unwrap_or_default());
    let target = endpoint.target_ref.as_ref();
    part(
        target
            .and_then(|t| t.namespace.as_deref())
            .unwrap_or_default(),
    );
    part(target.and_then(|t| t.name.as_deref()).unwrap_or_default());
}

/// Desired endpoints in the order they were found, by identity.
#[derive(Default)]
struct Desired {
    /// In the order found; `None` once placed.
    found: Vec<Option<Endpoint>>,
    /// The next of `found` not yet looked at by [`Desired::pop`].
    next: usize,
    /// Identity ([`write_key`]) → its place in `found`, while not yet placed.
    index: HashMap<String, usize>,
    /// A buffer for the identities looked up.
    key: String,
}

impl Desired {
    fn with_capacity(n: usize) -> Self {
        Desired {
            found: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
            ..Desired::default()
        }
    }

    /// Adds an endpoint; one of an identity already found replaces it, in its place.
    fn insert(&mut self, endpoint: Endpoint) {
        write_key(&endpoint, &mut self.key);
        match self.index.get(self.key.as_str()) {
            Some(&at) => self.found[at] = Some(endpoint),
            None => {
                self.index.insert(self.key.clone(), self.found.len());
                self.found.push(Some(endpoint));
            }
        }
    }

    /// Takes the desired endpoint of `existing`'s identity, if any.
    fn take(&mut self, existing: &Endpoint) -> Option<Endpoint> {
        write_key(existing, &mut self.key);
        let at = self.index.remove(self.key.as_str())?;
        self.found.get_mut(at)?.take()
    }

    fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    /// Moves endpoints into `slice` until it holds `max`.
    fn fill(&mut self, slice: &mut EndpointSlice, max: usize) {
        let list = slice.endpoints.get_or_insert_with(Vec::new);
        while list.len() < max
            && let Some(endpoint) = self.pop()
        {
            list.push(endpoint);
        }
    }

    /// The next desired endpoint not yet placed, in the order found.
    fn pop(&mut self) -> Option<Endpoint> {
        while let Some(slot) = self.found.get_mut(self.next) {
            self.next += 1;
            if let Some(endpoint) = slot.take() {
                write_key(&endpoint, &mut self.key);
                self.index.remove(self.key.as_str());
                return Some(endpoint);
            }
        }
        None
    }
}

/// Plans the slices of one Service.
pub(crate) fn reconcile(inputs: &Inputs<'_>, existing: Vec<EndpointSlice>) -> Plan {
    let spec = inputs.service.spec.clone().unwrap_or_default();
    let types = address_types(&spec);
    let mut plan = Plan {
        address_types: types.clone(),
        ..Plan::default()
    };
    let mut by_type: HashMap<String, Vec<EndpointSlice>> = HashMap::new();
    let mut unsupported = Vec::new();
    // While the Service is pending deletion its slices are the garbage collector's: one it no
    // longer owns is being orphaned (`--cascade=orphan`), not left over, and deleting it would
    // race the collector (upstream's reason for creating nothing then, applied to the deletes
    // the race would otherwise make).
    let deleting = inputs.service.metadata.deletion_timestamp.is_some();
    let judged = existing
        .into_iter()
        .filter(|slice| !deleting || owned_by(slice, inputs.service));
    for slice in judged {
        if types.contains(&slice.address_type.as_str()) {
            by_type
                .entry(slice.address_type.clone())
                .or_default()
                .push(slice);
        } else {
            unsupported.push(slice);
        }
    }
    for address_type in &types {
        let slices = by_type.remove(*address_type).unwrap_or_default();
        reconcile_type(inputs, &spec, address_type, slices, &mut plan);
    }
    plan.deletes.extend(unsupported);
    plan.missing_nodes.sort();
    plan.missing_nodes.dedup();
    plan
}

fn reconcile_type(
    inputs: &Inputs<'_>,
    spec: &ServiceSpec,
    address_type: &str,
    existing: Vec<EndpointSlice>,
    plan: &mut Plan,
) {
    let service = inputs.service;
    let publish = spec.publish_not_ready_addresses == Some(true);
    let headless_without_ports = spec.ports.as_deref().unwrap_or_default().is_empty()
        && spec.cluster_ip.as_deref() == Some("None");
    let existing_count = existing.len();
    let (mut creates, mut updates, mut deletes) = (Vec::new(), Vec::new(), Vec::new());
    let mut existing_by_ports: BTreeMap<PortKey, Vec<EndpointSlice>> = BTreeMap::new();
    for mut slice in existing {
        if owned_by(&slice, service) {
            // Upstream's NewPortMapKey sorts the slice's own ports as it keys them: a slice
            // written again goes out with its ports in that order. (One whose ports this
            // reorders is no longer the slice as read.)
            if let Some(ports) = slice.ports.as_mut()
                && !ports.is_sorted_by_key(crate::gohash::slice_port_order)
            {
                ports.sort_by_cached_key(crate::gohash::slice_port_order);
                slice.metadata.resource_version = None;
            }
            existing_by_ports
                .entry(port_key(slice.ports.as_deref().unwrap_or_default()))
                .or_default()
                .push(slice);
        } else {
            deletes.push(slice);
        }
    }
    let mut desired: BTreeMap<PortKey, (Vec<EndpointPort>, Desired)> = BTreeMap::new();
    // A pod's ports follow from the numbers its Service's ports resolve to: each resolution
    // seen so far and the port set it gives, so that the ports are built once per set.
    let service_ports = spec.ports.as_deref().unwrap_or_default();
    let mut resolutions: Vec<(Vec<Option<i32>>, PortKey)> = Vec::new();
    let mut resolution: Vec<Option<i32>> = Vec::with_capacity(service_ports.len());
    for pod in inputs.pods {
        if !included(pod) {
            continue;
        }
        resolution.clear();
        if !headless_without_ports {
            resolution.extend(
                service_ports
                    .iter()
                    .map(|p| crate::service_pods::target_port(p, pod)),
            );
        }
        let key = match resolutions.iter().find(|(r, _)| *r == resolution) {
            Some((_, key)) => key,
            None => {
                let ports = if headless_without_ports {
                    Vec::new()
                } else {
                    endpoint_ports(spec, pod)
                };
                let key = port_key(&ports);
                let pods = inputs.pods.len();
                desired
                    .entry(key.clone())
                    .or_insert_with(|| (ports, Desired::with_capacity(pods)));
                resolutions.push((resolution.clone(), key));
                &resolutions[resolutions.len() - 1].1
            }
        };
        let Some(entry) = desired.get_mut(key) else {
            continue;
        };
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        let zone = match inputs.zones.get(node) {
            Some(zone) => zone.clone(),
            // Upstream leaves out a pod whose Node is missing, as a kubelet that went away.
            // A Capstan without any Node (service discovery with no nodes modelled) keeps
            // its pods: there, no Node is the rule, not a fault.
            None if publish || inputs.nodeless => None,
            None => {
                plan.missing_nodes.push(node.to_string());
                continue;
            }
        };
        let endpoint = pod_endpoint(service, pod, zone, address_type);
        if !endpoint.addresses.is_empty() {
            entry.1.insert(endpoint);
        }
    }
    let mut unchanged = Vec::new();
    for (key, (ports, wanted)) in desired {
        let current = existing_by_ports.remove(&key).unwrap_or_default();
        let planned = by_port_mapping(inputs, address_type, ports, current, wanted);
        creates.extend(planned.creates);
        updates.extend(planned.updates);
        deletes.extend(planned.deletes);
        unchanged.extend(planned.unchanged);
        plan.read.extend(planned.read);
    }
    deletes.extend(existing_by_ports.into_values().flatten());
    // The placeholder: when everything of this type would go and nothing come.
    if existing_count == deletes.len() && creates.is_empty() {
        let placeholder = new_slice(service, address_type, Vec::new());
        let keep = deletes.len() == 1 && placeholder_equal(&deletes[0], &placeholder);
        if keep {
            deletes.clear();
        } else {
            creates.push(placeholder);
        }
    }
    crate::trafficdist::Hints::of(service).reconcile(&mut creates, &mut updates, unchanged);
    // A create paired with a delete of this type becomes an update of the deleted slice.
    let mut i = 0;
    while i < deletes.len() && !creates.is_empty() {
        if owned_by(&deletes[i], service) {
            let old = deletes.remove(i);
            let mut new = creates.pop().unwrap_or_else(|| old.clone());
            new.metadata.name = old.metadata.name.clone();
            new.metadata.generate_name = old.metadata.generate_name.clone();
            new.metadata.resource_version = None;
            updates.push(new);
        } else {
            i += 1;
        }
    }
    plan.creates.extend(creates);
    plan.updates.extend(updates);
    plan.deletes.extend(deletes);
}

/// Upstream's `placeholderSliceCompare`: of the metadata only the namespace and labels count
/// (not the owner references: an orphaned placeholder that fits is kept, not replaced).
fn placeholder_equal(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.metadata.namespace == b.metadata.namespace
        && a.metadata.labels.clone().unwrap_or_default()
            == b.metadata.labels.clone().unwrap_or_default()
        && a.address_type == b.address_type
        && a.ports.as_deref().unwrap_or_default().is_empty()
        && a.endpoints.as_deref().unwrap_or_default().is_empty()
}

/// `reconcileByPortMapping`: the slices of one port set, changed as little as possible.
fn by_port_mapping(
    inputs: &Inputs<'_>,
    address_type: &str,
    ports: Vec<EndpointPort>,
    existing: Vec<EndpointSlice>,
    mut wanted: Desired,
) -> Planned {
    let service = inputs.service;
    let max = inputs.max.max(1);
    let mut slices: Vec<EndpointSlice> = Vec::new();
    // Per slice: 0 unchanged, 1 to update, 2 to delete.
    let mut state: Vec<u8> = Vec::new();
    let mut read = Vec::new();
    for slice in existing {
        let mut kept = Vec::new();
        let mut updated = false;
        for endpoint in slice.endpoints.iter().flatten() {
            if let Some(desired) = wanted.take(endpoint) {
                updated |= !equal_beyond_key(&desired, endpoint);
                kept.push(desired);
            }
        }
        let (labels, labels_changed) = slice_labels(Some(&slice), service);
        let decision = if updated || kept.len() != len(&slice) {
            if kept.is_empty() { 2 } else { 1 }
        } else if labels_changed {
            1
        } else {
            0
        };
        let mut next = slice;
        if decision == 1 {
            let endpoints = next.endpoints.replace(kept);
            if next.metadata.resource_version.is_some() {
                // The slice as read, for the write (its endpoints are not copied: moved).
                read.push(EndpointSlice {
                    metadata: next.metadata.clone(),
                    address_type: next.address_type.clone(),
                    endpoints,
                    ports: next.ports.clone(),
                });
            }
            next.metadata.labels = Some(labels);
        }
        slices.push(next);
        state.push(decision);
    }
    // New endpoints fill the slices written anyway, fullest first.
    if !wanted.is_empty() {
        let mut order: Vec<usize> = (0..slices.len()).filter(|i| state[*i] == 1).collect();
        order.sort_by_key(|i| std::cmp::Reverse(len(&slices[*i])));
        for i in order {
            wanted.fill(&mut slices[i], max);
        }
    }
    let mut creates = Vec::new();
    while !wanted.is_empty() {
        // An unchanged slice all the rest fit in, the fullest such (best fit).
        let fill = if wanted.len() < max {
            (0..slices.len())
                .filter(|i| state[*i] == 0 && len(&slices[*i]) + wanted.len() <= max)
                .min_by_key(|i| max - (len(&slices[*i]) + wanted.len()))
        } else {
            None
        };
        match fill {
            Some(i) => {
                wanted.fill(&mut slices[i], max);
                slices[i].metadata.labels = Some(slice_labels(Some(&slices[i]), service).0);
                state[i] = 1;
            }
            None => {
                let mut slice = new_slice(service, address_type, ports.clone());
                wanted.fill(&mut slice, max);
                creates.push(slice);
            }
        }
    }
    let mut planned = Planned {
        creates,
        read,
        ..Planned::default()
    };
    for (slice, decision) in slices.into_iter().zip(state) {
        match decision {
            1 => planned.updates.push(slice),
            2 => planned.deletes.push(slice),
            _ => planned.unchanged.push(slice),
        }
    }
    planned
}

/// What [`by_port_mapping`] decided for the slices of one port set.
#[derive(Default)]
struct Planned {
    creates: Vec<EndpointSlice>,
    updates: Vec<EndpointSlice>,
    deletes: Vec<EndpointSlice>,
    /// Existing slices it leaves as they are (their hints are judged after).
    unchanged: Vec<EndpointSlice>,
    /// See [`Plan::read`].
    read: Vec<EndpointSlice>,
}

#[cfg(test)]
mod tests;
