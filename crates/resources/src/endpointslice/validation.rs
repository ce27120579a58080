//! `ValidateEndpointSlice` / `ValidateEndpointSliceUpdate` (pkg/apis/discovery/validation).

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::ip;
use capstan_machinery::validation::{
    PORT_RANGE, dns1123_label, dns1123_subdomain, label_value, qualified_name,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice};
use serde_json::json;

const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 100;
const MAX_TOPOLOGY_LABELS: usize = 16;
const MAX_ZONE_HINTS: usize = 8;
const MAX_NODE_HINTS: usize = 8;

/// The whole object; `old` on update (addressType is immutable, and addresses that were
/// already stored are not judged again by 1.36's stricter IP rules).
pub fn validate(slice: &EndpointSlice, old: Option<&EndpointSlice>) -> FieldErrors {
    let mut errors = FieldErrors::new();
    address_type(&mut errors, &slice.address_type);
    if let Some(old) = old
        && old.address_type != slice.address_type
    {
        errors.push(FieldError::invalid(
            "addressType",
            &json!(slice.address_type),
            "field is immutable",
        ));
    }
    ports(&mut errors, slice);
    endpoints(&mut errors, slice, old);
    errors
}

fn address_type(errors: &mut FieldErrors, address_type: &str) {
    if address_type.is_empty() {
        errors.push(FieldError::required("addressType", ""));
    } else if !ADDRESS_TYPES.contains(&address_type) {
        errors.push(FieldError::not_supported(
            "addressType",
            &json!(address_type),
            ADDRESS_TYPES,
        ));
    }
}

fn ports(errors: &mut FieldErrors, slice: &EndpointSlice) {
    let ports = slice.ports.as_deref().unwrap_or_default();
    if ports.len() > MAX_PORTS {
        errors.push(FieldError::too_many("ports", ports.len(), MAX_PORTS));
        return;
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let path = format!("ports[{i}]");
        let name = port.name.as_deref().unwrap_or_default();
        if !name.is_empty() {
            errors.check(format!("{path}.name"), name, dns1123_label);
        }
        if names.contains(&name) {
            errors.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
        } else {
            names.push(name);
        }
        match port.protocol.as_deref().unwrap_or_default() {
            "" => errors.push(FieldError::required(format!("{path}.protocol"), "")),
            "SCTP" | "TCP" | "UDP" => {}
            other => errors.push(FieldError::not_supported(
                format!("{path}.protocol"),
                &json!(other),
                &["SCTP", "TCP", "UDP"],
            )),
        }
        if let Some(number) = port.port
            && !(0..=65535).contains(&number)
        {
            errors.push(FieldError::invalid(
                format!("{path}.port"),
                &json!(number),
                PORT_RANGE,
            ));
        }
        if let Some(app) = port.app_protocol.as_deref() {
            errors.check(format!("{path}.appProtocol"), app, qualified_name);
        }
    }
}

/// The addresses the old object already had (kept even if today's rules refuse them).
fn stored_addresses(old: Option<&EndpointSlice>) -> Vec<&str> {
    old.into_iter()
        .flat_map(|o| o.endpoints.iter().flatten())
        .flat_map(|e| e.addresses.iter().map(String::as_str))
        .collect()
}

fn endpoints(errors: &mut FieldErrors, slice: &EndpointSlice, old: Option<&EndpointSlice>) {
    let endpoints = slice.endpoints.as_deref().unwrap_or_default();
    if endpoints.len() > MAX_ENDPOINTS {
        errors.push(FieldError::too_many(
            "endpoints",
            endpoints.len(),
            MAX_ENDPOINTS,
        ));
        return;
    }
    let stored = stored_addresses(old);
    for (i, endpoint) in endpoints.iter().enumerate() {
        endpoint_rules(errors, &format!("endpoints[{i}]"), endpoint, slice, &stored);
    }
}

fn endpoint_rules(
    errors: &mut FieldErrors,
    path: &str,
    endpoint: &Endpoint,
    slice: &EndpointSlice,
    stored: &[&str],
) {
    let addresses_path = format!("{path}.addresses");
    if endpoint.addresses.is_empty() {
        errors.push(FieldError::required(
            addresses_path.clone(),
            "must contain at least 1 address",
        ));
    } else if endpoint.addresses.len() > MAX_ADDRESSES {
        errors.push(FieldError::too_many(
            addresses_path.clone(),
            endpoint.addresses.len(),
            MAX_ADDRESSES,
        ));
    }
    for (j, address) in endpoint.addresses.iter().enumerate() {
        let at = format!("{addresses_path}[{j}]");
        match slice.address_type.as_str() {
            "IPv4" | "IPv6" => ip_address(errors, &at, address, &slice.address_type, stored),
            "FQDN" => fqdn(errors, &at, address),
            _ => {}
        }
    }
    if let Some(node) = endpoint.node_name.as_deref() {
        errors.check(format!("{path}.nodeName"), node, dns1123_subdomain);
    }
    let topology = endpoint.deprecated_topology.as_ref();
    if let Some(topology) = topology {
        let topology_path = format!("{path}.deprecatedTopology");
        if topology.len() > MAX_TOPOLOGY_LABELS {
            errors.push(FieldError::too_many(
                topology_path.clone(),
                topology.len(),
                MAX_TOPOLOGY_LABELS,
            ));
        }
        for (key, value) in topology {
            errors.check(topology_path.clone(), key, qualified_name);
            errors.check(format!("{topology_path}[{key}]"), value, label_value);
        }
    }
    if let Some(zone) = endpoint.zone.as_deref() {
        errors.check(format!("{path}.zone"), zone, label_value);
    }
    if let Some(hostname) = endpoint.hostname.as_deref() {
        errors.check(format!("{path}.hostname"), hostname, dns1123_label);
    }
    if let Some(hints) = endpoint.hints.as_ref() {
        hint_rules(errors, &format!("{path}.hints"), hints);
    }
}

