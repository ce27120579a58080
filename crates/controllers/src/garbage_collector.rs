//! The garbage collector: objects whose owners are gone go too, as upstream's
//! (`pkg/controller/garbagecollector`) decides, for every kind Capstan serves.
//!
//! - **Background** (the default): the owner is deleted at once; a dependent whose every
//!   owner reference is dangling (no such object, or one with another UID) is deleted, and a
//!   dependent that still has a live owner loses only the dangling references.
//! - **Orphan**: the owner carries the `orphan` finalizer; every dependent loses its
//!   reference to it, then the finalizer goes and the owner with it.
//! - **Foreground**: the owner carries `foregroundDeletion`; its dependents are deleted
//!   (in the foreground themselves when they have dependents), and the finalizer goes once no
//!   dependent with `blockOwnerDeletion` remains.
//!
//! Dependents are found from the watch of every kind (upstream's graph of owner UIDs). As
//! upstream's graph builder, a dependent whose owners the watches have all shown is left be
//! until an owner goes; one naming an owner not (yet) seen is judged by reading its owners at
//! the latest revision, so an owner created just before its dependent is never taken for
//! absent.

use capstan_machinery::hash::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use capstan_machinery::ApiError;
use capstan_registry::cache::EventType;
use capstan_registry::{DeleteOptions, ReadAt, Registry, Subresource, WriteOptions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

use crate::runtime::{Controller, Informer, Key, WorkQueue, key_of};

const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";
const MANAGER: &str = "kube-controller-manager";
/// Upstream's `--concurrent-gc-syncs` is 20; deletions here are local calls.
const WORKERS: usize = 4;

/// An object: its kind (an index into the collector's registries), namespace and name.
type Ref = (usize, String, String);

/// What the collector was asked to look at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Work {
    /// A dependent: are its owners still there? (upstream's attemptToDelete)
    Dependent(Ref),
    /// An owner being deleted with `orphan`: release its dependents.
    Orphan(Ref),
    /// An owner being deleted with `foregroundDeletion`: are its blocking dependents gone?
    Foreground(Ref),
}

/// The part of an object's metadata the collector reads.
#[derive(Debug, Default, serde::Deserialize)]
struct Meta {
    #[serde(default)]
    metadata: MetaFields,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    uid: Option<String>,
    deletion_timestamp: Option<String>,
    finalizers: Option<Vec<String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

impl MetaFields {
    fn uid(&self) -> &str {
        self.uid.as_deref().unwrap_or_default()
    }

    fn has_finalizer(&self, name: &str) -> bool {
        self.finalizers.iter().flatten().any(|f| f == name)
    }

