//! Controllers that give Capstan's objects meaning. Each reads through watches and writes
//! through the registry, as any API client would (validation, resourceVersions, watch events).
//!
//! Start with [`EndpointsController`]: it keeps the Endpoints of every selector-based Service
//! equal to the ready and not-ready addresses of the Pods it selects.
//! [`KubernetesServiceController`] keeps the built-in `default/kubernetes` Service.
//! [`NamespaceController`] empties namespaces being deleted, then deletes them.
//! [`apiservice::AvailabilityController`] keeps the `Available` condition of APIServices; its
//! module also resolves and connects to APIService backends for the aggregation proxy.

mod endpoints;
mod endpointslice;
mod garbage_collector;
mod gohash;
mod group;
pub mod identity;
mod kubernetes_service;
pub mod leader;
pub mod masters;
mod mirroring;
mod namespace;
pub mod queue;
mod tracker;
mod trafficdist;

pub use endpoints::EndpointsController;
pub use garbage_collector::GarbageCollector;
pub use group::Group;
pub use kubernetes_service::KubernetesServiceController;
pub use mirroring::MirroringController;
pub use namespace::NamespaceController;

/// A test's object from its JSON.
#[cfg(test)]
pub(crate) fn decoded<T: serde::de::DeserializeOwned>(object: serde_json::Value) -> T {
    serde_json::from_value(object).expect("the test's JSON decodes")
}

/// A watch over every object of a kind, from its current state (the initial events, then a
/// bookmark marking their end when `end_bookmark`).
pub fn watch_all(
    registry: &capstan_registry::Registry,
    end_bookmark: bool,
) -> capstan_registry::watch::Watcher {
    registry.watch(
        "",
        capstan_registry::watch::WatchOptions {
            labels: capstan_machinery::labels::LabelSelector::default(),
            fields: capstan_machinery::fields::FieldSelector::default(),
            start: capstan_registry::watch::WatchStart::Initial { end_bookmark },
        },
    )
}

/// Adds the name of every object of `registry` that is added or changes to `queue`, for the
/// life of the process (the watch is restarted when it ends).
pub fn enqueue_changes(
    registry: std::sync::Arc<capstan_registry::Registry>,
    queue: std::sync::Arc<queue::WorkQueue<String>>,
) {
    tokio::spawn(async move {
        loop {
            let mut watcher = watch_all(&registry, false);
            while let Some(item) = watcher.next().await {
                if let capstan_registry::watch::WatchItem::Event(kind, object) = item
                    && kind != capstan_registry::cache::EventType::Deleted
                {
                    queue.add(object.selectable.name().to_string());
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
}
