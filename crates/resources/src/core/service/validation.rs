//! `ValidateService` and `ValidateServiceUpdate` (the rules clients hit most), on the typed
//! Service.

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::ip::{
    cidr_warnings, ip_warnings, legacy_cidr_problem, legacy_ip_problem, parse_sloppy,
    special_problem,
};
use capstan_machinery::validation::{
    PORT_RANGE, dns1123_subdomain, qualified_name, validate_label_pairs,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::spec::{cluster_ip, externally_accessible, kind, needs_health_check};

const LB_ONLY: &str = "may only be used when `type` is 'LoadBalancer'";

fn valid_ip(text: &str) -> bool {
    parse_sloppy(text).is_some()
}

fn text(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or_default()
}

fn list(value: &Option<Vec<String>>) -> &[String] {
    value.as_deref().unwrap_or_default()
}

/// Go's `%v` of the internal ServicePort, as 1.36 renders a duplicate port (JSON of the
/// internal struct: only protocol and port are compared).
fn port_value(protocol: &str, port: i32) -> Value {
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

/// Validates a Service (create, and the object side of update: `old` is the stored Service,
/// whose addresses and ranges are accepted as they are even if today's rules refuse them).
pub fn validate(service: &Service, old: Option<&Service>) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let spec = super::spec::of(service);
    let old_spec = old.map(super::spec::of);
    let kind = kind(&spec);
    let headless = cluster_ip(&spec) == "None"
        || list(&spec.cluster_ips).first().map(String::as_ref) == Some("None");
    let annotation = |key: &str| {
        service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
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
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ports.is_empty() && !headless && kind != "ExternalName" {
        errors.push(FieldError::required("spec.ports", ""));
    }
    for refused in ["LoadBalancer", "NodePort"] {
        if headless && kind == refused {
            errors.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &json!("None"),
                format!("may not be set to 'None' for {refused} services"),
            ));
        }
    }
    if kind == "ExternalName" {
        errors.extend(validate_external_name(&spec));
    }
    errors.extend(validate_ports(ports));
    if let Some(selector) = &spec.selector {
        errors.extend(validate_label_pairs(
            selector.iter().map(|(k, v)| (&**k, &**v)),
            "spec.selector",
        ));
    }
    errors.extend(validate_session_affinity(&spec));
    errors.extend(validate_cluster_ip_fields(&spec, old_spec.as_deref()));
    errors.extend(validate_external_ips(&spec, old_spec.as_deref()));
    match kind {
        "" => errors.push(FieldError::required("spec.type", "")),
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName" => {}
        other => errors.push(FieldError::not_supported(
            "spec.type",
            &json!(other),
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        )),
    }
    if kind == "ClusterIP" {
        for (i, port) in ports.iter().enumerate() {
            if port.node_port.unwrap_or(0) != 0 {
                errors.push(FieldError::forbidden(
                    format!("spec.ports[{i}].nodePort"),
                    "may not be used when `type` is 'ClusterIP'",
                ));
            }
        }
    }
    errors.extend(validate_duplicate_ports(ports));
    errors.extend(validate_source_ranges(kind, &spec, service, old));
    if spec.allocate_load_balancer_node_ports.is_some() && kind != "LoadBalancer" {
        errors.push(FieldError::forbidden(
            "spec.allocateLoadBalancerNodePorts",
            LB_ONLY,
        ));
    }
    errors.extend(validate_load_balancer_class(&spec));
    errors.extend(validate_traffic_policies(&spec));
    errors
}

/// `externalIPs`: strict IPs (or ones the old object held) that are not special (loopback,
/// link-local, unspecified).
fn validate_external_ips(spec: &ServiceSpec, old: Option<&ServiceSpec>) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let existing = old.map(|o| list(&o.external_ips)).unwrap_or_default();
    for (i, ip) in list(&spec.external_ips).iter().enumerate() {
        let path = format!("spec.externalIPs[{i}]");
        if let Some(problem) = legacy_ip_problem(ip, existing) {
            errors.push(FieldError::invalid(path, &json!(ip), problem));
        } else if let Some(why) = parse_sloppy(ip).and_then(|a| special_problem(a, ip)) {
            errors.push(FieldError::invalid(path, &json!(ip), why));
        }
    }
    errors
}

