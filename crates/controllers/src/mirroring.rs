//! The EndpointSlice mirroring controller (upstream's
//! `pkg/controller/endpointslicemirroring`): the Endpoints of a Service without a selector —
//! written by hand or by another controller — are mirrored into EndpointSlices, so consumers
//! that read only slices see them too.
//!
//! One slice per distinct port set and address family of the repacked subsets, at most 1,000
//! addresses per subset (ready ones first), each endpoint with its `ready` condition, hostname,
//! node name and target. Labels and annotations follow the Endpoints (less the trigger time
//! and kubectl's last-applied configuration); the slice is owned by the Endpoints.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use capstan_machinery::ApiError;
use capstan_registry::cache::EventType;
use capstan_registry::object::from_typed;
use capstan_registry::{Registry, Subresource, WriteOptions};
use capstan_resources::discovery::endpointslice::{
    MANAGED_BY_LABEL, MIRRORING_CONTROLLER_NAME, SERVICE_NAME_LABEL,
};
use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::endpoints::repack;
use crate::endpointslice::{EndpointKey, endpoint_key, equal_beyond_key};
use crate::runtime::{Backoff, Controller, Informer, Key, OwnWrites, WorkQueue, key_of};

/// The label that keeps an Endpoints from being mirrored.
pub const SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
const LEADER: &str = "control-plane.alpha.kubernetes.io/leader";
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const MANAGER: &str = "kube-controller-manager";
/// `--mirroring-max-endpoints-per-subset`.
const MAX_PER_SUBSET: usize = 1000;
/// `--mirroring-concurrent-service-endpoint-syncs`.
const WORKERS: usize = 5;

type Labels = BTreeMap<String, String>;

/// A slice's identity within its Service: address type and its ports, in a canonical order.
type SliceKey = (String, Vec<(String, i32, String, String)>);

/// Mirrors selector-less Services' Endpoints into EndpointSlices.
pub struct MirroringController {
    services: Arc<Registry>,
    endpoints: Arc<Registry>,
    slices: Arc<Registry>,
    /// The mirrored slices of each Service, by name, from the slice watch.
    index: Mutex<HashMap<Key, BTreeSet<String>>>,
    /// Which Services have a selector, from the Service watch.
    selectors: Mutex<HashMap<Key, bool>>,
    /// Each Service's last slice write, and how far the slice watch has filed them.
    own: OwnWrites<Key>,
}

/// Whether a JSON object has any member, read without keeping any (`null` has none).
#[derive(Default)]
struct NonEmpty(bool);

impl<'de> serde::Deserialize<'de> for NonEmpty {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = NonEmpty;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map or null")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<NonEmpty, A::Error> {
                use serde::de::IgnoredAny;
                let mut any = false;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(NonEmpty(any))
            }
        }
        deserializer.deserialize_any(Members)
    }
}

/// Whether a Service's `spec.selector` (its raw JSON, when it has one) has a member; read
/// without decoding the selector.
fn has_selector(selector: Option<&[u8]>) -> bool {
    selector.is_some_and(|s| serde_json::from_slice::<NonEmpty>(s).is_ok_and(|n| n.0))
}

/// Where [`has_selector`] reads a Service.
const SELECTOR: &[&str] = &["spec", "selector"];

/// `shouldMirror`: not marked to be skipped, and not a leader-election record.
fn should_mirror(endpoints: &Endpoints) -> bool {
    let skip = endpoints
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SKIP_MIRROR))
        .is_some_and(|v| v == "true");
    let leader = endpoints
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(LEADER));
    !skip && !leader
}

fn slice_key(address_type: &str, ports: &[EndpointPort]) -> SliceKey {
    let mut ports: Vec<(String, i32, String, String)> = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or_default(),
                p.protocol.clone().unwrap_or_default(),
                p.app_protocol.clone().unwrap_or_default(),
            )
        })
        .collect();
    ports.sort();
    (address_type.to_string(), ports)
}

/// The slice endpoint of one Endpoints address (`addressToEndpoint`); `None` for an
/// address that is not an IP.
fn endpoint(address: &EndpointAddress, ready: bool) -> Option<(&'static str, Endpoint)> {
    let ip = capstan_machinery::ip::parse_sloppy(&address.ip)?;
    // An IPv4-mapped IPv6 address counts as IPv4, as Go's To4 says.
    let (family, text) = match ip {
        IpAddr::V4(v4) => ("IPv4", v4.to_string()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => ("IPv4", v4.to_string()),
            None => ("IPv6", v6.to_string()),
        },
    };
    Some((
        family,
        Endpoint {
            addresses: vec![text],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                ..EndpointConditions::default()
            }),
            hostname: address.hostname.clone().filter(|h| !h.is_empty()),
            node_name: address.node_name.clone(),
            target_ref: address.target_ref.clone(),
            ..Endpoint::default()
        },
    ))
}

