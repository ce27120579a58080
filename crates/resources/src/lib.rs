//! Capstan's resource kinds: one folder per kind, each a [`capstan_registry::Strategy`].
//!
//! Start with [`service::ServiceStrategy`] (defaults, validation, ClusterIP/NodePort
//! allocation, table printer); [`namespace::NamespaceStrategy`] is the minimal Namespace kind
//! that namespaced objects need.

pub mod namespace;
pub mod service;
