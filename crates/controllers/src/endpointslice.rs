//! The EndpointSlice controller's reconciler (upstream's `staging/src/k8s.io/endpointslice`):
//! from a Service, the pods it selects and the slices it has, the slices to create, update and
//! delete. The endpoints controller runs it in the same sync as the Service's Endpoints (one
//! pod index serves both), and writes the plan.
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

use capstan_registry::typed::from_json_without_managed_fields;
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
            crate::endpoints::target_port(p, pod).map(|number| EndpointPort {
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
                .then(|| crate::endpoints::canonical(&ip, &entry.ip))
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
                    .map(|p| crate::endpoints::target_port(p, pod)),
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
mod tests {
    use super::*;
    use serde_json::json;

    fn service() -> Service {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns", "uid": "svc-1",
            "labels": {"app": "web"}},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"],
                     "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}}))
        .expect("service")
    }

    fn pod(i: usize, ready: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": format!("p{i:03}"), "namespace": "ns", "uid": format!("u{i}")},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"phase": "Running", "podIP": format!("10.0.{}.{}", i / 250, i % 250 + 1),
                    "podIPs": [{"ip": format!("10.0.{}.{}", i / 250, i % 250 + 1)}],
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
            .expect("pod"),
        )
    }

    fn zones() -> HashMap<String, Option<String>> {
        [("n1".to_string(), Some("zone-a".to_string()))]
            .into_iter()
            .collect()
    }

    /// How many creates, updates and deletes a plan has.
    fn counts(plan: &Plan) -> (usize, usize, usize) {
        (plan.creates.len(), plan.updates.len(), plan.deletes.len())
    }

    fn inputs_of<'a>(
        service: &'a Service,
        pods: &'a [Arc<Pod>],
        zones: &'a HashMap<String, Option<String>>,
    ) -> Inputs<'a> {
        Inputs {
            service,
            pods,
            zones,
            nodeless: zones.is_empty(),
            max: 100,
        }
    }

    /// The plan applied as the server would (names given to creates).
    fn apply(existing: &mut Vec<EndpointSlice>, plan: Plan) {
        for delete in &plan.deletes {
            existing.retain(|s| s.metadata.name != delete.metadata.name);
        }
        for update in plan.updates {
            existing.retain(|s| s.metadata.name != update.metadata.name);
            existing.push(update);
        }
        for (i, mut create) in plan.creates.into_iter().enumerate() {
            create.metadata.name = Some(format!("web-{}-{i}", existing.len()));
            create.metadata.uid = None;
            existing.push(create);
        }
    }

    fn port_names(slice: &EndpointSlice) -> Vec<&str> {
        let ports = slice.ports.iter().flatten();
        ports.filter_map(|p| p.name.as_deref()).collect()
    }

    #[test]
    fn a_slices_ports_are_in_upstreams_hash_order() {
        // Go's `portsInOrder` for these (FNV-128a of their spew dumps): b, then a.
        let mut service = service();
        service.spec.as_mut().expect("spec").ports = Some(
            serde_json::from_value(json!([
                {"name": "a", "port": 80, "targetPort": 80, "protocol": "TCP"},
                {"name": "b", "port": 81, "targetPort": 81, "protocol": "TCP"}]))
            .expect("ports"),
        );
        let pods = [pod(0, true)];
        let zones = zones();
        let plan = reconcile(&inputs_of(&service, &pods, &zones), Vec::new());
        assert_eq!(port_names(&plan.creates[0]), ["b", "a"]);
        // A slice stored with its ports in another order (by an older Capstan) is written
        // again in this order when it is updated, as upstream's NewPortMapKey sorts it.
        let mut existing = Vec::new();
        apply(&mut existing, plan);
        if let Some(ports) = existing[0].ports.as_mut() {
            ports.reverse();
        }
        existing[0].metadata.resource_version = Some("5".into());
        let pods = [pod(0, true), pod(1, true)];
        let plan = reconcile(&inputs_of(&service, &pods, &zones), existing);
        assert_eq!(counts(&plan), (0, 1, 0));
        assert_eq!(port_names(&plan.updates[0]), ["b", "a"]);
        // Reordered, it is no longer the slice as read: nothing is kept for the write.
        assert!(plan.read.is_empty());
        assert_eq!(plan.updates[0].metadata.resource_version, None);
    }

    #[test]
    fn an_updated_slice_is_kept_as_read_for_the_write() {
        let service = service();
        let zones = zones();
        let pods: Vec<Arc<Pod>> = (0..3).map(|i| pod(i, true)).collect();
        let mut existing = Vec::new();
        apply(
            &mut existing,
            reconcile(&inputs_of(&service, &pods, &zones), Vec::new()),
        );
        existing[0].metadata.resource_version = Some("5".into());
        let as_read = existing[0].clone();
        let flipped: Vec<Arc<Pod>> = (0..3).map(|i| pod(i, i != 1)).collect();
        let plan = reconcile(&inputs_of(&service, &flipped, &zones), existing);
        assert_eq!(counts(&plan), (0, 1, 0));
        assert_eq!(plan.read, [as_read]);
        assert_eq!(
            plan.updates[0].metadata.resource_version.as_deref(),
            Some("5")
        );
        assert_ne!(plan.updates[0].endpoints, plan.read[0].endpoints);
    }

    #[test]
    fn pods_are_packed_a_hundred_a_slice_with_conditions_and_zones() {
        let service = service();
        let pods: Vec<Arc<Pod>> = (0..150).map(|i| pod(i, i != 2)).collect();
        let zones = zones();
        let inputs = inputs_of(&service, &pods, &zones);
        let plan = reconcile(&inputs, Vec::new());
        assert_eq!(plan.creates.len(), 2);
        assert_eq!(len(&plan.creates[0]) + len(&plan.creates[1]), 150);
        let first = &plan.creates[0];
        assert_eq!(
            first.ports.as_deref().unwrap_or_default()[0].port,
            Some(8080)
        );
        let endpoint = &first.endpoints.as_deref().unwrap_or_default()[2];
        assert_eq!(
            endpoint.conditions.as_ref().and_then(|c| c.ready),
            Some(false)
        );
        assert_eq!(endpoint.zone.as_deref(), Some("zone-a"));
        let labels = first.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(SERVICE_NAME_LABEL).map(String::as_str),
            Some("web")
        );
        assert_eq!(labels.get("app").map(String::as_str), Some("web"));
    }

    #[test]
    fn a_readiness_flip_updates_one_slice_in_place_and_a_second_sync_writes_nothing() {
        let service = service();
        let zones = zones();
        let mut pods: Vec<Arc<Pod>> = (0..150).map(|i| pod(i, true)).collect();
        let mut slices = Vec::new();
        let inputs = inputs_of(&service, &pods, &zones);
        apply(&mut slices, reconcile(&inputs, Vec::new()));
        pods[120] = pod(120, false);
        let inputs = inputs_of(&service, &pods, &zones);
        let plan = reconcile(&inputs, slices.clone());
        assert_eq!(counts(&plan), (0, 1, 0));
        apply(&mut slices, plan);
        let again = reconcile(&inputs, slices.clone());
        assert_eq!(counts(&again), (0, 0, 0));
    }

    /// The hints of each endpoint, in order (`None`: no hints; zones and nodes by name).
    fn hints(slices: &[EndpointSlice]) -> Vec<Option<(Vec<String>, Vec<String>)>> {
        let mut all: Vec<&k8s_openapi::api::discovery::v1::Endpoint> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .collect();
        all.sort_by_key(|e| e.addresses.clone());
        all.iter()
            .map(|e| {
                e.hints.as_ref().map(|h| {
                    let zones = h.for_zones.iter().flatten().map(|z| z.name.clone());
                    let nodes = h.for_nodes.iter().flatten().map(|n| n.name.clone());
                    (zones.collect(), nodes.collect())
                })
            })
            .collect()
    }

    #[test]
    fn traffic_distribution_hints_ready_endpoints_close_and_nothing_else_keeps_hints() {
        let mut service = service();
        let zones = zones();
        let pods = vec![pod(1, true), pod(2, false)];
        let set = |service: &mut Service, distribution: Option<&str>| {
            service.spec.as_mut().expect("spec").traffic_distribution =
                distribution.map(str::to_string);
        };
        let both = Some((vec!["zone-a".to_string()], vec!["n1".to_string()]));
        let zone = Some((vec!["zone-a".to_string()], vec![]));

        // PreferSameNode: the ready endpoint to its zone and node, the other unhinted.
        set(&mut service, Some("PreferSameNode"));
        let mut slices = Vec::new();
        let plan = reconcile(&inputs_of(&service, &pods, &zones), Vec::new());
        assert_eq!(hints(&plan.creates), [both, None]);
        apply(&mut slices, plan);
        let steady = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
        assert_eq!(counts(&steady), (0, 0, 0));

        // PreferClose: a slice nothing else changes is updated for its hints alone.
        set(&mut service, Some("PreferClose"));
        let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
        assert_eq!(counts(&plan), (0, 1, 0));
        assert_eq!(hints(&plan.updates), [zone.clone(), None]);
        apply(&mut slices, plan);
        let steady = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
        assert_eq!(counts(&steady), (0, 0, 0));

        // The topology-mode annotation overrides it; without Capstan's nodes' CPU, no hints.
        service.metadata.annotations =
            Some([(TOPOLOGY_MODE_ANNOTATION.to_string(), "Auto".to_string())].into());
        let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
        assert_eq!(counts(&plan), (0, 1, 0));
        assert_eq!(hints(&plan.updates), [None, None]);
        service.metadata.annotations = None;

        // No trafficDistribution: every hint goes, and then nothing is written.
        set(&mut service, None);
        let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
        assert_eq!(counts(&plan), (0, 1, 0));
        assert_eq!(hints(&plan.updates), [None, None]);
        apply(&mut slices, plan);
        let steady = reconcile(&inputs_of(&service, &pods, &zones), slices);
        assert_eq!(counts(&steady), (0, 0, 0));
    }

    const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";

    #[test]
    fn no_pods_leave_one_placeholder_that_is_kept() {
        let service = service();
        let zones = zones();
        let inputs = inputs_of(&service, &[], &zones);
        let mut slices = Vec::new();
        let plan = reconcile(&inputs, Vec::new());
        assert_eq!(plan.creates.len(), 1);
        assert!(
            plan.creates[0]
                .ports
                .as_deref()
                .unwrap_or_default()
                .is_empty()
        );
        apply(&mut slices, plan);
        let again = reconcile(&inputs, slices.clone());
        assert_eq!(counts(&again), (0, 0, 0));
        // An orphaned placeholder (another owner, or none) that otherwise fits is kept too:
        // upstream's comparison reads only the namespace and labels of its metadata.
        slices[0].metadata.owner_references = None;
        let orphaned = reconcile(&inputs, slices);
        assert_eq!(counts(&orphaned), (0, 0, 0));
    }

    #[test]
    fn a_service_pending_deletion_leaves_the_slices_it_no_longer_owns() {
        let mut service = service();
        let zones = zones();
        let pods = vec![pod(1, true)];
        let mut slices = Vec::new();
        apply(
            &mut slices,
            reconcile(&inputs_of(&service, &pods, &zones), Vec::new()),
        );
        // The garbage collector orphans the slice (`kubectl delete --cascade=orphan`).
        slices[0].metadata.owner_references = None;
        // A Service not being deleted replaces a slice it does not own.
        let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
        assert_eq!(counts(&plan), (1, 0, 1));
        // One being deleted leaves it, and creates nothing in its place (at the write).
        service.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-11-26T00:00:00Z")).expect("a time"));
        let plan = reconcile(&inputs_of(&service, &pods, &zones), slices);
        assert!(plan.deletes.is_empty());
    }

    #[test]
    fn a_pod_on_an_unknown_node_is_left_out_and_reported() {
        let service = service();
        let pods = vec![pod(1, true)];
        let zones = HashMap::from_iter([("n2".to_owned(), None)]);
        let inputs = inputs_of(&service, &pods, &zones);
        let plan = reconcile(&inputs, Vec::new());
        assert_eq!(plan.missing_nodes, ["n1"]);
        // Only the placeholder.
        assert_eq!(plan.creates.len(), 1);
        assert_eq!(len(&plan.creates[0]), 0);
        // With no Node at all, the pod is published (without a zone).
        let none = HashMap::new();
        let plan = reconcile(&inputs_of(&service, &pods, &none), Vec::new());
        assert!(plan.missing_nodes.is_empty());
        assert_eq!(len(&plan.creates[0]), 1);
    }
}

