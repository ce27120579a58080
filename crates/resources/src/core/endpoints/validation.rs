//! `ValidateEndpoints`.

use capstan_machinery::field::{FieldError, FieldErrors, FieldPath};
use capstan_machinery::ip;
use capstan_machinery::validation::{PORT_RANGE, dns1123_label, dns1123_subdomain, qualified_name};
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, Endpoints};
use serde_json::json;

fn address(errors: &mut FieldErrors, path: &FieldPath, address: &EndpointAddress) {
    let ip = &*address.ip;
    let at_ip = path.child("ip");
    // 1.36's strict check: leading zeros and IPv4-mapped IPv6 are refused with their own text
    // (the legacy sloppy parse accepts them, so the special-address check still runs).
    if let Some(problem) = ip::strict_problem(ip) {
        errors.push(FieldError::invalid(&at_ip, &json!(ip), problem));
    }
    if let Some(hostname) = address.hostname.as_deref().filter(|h| !h.is_empty()) {
        errors.check(&path.child("hostname"), hostname, dns1123_label);
    }
    if let Some(node) = address.node_name.as_deref() {
        errors.check(&path.child("nodeName"), node, dns1123_subdomain);
    }
    match ip::parse_sloppy(ip) {
        None => errors.push(FieldError::invalid(
            &at_ip,
            &json!(ip),
            "must be a valid IP address",
        )),
        Some(addr) => {
            if let Some(why) = ip::special_problem(addr, ip) {
                errors.push(FieldError::invalid(&at_ip, &json!(ip), why));
            }
        }
    }
}

fn port(errors: &mut FieldErrors, path: &str, port: &EndpointPort, named: bool) {
    crate::validate_port_name(
        errors,
        path,
        port.name.as_deref().unwrap_or_default(),
        named,
    );
    if !(1..=65535).contains(&port.port) {
        errors.push(FieldError::invalid(
            format!("{path}.port"),
            &json!(port.port),
            PORT_RANGE,
        ));
    }
    crate::validate_protocol(errors, path, port.protocol.as_deref());
    if let Some(app) = port.app_protocol.as_deref() {
        errors.check(format!("{path}.appProtocol"), app, qualified_name);
    }
}

/// Validates an Endpoints object.
pub fn validate(endpoints: &Endpoints) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let subsets = FieldPath::root("subsets");
    for (i, subset) in endpoints.subsets.iter().flatten().enumerate() {
        let path = subsets.index(i);
        let ready = subset.addresses.as_deref().unwrap_or_default();
        let not_ready = subset.not_ready_addresses.as_deref().unwrap_or_default();
        let ports = subset.ports.as_deref().unwrap_or_default();
        if ready.is_empty() && not_ready.is_empty() {
            errors.push(FieldError::required(
                &path,
                "must specify `addresses` or `notReadyAddresses`",
            ));
        }
        for (list, addresses) in [("addresses", ready), ("notReadyAddresses", not_ready)] {
            let list = path.child(list);
            for (j, a) in addresses.iter().enumerate() {
                address(&mut errors, &list.index(j), a);
            }
        }
        for (k, p) in ports.iter().enumerate() {
            port(
                &mut errors,
                &format!("{path}.ports[{k}]"),
                p,
                ports.len() > 1,
            );
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(object: serde_json::Value) -> FieldErrors {
        super::validate(&serde_json::from_value(object).expect("endpoints"))
    }

    #[test]
    fn leading_zeros_and_mapped_addresses_are_refused_as_in_1_36() {
        let errors = validate(
            json!({"subsets": [{"addresses": [{"ip": "010.1.1.1"}, {"ip": "::ffff:10.1.1.1"}]}]}),
        );
        let texts: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "subsets[0].addresses[0].ip: Invalid value: \"010.1.1.1\": must not have leading 0s",
                "subsets[0].addresses[1].ip: Invalid value: \"::ffff:10.1.1.1\": must not be an IPv4-mapped IPv6 address",
            ]
        );
    }

    #[test]
    fn an_empty_subset_and_a_bad_ip_read_like_upstream() {
        let errors =
            validate(json!({"subsets": [{}, {"addresses": [{"ip": "x"}, {"ip": "127.0.0.1"}]}]}));
        let texts: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "subsets[0]: Required value: must specify `addresses` or `notReadyAddresses`",
                "subsets[1].addresses[0].ip: Invalid value: \"x\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                "subsets[1].addresses[0].ip: Invalid value: \"x\": must be a valid IP address",
                "subsets[1].addresses[1].ip: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
            ]
        );
    }
}
