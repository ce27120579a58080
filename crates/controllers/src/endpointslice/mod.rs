//! The EndpointSlice controller: the EndpointSlices of every selector Service, from the pods
//! it selects, at most `--max-endpoints-per-slice` endpoints a slice, with zones from the
//! Nodes. It reads Services and Pods through the shared informers ([`ServicePods`]), its own
//! slices and the Nodes through informers of its own; [`reconcile`] plans, this module writes.

mod reconcile;

use std::sync::Arc;

use capstan_machinery::ApiError;
use capstan_machinery::hash::HashMap;
use capstan_registry::Registry;
use capstan_registry::decode::from_json_without_managed_fields;
use capstan_resources::discovery::endpointslice::{
    CONTROLLER_NAME, MANAGED_BY_LABEL, SERVICE_NAME_LABEL,
};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::runtime::{Backoff, Controller, Informer, Key, OwnWrites, Progress, WorkQueue};
use crate::service_pods::{Selection, ServicePods, TriggerTimes};

pub(crate) use reconcile::{EndpointKey, endpoint_key, equal_beyond_key};
use reconcile::{Inputs, Plan, reconcile};

/// Keeps the EndpointSlices of every selector Service: what it knows of nodes and of its own
/// slices, its queue, and the writes.
pub struct EndpointSliceController {
    shared: Arc<ServicePods>,
    slices: Arc<Registry>,
    nodes: Arc<Registry>,
    max: usize,
    state: std::sync::Mutex<SliceState>,
    queue: Arc<WorkQueue<Key>>,
    /// Each Service's last slice write, and how far the slice watch has filed them.
    own: OwnWrites<Key>,
    triggers: TriggerTimes,
    workers: usize,
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
    index: HashMap<Key, std::collections::BTreeSet<String>>,
    /// The other way: each indexed slice (namespace, name) → its Service.
    service_of: HashMap<Key, Key>,
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
    kept: HashMap<Key, EndpointSlice>,
}

/// A slice's identity as its watch event's metadata tells it.
#[derive(serde::Deserialize, Default)]
struct SliceMetaFields {
    uid: Option<String>,
    generation: Option<i64>,
}

impl EndpointSliceController {
    /// A controller of `slices`, reading Services and Pods through `shared` and zones from
    /// `nodes`: at most `max_per_slice` endpoints a slice (1–1000), up to `workers` Services
    /// synced at once (upstream's `--concurrent-service-endpoint-syncs`; at least one).
    pub fn new(
        shared: Arc<ServicePods>,
        (slices, nodes): (Arc<Registry>, Arc<Registry>),
        max_per_slice: usize,
        workers: usize,
    ) -> Self {
        let queue = Arc::new(WorkQueue::with_backoff(Backoff::ENDPOINT_SLICES));
        shared.subscribe(queue.clone());
        EndpointSliceController {
            shared,
            slices,
            nodes,
            max: max_per_slice.clamp(1, 1000),
            state: std::sync::Mutex::new(SliceState::default()),
            queue,
            own: Default::default(),
            triggers: TriggerTimes::default(),
            workers: workers.max(1),
        }
    }

    /// Runs until `group` stops, on a thread of its own (`eps-controller`), as upstream's
    /// runs apart from the endpoints controller, so neither waits for the other's writes.
    /// Syncs start once the shared informers and its node and slice informers have listed
    /// what exists.
    pub fn start(self, group: &crate::Group) -> std::io::Result<()> {
        group.within("eps-controller", || self.run())
    }

    fn run(self) {
        let controller = Arc::new(self);
        let own = controller.follow();
        Controller::new("endpointslice sync", controller.queue.clone())
            .workers(controller.workers)
            .after(controller.shared.synced().into_iter().chain(own))
            .run(move |key: Key| {
                let controller = controller.clone();
                async move { controller.sync_service(&key).await }
            });
    }

    /// One Service's sync: its slices reconciled with the pods it selects; nothing for a
    /// Service without a selector; a Service that is gone is forgotten (its slices go by
    /// their owner reference, through the garbage collector).
    async fn sync_service(&self, key: &Key) -> Result<(), ApiError> {
        match self.shared.selected(key)? {
            Selection::Pods(service, pods) => {
                let trigger = || self.triggers.of(key, &service, &pods);
                self.sync(key, &service, &pods, trigger).await
            }
            Selection::Skip => Ok(()),
            Selection::Gone => {
                self.own.forget(key);
                self.triggers.forget(key);
                Ok(())
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SliceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows nodes (zones) and slices (the index; a Service is synced again when someone
    /// else changed or deleted one of its slices).
    fn follow(self: &Arc<Self>) -> [Progress; 2] {
        use capstan_registry::cache::EventType;
        let queue = self.queue.clone();
        let writer = self.clone();
        let nodes = Informer::new(self.nodes.clone())
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
        let indexed = Informer::new(self.slices.clone())
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
    fn existing(&self, key: &Key) -> Vec<EndpointSlice> {
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
    async fn sync(
        &self,
        key: &Key,
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
        key: &Key,
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
                && let Some(queue) = Some(&self.queue)
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
        key: &Key,
        slice: &EndpointSlice,
    ) -> Result<(), capstan_machinery::ApiError> {
        let uid = slice.metadata.uid.clone().unwrap_or_default();
        self.state().tracked.insert(uid, -1);
        delete_slice(&self.slices, &self.own, key, slice).await
    }

    /// Remembers a slice this controller wrote.
    fn record(&self, key: &Key, object: &serde_json::Value) {
        let uid = capstan_machinery::meta::meta_str(object, "uid").to_string();
        self.state().tracked.insert(uid, generation_of(object));
        self.own.record(key, object);
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
    own: &OwnWrites<Key>,
    key: &Key,
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
