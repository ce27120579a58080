//! What the endpoints and EndpointSlice controllers share, as kube-controller-manager's
//! controllers share one informer factory: the Service and Pod informers, the index of which
//! pods each selector matches, the Services as a sync reads them, and how a trigger time is
//! worked out. Each controller keeps its own queue (fed by these informers), its own
//! informers of what it writes, and its own trigger times.

mod index;
mod pods;

use std::sync::{Arc, Mutex, MutexGuard};

use capstan_machinery::ApiError;
use capstan_machinery::hash::{HashMap, HashMapExt};
use capstan_registry::Registry;
use capstan_registry::cache::EventType;
use capstan_storage::Revision;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::runtime::{Informer, Key, Progress, Store, WorkQueue, key_of};

use index::Index;
pub(crate) use index::Labels;
pub(crate) use pods::{canonical, pod_view_of_json, ready_condition, target_port};

/// At most this many decoded Services are kept: the two controllers' syncs of a change come
/// within milliseconds of each other, and a few hundred decoded Services are well under a
/// megabyte.
const KEPT_SERVICES: usize = 256;

/// The Service and Pod informers the two controllers share, and what they index.
pub struct ServicePods {
    services: Arc<Registry>,
    pods: Arc<Registry>,
    index: Mutex<Index>,
    /// The Services as a sync reads them ([`service_as_read`]), decoded once per revision:
    /// both controllers sync a changed Service, and a pod's change syncs its Services again,
    /// from the same revision.
    services_read: Store<Service>,
    /// The controllers' queues, each fed every Service change that matters.
    subscribers: Mutex<Vec<Arc<WorkQueue<Key>>>>,
    /// How far the Service and Pod informers have got (told once they run).
    progress: [(tokio::sync::watch::Sender<Option<Revision>>, Progress); 2],
}

/// What a sync found for its Service.
pub(crate) enum Selection {
    /// The Service and the pods its selector matches.
    Pods(Arc<Service>, Vec<Arc<Pod>>),
    /// A Service without a selector, or an ExternalName: nothing to keep.
    Skip,
    /// The Service is gone.
    Gone,
}

impl ServicePods {
    /// The shared informers of these Services and Pods (started by [`ServicePods::start`]).
    pub fn new(services: Arc<Registry>, pods: Arc<Registry>) -> Self {
        ServicePods {
            services_read: Store::new(services.clone(), KEPT_SERVICES, service_as_read),
            services,
            pods,
            index: Mutex::new(Index::default()),
            subscribers: Mutex::new(Vec::new()),
            progress: [(); 2].map(|()| tokio::sync::watch::channel(None)),
        }
    }

    /// Feeds `queue` every Service change that matters (to subscribe before [`Self::start`]).
    pub(crate) fn subscribe(&self, queue: Arc<WorkQueue<Key>>) {
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(queue);
    }

    /// How far the Service and Pod informers have got: a controller's workers wait for both.
    pub(crate) fn synced(&self) -> [Progress; 2] {
        [self.progress[0].1.clone(), self.progress[1].1.clone()]
    }

    /// The pod/selector index, locked (a lock poisoned by a panicking holder is taken over).
    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the two informers on a thread of their own (`svc-pod-informers`) until `group`
    /// stops: every Service change, and every pod change that matters to a Service, queues
    /// that Service for each subscriber.
    pub fn start(self: &Arc<Self>, group: &crate::Group) -> std::io::Result<()> {
        let queues = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        let queues = Arc::new(queues.clone());
        group.within("svc-pod-informers", || self.run(&queues))
    }

    fn run(self: &Arc<Self>, queues: &Arc<Vec<Arc<WorkQueue<Key>>>>) {
        let wake = |queues: &Arc<Vec<Arc<WorkQueue<Key>>>>, keys: Vec<Key>| {
            for key in keys {
                for queue in queues.iter() {
                    queue.add(key.clone());
                }
            }
        };
        // Services: every change syncs that Service; their selectors are remembered so a pod
        // change only wakes the Services that select (or selected) it. Services known from
        // before a watch restart and not replayed were deleted meanwhile.
        let (on_change, on_replayed) = (self.clone(), self.clone());
        let (change_queues, replay_queues) = (queues.clone(), queues.clone());
        Informer::new(self.services.clone())
            .on_change(move |kind, object, _| {
                // Only the selector is decoded, found without reading the rest.
                let selector = (kind != EventType::Deleted)
                    .then(|| object.member(&["spec", "selector"]))
                    .flatten()
                    .and_then(|s| serde_json::from_slice::<Option<Labels>>(s).ok())
                    .flatten()
                    .filter(|m| !m.is_empty());
                let key = key_of(&object.selectable);
                on_change.index().set_selector(&key, selector.as_ref());
                wake(&change_queues, vec![key]);
            })
            .on_replayed(move |seen| {
                let gone = on_replayed.index().forget_services_except(seen);
                wake(&replay_queues, gone);
            })
            .start_reporting(self.progress[0].0.clone());
        // Pods: a change wakes the Services whose selector matches the pod's labels now or
        // matched them before. Pods indexed before a restart and not replayed are gone.
        let (on_change, on_replayed) = (self.clone(), self.clone());
        let (change_queues, replay_queues) = (queues.clone(), queues.clone());
        Informer::new(self.pods.clone())
            .on_change(move |kind, object, _| {
                let s = &object.selectable;
                let view = (kind != EventType::Deleted)
                    .then(|| pod_view_of_json(&object.lean_json()))
                    .flatten()
                    .map(Arc::new);
                let keys = on_change.index().pod_changed(s.namespace(), s.name(), view);
                wake(&change_queues, keys);
            })
            .on_replayed(move |seen| {
                let keys = on_replayed.index().forget_pods_except(seen);
                wake(&replay_queues, keys);
            })
            .start_reporting(self.progress[1].0.clone());
    }

    /// What a sync works from: the Service and the pods its selector matches, as the watches
    /// last showed them (as upstream's controllers read their informers); `Gone` when the
    /// Service is, `Skip` when it has no selector or is an ExternalName.
    pub(crate) fn selected(&self, key: &Key) -> Result<Selection, ApiError> {
        let Some(service) = self.services_read.get(&key.0, &key.1)? else {
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
}

/// The Service as a sync reads it: its labels, identity, creation and deletion times and spec
/// (upstream's controllers read their informer's cache the same way), without decoding the
/// rest.
fn service_as_read(json: &[u8], namespace: &str, name: &str) -> Result<Service, String> {
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
    let read: Read = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    Ok(Service {
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
    })
}

/// What the trigger time is computed from: the times last seen of each pod and of the Service.
#[derive(Default)]
struct TriggerState {
    /// Pod UID → its Ready condition's last transition (pods without one are left out).
    pods: HashMap<String, Time>,
    service: Option<Time>,
}

/// The trigger times one controller has worked out, per Service.
#[derive(Default)]
pub(crate) struct TriggerTimes(Mutex<HashMap<Key, TriggerState>>);

impl TriggerTimes {
    /// The last-change-trigger-time: the Service's creation on the first sync, then the
    /// earliest of the pod (Ready transition) and Service times that are newer than last seen;
    /// `""` for none.
    pub(crate) fn of(&self, key: &Key, service: &Service, pods: &[Arc<Pod>]) -> String {
        let created = service.metadata.creation_timestamp.clone();
        let mut triggers = self.0.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Forgets a Service that is gone.
    pub(crate) fn forget(&self, key: &Key) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// An RFC 3339 time as the API writes it.
fn time_text(time: &Time) -> String {
    match serde_json::to_value(time) {
        Ok(serde_json::Value::String(text)) => text,
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests;
