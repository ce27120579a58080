//! core/v1 Pod, minimal: what the endpoints controller reads and tests need to write
//! (`spec.containers[].ports`, `status.podIP(s)`, the Ready condition). No scheduler or kubelet
//! exists here: status is written through `/status` by whoever plays that part.

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_machinery::{meta, validation};
use capstan_registry::{ResourceInfo, Strategy};
use serde_json::{Value, json};

/// Pod's identity.
pub static POD_INFO: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    kind: "Pod",
    list_kind: "PodList",
    plural: "pods",
    singular: "pod",
    namespaced: true,
    short_names: &["po"],
    categories: &["all"],
    verbs: crate::NAMESPACED_VERBS,
    has_status: true,
    storage_version_hash: "xPOwRZ+Yhw8=",
    storage_prefix: "pods",
    allow_create_on_update: false,
    allow_unconditional_update: true,
    delete_returns_object: true,
};

/// The Pod strategy.
pub struct PodStrategy;

fn spec_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("spec")
        .and_then(|s| s.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The pod's `status.podIPs[].ip` values.
fn pod_ips(pod: &Value) -> Vec<&str> {
    pod.pointer("/status/podIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|entry| entry.get("ip").and_then(Value::as_str).unwrap_or(""))
        .collect()
}

/// Upstream's `validatePodIPs`: every new pod IP is a valid IP in 1.36's strict form (values
/// the pod already had may stay), and two IPs are one of each family.
fn validate_pod_ips(new: &Value, old: &Value) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let existing: std::collections::HashSet<&str> = pod_ips(old).into_iter().collect();
    let ips = pod_ips(new);
    for (i, ip) in ips.iter().enumerate() {
        if existing.contains(ip) {
            continue;
        }
        if let Some(problem) = capstan_machinery::ip::strict_problem(ip) {
            errors.push(FieldError::invalid(
                format!("status.podIPs[{i}]"),
                &json!(ip),
                problem,
            ));
        }
    }
    if ips.len() > 1 {
        let parsed: Vec<Option<std::net::IpAddr>> = ips
            .iter()
            .map(|ip| capstan_machinery::ip::parse_sloppy(ip))
            .collect();
        let v4 = parsed.iter().flatten().any(std::net::IpAddr::is_ipv4);
        let v6 = parsed.iter().flatten().any(std::net::IpAddr::is_ipv6);
        let dual_stack = parsed.iter().all(Option::is_some) && v4 && v6;
        if !dual_stack || ips.len() > 2 {
            // Upstream prints the internal type as JSON: its field has no JSON name.
            let shown: Vec<Value> = ips.iter().map(|ip| json!({"IP": ip})).collect();
            errors.push(FieldError {
                kind: capstan_machinery::field::ErrorType::Invalid,
                field: "status.podIPs".into(),
                value: capstan_machinery::field::render(&Value::Array(shown)),
                detail: "may specify no more than one IP for each IP family".into(),
            });
        }
    }
    errors
}

/// Whether a pod has condition Ready=True.
pub fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

impl Strategy for PodStrategy {
    fn info(&self) -> &ResourceInfo {
        &POD_INFO
    }

    /// Immediate when the pod was never scheduled or has finished; otherwise the requested
    /// period, else `spec.terminationGracePeriodSeconds` (30). With no kubelet to confirm, a
    /// terminating pod stays until it is deleted again with grace 0.
    fn grace_period(&self, object: &Value, requested: Option<i64>) -> Option<i64> {
        let scheduled = !object
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty();
        let phase = object
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !scheduled || phase == "Succeeded" || phase == "Failed" {
            return None;
        }
        Some(requested.unwrap_or_else(|| {
            object
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30)
        }))
    }

    fn decode(&self, object: Value) -> Result<Value, String> {
        crate::typed::<k8s_openapi::api::core::v1::Pod>(object)
    }

    fn default(&self, object: &mut Value) {
        let Some(root) = object.as_object_mut() else {
            return;
        };
        if let Some(spec) = root.get_mut("spec").and_then(Value::as_object_mut) {
            for (field, value) in [
                ("restartPolicy", json!("Always")),
                ("dnsPolicy", json!("ClusterFirst")),
                ("terminationGracePeriodSeconds", json!(30)),
                ("schedulerName", json!("default-scheduler")),
                ("securityContext", json!({})),
                ("enableServiceLinks", json!(true)),
            ] {
                spec.entry(field).or_insert(value);
            }
            for list in ["containers", "initContainers"] {
                for container in spec
                    .get_mut(list)
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object_mut)
                {
                    container
                        .entry("terminationMessagePath")
                        .or_insert(json!("/dev/termination-log"));
                    container
                        .entry("terminationMessagePolicy")
                        .or_insert(json!("File"));
                    let image = container.get("image").and_then(Value::as_str).unwrap_or("");
                    let tag = image
                        .rsplit('/')
                        .next()
                        .and_then(|last| last.split_once(':'))
                        .map(|(_, t)| t);
                    let policy = if tag.is_none_or(|t| t == "latest") {
                        "Always"
                    } else {
                        "IfNotPresent"
                    };
                    container.entry("imagePullPolicy").or_insert(json!(policy));
                    for port in container
                        .get_mut("ports")
                        .and_then(Value::as_array_mut)
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_object_mut)
                    {
                        crate::default_protocol(port);
                    }
                }
            }
        }
        // v1 conversion: podIP wins over podIPs[0].
        if let Some(status) = root.get_mut("status").and_then(Value::as_object_mut) {
            let ip = status
                .get("podIP")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let first = status
                .get("podIPs")
                .and_then(|l| l.get(0))
                .and_then(|e| e.get("ip"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if !ip.is_empty() && first != ip {
                status.insert("podIPs".into(), json!([{"ip": ip}]));
            } else if ip.is_empty() && !first.is_empty() {
                status.insert("podIP".into(), json!(first));
            }
        }
    }

    fn prepare_for_create(&self, object: &mut Value) {
        if let Value::Object(map) = object {
            map.insert(
                "status".into(),
                json!({"phase": "Pending", "qosClass": "BestEffort"}),
            );
        }
    }

    fn validate_create(&self, object: &Value) -> FieldErrors {
        let mut errors = FieldErrors::new();
        let containers = object
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if containers.is_empty() {
            errors.push(FieldError::required("spec.containers", ""));
        }
        let mut names = Vec::new();
        for (i, container) in containers.iter().enumerate() {
            let path = format!("spec.containers[{i}]");
            let name = container.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                errors.push(FieldError::required(format!("{path}.name"), ""));
            } else {
                for message in validation::dns1123_label(name) {
                    errors.push(FieldError::invalid(
                        format!("{path}.name"),
                        &json!(name),
                        message,
                    ));
                }
                if names.contains(&name) {
                    errors.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
                }
                names.push(name);
            }
            if container
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                errors.push(FieldError::required(format!("{path}.image"), ""));
            }
            for (j, port) in container
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let number = port.get("containerPort").cloned().unwrap_or(json!(0));
                match number.as_i64() {
                    Some(0) | None => errors.push(FieldError::required(
                        format!("{path}.ports[{j}].containerPort"),
                        "",
                    )),
                    Some(_) if !validation::is_port(&number) => errors.push(FieldError::invalid(
                        format!("{path}.ports[{j}].containerPort"),
                        &number,
                        validation::PORT_RANGE,
                    )),
                    _ => {}
                }
            }
        }
        for field in ["hostname", "subdomain"] {
            let value = spec_str(object, field);
            if !value.is_empty() {
                for message in validation::dns1123_label(value) {
                    errors.push(FieldError::invalid(
                        format!("spec.{field}"),
                        &json!(value),
                        message,
                    ));
                }
            }
        }
        errors
    }

    fn validate_update(&self, new: &Value, old: &Value) -> FieldErrors {
        let mut errors = self.validate_create(new);
        if spec_str(old, "nodeName") != spec_str(new, "nodeName")
            && !spec_str(old, "nodeName").is_empty()
        {
            errors.push(FieldError::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
        errors
    }

    fn validate_status_update(&self, new: &Value, old: &Value) -> FieldErrors {
        validate_pod_ips(new, old)
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &[
            "spec.nodeName",
            "spec.host",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
        ]
    }

    fn field_value(&self, object: &Value, field: &str) -> Option<String> {
        let text = |pointer: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        Some(match field {
            "metadata.name" => meta::name(object).to_string(),
            "metadata.namespace" => meta::namespace(object).to_string(),
            "spec.nodeName" | "spec.host" => text("/spec/nodeName"),
            "spec.restartPolicy" => text("/spec/restartPolicy"),
            "spec.schedulerName" => text("/spec/schedulerName"),
            "spec.serviceAccountName" => text("/spec/serviceAccountName"),
            "status.phase" => text("/status/phase"),
            "status.podIP" => text("/status/podIP"),
            _ => return None,
        })
    }

    fn unsupported_field_message(&self, field: &str) -> String {
        format!("field label not supported: {field}")
    }

    fn columns(&self) -> Vec<Column> {
        let column = |name: &'static str, priority: i32| Column {
            name,
            kind: "string",
            format: "",
            description: "",
            priority,
        };
        vec![
            NAME_COLUMN,
            column("Ready", 0),
            column("Status", 0),
            Column {
                kind: "integer",
                ..column("Restarts", 0)
            },
            AGE_COLUMN,
            column("IP", 1),
            column("Node", 1),
        ]
    }

    fn cells(&self, object: &Value) -> Vec<Value> {
        let containers = object
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let ready = if is_ready(object) { containers } else { 0 };
        let status = if meta::meta_str(object, "deletionTimestamp").is_empty() {
            object
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        } else {
            "Terminating".to_string()
        };
        let or_none = |text: &str| {
            if text.is_empty() {
                "<none>".to_string()
            } else {
                text.to_string()
            }
        };
        vec![
            json!(meta::name(object)),
            json!(format!("{ready}/{containers}")),
            json!(status),
            json!(0),
            json!(age(meta::meta_str(object, "creationTimestamp"))),
            json!(or_none(
                object
                    .pointer("/status/podIP")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            )),
            json!(or_none(spec_str(object, "nodeName"))),
        ]
    }
}