/// What the Endpoints should be mirrored as: endpoints and ports per slice key.
fn desired(endpoints: &Endpoints) -> BTreeMap<SliceKey, (Vec<EndpointPort>, Vec<Endpoint>)> {
    let mut out = BTreeMap::new();
    for (ready, not_ready, ports) in repack(endpoints.subsets.as_deref().unwrap_or_default()) {
        let mut ports: Vec<EndpointPort> = ports
            .iter()
            .map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        // In a slice's own order (`NewPortMapKey` sorts them), not the Endpoints'.
        ports.sort_by_cached_key(crate::gohash::slice_port_order);
        // Both families are wanted for every subset: an empty one clears what it had.
        for family in ["IPv4", "IPv6"] {
            out.entry(slice_key(family, &ports))
                .or_insert_with(|| (ports.clone(), Vec::new()));
        }
        let addresses = ready
            .iter()
            .map(|a| (a, true))
            .chain(not_ready.iter().map(|a| (a, false)));
        let mut added = 0;
        for (address, is_ready) in addresses {
            if added >= MAX_PER_SUBSET {
                break;
            }
            let Some((family, endpoint)) = endpoint(address, is_ready) else {
                continue;
            };
            added += 1;
            if let Some((_, list)) = out.get_mut(&slice_key(family, &ports)) {
                list.push(endpoint);
            }
        }
    }
    // Upstream keeps each slice's endpoints in a set keyed as a slice endpoint's identity
    // (addresses, hostname, target namespace and name): of two with one identity the later
    // wins. Here it takes the earlier one's place, so the order stays the subsets'.
    for (_, list) in out.values_mut() {
        let mut at: HashMap<EndpointKey, usize> = HashMap::new();
        let mut unique: Vec<Endpoint> = Vec::with_capacity(list.len());
        for endpoint in list.drain(..) {
            match at.entry(endpoint_key(&endpoint)) {
                std::collections::hash_map::Entry::Occupied(i) => unique[*i.get()] = endpoint,
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(unique.len());
                    unique.push(endpoint);
                }
            }
        }
        *list = unique;
    }
    out
}

/// The labels and annotations a mirrored slice carries.
fn slice_meta(endpoints: &Endpoints, name: &str) -> (Labels, Labels) {
    let mut labels = endpoints.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.into(), name.to_string());
    labels.insert(MANAGED_BY_LABEL.into(), MIRRORING_CONTROLLER_NAME.into());
    let mut annotations = endpoints.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(TRIGGER_TIME);
    annotations.remove(LAST_APPLIED);
    (labels, annotations)
}

/// Whether a slice's endpoints are already the desired ones (upstream's `totalChanges` finds
/// nothing added, updated or removed): each is found by its identity and compared on what
/// the identity leaves out ([`equal_beyond_key`]); fields neither reads, such as hints
/// someone added, are left alone.
fn same_endpoints(existing: &[Endpoint], desired: &[Endpoint]) -> bool {
    let wanted: HashMap<EndpointKey, &Endpoint> =
        desired.iter().map(|e| (endpoint_key(e), e)).collect();
    existing.len() == wanted.len()
        && existing.iter().all(|endpoint| {
            wanted
                .get(&endpoint_key(endpoint))
                .is_some_and(|want| equal_beyond_key(want, endpoint))
        })
}

fn options() -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_manager: MANAGER.into(),
        applied: false,
    }
}

impl MirroringController {
    /// A controller over these registries.
    pub fn new(services: Arc<Registry>, endpoints: Arc<Registry>, slices: Arc<Registry>) -> Self {
        MirroringController {
            services,
            endpoints,
            slices,
            index: Mutex::new(HashMap::new()),
            selectors: Mutex::new(HashMap::new()),
            own: Default::default(),
        }
    }

