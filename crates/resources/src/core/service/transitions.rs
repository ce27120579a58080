//! Type transitions on update (`dropTypeDependentFields`, PrepareForUpdate).

use k8s_openapi::api::core::v1::{Service, ServiceStatus};

use super::spec::{externally_accessible, kind, needs_health_check, node_ports};

/// `dropTypeDependentFields`: on a type change, values that only made sense for the old type
/// are wiped — but only where the client left them as they were.
pub fn drop_type_dependent_fields(new: &mut Service, old: &Service) {
    let Some(old_spec) = old.spec.as_ref() else {
        return;
    };
    let Some(spec) = new.spec.as_mut() else {
        return;
    };
    let (old_type, new_type) = (kind(old_spec).to_string(), kind(spec).to_string());
    if new_type == "ExternalName" && old_type != "ExternalName" {
        if spec.cluster_ip == old_spec.cluster_ip {
            spec.cluster_ip = None;
        }
        if spec.cluster_ips == old_spec.cluster_ips {
            spec.cluster_ips = None;
        }
        if spec.ip_families == old_spec.ip_families {
            spec.ip_families = None;
        }
        if spec.ip_family_policy == old_spec.ip_family_policy {
            spec.ip_family_policy = None;
        }
    }
    if matches!(&*old_type, "NodePort" | "LoadBalancer")
        && matches!(&*new_type, "ClusterIP" | "ExternalName")
    {
        let before = node_ports(old_spec);
        if node_ports(spec).iter().all(|p| before.contains(p)) {
            for port in spec.ports.iter_mut().flatten() {
                port.node_port = None;
            }
        }
    }
    if needs_health_check(old_spec)
        && !needs_health_check(spec)
        && spec.health_check_node_port == old_spec.health_check_node_port
    {
        spec.health_check_node_port = None;
    }
    if old_type == "LoadBalancer" && new_type != "LoadBalancer" {
        if spec.allocate_load_balancer_node_ports == old_spec.allocate_load_balancer_node_ports {
            spec.allocate_load_balancer_node_ports = None;
        }
        if spec.load_balancer_class == old_spec.load_balancer_class {
            spec.load_balancer_class = None;
        }
    }
    if externally_accessible(old_spec)
        && !externally_accessible(spec)
        && spec.external_traffic_policy == old_spec.external_traffic_policy
    {
        spec.external_traffic_policy = None;
    }
    if new_type != "LoadBalancer" {
        new.status = Some(empty_status());
    }
}

/// Upstream's `defaultOnReadInternalTrafficPolicy`: an ExternalName Service shows no
/// internal traffic policy. Upstream stores the field and drops it on every read; here it is
/// dropped once the field manager has seen the object (so the manager that set it, or left
/// it as it was across a change of type, keeps owning it) and never stored.
pub fn hide_internal_traffic_policy(service: &mut Service) {
    if let Some(spec) = service.spec.as_mut()
        && kind(spec) == "ExternalName"
    {
        spec.internal_traffic_policy = None;
    }
}

/// `status: {loadBalancer: {}}`, a Service's status when nothing has set it.
pub fn empty_status() -> ServiceStatus {
    ServiceStatus {
        load_balancer: Some(Default::default()),
        ..ServiceStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(object: serde_json::Value) -> Service {
        serde_json::from_value(object).expect("a Service")
    }

    #[test]
    fn node_port_to_cluster_ip_drops_what_only_node_ports_use() {
        let old = service(
            json!({"spec": {"type": "NodePort", "externalTrafficPolicy": "Cluster",
            "ports": [{"port": 80, "nodePort": 30080}]}}),
        );
        let mut new = service(
            json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": "Cluster",
            "ports": [{"port": 80, "nodePort": 30080}]}}),
        );
        drop_type_dependent_fields(&mut new, &old);
        assert_eq!(
            serde_json::to_value(new.spec).expect("json"),
            json!({"type": "ClusterIP", "ports": [{"port": 80}]})
        );
    }

    #[test]
    fn a_new_node_port_on_conversion_is_kept_for_validation_to_refuse() {
        let old = service(
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}}),
        );
        let mut new = service(
            json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80, "nodePort": 30099}]}}),
        );
        drop_type_dependent_fields(&mut new, &old);
        assert_eq!(
            new.spec.and_then(|s| s.ports).map(|p| p[0].node_port),
            Some(Some(30099))
        );
    }
}
