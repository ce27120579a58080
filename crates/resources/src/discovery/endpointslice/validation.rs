//! `ValidateEndpointSlice` / `ValidateEndpointSliceUpdate` (pkg/apis/discovery/validation).

use capstan_machinery::field::{FieldError, FieldErrors, FieldPath};
use capstan_machinery::ip;
use capstan_machinery::validation::{
    dns1123_label, dns1123_subdomain, label_value, qualified_name,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice};
use serde_json::json;

const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
/// Upstream validates at most 20,000 ports (the API text says 100).
const MAX_PORTS: usize = 20_000;
/// The most zone hints, and the most node hints, an endpoint may have.
const MAX_HINTS: usize = 8;

/// The whole object; `old` on update (addressType is immutable, and endpoints left as they
/// were are not judged again).
pub fn validate(slice: &EndpointSlice, old: Option<&EndpointSlice>) -> FieldErrors {
    let mut errors = FieldErrors::new();
    address_type(&mut errors, &slice.address_type);
    ports(&mut errors, slice);
    // Endpoints an update leaves as they were are not judged again.
    let unchanged = old.is_some_and(|old| {
        old.endpoints.as_deref().unwrap_or_default()
            == slice.endpoints.as_deref().unwrap_or_default()
    });
    if !unchanged {
        endpoints(&mut errors, slice);
    }
    if let Some(old) = old
        && old.address_type != slice.address_type
    {
        errors.push(FieldError::invalid(
            "addressType",
            &json!(slice.address_type),
            "field is immutable",
        ));
    }
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
        // Unnamed ports count too: two of them are a duplicate `""`.
        if names.contains(&name) {
            errors.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
        } else {
            names.push(name);
        }
        match port.protocol.as_deref() {
            None => errors.push(FieldError::required(format!("{path}.protocol"), "")),
            Some("SCTP" | "TCP" | "UDP") => {}
            Some(other) => errors.push(FieldError::not_supported(
                format!("{path}.protocol"),
                &json!(other),
                &["SCTP", "TCP", "UDP"],
            )),
        }
        // The port number is not validated upstream.
        if let Some(app) = port.app_protocol.as_deref() {
            errors.check(format!("{path}.appProtocol"), app, qualified_name);
        }
    }
}

fn endpoints(errors: &mut FieldErrors, slice: &EndpointSlice) {
    let endpoints = slice.endpoints.as_deref().unwrap_or_default();
    if endpoints.len() > MAX_ENDPOINTS {
        errors.push(FieldError::too_many(
            "endpoints",
            endpoints.len(),
            MAX_ENDPOINTS,
        ));
        return;
    }
    let list = FieldPath::root("endpoints");
    for (i, endpoint) in endpoints.iter().enumerate() {
        endpoint_rules(errors, &list.index(i), endpoint, slice);
    }
}

fn endpoint_rules(
    errors: &mut FieldErrors,
    path: &FieldPath,
    endpoint: &Endpoint,
    slice: &EndpointSlice,
) {
    let addresses_path = path.child("addresses");
    if endpoint.addresses.is_empty() {
        errors.push(FieldError::required(
            &addresses_path,
            "must contain at least 1 address",
        ));
    } else if endpoint.addresses.len() > MAX_ADDRESSES {
        errors.push(FieldError::too_many(
            &addresses_path,
            endpoint.addresses.len(),
            MAX_ADDRESSES,
        ));
    }
    for (j, address) in endpoint.addresses.iter().enumerate() {
        let at = addresses_path.index(j);
        match slice.address_type.as_str() {
            "IPv4" | "IPv6" => {
                ip_address(errors, &at, &addresses_path, address, &slice.address_type)
            }
            "FQDN" => fqdn(errors, &at, address),
            _ => {}
        }
    }
    if let Some(node) = endpoint.node_name.as_deref() {
        errors.check(&path.child("nodeName"), node, dns1123_subdomain);
    }
    // deprecatedTopology is dropped before validation (v1 writes never keep it); zone,
    // conditions and targetRef are not validated upstream.
    if let Some(hostname) = endpoint.hostname.as_deref() {
        errors.check(&path.child("hostname"), hostname, dns1123_label);
    }
    if let Some(hints) = endpoint.hints.as_ref() {
        hint_rules(errors, &path.child("hints"), hints);
    }
}

/// One address of an IP slice: 1.36's strict parse (and, for IPv6, canonical form), then
/// the family (reported on the list, without an index, as upstream), then the ranges an
/// endpoint may not use.
fn ip_address(
    errors: &mut FieldErrors,
    path: &FieldPath,
    list: &FieldPath,
    address: &str,
    family: &str,
) {
    if let Some(problem) = ip::strict_problem(address) {
        errors.push(FieldError::invalid(path, &json!(address), problem));
        return;
    }
    let Some(parsed) = ip::parse_sloppy(address) else {
        return;
    };
    if family == "IPv6" {
        let canonical = parsed.to_string();
        if canonical != address {
            errors.push(FieldError::invalid(
                path,
                &json!(address),
                format!("must be in canonical form ({canonical:?})"),
            ));
            return;
        }
    }
    if parsed.is_ipv4() != (family == "IPv4") {
        let detail = if family == "IPv4" {
            "must be an IPv4 address"
        } else {
            "must be an IPv6 address"
        };
        errors.push(FieldError::invalid(list, &json!(address), detail));
        return;
    }
    if let Some(why) = ip::special_problem(parsed, address) {
        errors.push(FieldError::invalid(path, &json!(address), why));
    }
}

/// `IsFullyQualifiedDomainName`: a DNS subdomain with at least two labels.
fn fqdn(errors: &mut FieldErrors, path: &FieldPath, address: &str) {
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

fn hint_rules(errors: &mut FieldErrors, path: &FieldPath, hints: &EndpointHints) {
    let zones: Vec<&str> = hints.for_zones.iter().flatten().map(|z| &*z.name).collect();
    if !hint_list(errors, &path.child("forZones"), &zones, label_value) {
        return;
    }
    let nodes: Vec<&str> = hints.for_nodes.iter().flatten().map(|n| &*n.name).collect();
    hint_list(errors, &path.child("forNodes"), &nodes, dns1123_subdomain);
}

/// One list of hints: at most eight, each name once and valid by `rule`; `false` when there
/// are too many (upstream then stops judging the hints).
fn hint_list(
    errors: &mut FieldErrors,
    path: &FieldPath,
    names: &[&str],
    rule: fn(&str) -> Vec<String>,
) -> bool {
    if names.len() > MAX_HINTS {
        errors.push(FieldError::too_many(path, names.len(), MAX_HINTS));
        return false;
    }
    for (i, name) in names.iter().enumerate() {
        let element = path.index(i);
        let at = element.child("name");
        if names[..i].contains(name) {
            errors.push(FieldError::duplicate(&at, &json!(name)));
        }
        errors.check(&at, name, rule);
    }
    true
}

/// `warnOnBadIPs`: non-standard addresses (in slices the controllers did not write), and on
/// create the deprecation of FQDN slices.
pub fn warnings(slice: &EndpointSlice, create: bool) -> Vec<String> {
    let mut out = Vec::new();
    if create && slice.address_type == "FQDN" {
        out.push("spec.addressType: FQDN endpoints are deprecated".to_string());
    }
    let managed_by = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(super::MANAGED_BY_LABEL))
        .map(String::as_str);
    if matches!(
        managed_by,
        Some(super::CONTROLLER_NAME | super::MIRRORING_CONTROLLER_NAME)
    ) {
        return out;
    }
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
                "endpoints[0].addresses: Invalid value: \"fd00::1\": must be an IPv4 address",
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