/// What an ExternalName Service may not have, and the name it must have.
fn validate_external_name(spec: &ServiceSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    for (field, values) in [
        ("clusterIPs", &spec.cluster_ips),
        ("ipFamilies", &spec.ip_families),
    ] {
        if !list(values).is_empty() {
            errors.push(FieldError::forbidden(
                format!("spec.{field}"),
                "may not be set for ExternalName services",
            ));
        }
    }
    if spec.ip_family_policy.is_some() {
        errors.push(FieldError::forbidden(
            "spec.ipFamilyPolicy",
            "may not be set for ExternalName services",
        ));
    }
    let name = text(&spec.external_name);
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        errors.push(FieldError::required("spec.externalName", ""));
    } else {
        errors.check("spec.externalName", name, dns1123_subdomain);
    }
    errors
}

/// The ports: names (required when there are several, DNS labels, unique), then each port.
fn validate_ports(ports: &[ServicePort]) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let mut names: Vec<&str> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        let name = text(&port.name);
        crate::validate_port_name(&mut errors, &path, name, ports.len() > 1);
        if !name.is_empty() && names.contains(&name) {
            errors.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
        }
        names.push(name);
        errors.extend(validate_port(&path, port));
    }
    errors
}

/// One port's number, protocol, target port, app protocol and node port (its name is checked
/// with its siblings').
fn validate_port(path: &str, port: &ServicePort) -> FieldErrors {
    let mut errors = FieldErrors::new();
    if !(1..=65535).contains(&port.port) {
        errors.push(FieldError::invalid(
            format!("{path}.port"),
            &json!(port.port),
            PORT_RANGE,
        ));
    }
    crate::validate_protocol(&mut errors, path, port.protocol.as_deref());
    match &port.target_port {
        Some(IntOrString::Int(n)) if !(1..=65535).contains(n) => {
            errors.push(FieldError::invalid(
                format!("{path}.targetPort"),
                &json!(n),
                PORT_RANGE,
            ));
        }
        Some(IntOrString::String(s)) => {
            errors.check(format!("{path}.targetPort"), s, iana_service_name);
        }
        _ => {}
    }
    if let Some(app) = port.app_protocol.as_deref() {
        errors.check(format!("{path}.appProtocol"), app, qualified_name);
    }
    errors
}

/// `sessionAffinity` and its ClientIP timeout.
fn validate_session_affinity(spec: &ServiceSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    match text(&spec.session_affinity) {
        "" => errors.push(FieldError::required("spec.sessionAffinity", "")),
        "ClientIP" => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            if let Some(t) = timeout
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
    errors
}

/// Two ports on one node port and protocol, or two ports with one port and protocol.
fn validate_duplicate_ports(ports: &[ServicePort]) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let mut seen_node_ports: Vec<(&str, i32)> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let node_port = port.node_port.unwrap_or(0);
        if node_port == 0 {
            continue;
        }
        let key = (text(&port.protocol), node_port);
        if seen_node_ports.contains(&key) {
            errors.push(FieldError::duplicate(
                format!("spec.ports[{i}].nodePort"),
                &json!(node_port),
            ));
        }
        seen_node_ports.push(key);
    }
    let mut seen: Vec<(&str, i32)> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let key = (text(&port.protocol), port.port);
        if seen.contains(&key) {
            errors.push(FieldError::duplicate(
                format!("spec.ports[{i}]"),
                &port_value(key.0, key.1),
            ));
        }
        seen.push(key);
    }
    errors
}

