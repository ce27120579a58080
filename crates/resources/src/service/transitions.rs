//! Type transitions on update (`dropTypeDependentFields`, PrepareForUpdate).

use serde_json::{Value, json};

use super::spec::{externally_accessible, needs_health_check};

/// `dropTypeDependentFields`: on a type change, values that only made sense for the old type
/// are wiped — but only where the client left them as they were.
pub fn drop_type_dependent_fields(new: &mut Value, old: &Value) {
    let Some(old_spec) = old.get("spec").and_then(Value::as_object).cloned() else {
        return;
    };
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let old_type = old_spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let new_type = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let same =
        |spec: &serde_json::Map<String, Value>, field: &str| spec.get(field) == old_spec.get(field);
    if new_type == "ExternalName" && old_type != "ExternalName" {
        for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if same(spec, field) {
                spec.shift_remove(field);
            }
        }
    }
    let node_ports = |spec: &serde_json::Map<String, Value>| -> Vec<i64> {
        spec.get("ports")
            .and_then(Value::as_array)
            .map(|ports| {
                ports
                    .iter()
                    .filter_map(|p| p.get("nodePort").and_then(Value::as_i64))
                    .filter(|p| *p != 0)
                    .collect()
            })
            .unwrap_or_default()
    };
    if matches!(old_type.as_str(), "NodePort" | "LoadBalancer")
        && matches!(new_type.as_str(), "ClusterIP" | "ExternalName")
    {
        let before = node_ports(&old_spec);
        if node_ports(spec).iter().all(|p| before.contains(p))
            && let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut)
        {
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                port.shift_remove("nodePort");
            }
        }
    }
    if needs_health_check(&old_spec)
        && !needs_health_check(spec)
        && same(spec, "healthCheckNodePort")
    {
        spec.shift_remove("healthCheckNodePort");
    }
    if old_type == "LoadBalancer" && new_type != "LoadBalancer" {
        for field in ["allocateLoadBalancerNodePorts", "loadBalancerClass"] {
            if same(spec, field) {
                spec.shift_remove(field);
            }
        }
    }
    if externally_accessible(&old_spec)
        && !externally_accessible(spec)
        && same(spec, "externalTrafficPolicy")
    {
        spec.shift_remove("externalTrafficPolicy");
    }
    if new_type != "LoadBalancer"
        && let Some(root) = new.as_object_mut()
    {
        root.insert("status".into(), json!({"loadBalancer": {}}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_port_to_cluster_ip_drops_what_only_node_ports_use() {
        let old = json!({"spec": {"type": "NodePort", "externalTrafficPolicy": "Cluster",
            "ports": [{"port": 80, "nodePort": 30080}]}});
        let mut new = json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": "Cluster",
            "ports": [{"port": 80, "nodePort": 30080}]}});
        drop_type_dependent_fields(&mut new, &old);
        assert_eq!(
            new["spec"],
            json!({"type": "ClusterIP", "ports": [{"port": 80}]})
        );
    }

    #[test]
    fn a_new_node_port_on_conversion_is_kept_for_validation_to_refuse() {
        let old = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}});
        let mut new =
            json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80, "nodePort": 30099}]}});
        drop_type_dependent_fields(&mut new, &old);
        assert_eq!(new["spec"]["ports"][0]["nodePort"], 30099);
    }
}
