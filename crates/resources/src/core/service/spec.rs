//! Predicates and readers on a Service's spec that defaulting, validation, allocation,
//! printing and type transitions all ask.

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

/// The spec's type (`""` when unset).
pub fn kind(spec: &ServiceSpec) -> &str {
    spec.type_.as_deref().unwrap_or_default()
}

/// The spec of a Service (empty when it has none).
pub fn of(service: &Service) -> std::borrow::Cow<'_, ServiceSpec> {
    match &service.spec {
        Some(spec) => std::borrow::Cow::Borrowed(spec),
        None => std::borrow::Cow::Owned(ServiceSpec::default()),
    }
}

/// `spec.clusterIP` (`""` when unset).
pub fn cluster_ip(spec: &ServiceSpec) -> &str {
    spec.cluster_ip.as_deref().unwrap_or_default()
}

/// The `nodePort`s set on the spec's ports (0 is unset).
pub fn node_ports(spec: &ServiceSpec) -> Vec<i32> {
    spec.ports
        .iter()
        .flatten()
        .filter_map(|p| p.node_port)
        .filter(|p| *p != 0)
        .collect()
}

/// Reachable from outside the cluster (`externalTrafficPolicy` applies): NodePort,
/// LoadBalancer, or ClusterIP with external IPs.
pub fn externally_accessible(spec: &ServiceSpec) -> bool {
    match spec.type_.as_deref() {
        Some("NodePort" | "LoadBalancer") => true,
        Some("ClusterIP") => spec
            .external_ips
            .as_ref()
            .is_some_and(|ips| !ips.is_empty()),
        _ => false,
    }
}

/// A `healthCheckNodePort` is needed: LoadBalancer with `externalTrafficPolicy: Local`.
pub fn needs_health_check(spec: &ServiceSpec) -> bool {
    spec.type_.as_deref() == Some("LoadBalancer")
        && spec.external_traffic_policy.as_deref() == Some("Local")
}
