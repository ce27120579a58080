//! `ValidateService` and `ValidateServiceUpdate` (the rules clients hit most; the full
//! catalogue lives in `spec/service.md` §4).

use std::net::IpAddr;

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::ip::{
    INVALID_IP as IP, canonical_ip_warning, cidr_warning, parse_cidr, special_problem,
    strict_problem,
};
use capstan_machinery::validation::{
    PORT_RANGE, dns1123_label, dns1123_subdomain, is_port, validate_labels,
};
use serde_json::{Value, json};

use super::ServiceAllocator;
use super::spec::{externally_accessible, needs_health_check};

const CIDR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";
const LB_ONLY: &str = "may only be used when `type` is 'LoadBalancer'";

fn str_at<'a>(value: &'a Value, field: &str) -> &'a str {
    value.get(field).and_then(Value::as_str).unwrap_or("")
}

fn valid_ip(text: &str) -> bool {
    text.parse::<IpAddr>().is_ok()
}

fn valid_cidr(text: &str) -> bool {
    parse_cidr(text).is_some()
}

/// Go's `%v` of the internal ServicePort, as 1.36 renders a duplicate port (JSON of the
/// internal struct: only protocol and port are compared).
fn port_value(protocol: &str, port: i64) -> Value {
    let mut map = serde_json::Map::new();
    map.insert("Name".into(), json!(""));
    map.insert("Protocol".into(), json!(protocol));
    map.insert("AppProtocol".into(), Value::Null);
    map.insert("Port".into(), json!(port));
    map.insert("TargetPort".into(), json!(0));
    map.insert("NodePort".into(), json!(0));
    Value::Object(map)
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
    let annotations = object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    if let (Some(mode), Some(hints)) = (
        annotation("service.kubernetes.io/topology-mode"),
        annotation("service.kubernetes.io/topology-aware-hints"),
    ) && mode != hints
    {
        errors.push(FieldError::invalid(
            "metadata.annotations[service.kubernetes.io/topology-mode]",
            &json!(mode),
            "must match annotations[service.kubernetes.io/topology-aware-hints] when both are specified",
        ));
    }
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
        if !is_port(&number) {
            errors.push(FieldError::invalid(
                format!("{path}.port"),
                &number,
                PORT_RANGE,
            ));
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
            Some(Value::Number(n)) if !is_port(&Value::Number(n.clone())) && !headless => {
                errors.push(FieldError::invalid(
                    format!("{path}.targetPort"),
                    &Value::Number(n.clone()),
                    PORT_RANGE,
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
        if let Some(app) = port.get("appProtocol").and_then(Value::as_str) {
            for message in capstan_machinery::validation::qualified_name(app) {
                errors.push(FieldError::invalid(
                    format!("{path}.appProtocol"),
                    &json!(app),
                    message,
                ));
            }
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
            let text = ip.as_str().unwrap_or("");
            let path = format!("spec.externalIPs[{i}]");
            if let Some(problem) = strict_problem(text) {
                errors.push(FieldError::invalid(path, ip, problem));
            } else if let Some(why) = text.parse().ok().and_then(|a| special_problem(a, text)) {
                errors.push(FieldError::invalid(path, ip, why));
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
    let mut seen_protocol_ports: Vec<(String, i64)> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let key = (
            str_at(port, "protocol").to_string(),
            port.get("port").and_then(Value::as_i64).unwrap_or(0),
        );
        if seen_protocol_ports.contains(&key) {
            errors.push(FieldError::duplicate(
                format!("spec.ports[{i}]"),
                &port_value(&key.0, key.1),
            ));
        }
        seen_protocol_ports.push(key);
    }
    let ranges = spec
        .get("loadBalancerSourceRanges")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty());
    if let Some(ranges) = ranges {
        if kind != "LoadBalancer" {
            errors.push(FieldError::forbidden(
                "spec.LoadBalancerSourceRanges",
                LB_ONLY,
            ));
        }
        for (i, range) in ranges.iter().enumerate() {
            let trimmed = range.as_str().unwrap_or("").trim();
            if !valid_cidr(trimmed) {
                errors.push(FieldError::invalid(
                    format!("spec.LoadBalancerSourceRanges[{i}]"),
                    &json!(trimmed),
                    CIDR,
                ));
            }
        }
    } else if let Some(value) = annotation("service.beta.kubernetes.io/load-balancer-source-ranges")
    {
        let path = "metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]";
        if kind != "LoadBalancer" {
            errors.push(FieldError::forbidden(path, LB_ONLY));
        }
        let trimmed = value.trim();
        if !trimmed.is_empty() && !trimmed.split(',').all(|r| valid_cidr(r.trim())) {
            errors.push(FieldError::invalid(path, &json!(value), CIDR));
        }
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
    errors.extend(validate_load_balancer_class(spec));
    let external = spec.as_object().is_some_and(externally_accessible);
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
    let needs_health = spec.as_object().is_some_and(needs_health_check);
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
            } else if let Some(problem) = strict_problem(ip) {
                errors.push(FieldError::invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &json!(ip),
                    problem,
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

/// §4.1 #30/#31.
fn validate_load_balancer_class(spec: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    if let Some(class) = spec.get("loadBalancerClass").and_then(Value::as_str) {
        if str_at(spec, "type") == "LoadBalancer" {
            for message in capstan_machinery::validation::qualified_name(class) {
                errors.push(FieldError::invalid(
                    "spec.loadBalancerClass",
                    &json!(class),
                    message,
                ));
            }
        } else {
            errors.push(FieldError::forbidden("spec.loadBalancerClass", LB_ONLY));
        }
    }
    errors
}

/// `ValidateServiceStatusUpdate`: the load balancer status.
pub fn validate_status(new: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let ingress = new
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ingress.is_empty() {
        return errors;
    }
    if new.pointer("/spec/type").and_then(Value::as_str) != Some("LoadBalancer") {
        errors.push(FieldError::forbidden(
            "status.loadBalancer.ingress",
            "may only be used when `spec.type` is 'LoadBalancer'",
        ));
        return errors;
    }
    for (i, entry) in ingress.iter().enumerate() {
        let path = format!("status.loadBalancer.ingress[{i}]");
        let ip = str_at(entry, "ip");
        if !ip.is_empty() && !valid_ip(ip) {
            errors.push(FieldError::invalid(format!("{path}.ip"), &json!(ip), IP));
        }
        match entry.get("ipMode").and_then(Value::as_str) {
            None if !ip.is_empty() => errors.push(FieldError::required(
                format!("{path}.ipMode"),
                "must be specified when `ip` is set",
            )),
            Some(_) if ip.is_empty() => errors.push(FieldError::forbidden(
                format!("{path}.ipMode"),
                "may not be specified when `ip` is not set",
            )),
            Some(mode) if mode != "Proxy" && mode != "VIP" => {
                errors.push(FieldError::not_supported(
                    format!("{path}.ipMode"),
                    &json!(mode),
                    &["Proxy", "VIP"],
                ))
            }
            _ => {}
        }
        let hostname = str_at(entry, "hostname");
        if !hostname.is_empty() {
            for message in dns1123_subdomain(hostname) {
                errors.push(FieldError::invalid(
                    format!("{path}.hostname"),
                    &json!(hostname),
                    message,
                ));
            }
            if valid_ip(hostname) {
                errors.push(FieldError::invalid(
                    format!("{path}.hostname"),
                    &json!(hostname),
                    "must be a DNS name, not an IP address",
                ));
            }
        }
    }
    errors
}

/// The `Warning` texts upstream sends for a Service (§9).
pub fn warnings(object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let empty = json!({});
    let spec = object.get("spec").unwrap_or(&empty);
    let kind = str_at(spec, "type");
    if object
        .pointer("/metadata/annotations/service.kubernetes.io~1topology-aware-hints")
        .is_some()
    {
        out.push("annotation service.kubernetes.io/topology-aware-hints is deprecated, please use service.kubernetes.io/topology-mode instead".to_string());
    }
    let external_ips = spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|l| !l.is_empty());
    if kind == "ExternalName" && external_ips {
        out.push("spec.externalIPs is ignored when spec.type is \"ExternalName\"".to_string());
    }
    if kind != "ExternalName" && !str_at(spec, "externalName").is_empty() {
        out.push("spec.externalName is ignored when spec.type is not \"ExternalName\"".to_string());
    }
    if kind == "ClusterIP" && str_at(spec, "clusterIP") == "None" {
        if !str_at(spec, "loadBalancerIP").is_empty() {
            out.push("spec.loadBalancerIP is ignored for headless services".to_string());
        }
        if external_ips {
            out.push("spec.externalIPs is ignored for headless services".to_string());
        }
        if !matches!(str_at(spec, "sessionAffinity"), "" | "None") {
            out.push("spec.SessionAffinity is ignored for headless services".to_string());
        }
    }
    if str_at(spec, "clusterIP") != "None" {
        for (i, ip) in spec
            .get("clusterIPs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            out.extend(canonical_ip_warning(
                &format!("spec.clusterIPs[{i}]"),
                ip.as_str().unwrap_or(""),
            ));
        }
    }
    for (i, ip) in spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        out.extend(canonical_ip_warning(
            &format!("spec.externalIPs[{i}]"),
            ip.as_str().unwrap_or(""),
        ));
    }
    out.extend(canonical_ip_warning(
        "spec.loadBalancerIP",
        str_at(spec, "loadBalancerIP"),
    ));
    for (i, range) in spec
        .get("loadBalancerSourceRanges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        out.extend(cidr_warning(
            &format!("spec.loadBalancerSourceRanges[{i}]"),
            range.as_str().unwrap_or("").trim(),
        ));
    }
    if str_at(spec, "trafficDistribution") == "PreferClose" {
        out.push(
            "spec.trafficDistribution: \"PreferClose\" is deprecated; use \"PreferSameZone\""
                .to_string(),
        );
    }
    if external_ips {
        out.push(
            "spec.externalIPs is deprecated and may no longer be implemented in some clusters"
                .to_string(),
        );
    }
    out
}

/// The update-only rules.
pub fn validate_update(new: &Value, old: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let empty = json!({});
    let old_spec = old.get("spec").unwrap_or(&empty);
    let new_spec = new.get("spec").unwrap_or(&empty);
    let old_type = str_at(old_spec, "type");
    let new_type = str_at(new_spec, "type");
    let list = |spec: &Value, field: &str| -> Vec<Value> {
        spec.get(field)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let old_ips = list(old_spec, "clusterIPs");
    let new_ips = list(new_spec, "clusterIPs");
    let headless = |ips: &[Value]| ips.first().and_then(Value::as_str) == Some("None");
    let policy = str_at(new_spec, "ipFamilyPolicy");
    if old_type != "ExternalName"
        && new_type != "ExternalName"
        && !(headless(&old_ips) && headless(&new_ips))
    {
        let ips = json!(new_ips);
        if new_ips.len() == old_ips.len() {
            for i in 0..new_ips.len() {
                if new_ips[i] != old_ips[i] {
                    errors.push(FieldError::invalid(
                        format!("spec.clusterIPs[{i}]"),
                        &ips,
                        "may not change once set",
                    ));
                }
            }
        } else if new_ips.len() < old_ips.len() {
            if new_ips.is_empty() {
                errors.push(FieldError::invalid(
                    "spec.clusterIPs[0]",
                    &ips,
                    "primary clusterIP can not be unset",
                ));
            } else if new_ips[0] != old_ips[0] {
                errors.push(FieldError::invalid(
                    "spec.clusterIPs[0]",
                    &ips,
                    "may not change once set",
                ));
            }
            if new_ips.len() == 1 && policy != "SingleStack" {
                errors.push(FieldError::invalid(
                    "spec.ipFamilyPolicy",
                    &json!(policy),
                    "must be set to 'SingleStack' when releasing the secondary clusterIP",
                ));
            }
        } else if !old_ips.is_empty() && new_ips[0] != old_ips[0] {
            errors.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &ips,
                "may not change once set",
            ));
        }
    }
    if old_type == "LoadBalancer" && new_type == "LoadBalancer" {
        let before = old_spec.get("loadBalancerClass").filter(|v| !v.is_null());
        let after = new_spec.get("loadBalancerClass").filter(|v| !v.is_null());
        if before != after {
            errors.push(FieldError::invalid(
                "spec.loadBalancerClass",
                after.unwrap_or(&json!("null")),
                "may not change once set",
            ));
        }
    }
    errors.extend(validate_load_balancer_class(new_spec));
    let needs = |spec: &Value| spec.as_object().is_some_and(needs_health_check);
    if needs(old_spec)
        && needs(new_spec)
        && old_spec.get("healthCheckNodePort") != new_spec.get("healthCheckNodePort")
    {
        errors.push(FieldError::forbidden(
            "spec.healthCheckNodePort",
            "field is immutable",
        ));
    }
    errors
}

