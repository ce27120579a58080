//! The endpoints controller, on typed Services, Pods and Endpoints:
//! the registry's JSON is decoded at the edge (the watch events, the reads and the write).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use capstan_machinery::hash::{HashMap, HashMapExt, HashSet};

use capstan_machinery::ApiError;
use capstan_registry::cache::EventType;
use k8s_openapi::api::core::v1::{
    Container, EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod,
    PodCondition, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::runtime::{Informer, Key, WorkQueue, key_of, synced};
use capstan_registry::{DeleteOptions, Registry, Subresource, WriteOptions};

const MAX_ADDRESSES: usize = 1000;
const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
const MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
const HEADLESS: &str = "service.kubernetes.io/headless";
const MANAGER: &str = "kube-controller-manager";
const LEADER: &str = "control-plane.alpha.kubernetes.io/leader";

const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Labels (and selectors): `map[string]string`.
type Labels = BTreeMap<String, String>;

/// Keeps Endpoints in step with Services and Pods.
pub struct EndpointsController {
    services: Arc<Registry>,
    pods: Arc<Registry>,
    endpoints: Arc<Registry>,
    triggers: std::sync::Mutex<HashMap<Key, TriggerState>>,
    index: std::sync::Mutex<Index>,
    /// The EndpointSlice controller's part of each sync (when slices are served).
    slices: Option<Arc<crate::endpointslice::SliceWriter>>,
    /// Its trigger times, tracked apart (each controller's first sync counts from creation).
    slice_triggers: std::sync::Mutex<HashMap<Key, TriggerState>>,
    /// Concurrent syncs: of Endpoints, and of EndpointSlices.
    workers: (usize, usize),
    /// Services as [`EndpointsController::service`] decoded them, by key with the revision
    /// they were read at: both controllers sync a changed Service, and a pod's change syncs
    /// its Services again, from the same revision.
    read: capstan_registry::cache::ByRevision<Arc<Service>>,
}

/// At most this many decoded Services are kept: the two controllers' syncs of a change come
/// within milliseconds of each other, and a few hundred decoded Services are well under a
/// megabyte.
const KEPT_SERVICES: usize = 256;

/// How many Services are synced at once.
const WORKERS: usize = 5;

/// What the watches have shown of selectors and pods, so that a pod change finds the Services
/// that select (or selected) it without testing every selector of the namespace, and a sync
/// reads only the pods its selector matches, already decoded.
#[derive(Default)]
struct Index {
    /// Per namespace: every Service with a selector, the anchor lookup and pod memberships.
    namespaces: HashMap<String, Namespace>,
}

#[derive(Default)]
struct Namespace {
    /// Selector Services by name.
    services: HashMap<String, Selected>,
    /// Services by one pair of their selector (its first): a pod can only be selected by the
    /// Services anchored at one of its own labels, so a pod change tests only those.
    anchors: HashMap<(String, String), BTreeSet<String>>,
    /// Pods by name: what the controllers read of each ([`pod_view_of_json`]) and the
    /// Services that select it.
    pods: HashMap<String, (Arc<Pod>, Vec<String>)>,
}

/// A Service's selector (its `key=value` pairs) and the pods it selects, by name: the same
/// views as [`Namespace::pods`], so that a sync reads its pods without a lookup each.
struct Selected {
    selector: Vec<(String, String)>,
    members: BTreeMap<String, Arc<Pod>>,
}

fn selects(selector: &[(String, String)], labels: Option<&Labels>) -> bool {
    labels.is_some_and(|labels| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl Namespace {
    fn forget_service(&mut self, service: &str) {
        let Some(old) = self.services.remove(service) else {
            return;
        };
        if let Some(anchor) = old.selector.first()
            && let Some(services) = self.anchors.get_mut(anchor)
        {
            services.remove(service);
            if services.is_empty() {
                self.anchors.remove(anchor);
            }
        }
        for pod in old.members.keys() {
            if let Some((_, services)) = self.pods.get_mut(pod) {
                services.retain(|s| s != service);
            }
        }
    }
}

impl Index {
    /// A Service's selector was set, changed or removed (`None`, or an empty map).
    fn set_selector(&mut self, key: &Key, selector: Option<&Labels>) {
        let (namespace, service) = key;
        let ns = self.namespaces.entry(namespace.clone()).or_default();
        ns.forget_service(service);
        let selector: Vec<(String, String)> = selector
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let Some(anchor) = selector.first().cloned() else {
            return;
        };
        let mut members = BTreeMap::new();
        for (name, (pod, services)) in ns.pods.iter_mut() {
            if selects(&selector, labels_of(pod)) {
                members.insert(name.clone(), pod.clone());
                services.push(service.clone());
            }
        }
        ns.anchors
            .entry(anchor)
            .or_default()
            .insert(service.clone());
        ns.services
            .insert(service.clone(), Selected { selector, members });
    }

    /// A pod was written (`Some` view) or deleted (`None`); returns the Services to sync:
    /// those that select it now or selected it before. A write that leaves the pod's view as
    /// it was (a status change beyond IPs and readiness, say) wakes nothing, as upstream's
    /// `podEndpointsChanged`: no sync could give another result.
    fn pod_changed(&mut self, namespace: &str, name: &str, pod: Option<Arc<Pod>>) -> Vec<Key> {
        let ns = self.namespaces.entry(namespace.to_string()).or_default();
        if let (Some(new), Some((old, _))) = (pod.as_deref(), ns.pods.get(name))
            && new == old.as_ref()
        {
            return Vec::new();
        }
        let before = ns.pods.remove(name).map(|(_, s)| s).unwrap_or_default();
        let mut now: Vec<String> = Vec::new();
        if let Some(labels) = pod.as_deref().and_then(labels_of) {
            for (k, v) in labels {
                let Some(anchored) = ns.anchors.get(&(k.clone(), v.clone())) else {
                    continue;
                };
                for service in anchored {
                    if ns
                        .services
                        .get(service)
                        .is_some_and(|s| selects(&s.selector, Some(labels)))
                    {
                        now.push(service.clone());
                    }
                }
            }
        }
        for service in before.iter().filter(|s| !now.contains(s)) {
            if let Some(selected) = ns.services.get_mut(service) {
                selected.members.remove(name);
            }
        }
        if let Some(pod) = &pod {
            for service in &now {
                if let Some(selected) = ns.services.get_mut(service) {
                    selected.members.insert(name.to_string(), pod.clone());
                }
            }
        }
        let mut wake: Vec<Key> = before
            .iter()
            .chain(now.iter())
            .map(|s| (namespace.to_string(), s.clone()))
            .collect();
        wake.sort();
        wake.dedup();
        if let Some(pod) = pod {
            ns.pods.insert(name.to_string(), (pod, now));
        }
        if ns.pods.is_empty() && ns.services.is_empty() {
            self.namespaces.remove(namespace);
        }
        wake
    }

    /// Forgets the selector Services not in `seen` (deleted while a watch was down); returns
    /// them, to be synced (their Endpoints then go).
    fn forget_services_except(&mut self, seen: &HashSet<Key>) -> Vec<Key> {
        let stale = self.keys_except(seen, |n| &n.services);
        for key in &stale {
            self.set_selector(key, None);
        }
        stale
    }

    /// Forgets the pods not in `seen` (deleted while a watch was down); returns the Services
    /// that selected them, to be synced.
    fn forget_pods_except(&mut self, seen: &HashSet<Key>) -> Vec<Key> {
        let stale = self.keys_except(seen, |n| &n.pods);
        stale
            .iter()
            .flat_map(|(namespace, pod)| self.pod_changed(namespace, pod, None))
            .collect()
    }

    /// The (namespace, name) keys of one of a namespace's maps that are not in `seen`.
    fn keys_except<V>(
        &self,
        seen: &HashSet<Key>,
        map: impl Fn(&Namespace) -> &HashMap<String, V>,
    ) -> Vec<Key> {
        self.namespaces
            .iter()
            .flat_map(|(ns, n)| map(n).keys().map(move |name| (ns.clone(), name.clone())))
            .filter(|key| !seen.contains(key))
            .collect()
    }

    /// The views of the pods a Service's selector matches. The index may not have seen the
    /// Service's latest selector yet: when the one it holds is not `selector` (the one a sync
    /// read), each member is checked against `selector`.
    fn members(&self, key: &Key, selector: &Labels) -> Vec<Arc<Pod>> {
        let (namespace, service) = key;
        let Some(selected) = self
            .namespaces
            .get(namespace)
            .and_then(|ns| ns.services.get(service))
        else {
            return Vec::new();
        };
        let pods = selected.members.values();
        let indexed = selected.selector.len() == selector.len()
            && selected
                .selector
                .iter()
                .zip(selector)
                .all(|((k, v), (key, value))| k == key && v == value);
        if indexed {
            pods.cloned().collect()
        } else {
            let pairs: Vec<(String, String)> = selector
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            pods.filter(|pod| selects(&pairs, labels_of(pod)))
                .cloned()
                .collect()
        }
    }
}

fn labels_of(pod: &Pod) -> Option<&Labels> {
    pod.metadata.labels.as_ref()
}

/// The view of a decoded pod ([`pod_view_of_json`]'s tests check it decodes the same).
#[cfg(test)]
fn pod_view(pod: &Pod) -> Pod {
    let container = |c: &Container| Container {
        name: c.name.clone(),
        ports: c.ports.clone(),
        restart_policy: c.restart_policy.clone(),
        ..Container::default()
    };
    let spec = pod.spec.as_ref().map(|spec| PodSpec {
        hostname: spec.hostname.clone(),
        subdomain: spec.subdomain.clone(),
        node_name: spec.node_name.clone(),
        containers: spec.containers.iter().map(container).collect(),
        init_containers: spec
            .init_containers
            .as_ref()
            .map(|list| list.iter().map(container).collect()),
        ..PodSpec::default()
    });
    let status = pod.status.as_ref().map(|status| PodStatus {
        phase: status.phase.clone(),
        pod_ip: status.pod_ip.clone(),
        pod_ips: status.pod_ips.clone(),
        conditions: status
            .conditions
            .as_ref()
            .map(|c| c.iter().filter(|c| c.type_ == "Ready").cloned().collect()),
        ..PodStatus::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            labels: pod.metadata.labels.clone(),
            deletion_timestamp: pod.metadata.deletion_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec,
        status,
    }
}

/// The part of a pod the controllers read (labels, identity, hostname and subdomain, node,
/// container ports, IPs, phase, the Ready condition), kept per pod from the pod watch so a
/// sync decodes nothing: a Service of 50 pods costs 50 map lookups, not 50 JSON decodes. It
/// is decoded straight from the pod's JSON: the rest of the pod (images, environment,
/// volumes, managedFields, other conditions) is skipped, not built.
pub fn pod_view_of_json(json: &[u8]) -> Option<Pod> {
    use k8s_openapi::api::core::v1::{ContainerPort, PodCondition, PodIP};
    #[derive(serde::Deserialize)]
    struct Read {
        metadata: Option<Meta>,
        spec: Option<Spec>,
        status: Option<Status>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        labels: Option<Labels>,
        deletion_timestamp: Option<Time>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        hostname: Option<String>,
        subdomain: Option<String>,
        node_name: Option<String>,
        containers: Option<Vec<Port>>,
        init_containers: Option<Vec<Port>>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Port {
        name: Option<String>,
        ports: Option<Vec<ContainerPort>>,
        restart_policy: Option<String>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        phase: Option<String>,
        #[serde(rename = "podIP")]
        pod_ip: Option<String>,
        #[serde(rename = "podIPs")]
        pod_ips: Option<Vec<PodIP>>,
        conditions: Option<Vec<PodCondition>>,
    }
    let read: Read = serde_json::from_slice(json).ok()?;
    let metadata = read.metadata.unwrap_or_default();
    let container = |c: Port| Container {
        name: c.name.unwrap_or_default(),
        ports: c.ports,
        restart_policy: c.restart_policy,
        ..Container::default()
    };
    Some(Pod {
        metadata: ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            labels: metadata.labels,
            deletion_timestamp: metadata.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: read.spec.map(|spec| PodSpec {
            hostname: spec.hostname,
            subdomain: spec.subdomain,
            node_name: spec.node_name,
            containers: spec
                .containers
                .into_iter()
                .flatten()
                .map(container)
                .collect(),
            init_containers: spec
                .init_containers
                .map(|list| list.into_iter().map(container).collect()),
            ..PodSpec::default()
        }),
        status: read.status.map(|status| PodStatus {
            phase: status.phase,
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            conditions: status
                .conditions
                .map(|c| c.into_iter().filter(|c| c.type_ == "Ready").collect()),
            ..PodStatus::default()
        }),
    })
}

/// What the trigger time is computed from: the times last seen of each pod and of the Service.
#[derive(Default)]
struct TriggerState {
    /// Pod UID → its Ready condition's last transition (pods without one are left out).
    pods: HashMap<String, Time>,
    service: Option<Time>,
}

/// One address as the repack sees it: ip, target uid, the address, ready.
type Entry = (String, String, EndpointAddress, bool);
/// Addresses of one port, keyed by (ip, target uid): the address and its ready flag.
type PortAddresses = BTreeMap<(String, String), (EndpointAddress, bool)>;

/// The two controllers' queues: every Service change goes to both.
struct Queues {
    endpoints: Arc<WorkQueue<Key>>,
    slices: Option<Arc<WorkQueue<Key>>>,
}

impl Queues {
    fn add(&self, key: Key) {
        if let Some(slices) = &self.slices {
            slices.add(key.clone());
        }
        self.endpoints.add(key);
    }
}

/// What a sync found for its Service.
enum Selection {
    /// The Service and the pods its selector matches.
    Pods(Arc<Service>, Vec<Arc<Pod>>),
    /// A Service without a selector, or an ExternalName: nothing to keep.
    Skip,
    /// The Service is gone.
    Gone,
}

/// A sync that did not complete (it is retried with back-off).
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The registry refused a read or write.
    #[error("{}", .0.message)]
    Api(#[from] ApiError),
}

/// An RFC 3339 time as the API writes it.
fn time_text(time: &Time) -> String {
    match serde_json::to_value(time) {
        Ok(serde_json::Value::String(text)) => text,
        _ => String::new(),
    }
}

impl EndpointsController {
    /// The pod/selector index, locked (a lock poisoned by a panicking holder is taken over).
    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A controller over these three registries.
    pub fn new(services: Arc<Registry>, pods: Arc<Registry>, endpoints: Arc<Registry>) -> Self {
        EndpointsController {
            services,
            pods,
            endpoints,
            triggers: std::sync::Mutex::new(HashMap::new()),
            index: std::sync::Mutex::new(Index::default()),
            slices: None,
            slice_triggers: std::sync::Mutex::new(HashMap::new()),
            read: capstan_registry::cache::ByRevision::new(KEPT_SERVICES),
            workers: (WORKERS, WORKERS),
        }
    }

    /// How many Services each controller syncs at once (upstream's
    /// `--concurrent-endpoint-syncs` and `--concurrent-service-endpoint-syncs`; at least one).
    pub fn with_concurrency(mut self, endpoints: usize, slices: usize) -> Self {
        self.workers = (endpoints.max(1), slices.max(1));
        self
    }

    /// Also keeps every selector Service's EndpointSlices (upstream's EndpointSlice
    /// controller), at most `max_per_slice` endpoints a slice, with zones from `nodes`.
    pub fn with_endpoint_slices(
        mut self,
        slices: Arc<Registry>,
        nodes: Arc<Registry>,
        max_per_slice: usize,
    ) -> Self {
        self.slices = Some(Arc::new(crate::endpointslice::SliceWriter::new(
            slices,
            nodes,
            max_per_slice,
        )));
        self
    }

    /// Runs until `group` stops, on a thread of its own (`ep-controller`; the EndpointSlice
    /// controller on `eps-controller`), as upstream's controller runs in its own process: its
    /// work never queues behind API requests on the server's workers, and its CPU use can be
    /// read per thread.
    pub fn start(self, group: &crate::Group) -> std::io::Result<()> {
        let inner = group.clone();
        group.spawn("ep-controller", async move {
            self.run(&inner);
            std::future::pending::<()>().await
        })
    }

    fn run(self, group: &crate::Group) {
        let controller = Arc::new(self);
        // Every change is queued for both controllers; the EndpointSlice controller works on
        // a thread of its own (`eps-controller`), as upstream's runs apart from the endpoints
        // controller, so neither waits for the other's writes.
        let queue = Arc::new(Queues {
            endpoints: Arc::new(WorkQueue::default()),
            slices: controller.slices.as_ref().map(|_| {
                Arc::new(WorkQueue::with_backoff(
                    crate::runtime::Backoff::ENDPOINT_SLICES,
                ))
            }),
        });
        let (services_synced, pods_synced, endpoints_synced);
        // Services: every change syncs that Service; their selectors are remembered so a pod
        // change only wakes the Services that select (or selected) it. Services known from
        // before a watch restart and not replayed were deleted meanwhile.
        {
            let (on_event, on_replayed) = (controller.clone(), controller.clone());
            let (event_queue, replay_queue) = (queue.clone(), queue.clone());
            services_synced = Informer::new(controller.services.clone())
                .on_change(move |kind, object, _| {
                    // Only the selector is decoded, found without reading the rest.
                    let selector = (kind != EventType::Deleted)
                        .then(|| object.member(&["spec", "selector"]))
                        .flatten()
                        .and_then(|s| serde_json::from_slice::<Option<Labels>>(s).ok())
                        .flatten()
                        .filter(|m| !m.is_empty());
                    let key = key_of(&object.selectable);
                    on_event.index().set_selector(&key, selector.as_ref());
                    event_queue.add(key);
                })
                .on_replayed(move |seen| {
                    let gone = on_replayed.index().forget_services_except(seen);
                    for key in gone {
                        replay_queue.add(key);
                    }
                })
                .start();
        }
        // Pods: a change wakes the Services whose selector matches the pod's labels now or
        // matched them before. Pods indexed before a restart and not replayed are gone.
        {
            let (on_event, on_replayed) = (controller.clone(), controller.clone());
            let (event_queue, replay_queue) = (queue.clone(), queue.clone());
            pods_synced = Informer::new(controller.pods.clone())
                .on_change(move |kind, object, _| {
                    let s = &object.selectable;
                    let view = (kind != EventType::Deleted)
                        .then(|| pod_view_of_json(&object.lean_json()))
                        .flatten()
                        .map(Arc::new);
                    let wake = on_event.index().pod_changed(s.namespace(), s.name(), view);
                    for key in wake {
                        event_queue.add(key);
                    }
                })
                .on_replayed(move |seen| {
                    let wake = on_replayed.index().forget_pods_except(seen);
                    for key in wake {
                        replay_queue.add(key);
                    }
                })
                .start();
        }
        // Endpoints: at start-up every existing one is checked (orphans of deleted Services go);
        // later only deletions matter (a deleted Endpoints of a live Service is re-created).
        {
            let event_queue = queue.clone();
            endpoints_synced = Informer::new(controller.endpoints.clone())
                .on_change(move |kind, object, replaying| {
                    // Only the start-up pass reads the object (for the leader annotation);
                    // later events are not decoded at all.
                    let orphan_check = replaying
                        && serde_json::from_slice::<Endpoints>(&object.lean_json())
                            .ok()
                            .and_then(|e| e.metadata.annotations)
                            .is_none_or(|a| !a.contains_key(LEADER));
                    if orphan_check || kind == EventType::Deleted {
                        event_queue.endpoints.add(key_of(&object.selectable));
                    }
                })
                .start();
        }
        if let (Some(writer), Some(slices)) = (&controller.slices, &queue.slices) {
            let (controller, writer, slices) = (controller.clone(), writer.clone(), slices.clone());
            let mut follows = vec![services_synced.clone(), pods_synced.clone()];
            let started = group.spawn("eps-controller", async move {
                // Its own watches (nodes, slices) run here too.
                follows.extend(writer.start(slices.clone()));
                synced(&follows).await;
                let mut workers = tokio::task::JoinSet::new();
                for _ in 0..controller.workers.1 {
                    let (controller, writer) = (controller.clone(), writer.clone());
                    workers.spawn(slices.clone().work("endpointslice sync", move |key: Key| {
                        let (controller, writer) = (controller.clone(), writer.clone());
                        async move { controller.sync_slices(&writer, &key).await }
                    }));
                }
                while workers.join_next().await.is_some() {}
            });
            if let Err(error) = started {
                tracing::error!(%error, "could not start the EndpointSlice controller");
            }
        }
        // Upstream's default of five concurrent syncs (`--concurrent-endpoint-syncs`): a sync
        // waits for its durable write, and others proceed meanwhile; one key is never synced
        // twice at once.
        let follows = [services_synced, pods_synced, endpoints_synced];
        for _ in 0..controller.workers.0 {
            let (controller, queue, follows) = (controller.clone(), queue.clone(), follows.clone());
            tokio::spawn(async move {
                synced(&follows).await;
                let work = queue
                    .endpoints
                    .clone()
                    .work("endpoints sync", move |key: Key| {
                        let controller = controller.clone();
                        async move { controller.sync(&key.0, &key.1).await }
                    });
                work.await
            });
        }
    }

    /// The last-change-trigger-time: the Service's creation on the first sync, then the
    /// earliest of the pod (Ready transition) and Service times that are newer than last seen;
    /// `""` for none.
    fn trigger_time(
        triggers: &std::sync::Mutex<HashMap<Key, TriggerState>>,
        key: &Key,
        service: &Service,
        pods: &[Arc<Pod>],
    ) -> String {
        let created = service.metadata.creation_timestamp.clone();
        let mut triggers = triggers.lock().unwrap_or_else(|e| e.into_inner());
        let first = !triggers.contains_key(key);
        let state = triggers.entry(key.clone()).or_default();
        let mut pod_times = HashMap::with_capacity(pods.len());
        let mut earliest: Option<&Time> = None;
        for pod in pods {
            let Some(time) = ready_condition(pod).and_then(|c| c.last_transition_time.as_ref())
            else {
                continue;
            };
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if state.pods.get(uid).is_none_or(|old| old < time) {
                earliest = Some(earliest.map_or(time, |e| e.min(time)));
            }
            pod_times.insert(uid.to_string(), time.clone());
        }
        let trigger = if first || state.service != created {
            created.clone()
        } else {
            earliest.cloned()
        };
        state.pods = pod_times;
        state.service = created;
        trigger.as_ref().map(time_text).unwrap_or_default()
    }

    /// The Service as the Service watch last showed it (upstream's controller reads its
    /// informer's cache the same way), with what a sync reads decoded: its labels, creation
    /// time and spec; `None` when it is gone.
    fn service(&self, namespace: &str, name: &str) -> Result<Option<Arc<Service>>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Read {
            metadata: ReadMeta,
            spec: Option<ServiceSpec>,
        }
        #[derive(serde::Deserialize)]
        struct ReadMeta {
            labels: Option<Labels>,
            #[serde(rename = "creationTimestamp")]
            creation_timestamp: Option<Time>,
            uid: Option<String>,
            #[serde(rename = "deletionTimestamp")]
            deletion_timestamp: Option<Time>,
        }
        let key = self.services.strategy().info().key(namespace, name);
        let Some(cached) = self.services.cache().get(&key) else {
            return Ok(None);
        };
        if let Some(service) = self.read.get(&cached.key, cached.revision) {
            return Ok(Some(service));
        }
        let read: Read = serde_json::from_slice(&cached.lean_json())
            .map_err(|_| ApiError::internal(format!("undecodable object at {key}")))?;
        let service = Arc::new(Service {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: read.metadata.labels,
                creation_timestamp: read.metadata.creation_timestamp,
                uid: read.metadata.uid,
                deletion_timestamp: read.metadata.deletion_timestamp,
                ..ObjectMeta::default()
            },
            spec: read.spec,
            status: None,
        });
        self.read
            .put(cached.key.clone(), cached.revision, service.clone());
        Ok(Some(service))
    }

    /// What a sync works from: the Service and the pods its selector matches, as the watches
    /// last showed them (as upstream's controllers read their informers); `Gone` when the
    /// Service is, `Skip` when it has no selector or is an ExternalName.
    fn selected(&self, key: &Key) -> Result<Selection, ApiError> {
        let Some(service) = self.service(&key.0, &key.1)? else {
            return Ok(Selection::Gone);
        };
        let spec = service.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            return Ok(Selection::Skip);
        }
        let Some(selector) = spec
            .and_then(|s| s.selector.as_ref())
            .filter(|s| !s.is_empty())
        else {
            return Ok(Selection::Skip);
        };
        let pods = self.index().members(key, selector);
        Ok(Selection::Pods(service, pods))
    }

    async fn sync(&self, namespace: &str, name: &str) -> Result<(), SyncError> {
        let key = (namespace.to_string(), name.to_string());
        let (service, pods) = match self.selected(&key)? {
            Selection::Pods(service, pods) => (service, pods),
            Selection::Skip => return Ok(()),
            // The Service is gone: so are its Endpoints.
            Selection::Gone => {
                let options = DeleteOptions::default();
                return match self.endpoints.delete(namespace, name, &options).await {
                    Err(e) if !e.is_not_found() => Err(e.into()),
                    _ => Ok(()),
                };
            }
        };
        let spec = service.spec.clone().unwrap_or_default();
        let (subsets, truncated) = build_subsets(&spec, name, &pods);
        let build = || build_subsets(&spec, name, &pods).0;
        let desired = Desired {
            labels: desired_labels(&service, &spec),
            subsets: std::sync::Mutex::new(Some(subsets)),
            build: &build,
            truncated,
            trigger: Self::trigger_time(&self.triggers, &key, &service, &pods),
        };
        self.write(namespace, name, &desired).await
    }

    /// The EndpointSlice controller's sync of one Service.
    async fn sync_slices(
        &self,
        writer: &crate::endpointslice::SliceWriter,
        key: &Key,
    ) -> Result<(), ApiError> {
        match self.selected(key)? {
            Selection::Pods(service, pods) => {
                let trigger = || Self::trigger_time(&self.slice_triggers, key, &service, &pods);
                writer.sync(key, &service, &pods, trigger).await
            }
            Selection::Skip => Ok(()),
            // Its slices go by their owner reference (the garbage collector).
            Selection::Gone => {
                writer.forget(key);
                self.slice_triggers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(key);
                Ok(())
            }
        }
    }

    /// Writes the desired Endpoints: patched over the stored ones (read once, inside the
    /// registry's write, which retries on a concurrent change), or created.
    async fn write(
        &self,
        namespace: &str,
        name: &str,
        desired: &Desired<'_>,
    ) -> Result<(), SyncError> {
        let options = WriteOptions {
            dry_run: false,
            field_manager: MANAGER.into(),
            applied: false,
        };
        let written = self
            .endpoints
            .patch_typed(
                namespace,
                name,
                &options,
                Subresource::Main,
                |current: &Endpoints| {
                    Ok(if desired.unchanged(current) {
                        current.clone()
                    } else {
                        desired.applied_to(&current.metadata)
                    })
                },
            )
            .await;
        match written {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => {
                let fresh = ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_string()),
                    ..ObjectMeta::default()
                };
                let created = desired.applied_to(&fresh);
                match self
                    .endpoints
                    .create_typed(namespace, &created, &options)
                    .await
                {
                    // A namespace being deleted takes no new objects: dropped, not retried
                    // (any other refusal is retried).
                    Err(e) if !e.is_namespace_terminating() => Err(e.into()),
                    _ => Ok(()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The Endpoints' labels: the Service's, with the headless and managed-by marks.
fn desired_labels(service: &Service, spec: &ServiceSpec) -> Labels {
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    let cluster_ip = spec.cluster_ip.as_deref().unwrap_or_default();
    if cluster_ip.is_empty() || cluster_ip == "None" {
        labels.insert(HEADLESS.into(), String::new());
    }
    labels.insert(MANAGED_BY.into(), "endpoint-controller".into());
    labels
}

/// What a sync wants the Endpoints to hold.
struct Desired<'a> {
    labels: Labels,
    /// Moved into the Endpoints the first write attempt makes (not copied: 50 addresses are
    /// hundreds of allocations); an attempt after that builds them again.
    subsets: std::sync::Mutex<Option<Vec<EndpointSubset>>>,
    build: &'a (dyn Fn() -> Vec<EndpointSubset> + Send + Sync),
    truncated: bool,
    trigger: String,
}

impl Desired<'_> {
    /// The Endpoints of metadata `current` (the stored one's) with the desired labels,
    /// annotations and subsets (the stored subsets are not copied, only replaced).
    fn applied_to(&self, current: &ObjectMeta) -> Endpoints {
        let mut endpoints = Endpoints {
            metadata: current.clone(),
            subsets: None,
        };
        endpoints.metadata.labels = Some(self.labels.clone());
        let mut annotations = endpoints.metadata.annotations.take().unwrap_or_default();
        if self.truncated {
            annotations.insert(OVER_CAPACITY.into(), "truncated".into());
        } else {
            annotations.remove(OVER_CAPACITY);
        }
        if self.trigger.is_empty() {
            annotations.remove(TRIGGER_TIME);
        } else {
            annotations.insert(TRIGGER_TIME.into(), self.trigger.clone());
        }
        endpoints.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
        let subsets = self.held().take().unwrap_or_else(self.build);
        endpoints.subsets = (!subsets.is_empty()).then_some(subsets);
        endpoints
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Vec<EndpointSubset>>> {
        self.subsets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nothing to write when subsets and labels already match and nothing is
    /// over capacity (the trigger-time annotation alone never causes a write, so a restart
    /// rewrites nothing).
    fn unchanged(&self, current: &Endpoints) -> bool {
        let without_headless = |labels: &Labels| {
            let mut labels = labels.clone();
            labels.remove(HEADLESS);
            labels
        };
        let current_labels = current.metadata.labels.clone().unwrap_or_default();
        let annotations = current.metadata.annotations.as_ref();
        current_labels.contains_key(MANAGED_BY)
            && !self.truncated
            && annotations.is_none_or(|a| !a.contains_key(OVER_CAPACITY))
            && current.subsets.as_deref().unwrap_or_default()
                == self.held().get_or_insert_with(self.build).as_slice()
            && without_headless(&current_labels) == without_headless(&self.labels)
    }
}

fn family_of(ip: &str) -> Option<&'static str> {
    ip.parse::<IpAddr>().ok().map(|ip| family(&ip))
}

fn family(ip: &IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    }
}

/// An address as Endpoints and slices hold it: canonical. `parsed_from` is the text `ip` was
/// parsed from (by std or [`capstan_machinery::ip::parse_sloppy`]): for IPv4 four decimal
/// parts, and when it is as short as the canonical form it has no leading zero, so it is that
/// form and is copied, not formatted again.
pub(crate) fn canonical(ip: &IpAddr, parsed_from: &str) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let digits = |o: &u8| match *o {
                100.. => 3,
                10.. => 2,
                _ => 1,
            };
            let len = v4.octets().iter().map(digits).sum::<usize>() + 3;
            if parsed_from.len() == len {
                parsed_from.to_string()
            } else {
                ip.to_string()
            }
        }
        IpAddr::V6(_) => ip.to_string(),
    }
}

fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The target port of a Service port for one pod (upstream's `FindPort`: a number as it is,
/// a name from the pod's containers, then its sidecars, with the port's protocol).
pub(crate) fn target_port(service_port: &ServicePort, pod: &Pod) -> Option<i32> {
    let protocol = service_port.protocol.as_deref().unwrap_or("TCP");
    let name = match &service_port.target_port {
        Some(IntOrString::Int(n)) => return Some(*n),
        Some(IntOrString::String(name)) => name,
        None => return Some(service_port.port),
    };
    let spec = pod.spec.as_ref()?;
    let search = |containers: &[Container], sidecars_only: bool| {
        containers
            .iter()
            .filter(|c| !sidecars_only || c.restart_policy.as_deref() == Some("Always"))
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| {
                p.name.as_deref() == Some(name.as_str())
                    && p.protocol.as_deref().unwrap_or("TCP") == protocol
            })
            .map(|p| p.container_port)
    };
    search(&spec.containers, false)
        .or_else(|| search(spec.init_containers.as_deref().unwrap_or_default(), true))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labelled(name: &str, app: &str) -> Option<Arc<Pod>> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": app, "tier": "x"}},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}]},
        }))
        .ok()?;
        Some(Arc::new(pod_view(&pod)))
    }

    /// The members of a Service, read with the selector the index holds for it.
    fn names(index: &Index, service: &str) -> Vec<String> {
        let held: Labels = index
            .namespaces
            .get("ns")
            .and_then(|ns| ns.services.get(service))
            .map(|s| s.selector.iter().cloned().collect())
            .unwrap_or_default();
        names_selected(index, service, &held)
    }

    fn names_selected(index: &Index, service: &str, selector: &Labels) -> Vec<String> {
        index
            .members(&("ns".into(), service.into()), selector)
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_pods_view_decoded_from_its_json_is_the_view_of_the_pod() {
        let full = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web"},
                "deletionTimestamp": "2026-01-01T00:00:00Z", "annotations": {"a": "b"},
                "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {}}}]},
            "spec": {"hostname": "h", "subdomain": "web", "nodeName": "n1",
                "containers": [{"name": "c", "image": "i", "env": [{"name": "E", "value": "v"}],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}],
                "initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always",
                    "ports": [{"name": "side", "containerPort": 9090}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.2",
                "podIPs": [{"ip": "10.0.0.2"}, {"ip": "fd00::2"}],
                "conditions": [{"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        let bare = json!({"metadata": {"name": "q"}, "spec": {"containers": []}});
        let nulls = json!({"metadata": null, "spec": {"containers": null}, "status": null});
        for object in [full, bare, nulls] {
            let json = serde_json::to_vec(&object).expect("json");
            let pod: Pod = serde_json::from_slice(&json).expect("a pod");
            assert_eq!(pod_view_of_json(&json), Some(pod_view(&pod)));
        }
    }

    #[test]
    fn an_address_is_written_in_canonical_form() {
        for text in [
            "10.0.0.1",
            "010.0.0.1",
            "10.00.0.1",
            "1.2.3.004",
            "0.0.0.0",
            "255.255.255.255",
            "100.20.3.0",
            "fe80::0001",
            "2001:DB8::1",
            "::ffff:1.2.3.4",
        ] {
            let ip = capstan_machinery::ip::parse_sloppy(text).expect(text);
            assert_eq!(canonical(&ip, text), ip.to_string(), "{text}");
        }
    }

    #[test]
    fn a_sync_reads_each_pods_latest_view_and_a_newer_selector() {
        let mut index = Index::default();
        let key: Key = ("ns".into(), "web".into());
        index.set_selector(&key, Some(&selector(&[("app", "web"), ("tier", "x")])));
        index.pod_changed("ns", "p1", labelled("p1", "web"));
        index.pod_changed("ns", "p2", labelled("p2", "web"));
        let moved: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p1", "namespace": "ns", "labels": {"app": "web", "tier": "x"}},
            "status": {"podIP": "10.0.0.9"},
        }))
        .expect("a pod");
        assert_eq!(
            index.pod_changed("ns", "p1", Some(Arc::new(pod_view(&moved)))),
            vec![key.clone()]
        );
        let held = selector(&[("app", "web"), ("tier", "x")]);
        let ips: Vec<Option<String>> = index
            .members(&key, &held)
            .iter()
            .map(|p| p.status.as_ref().and_then(|s| s.pod_ip.clone()))
            .collect();
        assert_eq!(
            ips,
            [Some("10.0.0.9".to_string()), Some("10.0.0.1".to_string())],
            "the changed pod is read as it is now"
        );
        // A sync that read a selector the index has not seen yet keeps only what it selects.
        let newer = selector(&[("app", "web"), ("tier", "y")]);
        assert!(names_selected(&index, "web", &newer).is_empty());
        let wider = selector(&[("app", "web")]);
        assert_eq!(names_selected(&index, "web", &wider), ["p1", "p2"]);
    }

    fn selector(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_index_follows_labels_selectors_and_deletions() {
        let mut index = Index::default();
        let key: Key = ("ns".into(), "web".into());
        index.pod_changed("ns", "p1", labelled("p1", "web"));
        index.pod_changed("ns", "p2", labelled("p2", "db"));
        index.set_selector(&key, Some(&selector(&[("app", "web"), ("tier", "x")])));
        assert_eq!(names(&index, "web"), ["p1"]);
        // A pod that starts to match wakes the Service and joins it.
        assert_eq!(
            index.pod_changed("ns", "p2", labelled("p2", "web")),
            vec![key.clone()]
        );
        assert_eq!(names(&index, "web"), ["p1", "p2"]);
        // A pod that stops matching wakes it once more and leaves.
        assert_eq!(
            index.pod_changed("ns", "p1", labelled("p1", "db")),
            vec![key.clone()]
        );
        assert_eq!(names(&index, "web"), ["p2"]);
        // Unrelated pods wake nothing; another namespace is another world.
        assert!(
            index
                .pod_changed("ns", "p3", labelled("p3", "db"))
                .is_empty()
        );
        assert!(
            index
                .pod_changed("other", "p4", labelled("p4", "web"))
                .is_empty()
        );
        // A write that leaves the pod as the controller sees it wakes nothing.
        assert!(
            index
                .pod_changed("ns", "p2", labelled("p2", "web"))
                .is_empty()
        );
        assert_eq!(names(&index, "web"), ["p2"]);
        // Deletion wakes the Service that selected the pod.
        assert_eq!(index.pod_changed("ns", "p2", None), vec![key.clone()]);
        assert!(names(&index, "web").is_empty());
        // A changed selector re-reads the pods; a removed one forgets them.
        index.set_selector(&key, Some(&selector(&[("app", "db")])));
        assert_eq!(names(&index, "web"), ["p1", "p3"]);
        // A Service not replayed after a watch restart was deleted meanwhile: forgotten.
        assert_eq!(
            index.forget_services_except(&HashSet::default()),
            vec![key.clone()]
        );
        assert!(names(&index, "web").is_empty());
        index.set_selector(&key, Some(&selector(&[("app", "db")])));
        index.set_selector(&key, None);
        assert!(names(&index, "web").is_empty());
        assert!(
            index
                .pod_changed("ns", "p1", labelled("p1", "db"))
                .is_empty()
        );
    }

    #[test]
    fn the_pod_view_keeps_what_the_controller_reads() {
        let view = labelled("p1", "web").expect("a pod");
        let view = serde_json::to_value(&*view).expect("json");
        assert_eq!(view["metadata"]["labels"]["app"], "web");
        assert_eq!(view["status"]["podIP"], "10.0.0.1");
        assert_eq!(
            view["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
    }

    #[tokio::test]
    async fn the_work_queue_coalesces_and_never_hands_out_a_key_twice_at_once() {
        let queue = WorkQueue::<Key>::default();
        let a: Key = ("ns".into(), "a".into());
        let b: Key = ("ns".into(), "b".into());
        queue.add(a.clone());
        queue.add(b.clone());
        queue.add(a.clone());
        assert_eq!(queue.next().await, a);
        // Queued again while being synced: held back until done, then handed out again.
        queue.add(a.clone());
        assert_eq!(queue.next().await, b);
        assert!(
            queue
                .state
                .lock()
                .map(|s| s.order.is_empty())
                .unwrap_or(false)
        );
        queue.done(&a);
        assert_eq!(queue.next().await, a);
        queue.done(&a);
        queue.done(&b);
        assert!(
            queue
                .state
                .lock()
                .map(|s| s.order.is_empty() && s.dirty.is_empty())
                .unwrap_or(false)
        );
    }

    fn pod(name: &str, ip: &str, ready_status: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
               "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": ready_status}]}}))
            .expect("a pod")
    }

    fn spec(value: serde_json::Value) -> ServiceSpec {
        serde_json::from_value(value).expect("a spec")
    }

    fn ips(addresses: &Option<Vec<EndpointAddress>>) -> Vec<&str> {
        addresses.iter().flatten().map(|a| &*a.ip).collect()
    }

    #[test]
    fn ready_and_unready_pods_with_a_named_target_port() {
        let spec = spec(
            json!({"clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"], "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]}),
        );
        let pods = [
            pod("p2", "10.244.0.12", "True"),
            pod("p1", "10.244.0.11", "True"),
            pod("p3", "10.244.0.13", "False"),
        ];
        let (subsets, truncated) = build_subsets(&spec, "web", &pods);
        assert!(!truncated);
        assert_eq!(subsets.len(), 1);
        assert_eq!(ips(&subsets[0].addresses), ["10.244.0.11", "10.244.0.12"]);
        assert_eq!(ips(&subsets[0].not_ready_addresses), ["10.244.0.13"]);
        assert_eq!(
            serde_json::to_value(&subsets[0].ports).expect("json"),
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
        );
        let target = subsets[0]
            .addresses
            .as_ref()
            .and_then(|a| a[0].target_ref.as_ref());
        assert_eq!(target.and_then(|t| t.kind.as_deref()), Some("Pod"));
    }

    #[test]
    fn ports_are_in_upstreams_hash_order() {
        // Go's order for these three (FNV-128a of their spew dumps): http, metrics, https; a
        // slice lists the same ports as http, https, metrics.
        let spec = spec(json!({"clusterIP": "10.96.0.10", "ports": [
            {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443},
            {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": 9090},
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}));
        let (subsets, _) = build_subsets(&spec, "web", &[pod("p1", "10.244.0.11", "True")]);
        let names: Vec<&str> = subsets[0]
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.name.as_deref())
            .collect();
        assert_eq!(names, ["http", "metrics", "https"]);
    }

    #[test]
    fn a_pod_with_an_address_endpoints_cannot_hold_is_left_out() {
        let spec =
            spec(json!({"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": 8080}]}));
        let pods = vec![
            pod("good", "10.244.0.5", "True"),
            pod("loopback", "127.0.0.1", "True"),
            pod("link-local", "169.254.1.1", "True"),
        ];
        let (subsets, _) = build_subsets(&spec, "web", &pods);
        assert_eq!(ips(&subsets[0].addresses), ["10.244.0.5"]);
    }

    #[test]
    fn more_than_a_thousand_addresses_are_truncated() {
        let spec = spec(
            json!({"clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"], "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}]}),
        );
        let pods: Vec<Pod> = (0..1001)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    &format!("10.245.{}.{}", i / 250, i % 250 + 1),
                    "True",
                )
            })
            .collect();
        let (subsets, truncated) = build_subsets(&spec, "many", &pods);
        assert!(truncated);
        assert_eq!(subsets[0].addresses.as_ref().map(Vec::len), Some(1000));
    }
}
