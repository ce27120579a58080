//! Decode-time defaults (`SetDefaults_Service`).

use serde_json::{Map, Value, json};

use super::spec::externally_accessible;

/// Applies the v1 defaults to a Service.
pub fn apply(object: &mut Value) {
    let Some(root) = object.as_object_mut() else {
        return;
    };
    let spec = root.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    if spec
        .get("sessionAffinity")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        spec.insert("sessionAffinity".into(), json!("None"));
    }
    match spec.get("sessionAffinity").and_then(Value::as_str) {
        Some("None") => {
            spec.shift_remove("sessionAffinityConfig");
        }
        Some("ClientIP") => {
            let complete = spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.get("clientIP"))
                .and_then(|c| c.get("timeoutSeconds"))
                .is_some_and(|t| !t.is_null());
            if !complete {
                spec.insert(
                    "sessionAffinityConfig".into(),
                    json!({"clientIP": {"timeoutSeconds": 10800}}),
                );
            }
        }
        _ => {}
    }
    if spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        spec.insert("type".into(), json!("ClusterIP"));
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            crate::default_protocol(port);
            let unset = match port.get("targetPort") {
                None | Some(Value::Null) => true,
                Some(Value::Number(n)) => n.as_i64() == Some(0),
                Some(Value::String(s)) => s.is_empty(),
                _ => false,
            };
            if unset && let Some(number) = port.get("port").cloned() {
                port.insert("targetPort".into(), number);
            }
        }
    }
    let kind = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if externally_accessible(spec)
        && spec
            .get("externalTrafficPolicy")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
    {
        spec.insert("externalTrafficPolicy".into(), json!("Cluster"));
    }
    if matches!(kind.as_str(), "ClusterIP" | "NodePort" | "LoadBalancer")
        && spec.get("internalTrafficPolicy").is_none_or(Value::is_null)
    {
        spec.insert("internalTrafficPolicy".into(), json!("Cluster"));
    }
    if kind == "LoadBalancer"
        && spec
            .get("allocateLoadBalancerNodePorts")
            .is_none_or(Value::is_null)
    {
        spec.insert("allocateLoadBalancerNodePorts".into(), json!(true));
    }
    if spec
        .get("selector")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        spec.shift_remove("selector");
    }
    if kind == "ExternalName" {
        // Read-time normalisation upstream: ExternalName Services show no traffic policy.
        spec.shift_remove("internalTrafficPolicy");
    }
    if kind == "LoadBalancer"
        && let Some(ingress) = root
            .get_mut("status")
            .and_then(|s| s.get_mut("loadBalancer"))
            .and_then(|l| l.get_mut("ingress"))
            .and_then(Value::as_array_mut)
    {
        for entry in ingress.iter_mut().filter_map(Value::as_object_mut) {
            let has_ip = entry
                .get("ip")
                .and_then(Value::as_str)
                .is_some_and(|ip| !ip.is_empty());
            if has_ip && entry.get("ipMode").is_none_or(Value::is_null) {
                entry.insert("ipMode".into(), json!("VIP"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_service_gets_upstreams_defaults() {
        let mut svc = json!({"spec":{"ports":[{"port":80}]}});
        apply(&mut svc);
        assert_eq!(
            svc["spec"],
            json!({"ports":[{"port":80,"protocol":"TCP","targetPort":80}],"sessionAffinity":"None","type":"ClusterIP","internalTrafficPolicy":"Cluster"})
        );
    }

    #[test]
    fn load_balancers_get_traffic_policy_and_node_port_allocation() {
        let mut svc = json!({"spec":{"type":"LoadBalancer","ports":[{"port":443}]}});
        apply(&mut svc);
        assert_eq!(svc["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(svc["spec"]["allocateLoadBalancerNodePorts"], true);
    }
}
