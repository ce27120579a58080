//! Controllers that give Capstan's objects meaning. Each reads through watches and writes
//! through the registry, as any API client would (validation, resourceVersions, watch events).
//!
//! Start with [`EndpointsController`]: it keeps the Endpoints of every selector-based Service
//! equal to the ready and not-ready addresses of the Pods it selects; the
//! [`EndpointSliceController`] keeps their EndpointSlices. Both read Services and Pods through
//! the informers they share, [`ServicePods`].
//! [`KubernetesServiceController`] keeps the built-in `default/kubernetes` Service.
//! [`NamespaceController`] empties namespaces being deleted, then deletes them.
//! Every controller stands on the [`runtime`]: informers, a work queue, a `Controller` shape.

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
pub mod runtime;
mod service_pods;
mod trafficdist;

pub use endpoints::EndpointsController;
pub use endpointslice::EndpointSliceController;
pub use garbage_collector::GarbageCollector;
pub use group::Group;
pub use kubernetes_service::KubernetesServiceController;
pub use mirroring::MirroringController;
pub use namespace::NamespaceController;
pub use service_pods::ServicePods;

/// A test's object from its JSON.
#[cfg(test)]
pub(crate) fn decoded<T: serde::de::DeserializeOwned>(object: serde_json::Value) -> T {
    serde_json::from_value(object).expect("the test's JSON decodes")
}
