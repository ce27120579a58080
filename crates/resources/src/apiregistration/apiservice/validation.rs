//! APIService validation.

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::validation::{dns1035_label, dns1123_subdomain};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{APIService, APIServiceSpec};
use serde_json::json;

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

/// The name an APIService must have: `spec.version + "." + spec.group`; the detail when
/// `name` is not it.
pub fn required_name(spec: &APIServiceSpec, name: &str) -> Option<String> {
    let group = spec.group.as_deref().unwrap_or_default();
    let version = spec.version.as_deref().unwrap_or_default();
    let required = format!("{version}.{group}");
    (name != required).then(|| format!("must be `spec.version+\".\"+spec.group`: {required:?}"))
}

/// The spec rules.
pub fn validate(apiservice: &APIService) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let spec = apiservice.spec.clone().unwrap_or_default();
    let group = spec.group.as_deref().unwrap_or_default();
    let version = spec.version.as_deref().unwrap_or_default();
    if group.is_empty() {
        if version != "v1" {
            errors.push(FieldError::required(
                "spec.group",
                "only v1 may have an empty group and it better be legacy kube",
            ));
        }
    } else {
        errors.check("spec.group", group, dns1123_subdomain);
    }
    errors.check("spec.version", version, dns1035_label);
    if !(1..=20000).contains(&spec.group_priority_minimum) {
        errors.push(FieldError::invalid(
            "spec.groupPriorityMinimum",
            &json!(spec.group_priority_minimum),
            "must be positive and less than 20000",
        ));
    }
    if !(1..=1000).contains(&spec.version_priority) {
        errors.push(FieldError::invalid(
            "spec.versionPriority",
            &json!(spec.version_priority),
            "must be positive and less than 1000",
        ));
    }
    let ca_bundle = spec.ca_bundle.as_ref().map_or(0, |b| b.0.len());
    let insecure = spec.insecure_skip_tls_verify.unwrap_or(false);
    match &spec.service {
        None => {
            if ca_bundle > 0 {
                errors.push(FieldError::invalid(
                    "spec.caBundle",
                    &json!(format!("{ca_bundle} bytes")),
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
            for (field, value) in [("namespace", &service.namespace), ("name", &service.name)] {
                if value.as_deref().unwrap_or_default().is_empty() {
                    errors.push(FieldError::required(format!("spec.service.{field}"), ""));
                }
            }
            let port = service.port.unwrap_or(0);
            if !(1..=65535).contains(&port) {
                errors.push(FieldError::invalid(
                    "spec.service.port",
                    &json!(port),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
            if insecure && ca_bundle > 0 {
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

/// `/status` writes: each condition's status is True, False or Unknown.
pub fn validate_status(apiservice: &APIService) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let conditions = apiservice
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten());
    for (i, condition) in conditions.enumerate() {
        if !matches!(&*condition.status, "True" | "False" | "Unknown") {
            errors.push(FieldError::not_supported(
                format!("status.conditions[{i}].status"),
                &json!(condition.status),
                &["True", "False", "Unknown"],
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(object: serde_json::Value) -> Vec<String> {
        let apiservice: APIService = serde_json::from_value(object).expect("an APIService");
        let name = apiservice.metadata.name.clone().unwrap_or_default();
        let spec = apiservice.spec.clone().unwrap_or_default();
        let named = required_name(&spec, &name).map(|detail| {
            let error = FieldError::invalid("metadata.name", &json!(name), detail);
            format!("{}: {}", error.field, error.body())
        });
        named
            .into_iter()
            .chain(
                validate(&apiservice)
                    .0
                    .iter()
                    .map(|e| format!("{}: {}", e.field, e.body())),
            )
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
