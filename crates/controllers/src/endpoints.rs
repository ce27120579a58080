//! The endpoints controller (`spec/endpoints.md` §3).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use capstan_machinery::labels::LabelSelector;
use capstan_machinery::meta;
use capstan_registry::cache::{CachedObject, EventType, Selectable};

use crate::queue::WorkQueue;
use crate::watch_all;
use capstan_registry::watch::WatchItem;
use capstan_registry::{DeleteOptions, ReadAt, Registry, WriteOptions};
use serde_json::{Map, Value, json};

const MAX_ADDRESSES: usize = 1000;
const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
const MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
const HEADLESS: &str = "service.kubernetes.io/headless";
const MANAGER: &str = "kube-controller-manager";

const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Keeps Endpoints in step with Services and Pods.
pub struct EndpointsController {
    services: Arc<Registry>,
    pods: Arc<Registry>,
    endpoints: Arc<Registry>,
    triggers: std::sync::Mutex<std::collections::HashMap<Key, TriggerState>>,
    index: std::sync::Mutex<Index>,
}

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
    /// Pods by name: what the controller reads of each ([`pod_view`]) and the Services that
    /// select it.
    pods: HashMap<String, (Arc<Value>, Vec<String>)>,
}

/// A Service's selector (its `key=value` pairs) and the names of the pods it selects.
struct Selected {
    selector: Vec<(String, String)>,
    members: BTreeSet<String>,
}

fn selects(selector: &[(String, String)], labels: Option<&Map<String, Value>>) -> bool {
    labels.is_some_and(|labels| {
        selector
            .iter()
            .all(|(k, v)| labels.get(k).and_then(Value::as_str) == Some(v.as_str()))
    })
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
        for pod in &old.members {
            if let Some((_, services)) = self.pods.get_mut(pod) {
                services.retain(|s| s != service);
            }
        }
    }
}