    fn deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    fn owners(&self) -> &[OwnerReference] {
        self.owner_references.as_deref().unwrap_or_default()
    }
}

/// Who owns whom, by UID, as the watches last showed.
#[derive(Default)]
struct Graph {
    /// Every object with owner references: its UID and its owners' UIDs.
    objects: HashMap<Ref, (String, Vec<String>)>,
    /// Dependents by their owner's UID.
    dependents: HashMap<String, HashSet<Ref>>,
    /// UIDs of the objects seen, to find an owner's dependents when it is deleted.
    uids: HashMap<Ref, String>,
    /// The objects seen, by UID.
    by_uid: HashMap<String, Ref>,
    /// UIDs of the objects seen being deleted in the foreground.
    waiting: HashSet<String>,
}

impl Graph {
    /// Records an object; returns the owner UIDs it no longer references.
    fn set(&mut self, object: &Ref, uid: &str, owners: Vec<String>) -> Vec<String> {
        if !uid.is_empty()
            && let Some(previous) = self.uids.insert(object.clone(), uid.to_string())
            && previous != uid
        {
            self.by_uid.remove(&previous);
        }
        if !uid.is_empty() {
            self.by_uid.insert(uid.to_string(), object.clone());
        }
        let before = self
            .objects
            .remove(object)
            .map(|(_, owners)| owners)
            .unwrap_or_default();
        for owner in &before {
            if let Some(set) = self.dependents.get_mut(owner) {
                set.remove(object);
                if set.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
        for owner in &owners {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .insert(object.clone());
        }
        let dropped = before.into_iter().filter(|o| !owners.contains(o)).collect();
        if !owners.is_empty() {
            self.objects
                .insert(object.clone(), (uid.to_string(), owners));
        }
        dropped
    }

    /// Forgets a deleted object; returns its UID and its owners' UIDs.
    fn remove(&mut self, object: &Ref) -> (Option<String>, Vec<String>) {
        let owners = self.set(object, "", Vec::new());
        let uid = self.uids.remove(object);
        if let Some(uid) = &uid {
            self.by_uid.remove(uid);
            self.waiting.remove(uid);
        }
        (uid, owners)
    }

    fn dependents_of(&self, uid: &str) -> Vec<Ref> {
        self.dependents
            .get(uid)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn find(&self, uid: &str) -> Option<Ref> {
        self.by_uid.get(uid).cloned()
    }
}

/// Deletes what has lost its owners.
pub struct GarbageCollector {
    kinds: Vec<Arc<Registry>>,
    graph: Mutex<Graph>,
}

/// What one owner reference turned out to be.
enum Owner {
    /// Exists with the referenced UID, and is not deleting its dependents first.
    Solid,
    /// Gone, or replaced by an object with another UID.
    Dangling,
    /// Being deleted in the foreground: its dependents go first.
    Waiting,
    /// Of a kind Capstan does not serve (upstream retries until it knows the kind): left be.
    Unknown,
}

fn write_options() -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_manager: MANAGER.into(),
        applied: false,
    }
}

impl GarbageCollector {
    /// A collector over every kind served.
    pub fn new(kinds: Vec<Arc<Registry>>) -> Self {
        GarbageCollector {
            kinds,
            graph: Mutex::new(Graph::default()),
        }
    }

    fn graph(&self) -> MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs for the life of the process.
    pub fn start(self) {
        let collector = Arc::new(self);
        let queue = Arc::new(WorkQueue::<Work>::default());
        // Each kind's informer feeds the graph. What the graph holds of a kind beyond what a
        // (re)started watch lists was deleted while no watch ran, and is taken for deleted
        // (upstream's DeletedFinalStateUnknown).
        for kind in 0..collector.kinds.len() {
            let (on_change, on_replayed) = (collector.clone(), collector.clone());
            let (change_queue, replay_queue) = (queue.clone(), queue.clone());
            Informer::new(collector.kinds[kind].clone())
                .on_change(move |event, object, _| {
                    let (namespace, name) = key_of(&object.selectable);
                    let meta = object.decode_metadata::<MetaFields>().unwrap_or_default();
                    for work in on_change.observe(event, (kind, namespace, name), &meta) {
                        change_queue.add(work);
                    }
                })
                .on_replayed(move |listed| {
                    for work in on_replayed.forget_unlisted(kind, listed) {
                        replay_queue.add(work);
                    }
                })
                .start();
        }
        Controller::new("garbage collection", queue)
            .workers(WORKERS)
            .run(move |work: Work| {
                let collector = collector.clone();
                async move { collector.process(work).await }
            });
    }

    /// Takes every object of `kind` the graph holds and `listed` lacks for deleted; returns
    /// the work that calls for.
    fn forget_unlisted(&self, kind: usize, listed: &HashSet<Key>) -> Vec<Work> {
        let gone: Vec<Ref> = self
            .graph()
            .uids
            .keys()
            .filter(|r| r.0 == kind && !listed.contains(&(r.1.clone(), r.2.clone())))
            .cloned()
            .collect();
        gone.into_iter()
            .flat_map(|key| self.observe(EventType::Deleted, key, &MetaFields::default()))
            .collect()
    }

