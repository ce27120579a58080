//! The namespace controller (upstream's `pkg/controller/namespace`): a namespace being deleted
//! has its content deleted, kind by kind; its status conditions say how that went; once nothing
//! is left the `kubernetes` finalizer is lifted (through `/finalize`) and the namespace is
//! deleted again, for good.

use std::sync::Arc;
use std::time::Duration;

use capstan_machinery::ApiError;
use capstan_registry::object::from_typed;
use capstan_registry::{DeleteOptions, ListOptions, ReadAt, Registry, Subresource, WriteOptions};
use capstan_resources::core::namespace::FINALIZER;
use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::runtime::{Backoff, Controller};

/// How often terminating namespaces are looked at again (content that waits on its own
/// finalizers or grace periods).
const RECHECK: Duration = Duration::from_secs(2);
/// How long a deleted namespace is left alone before its content is deleted (upstream's
/// `namespaceDeletionGracePeriod`: every server's admission sees it terminating first, and
/// last-moment creations land before the clean-up).
const DELETION_GRACE: Duration = Duration::from_secs(5);
/// The manager named in the namespace's managedFields.
const MANAGER: &str = "kube-controller-manager";

/// Deletes the content of namespaces being deleted, then the namespaces.
pub struct NamespaceController {
    namespaces: Arc<Registry>,
    /// Every namespaced kind served.
    contents: Vec<Arc<Registry>>,
}

impl NamespaceController {
    /// Watches `namespaces`; deletes what `contents` (every namespaced kind) hold in them.
    pub fn new(namespaces: Arc<Registry>, contents: Vec<Arc<Registry>>) -> Self {
        NamespaceController {
            namespaces,
            contents,
        }
    }

    /// Runs in background tasks for the life of the process.
    pub fn start(self) {
        let controller = Arc::new(self);
        let checked = controller.clone();
        let namespaces = controller.namespaces.clone();
        Controller::of_kind("namespace deletion", namespaces, Backoff::NEVER_DROPPED)
            .every(RECHECK, move || checked.deleting())
            .run(move |name: String| {
                let controller = controller.clone();
                async move { controller.sync(&name).await.map_err(|e| e.message) }
            });
    }

    /// The namespaces being deleted.
    fn deleting(&self) -> Vec<String> {
        let namespaces = self.namespaces.cached::<Namespace>("").into_iter();
        namespaces
            .filter(|namespace| namespace.metadata.deletion_timestamp.is_some())
            .filter_map(|namespace| namespace.metadata.name)
            .collect()
    }

    /// One pass over a namespace: nothing to do unless it is being deleted. A namespace
    /// deleted less than [`DELETION_GRACE`] ago, or whose content is still going, is left for
    /// the periodic recheck.
    async fn sync(&self, name: &str) -> Result<(), ApiError> {
        let namespace: Namespace = match self.namespaces.get_typed("", name, ReadAt::Latest).await {
            Ok(namespace) => namespace,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(deleted) = &namespace.metadata.deletion_timestamp else {
            return Ok(());
        };
        let since = jiff::Timestamp::now().duration_since(deleted.0);
        if since < jiff::SignedDuration::try_from(DELETION_GRACE).unwrap_or_default() {
            return Ok(());
        }
        if !holds_finalizer(&namespace) {
            return self.delete_namespace(&namespace).await;
        }
        let outcome = self.delete_content(name).await;
        let namespace = self.report(namespace, &outcome).await?;
        if outcome.failed.is_some() || !outcome.remaining.is_empty() {
            return Ok(());
        }
        self.finalize(namespace).await
    }

    /// Deletes every object of every namespaced kind in `namespace`; what is still there
    /// afterwards (finalizers, graceful deletion) is counted by resource.
    async fn delete_content(&self, namespace: &str) -> Content {
        let mut content = Content::default();
        for registry in &self.contents {
            let info = registry.strategy().info();
            let list = ListOptions {
                read_at: ReadAt::Latest,
                ..ListOptions::default()
            };
            let deleted = registry
                .delete_collection(namespace, &list, &DeleteOptions::default())
                .await;
            if let Err(error) = deleted {
                content.failed = Some(format!(
                    "Failed to delete all resource types, 1 remaining: {}",
                    error.message
                ));
                continue;
            }
            let left = registry
                .list(namespace, &list)
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            for object in &left {
                for finalizer in capstan_machinery::meta::finalizers(&object.object()) {
                    *content.finalizers.entry(finalizer.to_string()).or_default() += 1;
                }
            }
            let left = left.len();
            if left > 0 {
                let resource = match info.group {
                    "" => info.plural.to_string(),
                    group => format!("{}.{group}", info.plural),
                };
                content.remaining.push((resource, left));
            }
        }
        content
    }

    /// Writes the namespace's deletion conditions (only when they changed).
    async fn report(&self, namespace: Namespace, content: &Content) -> Result<Namespace, ApiError> {
        let mut updated = namespace.clone();
        let status = updated.status.get_or_insert_default();
        let conditions = status.conditions.get_or_insert_default();
        for wanted in content.conditions() {
            match conditions.iter_mut().find(|c| c.type_ == wanted.type_) {
                Some(existing)
                    if existing.status == wanted.status
                        && existing.reason == wanted.reason
                        && existing.message == wanted.message => {}
                Some(existing) => *existing = wanted,
                None => conditions.push(wanted),
            }
        }
        if updated == namespace {
            return Ok(namespace);
        }
        let name = namespace.metadata.name.clone().unwrap_or_default();
        let written = self
            .namespaces
            .update(
                "",
                &name,
                from_typed(&updated),
                &options(),
                Subresource::Status,
            )
            .await?;
        capstan_registry::object::to_typed(&written.0).map_err(ApiError::internal)
    }

    /// Lifts the `kubernetes` finalizer through `/finalize`, then deletes the namespace.
    async fn finalize(&self, mut namespace: Namespace) -> Result<(), ApiError> {
        let name = namespace.metadata.name.clone().unwrap_or_default();
        if let Some(finalizers) = namespace
            .spec
            .as_mut()
            .and_then(|spec| spec.finalizers.as_mut())
        {
            finalizers.retain(|f| f != FINALIZER);
        }
        let (written, _) = self
            .namespaces
            .update(
                "",
                &name,
                from_typed(&namespace),
                &options(),
                Subresource::Finalize,
            )
            .await?;
        let finalized: Namespace =
            capstan_registry::object::to_typed(&written).map_err(ApiError::internal)?;
        if holds_finalizer(&finalized) {
            return Ok(());
        }
        self.delete_namespace(&finalized).await
    }

    /// The final DELETE (pinned to the namespace's UID, as upstream's).
    async fn delete_namespace(&self, namespace: &Namespace) -> Result<(), ApiError> {
        let name = namespace.metadata.name.clone().unwrap_or_default();
        let options = DeleteOptions {
            uid: namespace.metadata.uid.clone(),
            ..DeleteOptions::default()
        };
        match self.namespaces.delete("", &name, &options).await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }
}

/// Whether a namespace still waits on the namespace controller.
fn holds_finalizer(namespace: &Namespace) -> bool {
    namespace
        .spec
        .as_ref()
        .and_then(|spec| spec.finalizers.as_ref())
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

fn options() -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_manager: MANAGER.into(),
        applied: false,
    }
}

