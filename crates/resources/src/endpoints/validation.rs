//! `ValidateEndpoints`.

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::ip;
use capstan_machinery::validation::{
    PORT_RANGE, dns1123_label, dns1123_subdomain, is_port, qualified_name,
};
use serde_json::{Value, json};

fn address(errors: &mut FieldErrors, path: &str, address: &Value) {
    let ip = address.get("ip").and_then(Value::as_str).unwrap_or("");
    // 1.36's strict check: leading zeros and IPv4-mapped IPv6 are refused with their own text
    // (the legacy sloppy parse accepts them, so the special-address check still runs).
    if let Some(problem) = ip::strict_problem(ip) {
        errors.push(FieldError::invalid(
            format!("{path}.ip"),
            &json!(ip),
            problem,
        ));
    }
    if let Some(hostname) = address.get("hostname").and_then(Value::as_str)
        && !hostname.is_empty()
    {
        for message in dns1123_label(hostname) {
            errors.push(FieldError::invalid(
                format!("{path}.hostname"),
                &json!(hostname),
                message,
            ));
        }
    }
    if let Some(node) = address.get("nodeName").and_then(Value::as_str) {
        for message in dns1123_subdomain(node) {
            errors.push(FieldError::invalid(
                format!("{path}.nodeName"),
                &json!(node),
                message,
            ));
        }
    }
    match ip::parse_sloppy(ip) {
        None => errors.push(FieldError::invalid(
            format!("{path}.ip"),
            &json!(ip),
            "must be a valid IP address",
        )),
        Some(addr) => {
            if let Some(why) = ip::special_problem(addr, ip) {
                errors.push(FieldError::invalid(format!("{path}.ip"), &json!(ip), why));
            }
        }
    }
}

/// Validates an Endpoints object.
pub fn validate(object: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let subsets = object
        .get("subsets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, subset) in subsets.iter().enumerate() {
        let path = format!("subsets[{i}]");
        let list = |field: &str| {
            subset
                .get(field)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let (ready, not_ready, ports) =
            (list("addresses"), list("notReadyAddresses"), list("ports"));
        if ready.is_empty() && not_ready.is_empty() {
            errors.push(FieldError::required(
                path.clone(),
                "must specify `addresses` or `notReadyAddresses`",
            ));
        }
        for (j, a) in ready.iter().enumerate() {
            address(&mut errors, &format!("{path}.addresses[{j}]"), a);
        }
        for (j, a) in not_ready.iter().enumerate() {
            address(&mut errors, &format!("{path}.notReadyAddresses[{j}]"), a);
        }
        for (k, port) in ports.iter().enumerate() {
            let port_path = format!("{path}.ports[{k}]");
            let name = port.get("name").and_then(Value::as_str).unwrap_or("");
            if ports.len() > 1 && name.is_empty() {
                errors.push(FieldError::required(format!("{port_path}.name"), ""));
            } else if !name.is_empty() {
                for message in dns1123_label(name) {
                    errors.push(FieldError::invalid(
                        format!("{port_path}.name"),
                        &json!(name),
                        message,
                    ));
                }
            }
            let number = port.get("port").cloned().unwrap_or(json!(0));
            if !is_port(&number) {
                errors.push(FieldError::invalid(
                    format!("{port_path}.port"),
                    &number,
                    PORT_RANGE,
                ));
            }
            let protocol = port.get("protocol").and_then(Value::as_str).unwrap_or("");
            if protocol.is_empty() {
                errors.push(FieldError::required(format!("{port_path}.protocol"), ""));
            } else if !["SCTP", "TCP", "UDP"].contains(&protocol) {
                errors.push(FieldError::not_supported(
                    format!("{port_path}.protocol"),
                    &json!(protocol),
                    &["SCTP", "TCP", "UDP"],
                ));
            }
            if let Some(app) = port.get("appProtocol").and_then(Value::as_str) {
                for message in qualified_name(app) {
                    errors.push(FieldError::invalid(
                        format!("{port_path}.appProtocol"),
                        &json!(app),
                        message,
                    ));
                }
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_and_mapped_addresses_are_refused_as_in_1_36() {
        let errors = validate(
            &json!({"subsets": [{"addresses": [{"ip": "010.1.1.1"}, {"ip": "::ffff:10.1.1.1"}]}]}),
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
            validate(&json!({"subsets": [{}, {"addresses": [{"ip": "x"}, {"ip": "127.0.0.1"}]}]}));
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