/// `loadBalancerSourceRanges`, or the older annotation when the field is empty.
fn validate_source_ranges(
    kind: &str,
    spec: &ServiceSpec,
    service: &Service,
    old: Option<&Service>,
) -> FieldErrors {
    const ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
    let annotation = |s: &Service| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION))
            .cloned()
    };
    let mut errors = FieldErrors::new();
    let ranges = list(&spec.load_balancer_source_ranges);
    if !ranges.is_empty() {
        if kind != "LoadBalancer" {
            errors.push(FieldError::forbidden(
                "spec.LoadBalancerSourceRanges",
                LB_ONLY,
            ));
        }
        let existing: Vec<String> = old
            .map(|o| list(&super::spec::of(o).load_balancer_source_ranges).to_vec())
            .unwrap_or_default()
            .iter()
            .map(|r| r.trim().to_string())
            .collect();
        for (i, range) in ranges.iter().enumerate() {
            let trimmed = range.trim();
            if let Some(problem) = legacy_cidr_problem(trimmed, &existing) {
                errors.push(FieldError::invalid(
                    format!("spec.LoadBalancerSourceRanges[{i}]"),
                    &json!(trimmed),
                    problem,
                ));
            }
        }
    } else if let Some(value) = annotation(service) {
        let path = format!("metadata.annotations[{ANNOTATION}]");
        if kind != "LoadBalancer" {
            errors.push(FieldError::forbidden(&*path, LB_ONLY));
        }
        // An unchanged annotation is not judged again; a changed one CIDR by CIDR, each as
        // the trimmed text (upstream's loop).
        let trimmed = value.trim();
        if old.and_then(annotation).as_deref() != Some(&*value) && !trimmed.is_empty() {
            for range in trimmed.split(',').map(str::trim) {
                if let Some(problem) = legacy_cidr_problem(range, &[]) {
                    errors.push(FieldError::invalid(&*path, &json!(range), problem));
                }
            }
        }
    }
    errors
}

/// External and internal traffic policies, the health check node port, traffic distribution.
fn validate_traffic_policies(spec: &ServiceSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let external = externally_accessible(spec);
    let etp = text(&spec.external_traffic_policy);
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
    let health = spec.health_check_node_port.unwrap_or(0);
    if !needs_health_check(spec) && health != 0 {
        errors.push(FieldError::invalid(
            "spec.healthCheckNodePort",
            &json!(health),
            "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
        ));
    }
    if let Some(itp) = spec.internal_traffic_policy.as_deref()
        && itp != "Cluster"
        && itp != "Local"
    {
        errors.push(FieldError::not_supported(
            "spec.internalTrafficPolicy",
            &json!(itp),
            &["Cluster", "Local"],
        ));
    }
    const DISTRIBUTIONS: &[&str] = &["PreferClose", "PreferSameZone", "PreferSameNode"];
    if let Some(distribution) = spec.traffic_distribution.as_deref()
        && !DISTRIBUTIONS.contains(&distribution)
    {
        errors.push(FieldError::not_supported(
            "spec.trafficDistribution",
            &json!(distribution),
            DISTRIBUTIONS,
        ));
    }
    errors
}