/// What deleting a namespace's content came to.
#[derive(Default)]
struct Content {
    /// A kind whose objects could not be deleted, and why.
    failed: Option<String>,
    /// Resources (`pods`, `leases.coordination.k8s.io`) with objects left, and how many.
    remaining: Vec<(String, usize)>,
    /// The finalizers the objects left carry, and on how many objects.
    finalizers: std::collections::BTreeMap<String, usize>,
}

impl Content {
    /// The conditions upstream's namespace deleter sets, as this pass found them.
    fn conditions(&self) -> Vec<NamespaceCondition> {
        let condition =
            |type_: &str, status: bool, reason: &str, message: String| NamespaceCondition {
                type_: type_.into(),
                status: if status { "True" } else { "False" }.into(),
                reason: Some(reason.into()),
                message: Some(message),
                last_transition_time: Some(Time(jiff::Timestamp::now())),
            };
        let mut conditions = vec![
            condition(
                "NamespaceDeletionDiscoveryFailure",
                false,
                "ResourcesDiscovered",
                "All resources successfully discovered".into(),
            ),
            condition(
                "NamespaceDeletionGroupVersionParsingFailure",
                false,
                "ParsedGroupVersions",
                "All legacy kube types successfully parsed".into(),
            ),
        ];
        conditions.push(match &self.failed {
            Some(why) => condition(
                "NamespaceDeletionContentFailure",
                true,
                "ContentDeletionFailed",
                why.clone(),
            ),
            None => condition(
                "NamespaceDeletionContentFailure",
                false,
                "ContentDeleted",
                "All content successfully deleted, may be waiting on finalization".into(),
            ),
        });
        // "pods has 1 resource instances, services has 2 resource instances"
        let counted = |counts: &mut dyn Iterator<Item = (&String, &usize)>, verb: &str| {
            counts
                .map(|(what, n)| format!("{what} {verb} {n} resource instances"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let remaining = counted(&mut self.remaining.iter().map(|(r, n)| (r, n)), "has");
        conditions.push(match remaining.as_str() {
            "" => condition(
                "NamespaceContentRemaining",
                false,
                "ContentRemoved",
                "All content successfully removed".into(),
            ),
            listed => condition(
                "NamespaceContentRemaining",
                true,
                "SomeResourcesRemain",
                format!("Some resources are remaining: {listed}"),
            ),
        });
        let finalizers = counted(&mut self.finalizers.iter(), "in");
        conditions.push(match finalizers.as_str() {
            "" => condition(
                "NamespaceFinalizersRemaining",
                false,
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished".into(),
            ),
            listed => condition(
                "NamespaceFinalizersRemaining",
                true,
                "SomeFinalizersRemain",
                format!("Some content in the namespace has finalizers remaining: {listed}"),
            ),
        });
        conditions
    }
}