/// The EndpointSlice side of the endpoints controller's sync: what it knows of nodes and of
/// its own slices, and the writes.
pub(crate) struct SliceWriter {
    slices: Arc<capstan_registry::Registry>,
    nodes: Arc<capstan_registry::Registry>,
    max: usize,
    state: std::sync::Mutex<SliceState>,
    /// The controller's queue (set when it starts).
    queue: std::sync::OnceLock<Arc<crate::runtime::WorkQueue<crate::runtime::Key>>>,
    /// Each Service's last slice write, and how far the slice watch has filed them.
    own: crate::runtime::OwnWrites<crate::runtime::Key>,
}

#[derive(Default)]
struct SliceState {
    /// Node name → zone label, from the node watch; shared with the syncs that read it (a
    /// sync takes the map, not a copy of every Node's entry; a node change copies it only
    /// while a sync still holds the old one).
    zones: Arc<HashMap<String, Option<String>>>,
    /// Whether the node watch has replayed what exists.
    nodes_replayed: bool,
    /// This controller's slices of each Service, by name, from the slice watch.
    index: HashMap<crate::runtime::Key, std::collections::BTreeSet<String>>,
    /// The other way: each indexed slice (namespace, name) → its Service.
    service_of: HashMap<crate::runtime::Key, crate::runtime::Key>,
    /// UID → the generation this controller last wrote (-1: it deleted it), so its own
    /// writes coming back through the watch do not sync the Service again.
    tracked: HashMap<String, i64>,
    /// UID → the highest generation its watch showed while this controller's update of it was
    /// in flight (`None`: none yet): whether that event was this write's own is decided when
    /// the write returns with its generation.
    in_flight: HashMap<String, Option<i64>>,
    /// The slices this controller last wrote, by (namespace, name), typed as the stored JSON
    /// decodes (without managedFields, each with the `resourceVersion` its write returned):
    /// a sync that finds a slice still at that revision in the watch cache takes it from here
    /// instead of decoding its JSON again (a sixth of this controller's time in a churn), as
    /// upstream's controller reads its slices from its informer's typed cache. A sync takes
    /// them out; a slice's other events drop a stale one.
    kept: HashMap<crate::runtime::Key, EndpointSlice>,
}

