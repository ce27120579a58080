//! Controllers that give Capstan's objects meaning. Each reads through watches and writes
//! through the registry, as any API client would (validation, resourceVersions, watch events).
//!
//! Start with [`EndpointsController`]: it keeps the Endpoints of every selector-based Service
//! equal to the ready and not-ready addresses of the Pods it selects.
//! [`KubernetesServiceController`] keeps the built-in `default/kubernetes` Service.

mod endpoints;
mod kubernetes_service;

pub use endpoints::EndpointsController;
pub use kubernetes_service::KubernetesServiceController;