    /// Updates the graph from one watch event; returns the work it calls for.
    fn observe(&self, event: EventType, key: Ref, meta: &MetaFields) -> Vec<Work> {
        let mut work = Vec::new();
        let mut graph = self.graph();
        if event == EventType::Deleted {
            let (uid, owners) = graph.remove(&key);
            if let Some(uid) = uid {
                work.extend(graph.dependents_of(&uid).into_iter().map(Work::Dependent));
            }
            // An owner deleting in the foreground may be waiting for this one.
            work.extend(
                owners
                    .iter()
                    .filter_map(|o| graph.find(o))
                    .map(Work::Foreground),
            );
            return work;
        }
        // The name now holds another object (the one seen was deleted and re-created while no
        // watch ran): the old one's dependents lost their owner.
        if let Some(previous) = graph.uids.get(&key).cloned()
            && !meta.uid().is_empty()
            && previous != meta.uid()
        {
            graph.waiting.remove(&previous);
            work.extend(
                graph
                    .dependents_of(&previous)
                    .into_iter()
                    .map(Work::Dependent),
            );
        }
        let owners: Vec<String> = meta.owners().iter().map(|o| o.uid.clone()).collect();
        let known = graph.objects.get(&key).map(|(_, o)| o.clone());
        let dropped = graph.set(&key, meta.uid(), owners.clone());
        if meta.deleting() && meta.has_finalizer(FOREGROUND) {
            graph.waiting.insert(meta.uid().to_string());
        } else {
            graph.waiting.remove(meta.uid());
        }
        // As upstream's graph builder, new owner references are verified by a live read only
        // when an owner has not been observed (upstream's virtual nodes) or is itself waiting
        // for its dependents; an observed owner's deletion brings its dependents back.
        if known.as_ref() != Some(&owners)
            && meta
                .owners()
                .iter()
                .any(|reference| !self.observed(&graph, &key, reference))
        {
            work.push(Work::Dependent(key.clone()));
        }
        // A reference taken away may have been what a foreground deletion waited for, and so
        // may one that no longer blocks its owner (upstream's graph builder queues an owner
        // whose reference was unblocked).
        let waiting_owners = owners.iter().filter(|o| graph.waiting.contains(*o));
        work.extend(
            dropped
                .iter()
                .chain(waiting_owners)
                .filter_map(|o| graph.find(o))
                .map(Work::Foreground),
        );
        if meta.deleting() && meta.has_finalizer(ORPHAN) {
            work.push(Work::Orphan(key.clone()));
        } else if meta.deleting() && meta.has_finalizer(FOREGROUND) {
            work.push(Work::Foreground(key.clone()));
        }
        work
    }

    /// Whether the graph holds the object `reference` names, with its UID, not waiting for
    /// its dependents (what a live read would classify as solid).
    fn observed(&self, graph: &Graph, dependent: &Ref, reference: &OwnerReference) -> bool {
        let Some(kind) = self.kind_of(reference) else {
            return true; // a kind not served is never read (left be)
        };
        let namespace = if self.kinds[kind].strategy().info().namespaced {
            dependent.1.as_str()
        } else {
            ""
        };
        graph.find(&reference.uid).is_some_and(|owner| {
            owner.0 == kind && owner.1 == namespace && owner.2 == reference.name
        }) && !graph.waiting.contains(&reference.uid)
    }

