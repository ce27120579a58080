//! `ValidateService` and `ValidateServiceUpdate` (the rules clients hit most; the full
//! catalogue lives in `spec/service.md` §4).

use std::net::IpAddr;

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::validation::{dns1123_label, dns1123_subdomain, validate_labels};
use serde_json::{Value, json};

use super::ServiceAllocator;

const RANGE: &str = "must be between 1 and 65535, inclusive";
const IP: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";
const LB_ONLY: &str = "may only be used when `type` is 'LoadBalancer'";

fn str_at<'a>(value: &'a Value, field: &str) -> &'a str {
    value.get(field).and_then(Value::as_str).unwrap_or("")
}

fn valid_ip(text: &str) -> bool {
    text.parse::<IpAddr>().is_ok()
}

fn iana_service_name(name: &str) -> Vec<&'static str> {
    let mut errors = Vec::new();
    if name.len() > 15 {
        errors.push("must be no more than 15 characters");
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errors.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    }
    if !name.bytes().any(|c| c.is_ascii_lowercase()) {
        errors.push("must contain at least one letter (a-z)");
    }
    if name.contains("--") {
        errors.push("must not contain consecutive hyphens");
    }
    if name.starts_with('-') || name.ends_with('-') {
        errors.push("must not begin or end with a hyphen");
    }
    errors
}