/// `ValidateServiceClusterIPsRelatedFields` (skipped for ExternalName): also run by the
/// allocator before it allocates, so malformed input gets these errors and only these.
pub fn validate_cluster_ip_fields(spec: &ServiceSpec, old: Option<&ServiceSpec>) -> FieldErrors {
    let mut errors = FieldErrors::new();
    if kind(spec) == "ExternalName" {
        return errors;
    }
    let cluster_ip = cluster_ip(spec);
    let cluster_ips = list(&spec.cluster_ips);
    if !cluster_ip.is_empty() && cluster_ips.is_empty() {
        errors.push(FieldError::required("spec.clusterIPs", ""));
    } else if !cluster_ip.is_empty() && cluster_ips.first().map(String::as_ref) != Some(cluster_ip)
    {
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
    errors.extend(validate_ip_families(spec));
    const POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];
    let policy = text(&spec.ip_family_policy);
    if !policy.is_empty() && !POLICIES.contains(&policy) {
        errors.push(FieldError::not_supported(
            "spec.ipFamilyPolicy",
            &json!(policy),
            POLICIES,
        ));
    }
    let existing = old.map(|o| list(&o.cluster_ips)).unwrap_or_default();
    let mut invalid_ips = false;
    for (i, ip) in cluster_ips.iter().enumerate() {
        if ip == "None" && i == 0 {
            if cluster_ips.len() > 1 {
                invalid_ips = true;
                errors.push(FieldError::invalid(
                    "spec.clusterIPs",
                    &json!(cluster_ips),
                    "'None' must be the first and only value",
                ));
            }
        } else if let Some(problem) = legacy_ip_problem(ip, existing) {
            invalid_ips = true;
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
    // A malformed or misplaced address would skew what follows: upstream stops here.
    if invalid_ips {
        return errors;
    }
    // Two addresses must be one of each family (upstream's `IsDualStackIPStrings` check,
    // made before families are defaulted from the addresses).
    let addresses: Option<Vec<std::net::IpAddr>> =
        cluster_ips.iter().map(|ip| parse_sloppy(ip)).collect();
    if let Some(addresses) = addresses.as_ref().filter(|a| a.len() > 1) {
        let dual_stack =
            addresses.iter().any(|a| a.is_ipv4()) && addresses.iter().any(|a| a.is_ipv6());
        if !dual_stack {
            errors.push(FieldError::invalid(
                "spec.clusterIPs",
                &json!(cluster_ips),
                "may specify no more than one IP for each IP family",
            ));
        }
    }
    // Each address of the family its `ipFamilies` entry names.
    if cluster_ips != ["None"] {
        let families = list(&spec.ip_families);
        for (i, (ip, family)) in cluster_ips.iter().zip(families).enumerate() {
            let v6 = parse_sloppy(ip).is_some_and(|a| a.is_ipv6());
            let expected = match family.as_str() {
                "IPv4" if v6 => "IPv4",
                "IPv6" if !v6 => "IPv6",
                _ => continue,
            };
            errors.push(FieldError::invalid(
                format!("spec.clusterIPs[{i}]"),
                &json!(ip),
                format!("expected an {expected} value as indicated by `ipFamilies[{i}]`"),
            ));
        }
    }
    errors
}

/// `ipFamilies`: each `IPv4` or `IPv6`, none twice.
fn validate_ip_families(spec: &ServiceSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let mut seen: Vec<&str> = Vec::new();
    for (i, family) in list(&spec.ip_families).iter().enumerate() {
        if family != "IPv4" && family != "IPv6" {
            errors.push(FieldError::not_supported(
                format!("spec.ipFamilies[{i}]"),
                &json!(family),
                &["IPv4", "IPv6"],
            ));
        }
        if seen.contains(&&**family) {
            errors.push(FieldError::duplicate(
                format!("spec.ipFamilies[{i}]"),
                &json!(family),
            ));
        }
        seen.push(family);
    }
    errors
}

/// `loadBalancerClass`: only on LoadBalancer Services, a qualified name.
fn validate_load_balancer_class(spec: &ServiceSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    if let Some(class) = spec.load_balancer_class.as_deref() {
        if kind(spec) == "LoadBalancer" {
            errors.check("spec.loadBalancerClass", class, qualified_name);
        } else {
            errors.push(FieldError::forbidden("spec.loadBalancerClass", LB_ONLY));
        }
    }
    errors
}

/// One `status.loadBalancer.ingress` entry.
fn validate_ingress(
    errors: &mut FieldErrors,
    path: &str,
    entry: &LoadBalancerIngress,
    existing: &[String],
) {
    let ip = text(&entry.ip);
    if !ip.is_empty()
        && let Some(problem) = legacy_ip_problem(ip, existing)
    {
        errors.push(FieldError::invalid(
            format!("{path}.ip"),
            &json!(ip),
            problem,
        ));
    }
    match entry.ip_mode.as_deref() {
        None if !ip.is_empty() => errors.push(FieldError::required(
            format!("{path}.ipMode"),
            "must be specified when `ip` is set",
        )),
        Some(_) if ip.is_empty() => errors.push(FieldError::forbidden(
            format!("{path}.ipMode"),
            "may not be specified when `ip` is not set",
        )),
        Some(mode) if mode != "Proxy" && mode != "VIP" => errors.push(FieldError::not_supported(
            format!("{path}.ipMode"),
            &json!(mode),
            &["Proxy", "VIP"],
        )),
        _ => {}
    }
    let hostname = text(&entry.hostname);
    if !hostname.is_empty() {
        errors.check(format!("{path}.hostname"), hostname, dns1123_subdomain);
        if valid_ip(hostname) {
            errors.push(FieldError::invalid(
                format!("{path}.hostname"),
                &json!(hostname),
                "must be a DNS name, not an IP address",
            ));
        }
    }
}

/// `ValidateServiceStatusUpdate`: the load balancer status (addresses the old status held
/// are accepted as they are).
pub fn validate_status(new: &Service, old: &Service) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let ingress_of = |service: &Service| -> Vec<LoadBalancerIngress> {
        service
            .status
            .iter()
            .filter_map(|s| s.load_balancer.as_ref())
            .flat_map(|l| l.ingress.iter().flatten())
            .cloned()
            .collect()
    };
    let ingress = ingress_of(new);
    let existing: Vec<String> = ingress_of(old)
        .into_iter()
        .filter_map(|i| i.ip.filter(|ip| !ip.is_empty()))
        .collect();
    if ingress.is_empty() {
        return errors;
    }
    if new.spec.as_ref().map(kind) != Some("LoadBalancer") {
        errors.push(FieldError::forbidden(
            "status.loadBalancer.ingress",
            "may only be used when `spec.type` is 'LoadBalancer'",
        ));
        return errors;
    }
    for (i, entry) in ingress.iter().enumerate() {
        validate_ingress(
            &mut errors,
            &format!("status.loadBalancer.ingress[{i}]"),
            entry,
            &existing,
        );
    }
    errors
}

/// The `Warning` texts upstream sends for a Service (`GetWarningsForService`, in its order).
pub fn warnings(service: &Service) -> Vec<String> {
    let mut out = Vec::new();
    let spec = super::spec::of(service);
    let kind = kind(&spec);
    if service
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("service.kubernetes.io/topology-aware-hints"))
    {
        out.push("annotation service.kubernetes.io/topology-aware-hints is deprecated, please use service.kubernetes.io/topology-mode instead".to_string());
    }
    if !matches!(cluster_ip(&spec), "" | "None") {
        for (i, ip) in list(&spec.cluster_ips).iter().enumerate() {
            out.extend(ip_warnings(&format!("spec.clusterIPs[{i}]"), ip));
        }
    }
    let headless = kind == "ClusterIP" && cluster_ip(&spec) == "None";
    let external_ips = list(&spec.external_ips);
    if headless {
        if !text(&spec.load_balancer_ip).is_empty() {
            out.push("spec.loadBalancerIP is ignored for headless services".to_string());
        }
        if !external_ips.is_empty() {
            out.push("spec.externalIPs is ignored for headless services".to_string());
        }
        if text(&spec.session_affinity) != "None" {
            out.push("spec.SessionAffinity is ignored for headless services".to_string());
        }
    }
    for (i, ip) in external_ips.iter().enumerate() {
        out.extend(ip_warnings(&format!("spec.externalIPs[{i}]"), ip));
    }
    if !external_ips.is_empty() && !headless && kind != "ExternalName" {
        out.push(
            "spec.externalIPs is deprecated and may no longer be implemented in some clusters"
                .to_string(),
        );
    }
    out.extend(ip_warnings(
        "spec.loadBalancerIP",
        text(&spec.load_balancer_ip),
    ));
    for (i, range) in list(&spec.load_balancer_source_ranges).iter().enumerate() {
        out.extend(cidr_warnings(
            &format!("spec.loadBalancerSourceRanges[{i}]"),
            range,
        ));
    }
    if kind == "ExternalName" && !external_ips.is_empty() {
        out.push("spec.externalIPs is ignored when spec.type is \"ExternalName\"".to_string());
    }
    if kind != "ExternalName" && !text(&spec.external_name).is_empty() {
        out.push("spec.externalName is ignored when spec.type is not \"ExternalName\"".to_string());
    }
    if text(&spec.traffic_distribution) == "PreferClose" {
        out.push(
            "spec.trafficDistribution: \"PreferClose\" is deprecated; use \"PreferSameZone\""
                .to_string(),
        );
    }
    out
}