fn ip_address(errors: &mut FieldErrors, path: &str, address: &str, family: &str, stored: &[&str]) {
    let parsed = ip::parse_sloppy(address);
    let right_family = parsed.is_some_and(|a| a.is_ipv4() == (family == "IPv4"));
    if !right_family {
        let detail = if family == "IPv4" {
            "must be a valid IPv4 address"
        } else {
            "must be a valid IPv6 address"
        };
        errors.push(FieldError::invalid(path, &json!(address), detail));
        return;
    }
    if !stored.contains(&address)
        && let Some(problem) = ip::strict_problem(address)
    {
        errors.push(FieldError::invalid(path, &json!(address), problem));
        return;
    }
    if let Some(addr) = parsed
        && let Some(why) = ip::special_problem(addr, address)
    {
        errors.push(FieldError::invalid(path, &json!(address), why));
    }
}

/// `IsFullyQualifiedDomainName`: a DNS subdomain with at least two labels.
fn fqdn(errors: &mut FieldErrors, path: &str, address: &str) {
    let name = address.strip_suffix('.').unwrap_or(address);
    if name.is_empty() {
        errors.push(FieldError::required(path, ""));
        return;
    }
    let problems = dns1123_subdomain(&name.to_lowercase());
    if !problems.is_empty() {
        for problem in problems {
            errors.push(FieldError::invalid(path, &json!(address), problem));
        }
        return;
    }
    if name.split('.').count() < 2 {
        errors.push(FieldError::invalid(
            path,
            &json!(address),
            "should be a domain with at least two segments separated by dots",
        ));
    }
}

fn hint_rules(errors: &mut FieldErrors, path: &str, hints: &EndpointHints) {
    let zones = hints.for_zones.as_deref().unwrap_or_default();
    if zones.len() > MAX_ZONE_HINTS {
        errors.push(FieldError::too_many(
            format!("{path}.forZones"),
            zones.len(),
            MAX_ZONE_HINTS,
        ));
    } else {
        let mut seen: Vec<&str> = Vec::new();
        for (i, zone) in zones.iter().enumerate() {
            let at = format!("{path}.forZones[{i}].name");
            if seen.contains(&zone.name.as_str()) {
                errors.push(FieldError::duplicate(at, &json!(zone.name)));
            } else {
                errors.check(at, &zone.name, label_value);
                seen.push(&zone.name);
            }
        }
    }
    let nodes = hints.for_nodes.as_deref().unwrap_or_default();
    if nodes.len() > MAX_NODE_HINTS {
        errors.push(FieldError::too_many(
            format!("{path}.forNodes"),
            nodes.len(),
            MAX_NODE_HINTS,
        ));
    } else {
        let mut seen: Vec<&str> = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let at = format!("{path}.forNodes[{i}].name");
            if seen.contains(&node.name.as_str()) {
                errors.push(FieldError::duplicate(at, &json!(node.name)));
            } else {
                errors.check(at, &node.name, dns1123_subdomain);
                seen.push(&node.name);
            }
        }
    }
}

/// Warnings for addresses in a non-canonical form, as for Endpoints.
pub fn warnings(slice: &EndpointSlice) -> Vec<String> {
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, endpoint) in slice.endpoints.iter().flatten().enumerate() {
        for (j, address) in endpoint.addresses.iter().enumerate() {
            let path = format!("endpoints[{i}].addresses[{j}]");
            out.extend(ip::ip_warnings(&path, address));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(object: serde_json::Value) -> Vec<String> {
        let slice: EndpointSlice = serde_json::from_value(object).expect("slice");
        validate(&slice, None)
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn the_reference_invalid_slice_reads_like_upstream() {
        assert_eq!(
            texts(
                json!({"addressType": "IPv5", "endpoints": [{"addresses": []}],
                         "ports": [{"port": 80, "protocol": "SCTPX"}]})
            ),
            [
                "addressType: Unsupported value: \"IPv5\": supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
                "ports[0].protocol: Unsupported value: \"SCTPX\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "endpoints[0].addresses: Required value: must contain at least 1 address",
            ]
        );
    }

    #[test]
    fn addresses_are_judged_by_the_slice_type() {
        assert_eq!(
            texts(
                json!({"addressType": "IPv4", "endpoints": [{"addresses": ["fd00::1", "127.0.0.1"]}]})
            ),
            [
                "endpoints[0].addresses[0]: Invalid value: \"fd00::1\": must be a valid IPv4 address",
                "endpoints[0].addresses[1]: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
            ]
        );
        assert!(
            texts(json!({"addressType": "FQDN", "endpoints": [{"addresses": ["db.example.com"]}]}))
                .is_empty()
        );
    }

    #[test]
    fn port_names_are_unique() {
        assert_eq!(
            texts(
                json!({"addressType": "IPv4", "ports": [{"name": "a", "protocol": "TCP"}, {"name": "a", "protocol": "TCP"}]})
            ),
            ["ports[1].name: Duplicate value: \"a\""]
        );
    }
}
