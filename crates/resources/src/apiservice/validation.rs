//! APIService validation (`spec/apiservice.md` §3).

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::meta;
use capstan_machinery::validation::{dns1035_label, dns1123_subdomain};
use serde_json::{Value, json};

/// Names are path segments: not `.` or `..`, no `/` or `%`.
pub fn path_segment_name(name: &str) -> Vec<String> {
    match name {
        "." => return vec!["may not be '.'".into()],
        ".." => return vec!["may not be '..'".into()],
        _ => {}
    }
    let mut errors = Vec::new();
    if name.contains('/') {
        errors.push("may not contain '/'".into());
    }
    if name.contains('%') {
        errors.push("may not contain '%'".into());
    }
    errors
}

fn int(object: &Value, pointer: &str) -> i64 {
    object.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// The spec rules, after the name rule the registry checks.
pub fn validate(object: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let group = object
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or("");
    let version = object
        .pointer("/spec/version")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = meta::name(object);
    let required = format!("{version}.{group}");
    if name != required {
        errors.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            format!("must be `spec.version+\".\"+spec.group`: {required:?}"),
        ));
    }
    if group.is_empty() {
        if version != "v1" {
            errors.push(FieldError::required(
                "spec.group",
                "only v1 may have an empty group and it better be legacy kube",
            ));
        }
    } else {
        for message in dns1123_subdomain(group) {
            errors.push(FieldError::invalid("spec.group", &json!(group), message));
        }
    }
    for message in dns1035_label(version) {
        errors.push(FieldError::invalid(
            "spec.version",
            &json!(version),
            message,
        ));
    }
    let group_priority = int(object, "/spec/groupPriorityMinimum");
    if !(1..=20000).contains(&group_priority) {
        errors.push(FieldError::invalid(
            "spec.groupPriorityMinimum",
            &json!(group_priority),
            "must be positive and less than 20000",
        ));
    }
    let version_priority = int(object, "/spec/versionPriority");
    if !(1..=1000).contains(&version_priority) {
        errors.push(FieldError::invalid(
            "spec.versionPriority",
            &json!(version_priority),
            "must be positive and less than 1000",
        ));
    }
    let ca_bundle = object
        .pointer("/spec/caBundle")
        .and_then(Value::as_str)
        .unwrap_or("");
    let insecure = object
        .pointer("/spec/insecureSkipTLSVerify")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    match object.pointer("/spec/service").filter(|s| !s.is_null()) {
        None => {
            if !ca_bundle.is_empty() {
                let bytes = base64_len(ca_bundle);
                errors.push(FieldError::invalid(
                    "spec.caBundle",
                    &json!(format!("{bytes} bytes")),
                    "local APIServices may not have a caBundle",
                ));
            }
            if insecure {
                errors.push(FieldError::invalid(
                    "spec.insecureSkipTLSVerify",
                    &json!(true),
                    "local APIServices may not have insecureSkipTLSVerify",
                ));
            }
        }
        Some(service) => {
            for field in ["namespace", "name"] {
                if service
                    .get(field)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                {
                    errors.push(FieldError::required(format!("spec.service.{field}"), ""));
                }
            }
            let port = service.get("port").and_then(Value::as_i64).unwrap_or(0);
            if !(1..=65535).contains(&port) {
                errors.push(FieldError::invalid(
                    "spec.service.port",
                    &json!(port),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
            if insecure && !ca_bundle.is_empty() {
                errors.push(FieldError::invalid(
                    "spec.insecureSkipTLSVerify",
                    &json!(true),
                    "may not be true if caBundle is present",
                ));
            }
        }
    }
    errors
}

/// The decoded length of a base64 string (its `[]byte` length upstream).
fn base64_len(text: &str) -> usize {
    let trimmed = text.trim_end_matches('=');
    trimmed.len() * 3 / 4
}

/// `/status` writes: each condition's status is True, False or Unknown.
pub fn validate_status(object: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    if let Some(conditions) = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
    {
        for (i, condition) in conditions.iter().enumerate() {
            let status = condition.get("status").cloned().unwrap_or(json!(""));
            if !matches!(status.as_str(), Some("True" | "False" | "Unknown")) {
                errors.push(FieldError::not_supported(
                    format!("status.conditions[{i}].status"),
                    &status,
                    &["True", "False", "Unknown"],
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(object: Value) -> Vec<String> {
        validate(&object)
            .0
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn upstream_messages() {
        assert_eq!(
            bodies(
                json!({"metadata": {"name": "v1.foo"}, "spec": {"group": "foo.example.com",
                "version": "v1beta1", "groupPriorityMinimum": 1, "versionPriority": 1}})
            ),
            [
                "metadata.name: Invalid value: \"v1.foo\": must be `spec.version+\".\"+spec.group`: \"v1beta1.foo.example.com\""
            ]
        );
        assert_eq!(
            bodies(
                json!({"metadata": {"name": "v1alpha1.example.com"}, "spec": {"group": "example.com",
                "version": "v1alpha1", "groupPriorityMinimum": 20001, "versionPriority": 0,
                "insecureSkipTLSVerify": true, "caBundle": "AAAA",
                "service": {"namespace": "", "name": "api", "port": 70000}}})
            ),
            [
                "spec.groupPriorityMinimum: Invalid value: 20001: must be positive and less than 20000",
                "spec.versionPriority: Invalid value: 0: must be positive and less than 1000",
                "spec.service.namespace: Required value",
                "spec.service.port: Invalid value: 70000: port is not valid: must be between 1 and 65535, inclusive",
                "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present",
            ]
        );
        assert_eq!(
            bodies(
                json!({"metadata": {"name": "v1."}, "spec": {"version": "v1",
                "groupPriorityMinimum": 18000, "versionPriority": 1, "caBundle": "AAAA"}})
            ),
            [
                "spec.caBundle: Invalid value: \"3 bytes\": local APIServices may not have a caBundle"
            ]
        );
        assert_eq!(path_segment_name("a/b"), ["may not contain '/'"]);
    }
}