    fn index(&self) -> MutexGuard<'_, HashMap<Key, BTreeSet<String>>> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn selectors(&self) -> MutexGuard<'_, HashMap<Key, bool>> {
        self.selectors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs for the life of the process.
    pub fn start(self) {
        let (services_synced, endpoints_synced, slices_synced);
        let controller = Arc::new(self);
        let queue = Arc::new(WorkQueue::<Key>::with_backoff(Backoff::MIRRORING));
        {
            // Services: a sync when one without a selector comes or goes, or its selector
            // comes or goes.
            let (c, q) = (controller.clone(), queue.clone());
            services_synced = Informer::new(controller.services.clone())
                .on_change(move |kind, object, _| {
                    let key = key_of(&object.selectable);
                    let selector =
                        kind != EventType::Deleted && has_selector(object.member(SELECTOR));
                    let before = if kind == EventType::Deleted {
                        c.selectors().remove(&key)
                    } else {
                        c.selectors().insert(key.clone(), selector)
                    };
                    if before != Some(selector) || !selector {
                        q.add(key);
                    }
                })
                .start();
        }
        {
            // Endpoints: every change of one that is (or was) mirrored.
            let q = queue.clone();
            endpoints_synced = Informer::new(controller.endpoints.clone())
                .on_change(move |_, object, _| q.add(key_of(&object.selectable)))
                .start();
        }
        {
            // Mirrored slices: kept in the index; a change by anyone else is undone.
            let (c, q) = (controller.clone(), queue.clone());
            let indexed = Informer::new(controller.slices.clone())
                .on_change(move |kind, object, _| {
                    let s = &object.selectable;
                    let managed = s.label(MANAGED_BY_LABEL) == Some(MIRRORING_CONTROLLER_NAME);
                    let service = s.label(SERVICE_NAME_LABEL).map(str::to_string);
                    let namespace = object.selectable.namespace().to_string();
                    let name = object.selectable.name().to_string();
                    let mut index = c.index();
                    // Forget the slice wherever it was, then file it under its Service.
                    let mut emptied = Vec::new();
                    for (key, names) in index.iter_mut() {
                        if key.0 == namespace && names.remove(&name) {
                            q.add(key.clone());
                            if names.is_empty() {
                                emptied.push(key.clone());
                            }
                        }
                    }
                    for key in emptied {
                        index.remove(&key);
                    }
                    if let (true, Some(service), false) =
                        (managed, service, kind == EventType::Deleted)
                    {
                        let key = (namespace, service);
                        index.entry(key.clone()).or_default().insert(name);
                        q.add(key);
                    }
                })
                .start();
            controller.own.follow(indexed.clone());
            slices_synced = indexed;
        }
        // Workers start once every index holds what exists (upstream's cache sync).
        Controller::new("endpointslice mirroring", queue)
            .workers(WORKERS)
            .after([services_synced, endpoints_synced, slices_synced])
            .run(move |key: Key| {
                let controller = controller.clone();
                async move { controller.sync(&key).await }
            });
    }

    /// The mirrored slices of a Service, as the slice watch last showed them.
    fn existing(&self, key: &Key) -> Vec<EndpointSlice> {
        let names = self.index().get(key).cloned().unwrap_or_default();
        crate::endpointslice::cached_slices(&self.slices, &key.0, &names)
    }

    /// The Endpoints to mirror for a Service, if it should be mirrored.
    fn source(&self, key: &Key) -> Option<Endpoints> {
        let (namespace, name) = key;
        // A Service the Service watch last saw with a selector is not mirrored (were its
        // selector gone since, that event syncs it again); else the cache tells.
        if self.selectors().get(key) == Some(&true) {
            return None;
        }
        let service = self
            .services
            .cache()
            .get(&self.services.strategy().info().key(namespace, name))?;
        if has_selector(service.member(SELECTOR)) {
            return None;
        }
        let cached = self
            .endpoints
            .cache()
            .get(&self.endpoints.strategy().info().key(namespace, name))?;
        let endpoints: Endpoints = serde_json::from_slice(&cached.lean_json()).ok()?;
        should_mirror(&endpoints).then_some(endpoints)
    }

    async fn sync(&self, key: &Key) -> Result<(), ApiError> {
        self.own.ensure_caught_up(key).await?;
        let existing = self.existing(key);
        let Some(endpoints) = self.source(key) else {
            if existing.is_empty() {
                // Nothing mirrored, and the index shows this controller's last write: no
                // later sync needs to wait for anything.
                self.own.forget(key);
            }
            for slice in &existing {
                self.delete(key, slice).await?;
            }
            return Ok(());
        };
        let (labels, annotations) = slice_meta(&endpoints, &key.1);
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Endpoints".into(),
            name: key.1.clone(),
            uid: endpoints.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let mut by_key: BTreeMap<SliceKey, Vec<EndpointSlice>> = BTreeMap::new();
        for slice in existing {
            let k = slice_key(
                &slice.address_type,
                slice.ports.as_deref().unwrap_or_default(),
            );
            by_key.entry(k).or_default().push(slice);
        }
        let mut creates: Vec<EndpointSlice> = Vec::new();
        let mut updates: Vec<EndpointSlice> = Vec::new();
        let mut deletes: Vec<EndpointSlice> = Vec::new();
        let build =
            |k: &SliceKey, ports: &[EndpointPort], list: &[Endpoint], name: Option<&str>| {
                EndpointSlice {
                    metadata: ObjectMeta {
                        name: name.map(str::to_string),
                        generate_name: name.is_none().then(|| format!("{}-", key.1)),
                        namespace: Some(key.0.clone()),
                        labels: Some(labels.clone()),
                        annotations: (!annotations.is_empty()).then(|| annotations.clone()),
                        owner_references: Some(vec![owner.clone()]),
                        ..ObjectMeta::default()
                    },
                    address_type: k.0.clone(),
                    endpoints: Some(list.to_vec()),
                    ports: Some(ports.to_vec()),
                }
            };
        for (k, (ports, list)) in desired(&endpoints) {
            let mut current = by_key.remove(&k).unwrap_or_default();
            if list.is_empty() {
                deletes.append(&mut current);
                continue;
            }
            if current.is_empty() {
                creates.push(build(&k, &ports, &list, None));
                continue;
            }
            let first = current.remove(0);
            deletes.append(&mut current);
            let mut slice_labels = first.metadata.labels.clone().unwrap_or_default();
            let ours = slice_labels.remove(MANAGED_BY_LABEL).is_some()
                && slice_labels.remove(SERVICE_NAME_LABEL).is_some();
            let endpoints_labels = endpoints.metadata.labels.clone().unwrap_or_default();
            let unchanged = ours
                && same_endpoints(first.endpoints.as_deref().unwrap_or_default(), &list)
                && slice_labels == endpoints_labels
                && first.metadata.annotations.clone().unwrap_or_default() == annotations
                && !first
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.kind == "Endpoints" && r.name == key.1 && r.uid != owner.uid);
            if !unchanged {
                updates.push(build(&k, &ports, &list, first.metadata.name.as_deref()));
            }
        }
        deletes.extend(by_key.into_values().flatten());
        // A slice about to be deleted is reused for a create of its address type.
        let mut kept_creates = Vec::new();
        for mut create in creates {
            match deletes
                .iter()
                .position(|d| d.address_type == create.address_type)
            {
                Some(i) => {
                    let reused = deletes.remove(i);
                    create.metadata.name = reused.metadata.name;
                    create.metadata.generate_name = None;
                    updates.push(create);
                }
                None => kept_creates.push(create),
            }
        }
        if endpoints.metadata.deletion_timestamp.is_none() {
            for slice in kept_creates {
                match self
                    .slices
                    .create(&key.0, from_typed(&slice), &options())
                    .await
                {
                    Ok(created) => self.own.record(key, &created),
                    // A namespace being deleted takes no new objects: the sync ends there,
                    // as upstream's (nothing updated or deleted either, nothing retried).
                    Err(e) if e.is_namespace_terminating() => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        // Upstream replaces the whole slice (an update without a resourceVersion): what else
        // the stored metadata held (generateName, finalizers) is not kept.
        for slice in updates {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let (updated, _) = self
                .slices
                .update_typed(&key.0, &name, &slice, &options(), Subresource::Main)
                .await?;
            self.own.record(key, &updated);
        }
        for slice in &deletes {
            self.delete(key, slice).await?;
        }
        Ok(())
    }

    async fn delete(&self, key: &Key, slice: &EndpointSlice) -> Result<(), ApiError> {
        crate::endpointslice::delete_slice(&self.slices, &self.own, key, slice).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_selector_counts_when_it_selects_something() {
        let of = |json: &[u8]| has_selector(capstan_registry::cache::member(json, SELECTOR));
        let with = |spec: serde_json::Value| of(json!({"spec": spec}).to_string().as_bytes());
        assert!(with(
            json!({"ports": [{"port": 80}], "selector": {"app": "web"}})
        ));
        assert!(!with(json!({"selector": {}})));
        assert!(!with(json!({"selector": null})));
        assert!(!with(json!({"ports": [{"port": 80}]})));
        assert!(!with(json!({"selector": "app=web"})));
        assert!(!of(b"{}"));
        assert!(!of(b"{\"spec\": null}"));
        assert!(!of(b"not json"));
        assert!(of(b"{\"status\": {}, \"spec\": {\"a\": [1, {\"selector\": {}}], \"selector\": {\"x\": \"y\"}}}"));
    }

    #[test]
    fn subsets_become_one_slice_per_family_and_port_set() {
        let e: Endpoints = crate::decoded(json!({"metadata": {"name": "ext"}, "subsets": [
            {"addresses": [{"ip": "192.0.2.10"}, {"ip": "2001:db8::1"}],
             "notReadyAddresses": [{"ip": "192.0.2.11"}], "ports": [{"port": 5432, "protocol": "TCP"}]}]}));
        let wanted = desired(&e);
        let v4 = &wanted[&slice_key(
            "IPv4",
            &[EndpointPort {
                name: Some(String::new()),
                port: Some(5432),
                protocol: Some("TCP".into()),
                app_protocol: None,
            }],
        )];
        let conditions: Vec<Option<bool>> =
            v4.1.iter()
                .map(|e| e.conditions.as_ref().and_then(|c| c.ready))
                .collect();
        assert_eq!(conditions, [Some(true), Some(false)]);
        assert_eq!(v4.0[0].name.as_deref(), Some(""));
        let v6: Vec<&Vec<Endpoint>> = wanted
            .iter()
            .filter(|(k, _)| k.0 == "IPv6")
            .map(|(_, (_, l))| l)
            .collect();
        assert_eq!(v6.len(), 1);
        assert_eq!(v6[0][0].addresses, ["2001:db8::1"]);
    }

    /// An endpoint's addresses and hostname.
    type Named = (String, Option<String>);

    /// The endpoints wanted for each address type, with their hostnames.
    fn wanted(endpoints: serde_json::Value) -> Vec<(String, Vec<Named>)> {
        desired(&crate::decoded(endpoints))
            .into_iter()
            .filter(|(_, (_, list))| !list.is_empty())
            .map(|(k, (_, list))| {
                let list = list
                    .into_iter()
                    .map(|e| (e.addresses.join(","), e.hostname));
                (k.0, list.collect())
            })
            .collect()
    }

    #[test]
    fn one_endpoint_per_identity_as_upstream_sets_them() {
        // Two spellings of one IPv6 address are one endpoint; of two with one identity, the
        // later wins (here: not ready).
        let e: Endpoints = crate::decoded(json!({"metadata": {"name": "ext"}, "subsets": [
            {"addresses": [{"ip": "2001:DB8::1"}],
             "notReadyAddresses": [{"ip": "2001:db8::1"}], "ports": [{"port": 80}]}]}));
        let six: Vec<Endpoint> = desired(&e).into_values().flat_map(|(_, l)| l).collect();
        assert_eq!(six.len(), 1);
        assert_eq!(six[0].addresses, ["2001:db8::1"]);
        assert_eq!(
            six[0].conditions.as_ref().and_then(|c| c.ready),
            Some(false)
        );
        // One address listed under two ports: as it first appears (RepackSubsets).
        let both = wanted(json!({"metadata": {"name": "ext"}, "subsets": [
            {"addresses": [{"ip": "10.0.0.1", "hostname": "h1"}], "ports": [{"port": 443}]},
            {"addresses": [{"ip": "10.0.0.1", "hostname": "h2"}], "ports": [{"port": 80}]}]}));
        assert_eq!(
            both,
            [(
                "IPv4".to_string(),
                vec![("10.0.0.1".to_string(), Some("h1".to_string()))]
            )]
        );
    }

    #[test]
    fn endpoints_are_compared_by_identity_and_what_it_leaves_out() {
        let endpoint = |ready: bool, zone: Option<&str>| -> Endpoint {
            crate::decoded(
                json!({"addresses": ["10.0.0.1"], "conditions": {"ready": ready},
                "hints": zone.map(|z| json!({"forZones": [{"name": z}]}))}),
            )
        };
        // Hints someone added are not the mirror's business.
        assert!(same_endpoints(
            &[endpoint(true, Some("a"))],
            &[endpoint(true, None)]
        ));
        assert!(!same_endpoints(
            &[endpoint(false, None)],
            &[endpoint(true, None)]
        ));
        assert!(!same_endpoints(&[], &[endpoint(true, None)]));
    }

    #[test]
    fn skip_mirror_and_leader_records_are_not_mirrored() {
        assert!(!should_mirror(&crate::decoded(
            json!({"metadata": {"labels": {SKIP_MIRROR: "true"}}})
        )));
        assert!(should_mirror(&crate::decoded(
            json!({"metadata": {"labels": {SKIP_MIRROR: "yes"}}})
        )));
        assert!(!should_mirror(&crate::decoded(
            json!({"metadata": {"annotations": {LEADER: "x"}}})
        )));
    }
}