/// The clusterIPs rules of an update (`validateServiceClusterIPsRelatedFields`' update half).
fn validate_cluster_ips_update(old_spec: &ServiceSpec, new_spec: &ServiceSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let old_ips = list(&old_spec.cluster_ips);
    let new_ips = list(&new_spec.cluster_ips);
    let headless = |ips: &[String]| ips.first().map(String::as_ref) == Some("None");
    if kind(old_spec) == "ExternalName"
        || kind(new_spec) == "ExternalName"
        || (headless(old_ips) && headless(new_ips))
    {
        return errors;
    }
    let policy = text(&new_spec.ip_family_policy);
    let ips = json!(new_ips);
    let changed = |errors: &mut FieldErrors, i: usize| {
        errors.push(FieldError::invalid(
            format!("spec.clusterIPs[{i}]"),
            &ips,
            "may not change once set",
        ));
    };
    if new_ips.len() == old_ips.len() {
        for i in (0..new_ips.len()).filter(|i| new_ips[*i] != old_ips[*i]) {
            changed(&mut errors, i);
        }
    } else if new_ips.len() < old_ips.len() {
        if new_ips.is_empty() {
            errors.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &ips,
                "primary clusterIP can not be unset",
            ));
        } else if new_ips[0] != old_ips[0] {
            changed(&mut errors, 0);
        }
        if new_ips.len() == 1 && policy != "SingleStack" {
            errors.push(FieldError::invalid(
                "spec.ipFamilyPolicy",
                &json!(new_spec.ip_family_policy),
                "must be set to 'SingleStack' when releasing the secondary clusterIP",
            ));
        }
    } else if !old_ips.is_empty() && new_ips[0] != old_ips[0] {
        changed(&mut errors, 0);
    }
    errors
}