impl Index {
    /// A Service's selector was set, changed or removed (`None`, or an empty map).
    fn set_selector(&mut self, key: &Key, selector: Option<&Map<String, Value>>) {
        let (namespace, service) = key;
        let ns = self.namespaces.entry(namespace.clone()).or_default();
        ns.forget_service(service);
        let selector: Vec<(String, String)> = selector
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        let Some(anchor) = selector.first().cloned() else {
            return;
        };
        let mut members = BTreeSet::new();
        for (name, (pod, services)) in ns.pods.iter_mut() {
            if selects(&selector, labels_of(pod)) {
                members.insert(name.clone());
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
    /// those that select it now or selected it before.
    fn pod_changed(&mut self, namespace: &str, name: &str, pod: Option<Arc<Value>>) -> Vec<Key> {
        let ns = self.namespaces.entry(namespace.to_string()).or_default();
        let before = ns.pods.remove(name).map(|(_, s)| s).unwrap_or_default();
        let mut now: Vec<String> = Vec::new();
        if let Some(labels) = pod.as_deref().and_then(labels_of) {
            for (k, v) in labels {
                let Some(v) = v.as_str() else { continue };
                let Some(anchored) = ns.anchors.get(&(k.clone(), v.to_string())) else {
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
        for service in now.iter().filter(|s| !before.contains(s)) {
            if let Some(selected) = ns.services.get_mut(service) {
                selected.members.insert(name.to_string());
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

    /// The views of the pods a Service's selector matches.
    fn members(&self, key: &Key) -> Vec<Arc<Value>> {
        let (namespace, service) = key;
        let Some(ns) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        let Some(selected) = ns.services.get(service) else {
            return Vec::new();
        };
        selected
            .members
            .iter()
            .filter_map(|name| ns.pods.get(name).map(|(pod, _)| pod.clone()))
            .collect()
    }
}

fn labels_of(pod: &Value) -> Option<&Map<String, Value>> {
    pod.pointer("/metadata/labels").and_then(Value::as_object)
}

/// The part of a pod the controller reads (labels, identity, hostname and subdomain, node,
/// container ports, IPs, phase, the Ready condition), kept per pod from the pod watch so a
/// sync decodes nothing: a Service of 50 pods costs 50 map lookups, not 50 JSON decodes.
pub fn pod_view(pod: &Value) -> Value {
    let pick = |from: Option<&Value>, fields: &[&str]| -> Value {
        let mut out = Map::new();
        if let Some(from) = from.and_then(Value::as_object) {
            for field in fields {
                if let Some(value) = from.get(*field) {
                    out.insert((*field).to_string(), value.clone());
                }
            }
        }
        Value::Object(out)
    };
    let containers = |field: &str| -> Value {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .map(|list| {
                Value::Array(
                    list.iter()
                        .map(|c| pick(Some(c), &["name", "ports", "restartPolicy"]))
                        .collect(),
                )
            })
            .unwrap_or(Value::Null)
    };
    let mut spec = pick(pod.get("spec"), &["hostname", "subdomain", "nodeName"]);
    if let Value::Object(spec) = &mut spec {
        for field in ["containers", "initContainers"] {
            let list = containers(field);
            if !list.is_null() {
                spec.insert(field.into(), list);
            }
        }
    }
    let mut status = pick(pod.get("status"), &["phase", "podIP", "podIPs"]);
    if let (Value::Object(status), Some(conditions)) = (
        &mut status,
        pod.pointer("/status/conditions").and_then(Value::as_array),
    ) {
        let ready: Vec<Value> = conditions
            .iter()
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
            .cloned()
            .collect();
        status.insert("conditions".into(), Value::Array(ready));
    }
    json!({
        "metadata": pick(pod.get("metadata"), &["name", "namespace", "uid", "labels", "deletionTimestamp"]),
        "spec": spec,
        "status": status,
    })
}

/// What §3.5 remembers per Service: the trigger time last seen of each pod and of the Service.
#[derive(Default)]
struct TriggerState {
    pods: std::collections::HashMap<String, String>,
    service: String,
}

type Key = (String, String);

/// One address as the repack sees it: ip, target uid, the address, ready.
type Entry = (String, String, Value, bool);
/// Addresses of one port, keyed by (ip, target uid): the address and its ready flag.
type PortAddresses = BTreeMap<(String, String), (Value, bool)>;

/// The part of a Service the index keeps.
#[derive(serde::Deserialize)]
struct SelectorOf {
    spec: Option<SelectorSpec>,
}

#[derive(serde::Deserialize)]
struct SelectorSpec {
    selector: Option<Map<String, Value>>,
}

fn key_of(selectable: &Selectable) -> Key {
    (selectable.namespace().into(), selectable.name().into())
}

/// Follows every object of a kind for the life of the process, watching again whenever a
/// watch ends: `event` sees each change (`true` while a (re)start replays what exists), and
/// `replayed` the keys of that replay once it is complete, so what disappeared while no watch
/// was open can be forgotten (as an informer's Replace does).
fn follow<E, R>(registry: Arc<Registry>, event: E, replayed: R)
where
    E: Fn(EventType, &CachedObject, bool) + Send + 'static,
    R: Fn(HashSet<Key>) + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let mut watcher = watch_all(&registry, true);
            let mut replay: Option<HashSet<Key>> = Some(HashSet::new());
            while let Some(item) = watcher.next().await {
                match item {
                    WatchItem::Event(kind, object) => {
                        if let Some(seen) = replay.as_mut() {
                            seen.insert(key_of(&object.selectable));
                        }
                        event(kind, &object, replay.is_some());
                    }
                    WatchItem::Bookmark(_, true) => {
                        if let Some(seen) = replay.take() {
                            replayed(seen);
                        }
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
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
            triggers: std::sync::Mutex::new(std::collections::HashMap::new()),
            index: std::sync::Mutex::new(Index::default()),
        }
    }

    /// Runs for the life of the process on a thread of its own (`ep-controller`), as
    /// upstream's controller runs in its own process: its work never queues behind API
    /// requests on the server's workers, and its CPU use can be read per thread.
    pub fn start(self) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("ep-controller".into())
            .spawn(move || {
                runtime.block_on(async move {
                    self.run();
                    std::future::pending::<()>().await
                })
            })?;
        Ok(())
    }

    fn run(self) {
        let controller = Arc::new(self);
        let queue = Arc::new(WorkQueue::<Key>::default());
        // Services: every change syncs that Service; their selectors are remembered so a pod
        // change only wakes the Services that select (or selected) it. Services known from
        // before a watch restart and not replayed were deleted meanwhile.
        {
            let (on_event, on_replayed) = (controller.clone(), controller.clone());
            let (event_queue, replay_queue) = (queue.clone(), queue.clone());
            follow(
                controller.services.clone(),
                move |kind, object, _| {
                    // Only the selector is decoded; the rest of the Service is skipped.
                    let selector = (kind != EventType::Deleted)
                        .then(|| {
                            serde_json::from_slice::<SelectorOf>(object.raw_json())
                                .ok()
                                .and_then(|s| s.spec?.selector)
                        })
                        .flatten()
                        .filter(|m| !m.is_empty());
                    let key = key_of(&object.selectable);
                    on_event.index().set_selector(&key, selector.as_ref());
                    event_queue.add(key);
                },
                move |seen| {
                    let gone = on_replayed.index().forget_services_except(&seen);
                    for key in gone {
                        replay_queue.add(key);
                    }
                },
            );
        }
        // Pods: a change wakes the Services whose selector matches the pod's labels now or
        // matched them before. Pods indexed before a restart and not replayed are gone.
        {
            let (on_event, on_replayed) = (controller.clone(), controller.clone());
            let (event_queue, replay_queue) = (queue.clone(), queue.clone());
            follow(
                controller.pods.clone(),
                move |kind, object, _| {
                    let s = &object.selectable;
                    let view =
                        (kind != EventType::Deleted).then(|| Arc::new(pod_view(&object.object())));
                    let wake = on_event.index().pod_changed(s.namespace(), s.name(), view);
                    for key in wake {
                        event_queue.add(key);
                    }
                },
                move |seen| {
                    let wake = on_replayed.index().forget_pods_except(&seen);
                    for key in wake {
                        replay_queue.add(key);
                    }
                },
            );
        }
        // Endpoints: at start-up every existing one is checked (orphans of deleted Services go);
        // later only deletions matter (a deleted Endpoints of a live Service is re-created).
        {
            let event_queue = queue.clone();
            follow(
                controller.endpoints.clone(),
                move |kind, object, replaying| {
                    // Only the start-up pass reads the object (for the leader annotation);
                    // later events are not decoded at all.
                    let orphan_check = replaying
                        && object
                            .object()
                            .pointer(
                                "/metadata/annotations/control-plane.alpha.kubernetes.io~1leader",
                            )
                            .is_none();
                    if orphan_check || kind == EventType::Deleted {
                        event_queue.add(key_of(&object.selectable));
                    }
                },
                |_| {},
            );
        }
        // Upstream's default of five concurrent syncs (`--concurrent-endpoint-syncs`): a sync
        // waits for its durable write, and others proceed meanwhile; one key is never synced
        // twice at once.
        for _ in 0..WORKERS {
            let (queue, controller) = (queue.clone(), controller.clone());
            tokio::spawn(async move {
                loop {
                    let key = queue.next().await;
                    let result = controller.sync(&key.0, &key.1).await;
                    queue.done(&key);
                    match result {
                        Ok(()) => queue.forget(&key),
                        Err(error) => {
                            let (namespace, name) = (key.0.clone(), key.1.clone());
                            match queue.retry_later(key) {
                                Some(delay) => {
                                    tracing::debug!(%namespace, %name, %error, ?delay, "endpoints sync failed; retrying")
                                }
                                None => {
                                    tracing::warn!(%namespace, %name, %error, "endpoints sync failed too often; dropped until the Service or its pods change")
                                }
                            }
                        }
                    }
                }
            });
        }
    }

    /// The last-change-trigger-time (§3.5): the Service's creation on the first sync, then the
    /// earliest of the pod (Ready transition) and Service times that are newer than last seen.
    /// Timestamps are RFC 3339 strings in UTC, which order as text.
    fn trigger_time(&self, key: &Key, service: &Value, pods: &[Arc<Value>]) -> String {
        let created = meta::meta_str(service, "creationTimestamp").to_string();
        let pod_times: std::collections::HashMap<String, String> = pods
            .iter()
            .map(|pod| {
                let time = pod
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|c| {
                        c.iter()
                            .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
                    })
                    .and_then(|c| c.get("lastTransitionTime"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                (meta::meta_str(pod, "uid").to_string(), time)
            })
            .collect();
        let mut triggers = self.triggers.lock().unwrap_or_else(|e| e.into_inner());
        let first = !triggers.contains_key(key);
        let state = triggers.entry(key.clone()).or_default();
        let trigger = if first || state.service != created {
            created.clone()
        } else {
            pod_times
                .iter()
                .filter(|(uid, time)| {
                    !time.is_empty() && state.pods.get(*uid).is_none_or(|old| old < *time)
                })
                .map(|(_, time)| time.clone())
                .min()
                .unwrap_or_default()
        };
        state.pods = pod_times;
        state.service = created;
        trigger
    }

    async fn sync(&self, namespace: &str, name: &str) -> Result<(), String> {
        let write = WriteOptions {
            dry_run: false,
            field_manager: MANAGER.into(),
            applied: false,
        };
        let service = match self.services.get(namespace, name, ReadAt::Latest).await {
            Ok(service) => service,
            Err(e) if e.code == 404 => {
                return match self
                    .endpoints
                    .delete(namespace, name, &DeleteOptions::default())
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if e.code == 404 => Ok(()),
                    Err(e) => Err(e.message),
                };
            }
            Err(e) => return Err(e.message),
        };
        let spec = service.get("spec").cloned().unwrap_or(json!({}));
        if spec.get("type").and_then(Value::as_str) == Some("ExternalName") {
            return Ok(());
        }
        let Some(selector) = spec
            .get("selector")
            .and_then(Value::as_object)
            .filter(|s| !s.is_empty())
        else {
            return Ok(());
        };
        // The pods the selector matches, as the pod watch last showed them (as upstream's
        // controller reads its informer).
        let selector = LabelSelector::from_map(selector);
        let pods: Vec<Arc<Value>> = self
            .index()
            .members(&(namespace.to_string(), name.to_string()))
            .into_iter()
            .filter(|pod| selector.matches(labels_of(pod)))
            .collect();
        let (subsets, truncated) = build_subsets(&spec, name, &pods);
        let trigger =
            self.trigger_time(&(namespace.to_string(), name.to_string()), &service, &pods);

        let mut labels: Map<String, Value> = service
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let cluster_ip = spec.get("clusterIP").and_then(Value::as_str).unwrap_or("");
        if cluster_ip.is_empty() || cluster_ip == "None" {
            labels.insert(HEADLESS.into(), json!(""));
        }
        labels.insert(MANAGED_BY.into(), json!("endpoint-controller"));
        let subsets = Value::Array(subsets);
        // The desired Endpoints, from the current ones (None: to be created).
        let desired_from = |current: Option<&Value>| -> Value {
            let mut desired = current
                .cloned()
                .unwrap_or_else(|| json!({"metadata": {"name": name, "namespace": namespace}}));
            let metadata = meta::metadata_mut(&mut desired);
            metadata.insert("labels".into(), Value::Object(labels.clone()));
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .map(|a| {
                    if truncated {
                        a.insert(OVER_CAPACITY.into(), json!("truncated"));
                    } else {
                        a.shift_remove(OVER_CAPACITY);
                    }
                    if trigger.is_empty() {
                        a.shift_remove(TRIGGER_TIME);
                    } else {
                        a.insert(TRIGGER_TIME.into(), json!(trigger));
                    }
                    a.is_empty()
                });
            if annotations == Some(true) {
                metadata.shift_remove("annotations");
            }
            if let Value::Object(map) = &mut desired {
                if subsets.as_array().is_some_and(Vec::is_empty) {
                    map.shift_remove("subsets");
                } else {
                    map.insert("subsets".into(), subsets.clone());
                }
            }
            desired
        };
        // §3.2 step 10: nothing to write when subsets and labels already match and nothing is
        // over capacity (the trigger-time annotation alone never causes a write, so a restart
        // rewrites nothing). The stored Endpoints are read once, inside the registry's write
        // (which retries on a concurrent change).
        let unchanged = |current: &Value, desired: &Value| {
            let strip = |object: &Value| {
                let mut labels = object
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                labels.remove(HEADLESS);
                labels
            };
            let subsets_of = |object: &Value| {
                object
                    .get("subsets")
                    .filter(|s| s.as_array().is_some_and(|a| !a.is_empty()))
                    .cloned()
            };
            let managed = current
                .pointer("/metadata/labels")
                .and_then(|l| l.get(MANAGED_BY))
                .is_some();
            let over = current
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(OVER_CAPACITY))
                .is_some();
            managed
                && !truncated
                && !over
                && subsets_of(current) == subsets_of(desired)
                && strip(current) == strip(desired)
        };
        let written = self
            .endpoints
            .patch(namespace, name, &write, false, |current| {
                // The registry hands the object over with its kind and apiVersion.
                let mut current = current.clone();
                meta::strip_type_meta(&mut current);
                let desired = desired_from(Some(&current));
                Ok(if unchanged(&current, &desired) {
                    current
                } else {
                    desired
                })
            })
            .await;
        match written {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => {
                match self
                    .endpoints
                    .create(namespace, desired_from(None), &write)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if e.code == 403 => Ok(()), // namespace terminating
                    Err(e) => Err(e.message),
                }
            }
            Err(e) => Err(e.message),
        }
    }
}

fn family_of(ip: &str) -> Option<&'static str> {
    match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(_) => Some("IPv4"),
        IpAddr::V6(_) => Some("IPv6"),
    }
}

/// The target port of a Service port for one pod (§3.2 step 8).
fn target_port(service_port: &Value, pod: &Value) -> Option<i64> {
    let protocol = service_port
        .get("protocol")
        .and_then(Value::as_str)
        .unwrap_or("TCP");
    match service_port.get("targetPort") {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(name)) => {
            let search = |containers: Option<&Value>, sidecars_only: bool| {
                containers.and_then(Value::as_array).and_then(|list| {
                    list.iter()
                        .filter(|c| {
                            !sidecars_only
                                || c.get("restartPolicy").and_then(Value::as_str) == Some("Always")
                        })
                        .flat_map(|c| {
                            c.get("ports")
                                .and_then(Value::as_array)
                                .cloned()
                                .unwrap_or_default()
                        })
                        .find(|p| {
                            p.get("name").and_then(Value::as_str) == Some(name.as_str())
                                && p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                                    == protocol
                        })
                        .and_then(|p| p.get("containerPort").and_then(Value::as_i64))
                })
            };
            search(pod.pointer("/spec/containers"), false)
                .or_else(|| search(pod.pointer("/spec/initContainers"), true))
        }
        _ => service_port.get("port").and_then(Value::as_i64),
    }
}

/// Subsets for a Service and its selected pods (§3.2 steps 6–9, §3.3, §3.4); `true` when
/// truncated to 1000 addresses.
pub fn build_subsets<P: std::borrow::Borrow<Value>>(
    spec: &Value,
    service_name: &str,
    pods: &[P],
) -> (Vec<Value>, bool) {
    let publish = spec
        .get("publishNotReadyAddresses")
        .and_then(Value::as_bool)
        == Some(true);
    let cluster_ip = spec.get("clusterIP").and_then(Value::as_str).unwrap_or("");
    let family = spec
        .pointer("/ipFamilies/0")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| family_of(cluster_ip).map(str::to_string));
    let service_ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // port key (JSON) -> (port, addresses keyed by (ip, uid) with their ready flag)
    let mut by_port: BTreeMap<String, (Option<Value>, PortAddresses)> = BTreeMap::new();
    for pod in pods {
        let pod: &Value = pod.borrow();
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        let mut ips: Vec<String> = pod
            .pointer("/status/podIPs")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(|e| e.get("ip").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = pod
                .pointer("/status/podIP")
                .and_then(Value::as_str)
                .filter(|ip| !ip.is_empty())
        {
            ips.push(ip.to_string());
        }
        if ips.is_empty() {
            continue;
        }
        if !publish && !meta::meta_str(pod, "deletionTimestamp").is_empty() {
            continue;
        }
        let wanted = family
            .clone()
            .or_else(|| family_of(&ips[0]).map(str::to_string));
        let Some(ip) = ips
            .iter()
            .find(|ip| family_of(ip).map(str::to_string) == wanted)
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            continue;
        };
        // An address Endpoints may not hold (loopback, link-local, unspecified) would make
        // the whole write fail validation and keep every other pod of the Service out too:
        // such a pod is left out instead.
        if capstan_machinery::ip::special_problem(ip, &ip.to_string()).is_some() {
            continue;
        }
        let mut address = Map::new();
        address.insert("ip".into(), json!(ip.to_string()));
        let hostname = pod
            .pointer("/spec/hostname")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !hostname.is_empty()
            && pod.pointer("/spec/subdomain").and_then(Value::as_str) == Some(service_name)
        {
            address.insert("hostname".into(), json!(hostname));
        }
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !node.is_empty() {
            address.insert("nodeName".into(), json!(node));
        }
        let uid = meta::meta_str(pod, "uid").to_string();
        address.insert(
            "targetRef".into(),
            json!({"kind": "Pod", "namespace": meta::namespace(pod), "name": meta::name(pod), "uid": uid}),
        );
        let address = Value::Object(address);
        let is_ready = publish || capstan_resources::pod::is_ready(pod);
        let mut add = |port: Option<Value>| {
            let key = port.as_ref().map_or_else(String::new, |p| p.to_string());
            let entry = by_port
                .entry(key)
                .or_insert_with(|| (port, BTreeMap::new()));
            let slot = entry
                .1
                .entry((ip.to_string(), uid.clone()))
                .or_insert((address.clone(), is_ready));
            slot.1 &= is_ready; // not-ready wins
        };
        if service_ports.is_empty() {
            if cluster_ip == "None" {
                add(None);
            }
            continue;
        }
        for service_port in &service_ports {
            let Some(port) = target_port(service_port, pod) else {
                continue;
            };
            let mut endpoint_port = Map::new();
            if let Some(name) = service_port
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                endpoint_port.insert("name".into(), json!(name));
            }
            endpoint_port.insert("port".into(), json!(port));
            endpoint_port.insert(
                "protocol".into(),
                json!(
                    service_port
                        .get("protocol")
                        .and_then(Value::as_str)
                        .unwrap_or("TCP")
                ),
            );
            if let Some(app) = service_port.get("appProtocol") {
                endpoint_port.insert("appProtocol".into(), app.clone());
            }
            add(Some(Value::Object(endpoint_port)));
        }
    }
    // Ports with identical address sets share a subset.
    let mut groups: Vec<(Vec<Value>, Vec<Entry>)> = Vec::new();
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
    let sort_key = |p: &Value| {
        (
            p.get("port").and_then(Value::as_i64).unwrap_or(0),
            p.get("protocol")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            p.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            p.get("appProtocol")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        )
    };
    let mut subsets: Vec<(Vec<Value>, Vec<Value>, Vec<Value>)> = groups
        .into_iter()
        .map(|(mut ports, mut list)| {
            ports.sort_by_key(sort_key);
            list.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()).then(a.1.cmp(&b.1)));
            let (ready, not_ready): (Vec<Entry>, Vec<Entry>) = list.into_iter().partition(|e| e.3);
            let ready: Vec<Value> = ready.into_iter().map(|e| e.2).collect();
            let not_ready: Vec<Value> = not_ready.into_iter().map(|e| e.2).collect();
            (ready, not_ready, ports)
        })
        .collect();
    subsets.sort_by_key(|(ready, not_ready, ports)| {
        (
            ports.first().map(sort_key),
            ready
                .first()
                .or(not_ready.first())
                .and_then(|a| a.get("ip"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        )
    });
    let total: usize = subsets.iter().map(|(r, n, _)| r.len() + n.len()).sum();
    let truncated = total > MAX_ADDRESSES;
    if truncated {
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
    }
    let subsets = subsets
        .into_iter()
        .filter(|(r, n, _)| !r.is_empty() || !n.is_empty())
        .map(|(ready, not_ready, ports)| {
            let mut subset = Map::new();
            if !ready.is_empty() {
                subset.insert("addresses".into(), Value::Array(ready));
            }
            if !not_ready.is_empty() {
                subset.insert("notReadyAddresses".into(), Value::Array(not_ready));
            }
            if !ports.is_empty() {
                subset.insert("ports".into(), Value::Array(ports));
            }
            Value::Object(subset)
        })
        .collect();
    (subsets, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(name: &str, app: &str) -> Option<Arc<Value>> {
        Some(Arc::new(pod_view(&json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": app, "tier": "x"}},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}, {"type": "Other"}]},
        }))))
    }

    fn names(index: &Index, service: &str) -> Vec<String> {
        index
            .members(&("ns".into(), service.into()))
            .iter()
            .map(|p| meta::name(p).to_string())
            .collect()
    }

    #[test]
    fn the_index_follows_labels_selectors_and_deletions() {
        let mut index = Index::default();
        let key: Key = ("ns".into(), "web".into());
        index.pod_changed("ns", "p1", labelled("p1", "web"));
        index.pod_changed("ns", "p2", labelled("p2", "db"));
        let selector = json!({"app": "web", "tier": "x"});
        index.set_selector(&key, selector.as_object());
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
        // Deletion wakes the Service that selected the pod.
        assert_eq!(index.pod_changed("ns", "p2", None), vec![key.clone()]);
        assert!(names(&index, "web").is_empty());
        // A changed selector re-reads the pods; a removed one forgets them.
        index.set_selector(&key, json!({"app": "db"}).as_object());
        assert_eq!(names(&index, "web"), ["p1", "p3"]);
        // A Service not replayed after a watch restart was deleted meanwhile: forgotten.
        assert_eq!(
            index.forget_services_except(&HashSet::new()),
            vec![key.clone()]
        );
        assert!(names(&index, "web").is_empty());
        index.set_selector(&key, json!({"app": "db"}).as_object());
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
        let view = labelled("p1", "web").unwrap_or_default();
        assert_eq!(view["metadata"]["labels"]["app"], "web");
        assert_eq!(view["status"]["podIP"], "10.0.0.1");
        assert_eq!(
            view["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
        assert!(capstan_resources::pod::is_ready(&view));
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

    fn pod(name: &str, ip: &str, ready_status: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
               "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": ready_status}]}})
    }

    #[test]
    fn ready_and_unready_pods_with_a_named_target_port() {
        let spec = json!({"clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"], "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]});
        let pods = [
            pod("p2", "10.244.0.12", "True"),
            pod("p1", "10.244.0.11", "True"),
            pod("p3", "10.244.0.13", "False"),
        ];
        let (subsets, truncated) = build_subsets(&spec, "web", &pods);
        assert!(!truncated);
        assert_eq!(subsets.len(), 1);
        let ips: Vec<&str> = subsets[0]["addresses"]
            .as_array()
            .expect("addresses")
            .iter()
            .filter_map(|a| a["ip"].as_str())
            .collect();
        assert_eq!(ips, ["10.244.0.11", "10.244.0.12"]);
        assert_eq!(subsets[0]["notReadyAddresses"][0]["ip"], "10.244.0.13");
        assert_eq!(
            subsets[0]["ports"],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
        );
        assert_eq!(subsets[0]["addresses"][0]["targetRef"]["kind"], "Pod");
    }

    #[test]
    fn a_pod_with_an_address_endpoints_cannot_hold_is_left_out() {
        let spec = json!({"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": 8080}]});
        let pods = vec![
            pod("good", "10.244.0.5", "True"),
            pod("loopback", "127.0.0.1", "True"),
            pod("link-local", "169.254.1.1", "True"),
        ];
        let (subsets, _) = build_subsets(&spec, "web", &pods);
        let ips: Vec<&str> = subsets[0]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["ip"].as_str())
            .collect();
        assert_eq!(ips, ["10.244.0.5"]);
    }

    #[test]
    fn more_than_a_thousand_addresses_are_truncated() {
        let spec = json!({"clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"], "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}]});
        let pods: Vec<Value> = (0..1001)
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
        assert_eq!(subsets[0]["addresses"].as_array().map(Vec::len), Some(1000));
    }
}
