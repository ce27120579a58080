//! The endpoints controller (`spec/endpoints.md` §3).

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use capstan_machinery::labels::LabelSelector;
use capstan_machinery::meta;
use capstan_registry::cache::EventType;
use capstan_registry::watch::{WatchItem, WatchOptions, WatchStart};
use capstan_registry::{DeleteOptions, ListOptions, ReadAt, Registry, WriteOptions};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

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
    selectors: std::sync::Mutex<std::collections::HashMap<Key, LabelSelector>>,
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

fn watch_all(registry: &Registry, end_bookmark: bool) -> capstan_registry::watch::Watcher {
    registry.watch(
        "",
        WatchOptions {
            labels: LabelSelector::default(),
            fields: capstan_machinery::fields::FieldSelector::default(),
            start: WatchStart::Initial { end_bookmark },
        },
    )
}

impl EndpointsController {
    /// A controller over these three registries.
    pub fn new(services: Arc<Registry>, pods: Arc<Registry>, endpoints: Arc<Registry>) -> Self {
        EndpointsController {
            services,
            pods,
            endpoints,
            triggers: std::sync::Mutex::new(std::collections::HashMap::new()),
            selectors: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Runs in background tasks for the life of the process.
    pub fn start(self) {
        let controller = Arc::new(self);
        let (queue, mut work) = mpsc::unbounded_channel::<Key>();
        // Services: every change syncs that Service; their selectors are remembered so a pod
        // change only wakes the Services that select (or selected) it.
        {
            let queue = queue.clone();
            let controller = controller.clone();
            tokio::spawn(async move {
                loop {
                    let mut watcher = watch_all(&controller.services, false);
                    while let Some(item) = watcher.next().await {
                        if let WatchItem::Event(kind, object) = item {
                            let s = &object.selectable;
                            let key: Key = (meta::namespace(s).into(), meta::name(s).into());
                            let selector = (kind != EventType::Deleted)
                                .then(|| {
                                    object
                                        .object()
                                        .pointer("/spec/selector")
                                        .and_then(Value::as_object)
                                        .cloned()
                                })
                                .flatten()
                                .filter(|m| !m.is_empty());
                            {
                                let mut selectors = controller
                                    .selectors
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner());
                                match selector {
                                    Some(selector) => {
                                        selectors.insert(
                                            key.clone(),
                                            LabelSelector::from_map(&selector),
                                        );
                                    }
                                    None => {
                                        selectors.remove(&key);
                                    }
                                }
                            }
                            let _ = queue.send(key);
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            });
        }
        // Pods: a change wakes the Services whose selector matches the pod's labels now or
        // matched them before.
        {
            let queue = queue.clone();
            let controller = controller.clone();
            tokio::spawn(async move {
                let mut last_labels: std::collections::HashMap<
                    std::sync::Arc<str>,
                    Map<String, Value>,
                > = std::collections::HashMap::new();
                loop {
                    let mut watcher = watch_all(&controller.pods, false);
                    while let Some(item) = watcher.next().await {
                        if let WatchItem::Event(kind, object) = item {
                            let namespace = meta::namespace(&object.selectable).to_string();
                            let labels = object
                                .selectable
                                .pointer("/metadata/labels")
                                .and_then(Value::as_object)
                                .cloned()
                                .unwrap_or_default();
                            let before = if kind == EventType::Deleted {
                                last_labels.remove(&object.key)
                            } else {
                                last_labels.insert(object.key.clone(), labels.clone())
                            };
                            let selectors = controller
                                .selectors
                                .lock()
                                .unwrap_or_else(|e| e.into_inner());
                            for ((ns, name), selector) in selectors.iter() {
                                if *ns == namespace
                                    && (selector.matches(Some(&labels))
                                        || before
                                            .as_ref()
                                            .is_some_and(|b| selector.matches(Some(b))))
                                {
                                    let _ = queue.send((ns.clone(), name.clone()));
                                }
                            }
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            });
        }
        // Endpoints: at start-up every existing one is checked (orphans of deleted Services go);
        // later only deletions matter (a deleted Endpoints of a live Service is re-created).
        {
            let queue = queue.clone();
            let controller = controller.clone();
            tokio::spawn(async move {
                loop {
                    let mut watcher = watch_all(&controller.endpoints, true);
                    let mut initial = true;
                    while let Some(item) = watcher.next().await {
                        match item {
                            WatchItem::Bookmark(_, true) => initial = false,
                            WatchItem::Event(kind, object) => {
                                let s = &object.selectable;
                                let leader = object.object().pointer("/metadata/annotations/control-plane.alpha.kubernetes.io~1leader").is_some();
                                if (initial && !leader) || kind == EventType::Deleted {
                                    let _ = queue
                                        .send((meta::namespace(s).into(), meta::name(s).into()));
                                }
                            }
                            _ => {}
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            });
        }
        tokio::spawn(async move {
            while let Some(first) = work.recv().await {
                let mut keys: HashSet<Key> = HashSet::from([first]);
                while let Ok(key) = work.try_recv() {
                    keys.insert(key);
                }
                for key in keys {
                    if let Err(error) = controller.sync(&key.0, &key.1).await {
                        tracing::debug!(namespace = %key.0, name = %key.1, %error, "endpoints sync failed; retrying");
                        let queue = queue.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            let _ = queue.send(key);
                        });
                    }
                }
            }
        });
    }

    /// The last-change-trigger-time (§3.5): the Service's creation on the first sync, then the
    /// earliest of the pod (Ready transition) and Service times that are newer than last seen.
    /// Timestamps are RFC 3339 strings in UTC, which order as text.
    fn trigger_time(&self, key: &Key, service: &Value, pods: &[Value]) -> String {
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
        let pods = self
            .pods
            .list(
                namespace,
                &ListOptions {
                    labels: LabelSelector::from_map(selector),
                    read_at: ReadAt::Latest,
                    ..ListOptions::default()
                },
            )
            .await
            .map_err(|e| e.message)?;
        let pods: Vec<Value> = pods.items.iter().map(|o| o.object()).collect();
        let (subsets, truncated) = build_subsets(&spec, name, &pods);
        let trigger =
            self.trigger_time(&(namespace.to_string(), name.to_string()), &service, &pods);

        let current = match self.endpoints.get(namespace, name, ReadAt::Latest).await {
            Ok(current) => Some(current),
            Err(e) if e.code == 404 => None,
            Err(e) => return Err(e.message),
        };
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
        let mut desired = current
            .clone()
            .unwrap_or_else(|| json!({"metadata": {"name": name, "namespace": namespace}}));
        let metadata = meta::metadata_mut(&mut desired);
        metadata.insert("labels".into(), Value::Object(labels));
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .map(|a| {
                if truncated {
                    a.insert(OVER_CAPACITY.into(), json!("truncated"));
                } else {
                    a.remove(OVER_CAPACITY);
                }
                if trigger.is_empty() {
                    a.remove(TRIGGER_TIME);
                } else {
                    a.insert(TRIGGER_TIME.into(), json!(trigger));
                }
                a.is_empty()
            });
        if annotations == Some(true) {
            metadata.remove("annotations");
        }
        if let Value::Object(map) = &mut desired {
            if subsets.is_empty() {
                map.remove("subsets");
            } else {
                map.insert("subsets".into(), Value::Array(subsets));
            }
        }
        match current {
            Some(current) => {
                // §3.2 step 10: nothing to write when subsets and labels already match and
                // nothing is over capacity (the trigger-time annotation alone never causes a
                // write, so a restart rewrites nothing).
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
                        .cloned()
                        .filter(|s| s.as_array().is_some_and(|a| !a.is_empty()))
                };
                let managed = current
                    .pointer("/metadata/labels")
                    .and_then(|l| l.get(MANAGED_BY))
                    .is_some();
                let over = current
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(OVER_CAPACITY))
                    .is_some();
                if managed
                    && !truncated
                    && !over
                    && subsets_of(&current) == subsets_of(&desired)
                    && strip(&current) == strip(&desired)
                {
                    return Ok(());
                }
                self.endpoints
                    .update(namespace, name, desired, &write, false)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message)
            }
            None => match self.endpoints.create(namespace, desired, &write).await {
                Ok(_) => Ok(()),
                Err(e) if e.code == 403 => Ok(()), // namespace terminating
                Err(e) => Err(e.message),
            },
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
pub fn build_subsets(spec: &Value, service_name: &str, pods: &[Value]) -> (Vec<Value>, bool) {
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
        let signature: Vec<(String, String, bool)> = list
            .iter()
            .map(|(ip, uid, _, r)| (ip.clone(), uid.clone(), *r))
            .collect();
        match groups.iter_mut().find(|(_, l)| {
            l.iter()
                .map(|(ip, uid, _, r)| (ip.clone(), uid.clone(), *r))
                .collect::<Vec<_>>()
                == signature
        }) {
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
            let ready: Vec<Value> = list.iter().filter(|e| e.3).map(|e| e.2.clone()).collect();
            let not_ready: Vec<Value> = list.iter().filter(|e| !e.3).map(|e| e.2.clone()).collect();
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
