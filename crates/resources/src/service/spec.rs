//! Predicates on a Service's spec that defaulting, validation, allocation and type
//! transitions all ask.

use serde_json::{Map, Value};

/// Reachable from outside the cluster (`externalTrafficPolicy` applies): NodePort,
/// LoadBalancer, or ClusterIP with external IPs.
pub fn externally_accessible(spec: &Map<String, Value>) -> bool {
    match spec.get("type").and_then(Value::as_str) {
        Some("NodePort" | "LoadBalancer") => true,
        Some("ClusterIP") => spec
            .get("externalIPs")
            .and_then(Value::as_array)
            .is_some_and(|ips| !ips.is_empty()),
        _ => false,
    }
}

/// A `healthCheckNodePort` is needed: LoadBalancer with `externalTrafficPolicy: Local`.
pub fn needs_health_check(spec: &Map<String, Value>) -> bool {
    spec.get("type").and_then(Value::as_str) == Some("LoadBalancer")
        && spec.get("externalTrafficPolicy").and_then(Value::as_str) == Some("Local")
}