/// The ipFamilies rules of an update (`validateUpgradeDowngradeIPFamilies`): the primary family
/// stays; releasing the secondary needs SingleStack. Headless Services may change families.
fn validate_ip_families_update(old_spec: &ServiceSpec, new_spec: &ServiceSpec) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let headless = |s: &ServiceSpec| list(&s.cluster_ips) == ["None"];
    if kind(old_spec) == "ExternalName"
        || kind(new_spec) == "ExternalName"
        || headless(old_spec)
        || headless(new_spec)
    {
        return errors;
    }
    let (old_families, new_families) = (list(&old_spec.ip_families), list(&new_spec.ip_families));
    let changed = |errors: &mut FieldErrors, value: Value| {
        errors.push(FieldError::invalid(
            "spec.ipFamilies[0]",
            &value,
            "may not change once set",
        ));
    };
    let ips = json!(list(&new_spec.cluster_ips));
    match old_families.len().cmp(&new_families.len()) {
        std::cmp::Ordering::Equal => {
            for (old, new) in old_families.iter().zip(new_families) {
                if old != new {
                    changed(&mut errors, json!(new_families));
                }
            }
        }
        std::cmp::Ordering::Greater => {
            if list(&new_spec.cluster_ips).is_empty() {
                errors.push(FieldError::invalid(
                    "spec.ipFamilies[0]",
                    &json!(new_families),
                    "primary ipFamily can not be unset",
                ));
            }
            if new_families.first().is_some_and(|f| *f != old_families[0]) {
                changed(&mut errors, ips);
            }
            if new_families.len() == 1 && text(&new_spec.ip_family_policy) != "SingleStack" {
                errors.push(FieldError::invalid(
                    "spec.ipFamilyPolicy",
                    &json!(new_spec.ip_family_policy),
                    "must be set to 'SingleStack' when releasing the secondary ipFamily",
                ));
            }
        }
        std::cmp::Ordering::Less => {
            if let (Some(old), Some(new)) = (old_families.first(), new_families.first())
                && old != new
            {
                changed(&mut errors, ips);
            }
        }
    }
    errors
}