/// Validates a Service (create, and the object side of update).
pub fn validate(object: &Value, allocator: &ServiceAllocator) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let empty = json!({});
    let spec = object.get("spec").unwrap_or(&empty);
    let kind = str_at(spec, "type");
    let cluster_ips: Vec<&str> = spec
        .get("clusterIPs")
        .and_then(Value::as_array)
        .map(|l| l.iter().map(|v| v.as_str().unwrap_or("")).collect())
        .unwrap_or_default();
    let cluster_ip = str_at(spec, "clusterIP");
    let headless = cluster_ip == "None" || cluster_ips.first() == Some(&"None");
    let ports: Vec<Value> = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && !headless && kind != "ExternalName" {
        errors.push(FieldError::required("spec.ports", ""));
    }
    if headless && kind == "LoadBalancer" {
        errors.push(FieldError::invalid(
            "spec.clusterIPs[0]",
            &json!("None"),
            "may not be set to 'None' for LoadBalancer services",
        ));
    }
    if headless && kind == "NodePort" {
        errors.push(FieldError::invalid(
            "spec.clusterIPs[0]",
            &json!("None"),
            "may not be set to 'None' for NodePort services",
        ));
    }
    if kind == "ExternalName" {
        for field in ["clusterIPs", "ipFamilies"] {
            if spec
                .get(field)
                .and_then(Value::as_array)
                .is_some_and(|l| !l.is_empty())
            {
                errors.push(FieldError::forbidden(
                    format!("spec.{field}"),
                    "may not be set for ExternalName services",
                ));
            }
        }
        if spec.get("ipFamilyPolicy").is_some_and(|v| !v.is_null()) {
            errors.push(FieldError::forbidden(
                "spec.ipFamilyPolicy",
                "may not be set for ExternalName services",
            ));
        }
        let name = str_at(spec, "externalName");
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.is_empty() {
            errors.push(FieldError::required("spec.externalName", ""));
        } else {
            for message in dns1123_subdomain(name) {
                errors.push(FieldError::invalid(
                    "spec.externalName",
                    &json!(name),
                    message,
                ));
            }
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        let name = str_at(port, "name");
        if ports.len() > 1 && name.is_empty() {
            errors.push(FieldError::required(format!("{path}.name"), ""));
        } else if !name.is_empty() {
            for message in dns1123_label(name) {
                errors.push(FieldError::invalid(
                    format!("{path}.name"),
                    &json!(name),
                    message,
                ));
            }
            if names.contains(&name) {
                errors.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
            }
        }
        names.push(name);
        let number = port.get("port").cloned().unwrap_or(json!(0));
        if !number.as_i64().is_some_and(|p| (1..=65535).contains(&p)) {
            errors.push(FieldError::invalid(format!("{path}.port"), &number, RANGE));
        }
        let protocol = str_at(port, "protocol");
        if protocol.is_empty() {
            errors.push(FieldError::required(format!("{path}.protocol"), ""));
        } else if !["SCTP", "TCP", "UDP"].contains(&protocol) {
            errors.push(FieldError::not_supported(
                format!("{path}.protocol"),
                &json!(protocol),
                &["SCTP", "TCP", "UDP"],
            ));
        }
        match port.get("targetPort") {
            Some(Value::Number(n))
                if !n.as_i64().is_some_and(|p| (1..=65535).contains(&p)) && !headless =>
            {
                errors.push(FieldError::invalid(
                    format!("{path}.targetPort"),
                    &Value::Number(n.clone()),
                    RANGE,
                ));
            }
            Some(Value::String(s)) => {
                for message in iana_service_name(s) {
                    errors.push(FieldError::invalid(
                        format!("{path}.targetPort"),
                        &json!(s),
                        message,
                    ));
                }
            }
            _ => {}
        }
        if kind == "ClusterIP" && port.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0 {
            errors.push(FieldError::forbidden(
                format!("{path}.nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            ));
        }
    }
    if let Some(selector) = spec.get("selector").and_then(Value::as_object) {
        errors.extend(validate_labels(selector, "spec.selector"));
    }
    match str_at(spec, "sessionAffinity") {
        "" => errors.push(FieldError::required("spec.sessionAffinity", "")),
        "ClientIP" => {
            let timeout = spec.pointer("/sessionAffinityConfig/clientIP/timeoutSeconds");
            if let Some(t) = timeout.and_then(Value::as_i64)
                && !(1..=86400).contains(&t)
            {
                errors.push(FieldError::invalid(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    &json!(t),
                    "must be greater than 0 and less than 86400",
                ));
            }
        }
        "None" => {}
        other => errors.push(FieldError::not_supported(
            "spec.sessionAffinity",
            &json!(other),
            &["ClientIP", "None"],
        )),
    }
    errors.extend(validate_cluster_ip_fields(spec));
    if let Some(ips) = spec.get("externalIPs").and_then(Value::as_array) {
        for (i, ip) in ips.iter().enumerate() {
            if !valid_ip(ip.as_str().unwrap_or("")) {
                errors.push(FieldError::invalid(
                    format!("spec.externalIPs[{i}]"),
                    ip,
                    IP,
                ));
            }
        }
    }
    match kind {
        "" => errors.push(FieldError::required("spec.type", "")),
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName" => {}
        other => errors.push(FieldError::not_supported(
            "spec.type",
            &json!(other),
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        )),
    }
    let mut seen_ports: Vec<(String, i64)> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let node_port = port.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
        if node_port == 0 {
            continue;
        }
        let key = (str_at(port, "protocol").to_string(), node_port);
        if seen_ports.contains(&key) {
            errors.push(FieldError::duplicate(
                format!("spec.ports[{i}].nodePort"),
                &json!(node_port),
            ));
        }
        seen_ports.push(key);
    }
    if spec
        .get("allocateLoadBalancerNodePorts")
        .is_some_and(|v| !v.is_null())
        && kind != "LoadBalancer"
    {
        errors.push(FieldError::forbidden(
            "spec.allocateLoadBalancerNodePorts",
            LB_ONLY,
        ));
    }
    let external = matches!(kind, "NodePort" | "LoadBalancer")
        || (kind == "ClusterIP"
            && spec
                .get("externalIPs")
                .and_then(Value::as_array)
                .is_some_and(|l| !l.is_empty()));
    let etp = str_at(spec, "externalTrafficPolicy");
    if !external && !etp.is_empty() {
        errors.push(FieldError::invalid(
            "spec.externalTrafficPolicy",
            &json!(etp),
            "may only be set for externally-accessible services",
        ));
    } else if external && etp.is_empty() {
        errors.push(FieldError::required("spec.externalTrafficPolicy", ""));
    } else if external && etp != "Cluster" && etp != "Local" {
        errors.push(FieldError::not_supported(
            "spec.externalTrafficPolicy",
            &json!(etp),
            &["Cluster", "Local"],
        ));
    }
    let health = spec
        .get("healthCheckNodePort")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let needs_health = kind == "LoadBalancer" && etp == "Local";
    if !needs_health && health != 0 {
        errors.push(FieldError::invalid(
            "spec.healthCheckNodePort",
            &json!(health),
            "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
        ));
    }
    if let Some(itp) = spec.get("internalTrafficPolicy").and_then(Value::as_str)
        && itp != "Cluster"
        && itp != "Local"
    {
        errors.push(FieldError::not_supported(
            "spec.internalTrafficPolicy",
            &json!(itp),
            &["Cluster", "Local"],
        ));
    }
    if let Some(distribution) = spec.get("trafficDistribution").and_then(Value::as_str)
        && !["PreferClose", "PreferSameZone", "PreferSameNode"].contains(&distribution)
    {
        errors.push(FieldError::not_supported(
            "spec.trafficDistribution",
            &json!(distribution),
            &["PreferClose", "PreferSameZone", "PreferSameNode"],
        ));
    }
    let _ = allocator;
    errors
}

/// `ValidateServiceClusterIPsRelatedFields` (skipped for ExternalName): also run by the
/// allocator before it allocates, so malformed input gets these errors and only these.
pub fn validate_cluster_ip_fields(spec: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let kind = str_at(spec, "type");
    let cluster_ip = str_at(spec, "clusterIP");
    let cluster_ips: Vec<&str> = spec
        .get("clusterIPs")
        .and_then(Value::as_array)
        .map(|l| l.iter().map(|v| v.as_str().unwrap_or("")).collect())
        .unwrap_or_default();
    if kind != "ExternalName" {
        if !cluster_ip.is_empty() && cluster_ips.is_empty() {
            errors.push(FieldError::required("spec.clusterIPs", ""));
        } else if !cluster_ip.is_empty() && cluster_ips.first() != Some(&cluster_ip) {
            errors.push(FieldError::invalid(
                "spec.clusterIPs",
                &json!(cluster_ips),
                "first value must match `clusterIP`",
            ));
        } else if cluster_ip.is_empty() && !cluster_ips.is_empty() {
            errors.push(FieldError::invalid(
                "spec.clusterIPs",
                &json!(cluster_ips),
                "must be empty when `clusterIP` is not specified",
            ));
        }
        for (i, ip) in cluster_ips.iter().enumerate() {
            if *ip == "None" && i == 0 {
                if cluster_ips.len() > 1 {
                    errors.push(FieldError::invalid(
                        "spec.clusterIPs",
                        &json!(cluster_ips),
                        "'None' must be the first and only value",
                    ));
                }
            } else if !valid_ip(ip) {
                errors.push(FieldError::invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &json!(ip),
                    IP,
                ));
            }
        }
        if cluster_ips.len() > 2 {
            errors.push(FieldError::invalid(
                "spec.clusterIPs",
                &json!(cluster_ips),
                "may only hold up to 2 values",
            ));
        }
        if let Some(families) = spec.get("ipFamilies").and_then(Value::as_array) {
            let mut seen = Vec::new();
            for (i, family) in families.iter().enumerate() {
                let text = family.as_str().unwrap_or("");
                if text != "IPv4" && text != "IPv6" {
                    errors.push(FieldError::not_supported(
                        format!("spec.ipFamilies[{i}]"),
                        family,
                        &["IPv4", "IPv6"],
                    ));
                } else if seen.contains(&text) {
                    errors.push(FieldError::duplicate(
                        format!("spec.ipFamilies[{i}]"),
                        family,
                    ));
                }
                seen.push(text);
            }
        }
        let policy = str_at(spec, "ipFamilyPolicy");
        if !policy.is_empty()
            && !["PreferDualStack", "RequireDualStack", "SingleStack"].contains(&policy)
        {
            errors.push(FieldError::not_supported(
                "spec.ipFamilyPolicy",
                &json!(policy),
                &["PreferDualStack", "RequireDualStack", "SingleStack"],
            ));
        }
    }
    errors
}

/// The update-only rules.
pub fn validate_update(new: &Value, old: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let old_type = old
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let new_type = new
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("");
    if old_type != "ExternalName" && new_type != "ExternalName" {
        let old_ips = old
            .pointer("/spec/clusterIPs")
            .cloned()
            .unwrap_or(json!([]));
        let new_ips = new
            .pointer("/spec/clusterIPs")
            .cloned()
            .unwrap_or(json!([]));
        let first = |v: &Value| v.get(0).cloned();
        if first(&old_ips).is_some() && first(&old_ips) != first(&new_ips) {
            errors.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &new_ips,
                "may not change once set",
            ));
        }
    }
    errors
}
