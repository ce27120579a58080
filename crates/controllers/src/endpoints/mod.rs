//! The endpoints controller: the Endpoints of every selector Service, equal to the ready and
//! not-ready addresses of the Pods it selects. It reads Services and Pods through the shared
//! informers ([`ServicePods`]), its own Endpoints through an informer of its own, and writes
//! through the registry; the registry's JSON is decoded at the edge.

mod subsets;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use capstan_machinery::ApiError;
use capstan_registry::cache::EventType;
use capstan_registry::{DeleteOptions, Registry, Subresource, WriteOptions};
use k8s_openapi::api::core::v1::{EndpointSubset, Endpoints, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::runtime::{Controller, Informer, Key, WorkQueue, key_of};
use crate::service_pods::{Labels, Selection, ServicePods, TriggerTimes};

pub(crate) use subsets::{build_subsets, repack};

/// Marks an Endpoints whose addresses were cut to [`subsets`]' limit.
const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// The label naming who keeps an Endpoints (this controller's value: `endpoint-controller`).
const MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
/// The label that marks a headless Service's Endpoints.
const HEADLESS: &str = "service.kubernetes.io/headless";
/// The field manager of the controller's writes.
const MANAGER: &str = "kube-controller-manager";
/// The annotation of an Endpoints used as a leader-election lock: never an orphan.
const LEADER: &str = "control-plane.alpha.kubernetes.io/leader";
/// When the change an Endpoints shows began (upstream's last-change-trigger-time).
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Keeps Endpoints in step with Services and Pods.
pub struct EndpointsController {
    shared: Arc<ServicePods>,
    endpoints: Arc<Registry>,
    queue: Arc<WorkQueue<Key>>,
    triggers: TriggerTimes,
    workers: usize,
}

/// A sync that did not complete (it is retried with back-off).
#[derive(Debug, thiserror::Error)]
enum SyncError {
    /// The registry refused a read or write.
    #[error("{}", .0.message)]
    Api(#[from] ApiError),
}

impl EndpointsController {
    /// A controller of `endpoints`, reading Services and Pods through `shared`, syncing up to
    /// `workers` Services at once (upstream's `--concurrent-endpoint-syncs`; at least one).
    pub fn new(shared: Arc<ServicePods>, endpoints: Arc<Registry>, workers: usize) -> Self {
        let queue = Arc::new(WorkQueue::default());
        shared.subscribe(queue.clone());
        EndpointsController {
            shared,
            endpoints,
            queue,
            triggers: TriggerTimes::default(),
            workers: workers.max(1),
        }
    }

    /// Runs until `group` stops, on a thread of its own (`ep-controller`), as upstream's runs
    /// in its own process: its work never queues behind API requests on the server's workers,
    /// and its CPU use can be read per thread. Syncs start once the shared informers and its
    /// Endpoints informer have listed what exists.
    pub fn start(self, group: &crate::Group) -> std::io::Result<()> {
        group.within("ep-controller", || self.run())
    }

    fn run(self) {
        let controller = Arc::new(self);
        // Endpoints: at start-up every existing one is checked (orphans of deleted Services
        // go); later only deletions matter (a deleted Endpoints of a live Service is
        // re-created).
        let queue = controller.queue.clone();
        let endpoints_synced = Informer::new(controller.endpoints.clone())
            .on_change(move |kind, object, listing| {
                // Only the start-up pass reads the object (for the leader annotation); later
                // events are not decoded at all.
                let orphan_check = listing
                    && serde_json::from_slice::<Endpoints>(&object.lean_json())
                        .ok()
                        .and_then(|e| e.metadata.annotations)
                        .is_none_or(|a| !a.contains_key(LEADER));
                if orphan_check || kind == EventType::Deleted {
                    queue.add(key_of(&object.selectable));
                }
            })
            .start();
        // Upstream's default of five concurrent syncs: a sync waits for its durable write,
        // and others proceed meanwhile; one key is never synced twice at once.
        Controller::new("endpoints sync", controller.queue.clone())
            .workers(controller.workers)
            .after(
                controller
                    .shared
                    .synced()
                    .into_iter()
                    .chain([endpoints_synced]),
            )
            .run(move |key: Key| {
                let controller = controller.clone();
                async move { controller.sync(&key.0, &key.1).await }
            });
    }

    async fn sync(&self, namespace: &str, name: &str) -> Result<(), SyncError> {
        let key = (namespace.to_string(), name.to_string());
        let (service, pods) = match self.shared.selected(&key)? {
            Selection::Pods(service, pods) => (service, pods),
            Selection::Skip => return Ok(()),
            // The Service is gone: so are its Endpoints.
            Selection::Gone => {
                self.triggers.forget(&key);
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
            trigger: self.triggers.of(&key, &service, &pods),
        };
        self.write(namespace, name, &desired).await
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