/// A slice's identity as its watch event's metadata tells it.
#[derive(serde::Deserialize, Default)]
struct SliceMetaFields {
    uid: Option<String>,
    generation: Option<i64>,
}

impl SliceWriter {
    pub(crate) fn new(
        slices: Arc<capstan_registry::Registry>,
        nodes: Arc<capstan_registry::Registry>,
        max: usize,
    ) -> Self {
        SliceWriter {
            slices,
            nodes,
            max: max.clamp(1, 1000),
            state: std::sync::Mutex::new(SliceState::default()),
            queue: std::sync::OnceLock::new(),
            own: Default::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SliceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows nodes (zones) and slices (the index; a Service is synced again when someone
    /// else changed or deleted one of its slices).
    pub(crate) fn start(
        self: &Arc<Self>,
        queue: Arc<crate::runtime::WorkQueue<crate::runtime::Key>>,
    ) -> [crate::runtime::Progress; 2] {
        use capstan_registry::cache::EventType;
        let _ = self.queue.set(queue.clone());
        let writer = self.clone();
        let nodes = crate::runtime::Informer::new(self.nodes.clone())
            .on_change(move |kind, object, _| {
                let name = object.selectable.name().to_string();
                let mut state = writer.state();
                if kind == EventType::Deleted {
                    if state.zones.contains_key(&name) {
                        Arc::make_mut(&mut state.zones).remove(&name);
                    }
                } else {
                    let zone = object
                        .selectable
                        .label(capstan_resources::core::node::ZONE_LABEL)
                        // An empty zone label is no zone (upstream's podToEndpoint).
                        .filter(|zone| !zone.is_empty())
                        .map(str::to_string);
                    // A node's status heartbeats leave its zone as it was: nothing to change.
                    if state.zones.get(&name) != Some(&zone) {
                        Arc::make_mut(&mut state.zones).insert(name, zone);
                    }
                }
            })
            .on_replayed({
                let writer = self.clone();
                move |_| writer.state().nodes_replayed = true
            })
            .start();
        let writer = self.clone();
        let indexed = crate::runtime::Informer::new(self.slices.clone())
            .on_change(move |kind, object, _| {
                let s = &object.selectable;
                let (namespace, name) = (s.namespace().to_string(), s.name().to_string());
                let ours = s.label(MANAGED_BY_LABEL) == Some(CONTROLLER_NAME);
                let service = s.label(SERVICE_NAME_LABEL).map(str::to_string);
                let meta = object
                    .decode_metadata::<SliceMetaFields>()
                    .unwrap_or_default();
                let uid = meta.uid.unwrap_or_default();
                let mut state = writer.state();
                let mut wake = Vec::new();
                let slice_key = (namespace.clone(), name.clone());
                // Changed since this controller wrote it (or gone): what it kept is stale.
                if kind == EventType::Deleted
                    || state.kept.get(&slice_key).is_some_and(|kept| {
                        kept.metadata.resource_version.as_deref()
                            != Some(object.revision.to_string().as_str())
                    })
                {
                    state.kept.remove(&slice_key);
                }
                if let Some(key) = state.service_of.remove(&slice_key) {
                    if let Some(names) = state.index.get_mut(&key) {
                        names.remove(&name);
                        if names.is_empty() {
                            state.index.remove(&key);
                        }
                    }
                    wake.push(key);
                }
                let tracked = state.tracked.get(&uid).copied();
                if kind == EventType::Deleted {
                    state.tracked.remove(&uid);
                    // A slice this controller wrote, deleted by someone else: the Service gets
                    // its endpoints back. As upstream's tracker, one it never wrote (since it
                    // started) or deleted itself wakes nothing.
                    if tracked.is_none_or(|generation| generation == -1) {
                        wake.clear();
                    }
                } else if let (true, Some(service)) = (ours, service) {
                    let key = (namespace, service);
                    state.index.entry(key.clone()).or_default().insert(name);
                    state.service_of.insert(slice_key, key.clone());
                    let generation = meta.generation.unwrap_or(0);
                    let own_write = tracked.is_some_and(|g| g >= generation);
                    if let Some(seen) = state.in_flight.get_mut(&uid) {
                        // Decided when the write in flight returns.
                        *seen = Some(seen.map_or(generation, |s| s.max(generation)));
                        wake.retain(|k| *k != key);
                    } else if own_write {
                        wake.retain(|k| *k != key);
                    } else {
                        wake.push(key);
                    }
                } else {
                    // No longer ours: forget it, and let its Service make up for it.
                    state.tracked.remove(&uid);
                }
                drop(state);
                for key in wake {
                    queue.add(key);
                }
            })
            .start();
        self.own.follow(indexed.clone());
        [nodes, indexed]
    }

    /// This controller's slices of a Service, as the slice index shows them, less those
    /// pending deletion (upstream's `dropEndpointSlicesPendingDeletion`).
    ///
    /// Each is the slice this controller kept when it wrote it, when the watch cache still
    /// holds it at that revision; otherwise it is decoded from the cache.
    fn existing(&self, key: &crate::runtime::Key) -> Vec<EndpointSlice> {
        let names = self.state().index.get(key).cloned().unwrap_or_default();
        let info = self.slices.strategy().info();
        let mut slices = Vec::with_capacity(names.len());
        for name in names {
            let Some(cached) = self.slices.cache().get(&info.key(&key.0, &name)) else {
                continue;
            };
            let revision = cached.revision.to_string();
            let kept = self.state().kept.remove(&(key.0.clone(), name));
            let slice = match kept {
                Some(kept) if kept.metadata.resource_version.as_deref() == Some(&revision) => {
                    debug_assert_eq!(
                        Some(&kept),
                        decode_cached(&cached, true).as_ref(),
                        "a kept slice is the stored one"
                    );
                    kept
                }
                _ => match decode_cached(&cached, true) {
                    Some(slice) => slice,
                    None => continue,
                },
            };
            if slice.metadata.deletion_timestamp.is_none() {
                slices.push(slice);
            }
        }
        slices
    }

    /// Keeps `slice` as just written ([`SliceState::kept`]): with the metadata of the object
    /// the write returned (the stored one's) and the defaults the write's rules gave it, it is
    /// what the stored JSON decodes to.
    fn keep(&self, namespace: &str, mut slice: EndpointSlice, mut written: serde_json::Value) {
        use capstan_registry::Strategy;
        let metadata = capstan_machinery::meta::metadata_mut(&mut written);
        metadata.shift_remove("managedFields");
        let Ok(metadata) = serde_json::from_value::<ObjectMeta>(serde_json::Value::Object(
            std::mem::take(metadata),
        )) else {
            return;
        };
        let Some(name) = metadata.name.clone() else {
            return;
        };
        if metadata.resource_version.is_none() {
            return;
        }
        slice.metadata = metadata;
        capstan_resources::discovery::endpointslice::EndpointSliceStrategy.default(&mut slice);
        // The stored JSON leaves empty lists out: they decode as absent.
        fn none_if_empty<T>(list: &mut Option<Vec<T>>) {
            if list.as_ref().is_some_and(Vec::is_empty) {
                *list = None;
            }
        }
        none_if_empty(&mut slice.ports);
        for endpoint in slice.endpoints.iter_mut().flatten() {
            if let Some(hints) = endpoint.hints.as_mut() {
                none_if_empty(&mut hints.for_zones);
                none_if_empty(&mut hints.for_nodes);
            }
        }
        none_if_empty(&mut slice.endpoints);
        let key = (namespace.to_string(), name);
        let mut state = self.state();
        // Only a slice the index holds: one deleted before this write returned (its events
        // already seen) would never be dropped.
        if state.service_of.contains_key(&key) {
            state.kept.insert(key, slice);
        }
    }

    /// Reconciles and writes a Service's slices; the trigger time (`trigger`, taken only once
    /// the slice index shows this controller's last write, as upstream's `StaleSlices` check
    /// comes first: a refused sync leaves the pods' change times to its retry) goes on every
    /// slice written.
    pub(crate) async fn sync(
        &self,
        key: &crate::runtime::Key,
        service: &Service,
        pods: &[Arc<Pod>],
        trigger: impl FnOnce() -> String,
    ) -> Result<(), capstan_machinery::ApiError> {
        use capstan_machinery::ApiError;
        self.own.ensure_caught_up(key).await?;
        let trigger = trigger();
        let trigger = trigger.as_str();
        let existing = self.existing(key);
        let (zones, replayed) = {
            let state = self.state();
            (state.zones.clone(), state.nodes_replayed)
        };
        let inputs = Inputs {
            service,
            pods,
            zones: &zones,
            nodeless: replayed && zones.is_empty(),
            max: self.max,
        };
        let plan = reconcile(&inputs, existing);
        let annotate = |slice: &mut EndpointSlice| {
            let annotations = slice
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            if trigger.is_empty() {
                annotations.remove(TRIGGER_TIME);
            } else {
                annotations.insert(TRIGGER_TIME.into(), trigger.to_string());
            }
            if annotations.is_empty() {
                slice.metadata.annotations = None;
            }
        };
        // As upstream's Reconcile: each address type the Service has is written on its own
        // (a failed write ends that type's writes, not the other's), then the slices of types
        // it no longer has are deleted; the first error is the sync's.
        let Plan {
            mut creates,
            mut updates,
            mut deletes,
            missing_nodes,
            address_types,
            mut read,
        } = plan;
        let mut failed: Option<ApiError> = None;
        for address_type in address_types {
            let of_type = |slices: &mut Vec<EndpointSlice>| -> Vec<EndpointSlice> {
                let (mine, rest) = std::mem::take(slices)
                    .into_iter()
                    .partition(|s| s.address_type == address_type);
                *slices = rest;
                mine
            };
            let written = (
                of_type(&mut creates),
                of_type(&mut updates),
                of_type(&mut deletes),
            );
            if let Err(error) = self
                .finalize(key, service, written, &mut read, &annotate)
                .await
            {
                failed.get_or_insert(error);
            }
        }
        for slice in &deletes {
            if let Err(error) = self.delete(key, slice).await {
                failed.get_or_insert(error);
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        if missing_nodes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::internal(format!(
                "skipping pods for Service {}/{}: nodes {} not found",
                key.0,
                key.1,
                missing_nodes.join(", ")
            )))
        }
    }

    /// Upstream's `finalize` for one address type: creates (none while the Service is being
    /// deleted; a namespace being deleted ends the writes quietly), then updates, then
    /// deletes, stopping at the first error.
    async fn finalize(
        &self,
        key: &crate::runtime::Key,
        service: &Service,
        (creates, updates, deletes): (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<EndpointSlice>),
        read: &mut Vec<EndpointSlice>,
        annotate: &impl Fn(&mut EndpointSlice),
    ) -> Result<(), capstan_machinery::ApiError> {
        let options = capstan_registry::WriteOptions {
            dry_run: false,
            field_manager: "kube-controller-manager".into(),
            applied: false,
        };
        let namespace = &key.0;
        if service.metadata.deletion_timestamp.is_none() {
            for mut slice in creates {
                annotate(&mut slice);
                match self.slices.create_typed(namespace, &slice, &options).await {
                    Ok(created) => {
                        self.record(key, &created);
                        self.keep(namespace, slice, created);
                    }
                    Err(e) if e.is_namespace_terminating() => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        for mut slice in updates {
            annotate(&mut slice);
            let name = slice.metadata.name.clone().unwrap_or_default();
            // The write's watch event can come back before this call returns: events of the
            // slice meanwhile are judged against the generation the write returns.
            let uid = slice.metadata.uid.clone().unwrap_or_default();
            if !uid.is_empty() {
                self.state().in_flight.insert(uid.clone(), None);
            }
            // The update goes unconditionally (as before); the version it was made from finds
            // the slice as read, which the write's rules take when it is still the stored one.
            let at = slice.metadata.resource_version.take();
            let stored = read
                .iter()
                .position(|r| {
                    r.metadata.name == slice.metadata.name && r.metadata.resource_version == at
                })
                .filter(|_| at.is_some())
                .map(|i| read.swap_remove(i));
            let written = self
                .slices
                .update_typed_over(
                    namespace,
                    &name,
                    (&slice, stored),
                    &options,
                    capstan_registry::Subresource::Main,
                )
                .await;
            let seen = self.state().in_flight.remove(&uid).flatten();
            // A failed write is retried whatever its watch showed.
            let (updated, _) = written?;
            if seen.is_some_and(|g| g > generation_of(&updated))
                && let Some(queue) = self.queue.get()
            {
                // Someone else changed the slice right after this write.
                queue.add(key.clone());
            }
            self.record(key, &updated);
            self.keep(namespace, slice, updated);
        }
        for slice in deletes {
            self.delete(key, &slice).await?;
        }
        Ok(())
    }

    /// Deletes one of a Service's slices, expecting its deletion event.
    async fn delete(
        &self,
        key: &crate::runtime::Key,
        slice: &EndpointSlice,
    ) -> Result<(), capstan_machinery::ApiError> {
        let uid = slice.metadata.uid.clone().unwrap_or_default();
        self.state().tracked.insert(uid, -1);
        delete_slice(&self.slices, &self.own, key, slice).await
    }

    /// Remembers a slice this controller wrote.
    fn record(&self, key: &crate::runtime::Key, object: &serde_json::Value) {
        let uid = capstan_machinery::meta::meta_str(object, "uid").to_string();
        self.state().tracked.insert(uid, generation_of(object));
        self.own.record(key, object);
    }

    /// Forgets a Service that is gone.
    pub(crate) fn forget(&self, key: &crate::runtime::Key) {
        self.own.forget(key);
    }
}

/// The named slices of a namespace, as the watch cache holds them now, without their
/// managedFields (the registry's: a write keeps the stored ones) and `resourceVersion`.
pub(crate) fn cached_slices(
    slices: &capstan_registry::Registry,
    namespace: &str,
    names: &std::collections::BTreeSet<String>,
) -> Vec<EndpointSlice> {
    let info = slices.strategy().info();
    names
        .iter()
        .filter_map(|name| slices.cache().get(&info.key(namespace, name)))
        .filter_map(|cached| decode_cached(&cached, false))
        .collect()
}

/// A slice as the watch cache holds it, without its managedFields; `versioned`: with the
/// `resourceVersion` it was read at.
fn decode_cached(
    cached: &capstan_registry::cache::CachedObject,
    versioned: bool,
) -> Option<EndpointSlice> {
    let mut slice: EndpointSlice = from_json_without_managed_fields(&cached.lean_json()).ok()?;
    if versioned {
        slice.metadata.resource_version = Some(cached.revision.to_string());
    }
    Some(slice)
}

/// Deletes a slice of `key` (one already gone is no error), remembering the write so the
/// next sync of `key` waits for the index to show it.
pub(crate) async fn delete_slice(
    slices: &capstan_registry::Registry,
    own: &crate::runtime::OwnWrites<crate::runtime::Key>,
    key: &crate::runtime::Key,
    slice: &EndpointSlice,
) -> Result<(), capstan_machinery::ApiError> {
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    let options = capstan_registry::DeleteOptions::default();
    match slices.delete(&key.0, name, &options).await {
        Ok(deleted) => {
            own.record(key, &deleted.object);
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// A written object's `metadata.generation` (0 for none).
fn generation_of(object: &serde_json::Value) -> i64 {
    capstan_machinery::meta::metadata(object)
        .and_then(|m| m.get("generation"))
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0)
}

/// The annotation every written slice carries: when the change it shows began.
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
