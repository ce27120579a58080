//! Capstan's API aggregation, everything APIService, as kube-aggregator is one tree: which
//! group versions APIServices claim, discovery merged from their backends, the proxy to them,
//! the availability controller that keeps their `Available` condition, and the local
//! APIServices of the groups served here, registered at start.
//!
//! Start with [`Aggregator`]: the API server hands it what no kind of its own serves
//! (`capstan_apiserver::RemoteGroups`). [`backend`] finds and reaches an APIService's backend;
//! [`AvailabilityController`] probes it exactly as the proxy reaches it.

mod autoregister;
mod availability;
pub mod backend;
mod client;
mod proxy;

pub use autoregister::{RegisterError, register_local_apiservices};
pub use availability::AvailabilityController;
pub use backend::{BackendError, ProxyClient, ProxyClientError};
pub use client::{Backends, Connector, TlsConnection};
pub use proxy::Aggregator;

/// The registry of the kind `plural` of `group`, when it is served.
fn registry(
    registries: &[std::sync::Arc<capstan_registry::Registry>],
    group: &str,
    plural: &str,
) -> Option<std::sync::Arc<capstan_registry::Registry>> {
    registries
        .iter()
        .find(|r| {
            let info = r.strategy().info();
            info.group == group && info.plural == plural
        })
        .cloned()
}