    /// The live object's metadata, at the latest revision.
    async fn read(&self, (kind, namespace, name): &Ref) -> Result<Option<MetaFields>, ApiError> {
        match self.kinds[*kind].get(namespace, name, ReadAt::Latest).await {
            Ok(object) => Ok(Some(
                serde_json::from_value::<Meta>(object)
                    .unwrap_or_default()
                    .metadata,
            )),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn process(&self, work: Work) -> Result<(), ApiError> {
        match work {
            Work::Dependent(key) => self.attempt_to_delete(&key).await,
            Work::Orphan(key) => self.orphan_dependents(&key).await,
            Work::Foreground(key) => self.foreground(&key).await,
        }
    }

    /// The kind an owner reference names, if Capstan serves it.
    fn kind_of(&self, reference: &OwnerReference) -> Option<usize> {
        let (group, version) = match reference.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", reference.api_version.as_str()),
        };
        self.kinds.iter().position(|r| {
            let info = r.strategy().info();
            info.group == group && info.version == version && info.kind == reference.kind
        })
    }

    async fn classify(&self, key: &Ref, reference: &OwnerReference) -> Result<Owner, ApiError> {
        let Some(kind) = self.kind_of(reference) else {
            return Ok(Owner::Unknown);
        };
        let owner_namespaced = self.kinds[kind].strategy().info().namespaced;
        let namespace = if owner_namespaced {
            key.1.clone()
        } else {
            String::new()
        };
        let owner = self
            .read(&(kind, namespace, reference.name.clone()))
            .await?;
        Ok(match owner {
            None => Owner::Dangling,
            Some(owner) if owner.uid() != reference.uid => Owner::Dangling,
            Some(owner) if owner.deleting() && owner.has_finalizer(FOREGROUND) => Owner::Waiting,
            Some(_) => Owner::Solid,
        })
    }

    /// Upstream's attemptToDeleteItem.
    async fn attempt_to_delete(&self, key: &Ref) -> Result<(), ApiError> {
        let Some(meta) = self.read(key).await? else {
            return Ok(());
        };
        if meta.deleting() {
            return if meta.has_finalizer(FOREGROUND) {
                self.foreground(key).await
            } else {
                Ok(())
            };
        }
        let registry = &self.kinds[key.0];
        let namespaced = registry.strategy().info().namespaced;
        let (mut solid, mut dangling, mut waiting) = (0, Vec::new(), Vec::new());
        for reference in meta.owners() {
            if !namespaced
                && self
                    .kind_of(reference)
                    .is_some_and(|k| self.kinds[k].strategy().info().namespaced)
            {
                // Cluster-scoped objects cannot refer to namespaced owners: left alone.
                return Ok(());
            }
            match self.classify(key, reference).await? {
                Owner::Solid | Owner::Unknown => solid += 1,
                Owner::Dangling => dangling.push(reference.uid.clone()),
                Owner::Waiting => waiting.push(reference.uid.clone()),
            }
        }
        if solid > 0 {
            if dangling.is_empty() && waiting.is_empty() {
                return Ok(());
            }
            let gone: Vec<String> = dangling.into_iter().chain(waiting).collect();
            return self.remove_references(key, meta.uid(), &gone).await;
        }
        let dependents = self.graph().dependents_of(meta.uid());
        let policy = if !waiting.is_empty() && !dependents.is_empty() {
            // Upstream's cycle detection: when a dependent of this object is itself deleting
            // its dependents first, this object's references stop blocking their owners, or
            // they and it would wait on each other for good.
            let cycle = {
                let graph = self.graph();
                dependents.iter().any(|dependent| {
                    graph
                        .uids
                        .get(dependent)
                        .is_some_and(|uid| graph.waiting.contains(uid))
                })
            };
            if cycle {
                self.unblock_owner_references(key, meta.uid()).await?;
            }
            FOREGROUND_POLICY
        } else if meta.has_finalizer(ORPHAN) {
            "Orphan"
        } else if meta.has_finalizer(FOREGROUND) {
            FOREGROUND_POLICY
        } else {
            "Background"
        };
        let options = DeleteOptions {
            uid: Some(meta.uid().to_string()),
            propagation: Some(policy.to_string()),
            ..DeleteOptions::default()
        };
        match registry.delete(&key.1, &key.2, &options).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes the references to `owners` out of a dependent (upstream's strategic-merge
    /// `$patch: delete` by owner UID, guarded by the dependent's UID).
    async fn remove_references(
        &self,
        key: &Ref,
        uid: &str,
        owners: &[String],
    ) -> Result<(), ApiError> {
        let names = |r: &Value| {
            let uid = r.get("uid").and_then(Value::as_str);
            !owners.iter().any(|o| uid == Some(o.as_str()))
        };
        self.edit_list(key, Some(uid), "ownerReferences", |r| {
            names(&r).then_some(r)
        })
        .await
    }

    /// Takes a GC finalizer off an owner; the registry deletes it when it was the last.
    async fn remove_finalizer(&self, key: &Ref, finalizer: &str) -> Result<(), ApiError> {
        let other = |f: &Value| f.as_str() != Some(finalizer);
        self.edit_list(key, None, "finalizers", |f| other(&f).then_some(f))
            .await
    }

    /// Makes every owner reference of a dependent non-blocking (upstream's
    /// `unblockOwnerReferences` patch: `blockOwnerDeletion: false` where it was true).
    async fn unblock_owner_references(&self, key: &Ref, uid: &str) -> Result<(), ApiError> {
        let unblock = |mut reference: Value| {
            if reference.get("blockOwnerDeletion") == Some(&Value::Bool(true)) {
                reference["blockOwnerDeletion"] = Value::Bool(false);
            }
            reference
        };
        self.edit_list(key, Some(uid), "ownerReferences", |r| Some(unblock(r)))
            .await
    }

    /// Edits each entry of a metadata list (`ownerReferences`, `finalizers`), keeping those
    /// `edit` answers; the list is removed when none is left. Nothing when the object is gone
    /// or was recreated (another UID than `uid`).
    async fn edit_list(
        &self,
        key: &Ref,
        uid: Option<&str>,
        field: &str,
        edit: impl Fn(Value) -> Option<Value>,
    ) -> Result<(), ApiError> {
        let registry = &self.kinds[key.0];
        let edited = registry
            .patch(
                (&key.1, &key.2),
                &write_options(),
                Subresource::Main,
                // An edited list may end up empty (which its type's form leaves out): the
                // registry normalizes what a plain patch returns.
                |current| {
                    let mut object = current.clone();
                    if let Some(uid) = uid
                        && capstan_machinery::meta::meta_str(&object, "uid") != uid
                    {
                        return Err(ApiError::conflict(
                            registry.strategy().info().group_resource(),
                            &key.2,
                            "the object has been recreated",
                        ));
                    }
                    let metadata = capstan_machinery::meta::metadata_mut(&mut object);
                    let list = metadata.get(field).and_then(Value::as_array).cloned();
                    let kept: Vec<Value> = list.into_iter().flatten().filter_map(&edit).collect();
                    if kept.is_empty() {
                        metadata.shift_remove(field);
                    } else {
                        metadata.insert(field.to_string(), Value::Array(kept));
                    }
                    Ok(object)
                },
            )
            .await;
        match edited {
            Err(e) if !(e.is_not_found() || e.is_conflict()) => Err(e),
            _ => Ok(()),
        }
    }

    /// An owner being deleted with `finalizer`: its UID and its dependents; `None` when it is
    /// gone or not (or no longer) waiting on that finalizer.
    async fn deleting_with(
        &self,
        key: &Ref,
        finalizer: &str,
    ) -> Result<Option<(String, Vec<Ref>)>, ApiError> {
        Ok(self
            .read(key)
            .await?
            .filter(|meta| meta.deleting() && meta.has_finalizer(finalizer))
            .map(|meta| {
                let owner = meta.uid().to_string();
                let dependents = self.graph().dependents_of(&owner);
                (owner, dependents)
            }))
    }

    /// Upstream's attemptToOrphan: every dependent lets go of the owner, then its `orphan`
    /// finalizer goes.
    async fn orphan_dependents(&self, key: &Ref) -> Result<(), ApiError> {
        let Some((owner, dependents)) = self.deleting_with(key, ORPHAN).await? else {
            return Ok(());
        };
        for dependent in dependents {
            let Some(live) = self.read(&dependent).await? else {
                continue;
            };
            if live.owners().iter().any(|r| r.uid == owner) {
                self.remove_references(&dependent, live.uid(), std::slice::from_ref(&owner))
                    .await?;
            }
        }
        self.remove_finalizer(key, ORPHAN).await
    }

    /// Upstream's processDeletingDependentsItem: the finalizer goes once no dependent with
    /// `blockOwnerDeletion` is left; until then every dependent is judged (and deleted).
    async fn foreground(&self, key: &Ref) -> Result<(), ApiError> {
        let Some((owner, dependents)) = self.deleting_with(key, FOREGROUND).await? else {
            return Ok(());
        };
        let mut blocking = false;
        for dependent in dependents {
            let Some(live) = self.read(&dependent).await? else {
                continue;
            };
            let blocks = live
                .owners()
                .iter()
                .any(|r| r.uid == owner && r.block_owner_deletion == Some(true));
            blocking |= blocks;
            if !live.deleting() {
                Box::pin(self.attempt_to_delete(&dependent)).await?;
            }
        }
        if blocking {
            // The dependents' deletions bring this owner back (their DELETED events).
            return Ok(());
        }
        self.remove_finalizer(key, FOREGROUND).await
    }
}

const FOREGROUND_POLICY: &str = "Foreground";

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(uid: &str, owners: &[&str]) -> MetaFields {
        let reference = |uid: &&str| OwnerReference {
            uid: uid.to_string(),
            ..OwnerReference::default()
        };
        MetaFields {
            uid: Some(uid.into()),
            owner_references: Some(owners.iter().map(reference).collect()),
            ..MetaFields::default()
        }
    }

    #[test]
    fn an_owner_replaced_or_gone_unseen_brings_its_dependents_up() {
        let collector = GarbageCollector::new(Vec::new());
        let (owner, dependent): (Ref, Ref) = (
            (0, "ns".into(), "web".into()),
            (1, "ns".into(), "web-abc".into()),
        );
        collector.observe(EventType::Added, owner.clone(), &meta("o1", &[]));
        collector.observe(EventType::Added, dependent.clone(), &meta("d1", &["o1"]));
        // The same name, another object (deleted and re-created while no watch ran).
        let work = collector.observe(EventType::Added, owner.clone(), &meta("o2", &[]));
        assert_eq!(work, vec![Work::Dependent(dependent.clone())]);
        // A relist that no longer shows the owner takes it for deleted: its dependents come up.
        collector.observe(EventType::Added, dependent.clone(), &meta("d1", &["o2"]));
        // Each kind's list: the dependents' shows the dependent, the owners' nothing.
        let listed = HashSet::from_iter([(dependent.1.clone(), dependent.2.clone())]);
        assert!(collector.forget_unlisted(1, &listed).is_empty());
        let work = collector.forget_unlisted(0, &HashSet::default());
        assert_eq!(work, vec![Work::Dependent(dependent)]);
        assert!(collector.graph().find("o2").is_none());
    }

    #[test]
    fn the_graph_finds_dependents_by_owner_uid_and_forgets_them() {
        let mut graph = Graph::default();
        let slice: Ref = (1, "ns".into(), "web-abc".into());
        let service: Ref = (0, "ns".into(), "web".into());
        graph.set(&service, "svc-uid", Vec::new());
        assert!(
            graph
                .set(&slice, "slice-uid", vec!["svc-uid".into()])
                .is_empty()
        );
        assert_eq!(graph.dependents_of("svc-uid"), vec![slice.clone()]);
        assert_eq!(graph.find("svc-uid"), Some(service.clone()));
        // The reference taken away: reported, and the slice is no longer a dependent.
        assert_eq!(graph.set(&slice, "slice-uid", Vec::new()), vec!["svc-uid"]);
        assert!(graph.dependents_of("svc-uid").is_empty());
        graph.set(&slice, "slice-uid", vec!["svc-uid".into()]);
        let (uid, owners) = graph.remove(&slice);
        assert_eq!(uid.as_deref(), Some("slice-uid"));
        assert_eq!(owners, vec!["svc-uid"]);
        assert!(graph.dependents_of("svc-uid").is_empty());
    }
}
