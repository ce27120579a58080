//! Decode-time defaults (`SetDefaults_Service`).

use k8s_openapi::api::core::v1::{ClientIPConfig, Service, SessionAffinityConfig};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::spec::{externally_accessible, kind};

/// Whether a value is unset or empty, as Go's zero value.
fn unset(value: &Option<String>) -> bool {
    value.as_deref().is_none_or(str::is_empty)
}

/// Applies the v1 defaults to a Service.
pub fn apply(service: &mut Service) {
    let spec = service.spec.get_or_insert_with(Default::default);
    if unset(&spec.session_affinity) {
        spec.session_affinity = Some("None".into());
    }
    match spec.session_affinity.as_deref() {
        Some("None") => spec.session_affinity_config = None,
        Some("ClientIP") => {
            let complete = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .is_some_and(|c| c.timeout_seconds.is_some());
            if !complete {
                spec.session_affinity_config = Some(SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(10800),
                    }),
                });
            }
        }
        _ => {}
    }
    if unset(&spec.type_) {
        spec.type_ = Some("ClusterIP".into());
    }
    for port in spec.ports.iter_mut().flatten() {
        crate::default_protocol(&mut port.protocol);
        let target_unset = match &port.target_port {
            None => true,
            Some(IntOrString::Int(n)) => *n == 0,
            Some(IntOrString::String(s)) => s.is_empty(),
        };
        if target_unset {
            port.target_port = Some(IntOrString::Int(port.port));
        }
    }
    let service_type = kind(spec).to_string();
    if externally_accessible(spec) && unset(&spec.external_traffic_policy) {
        spec.external_traffic_policy = Some("Cluster".into());
    }
    if matches!(&*service_type, "ClusterIP" | "NodePort" | "LoadBalancer")
        && spec.internal_traffic_policy.is_none()
    {
        spec.internal_traffic_policy = Some("Cluster".into());
    }
    if service_type == "LoadBalancer" {
        spec.allocate_load_balancer_node_ports.get_or_insert(true);
    }
    if spec.selector.as_ref().is_some_and(|s| s.is_empty()) {
        spec.selector = None;
    }
    if service_type == "LoadBalancer" {
        let ingress = service
            .status
            .iter_mut()
            .filter_map(|s| s.load_balancer.as_mut())
            .flat_map(|l| l.ingress.iter_mut().flatten());
        for entry in ingress {
            if !unset(&entry.ip) && entry.ip_mode.is_none() {
                entry.ip_mode = Some("VIP".into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaulted(object: serde_json::Value) -> serde_json::Value {
        let mut service: Service = serde_json::from_value(object).expect("a Service");
        apply(&mut service);
        serde_json::to_value(service.spec).expect("json")
    }

    #[test]
    fn a_minimal_service_gets_upstreams_defaults() {
        assert_eq!(
            defaulted(json!({"spec":{"ports":[{"port":80}]}})),
            json!({"ports":[{"port":80,"protocol":"TCP","targetPort":80}],"sessionAffinity":"None","type":"ClusterIP","internalTrafficPolicy":"Cluster"})
        );
    }

    #[test]
    fn load_balancers_get_traffic_policy_and_node_port_allocation() {
        let spec = defaulted(json!({"spec":{"type":"LoadBalancer","ports":[{"port":443}]}}));
        assert_eq!(spec["externalTrafficPolicy"], "Cluster");
        assert_eq!(spec["allocateLoadBalancerNodePorts"], true);
    }
}