#[cfg(test)]
mod ip_tests {
    use super::*;

    #[test]
    fn cidr_warnings() {
        let path = "spec.loadBalancerSourceRanges[0]";
        assert_eq!(cidr_warning(path, "10.0.0.0/8"), None);
        assert_eq!(
            cidr_warning(path, "10.1.2.3/8"),
            Some("spec.loadBalancerSourceRanges[0]: CIDR value \"10.1.2.3/8\" is ambiguous in this context (should be \"10.0.0.0/8\" or \"10.1.2.3/32\"?)".into())
        );
        assert_eq!(
            cidr_warning(path, "010.0.0.0/8"),
            Some("spec.loadBalancerSourceRanges[0]: non-standard CIDR value \"010.0.0.0/8\" will be considered invalid in a future Kubernetes release: use \"10.0.0.0/8\"".into())
        );
        assert_eq!(
            cidr_warning(path, "FD00::/64"),
            Some("spec.loadBalancerSourceRanges[0]: IPv6 CIDR value \"FD00::/64\" should be in RFC 5952 canonical format (\"fd00::/64\")".into())
        );
        assert!(!valid_cidr("1.2.3.4/33") && !valid_cidr("foo.bar"));
        let service =
            json!({"spec": {"type": "LoadBalancer", "loadBalancerSourceRanges": [" 10.1.2.3/8 "]}});
        assert!(warnings(&service).iter().any(|w| w.starts_with(
            "spec.loadBalancerSourceRanges[0]: CIDR value \"10.1.2.3/8\" is ambiguous"
        )));
    }
}