/// The update-only rules, in `ValidateServiceUpdate`'s order (before the object's own).
pub fn validate_update(new: &Service, old: &Service) -> FieldErrors {
    let old_spec = super::spec::of(old);
    let new_spec = super::spec::of(new);
    let mut errors = validate_cluster_ips_update(&old_spec, &new_spec);
    errors.extend(validate_ip_families_update(&old_spec, &new_spec));
    if kind(&old_spec) == "LoadBalancer"
        && kind(&new_spec) == "LoadBalancer"
        && old_spec.load_balancer_class != new_spec.load_balancer_class
    {
        errors.push(FieldError::invalid(
            "spec.loadBalancerClass",
            &json!(new_spec.load_balancer_class),
            "may not change once set",
        ));
    }
    errors.extend(validate_load_balancer_class(&new_spec));
    if needs_health_check(&old_spec)
        && needs_health_check(&new_spec)
        && old_spec.health_check_node_port != new_spec.health_check_node_port
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

    fn service(value: Value) -> Service {
        serde_json::from_value(value).expect("a Service")
    }

    #[test]
    fn source_ranges_are_strict_but_stored_ones_stay() {
        let lb = |ranges: Value| {
            service(
                json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}],
                "loadBalancerSourceRanges": ranges}}),
            )
        };
        let stored = lb(json!(["10.1.2.3/8"]));
        let refused: Vec<String> = validate(&stored, None)
            .0
            .iter()
            .filter(|e| e.field.starts_with("spec.LoadBalancerSourceRanges"))
            .map(|e| e.detail.clone())
            .collect();
        assert_eq!(refused, ["must not have bits set beyond the prefix length"]);
        // An update that keeps a value stored under older rules is accepted; a new one is not.
        let kept = lb(json!([" 10.1.2.3/8 ", "10.0.0.0/8"]));
        assert!(
            !validate(&kept, Some(&stored))
                .0
                .iter()
                .any(|e| e.field.starts_with("spec.LoadBalancerSourceRanges"))
        );
        let added = lb(json!(["10.1.2.3/8", "192.168.1.1/24"]));
        assert!(
            validate(&added, Some(&stored))
                .0
                .iter()
                .any(|e| e.field == "spec.LoadBalancerSourceRanges[1]")
        );
        // A space-padded value is not warned about (upstream's parser refuses the padding).
        assert!(
            !warnings(&kept)
                .iter()
                .any(|w| w.starts_with("spec.loadBalancerSourceRanges[0]"))
        );
    }

    #[test]
    fn families_may_not_change_but_headless_ones_may() {
        let old = service(
            json!({"spec": {"type": "ClusterIP", "clusterIPs": ["10.0.0.1"],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}}),
        );
        let new = service(
            json!({"spec": {"type": "ClusterIP", "clusterIPs": ["10.0.0.1"],
            "ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}}),
        );
        let errors = validate_update(&new, &old);
        assert_eq!(errors.0[0].field, "spec.ipFamilies[0]");
        assert_eq!(errors.0[0].detail, "may not change once set");
        let headless = |family: &str| {
            service(json!({"spec": {"type": "ClusterIP", "clusterIPs": ["None"],
                "ipFamilies": [family]}}))
        };
        assert!(
            validate_update(&headless("IPv6"), &headless("IPv4"))
                .0
                .is_empty()
        );
    }
}
