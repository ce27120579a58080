//! core/v1 Pod, minimal: what the endpoints controller reads and tests need to write
//! (`spec.containers[].ports`, `status.podIP(s)`, the Ready condition). No scheduler or kubelet
//! exists here: status is written through `/status` by whoever plays that part.

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_machinery::validation;
use capstan_registry::{ResourceInfo, Strategy};
use k8s_openapi::api::core::v1::{Container, Pod, PodIP, PodStatus};
use serde_json::{Value, json};

/// Pod's identity.
pub static POD_INFO: ResourceInfo = ResourceInfo::of::<Pod>(&super::V1, "io.k8s.api.core.v1.Pod")
    .short_names(&["po"])
    .categories(&["all"])
    .with_status()
    .storage_version_hash("xPOwRZ+Yhw8=")
    .unconditional_update()
    .delete_returns_object()
    // PodSpec's containers are not omitempty.
    .zero(r#"{"metadata":{"creationTimestamp":null},"spec":{"containers":null},"status":{}}"#)
    // podStatusStrategy.GetResetFields.
    .status_resets(&[
        &["spec"],
        &["metadata", "deletionTimestamp"],
        &["metadata", "ownerReferences"],
    ]);

/// The Pod strategy.
pub struct PodStrategy;

/// The pod's `status.podIPs[].ip` values.
fn pod_ips(pod: &Pod) -> Vec<&str> {
    pod.status
        .iter()
        .flat_map(|s| s.pod_ips.iter().flatten())
        .map(|entry| &*entry.ip)
        .collect()
}

/// Upstream's `validatePodIPs`: every new pod IP is a valid IP in 1.36's strict form (values
/// the pod already had may stay), and two IPs are one of each family.
fn validate_pod_ips(new: &Pod, old: &Pod) -> FieldErrors {
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
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

fn pod_ip(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap_or_default()
}

/// The image pull policy upstream defaults: `Always` for `:latest` or no tag.
fn pull_policy(image: &str) -> &'static str {
    let tag = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':'))
        .map(|(_, t)| t);
    if tag.is_none_or(|t| t == "latest") {
        "Always"
    } else {
        "IfNotPresent"
    }
}

fn default_container(container: &mut Container) {
    container
        .termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".into());
    container
        .termination_message_policy
        .get_or_insert_with(|| "File".into());
    let policy = pull_policy(container.image.as_deref().unwrap_or_default());
    container
        .image_pull_policy
        .get_or_insert_with(|| policy.into());
    for port in container.ports.iter_mut().flatten() {
        crate::default_protocol(&mut port.protocol);
    }
}

/// One container's rules; `seen` holds the names of the containers before it.
fn validate_container<'a>(
    errors: &mut FieldErrors,
    path: &str,
    container: &'a Container,
    seen: &mut Vec<&'a str>,
) {
    if container.name.is_empty() {
        errors.push(FieldError::required(format!("{path}.name"), ""));
    } else {
        errors.check(
            format!("{path}.name"),
            &container.name,
            validation::dns1123_label,
        );
        if seen.contains(&&*container.name) {
            errors.push(FieldError::duplicate(
                format!("{path}.name"),
                &json!(container.name),
            ));
        }
        seen.push(&container.name);
    }
    if container.image.as_deref().unwrap_or_default().is_empty() {
        errors.push(FieldError::required(format!("{path}.image"), ""));
    }
    for (j, port) in container.ports.iter().flatten().enumerate() {
        let field = format!("{path}.ports[{j}].containerPort");
        match port.container_port {
            0 => errors.push(FieldError::required(field, "")),
            1..=65535 => {}
            other => errors.push(FieldError::invalid(
                field,
                &json!(other),
                validation::PORT_RANGE,
            )),
        }
    }
}

impl Strategy for PodStrategy {
    type Object = Pod;

    fn info(&self) -> &ResourceInfo {
        &POD_INFO
    }

    /// Immediate when the pod was never scheduled or has finished; otherwise the requested
    /// period, else `spec.terminationGracePeriodSeconds` (30). With no kubelet to confirm, a
    /// terminating pod stays until it is deleted again with grace 0.
    fn grace_period(&self, pod: &Pod, requested: Option<i64>) -> Option<i64> {
        if node_name(pod).is_empty() || matches!(phase(pod), "Succeeded" | "Failed") {
            return None;
        }
        Some(requested.unwrap_or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30)
        }))
    }

    fn default(&self, pod: &mut Pod) {
        if let Some(spec) = pod.spec.as_mut() {
            spec.restart_policy.get_or_insert_with(|| "Always".into());
            spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
            spec.termination_grace_period_seconds.get_or_insert(30);
            spec.scheduler_name
                .get_or_insert_with(|| "default-scheduler".into());
            spec.security_context.get_or_insert_with(Default::default);
            spec.enable_service_links.get_or_insert(true);
            spec.containers.iter_mut().for_each(default_container);
            spec.init_containers
                .iter_mut()
                .flatten()
                .for_each(default_container);
        }
        // v1 conversion: podIP wins over podIPs[0].
        if let Some(status) = pod.status.as_mut() {
            let ip = status.pod_ip.clone().unwrap_or_default();
            let first = status
                .pod_ips
                .as_ref()
                .and_then(|l| l.first())
                .map(|e| e.ip.clone())
                .unwrap_or_default();
            if !ip.is_empty() && first != ip {
                status.pod_ips = Some(vec![PodIP { ip }]);
            } else if ip.is_empty() && !first.is_empty() {
                status.pod_ip = Some(first);
            }
        }
    }

    fn prepare_for_create(&self, pod: &mut Pod) {
        pod.status = Some(PodStatus {
            phase: Some("Pending".into()),
            qos_class: Some("BestEffort".into()),
            ..PodStatus::default()
        });
    }

    fn validate_create(&self, pod: &Pod) -> FieldErrors {
        let mut errors = FieldErrors::new();
        let spec = pod.spec.clone().unwrap_or_default();
        if spec.containers.is_empty() {
            errors.push(FieldError::required("spec.containers", ""));
        }
        let mut seen = Vec::new();
        for (i, container) in spec.containers.iter().enumerate() {
            let path = format!("spec.containers[{i}]");
            validate_container(&mut errors, &path, container, &mut seen);
        }
        for (field, value) in [("hostname", &spec.hostname), ("subdomain", &spec.subdomain)] {
            let value = value.as_deref().unwrap_or_default();
            if !value.is_empty() {
                errors.check(format!("spec.{field}"), value, validation::dns1123_label);
            }
        }
        errors
    }

    fn validate_update(&self, new: &Pod, old: &Pod) -> FieldErrors {
        let mut errors = Strategy::validate_create(self, new);
        if node_name(old) != node_name(new) && !node_name(old).is_empty() {
            errors.push(FieldError::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
        errors
    }

    fn validate_status_update(&self, new: &Pod, old: &Pod) -> FieldErrors {
        validate_pod_ips(new, old)
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &[
            "spec.nodeName",
            "spec.host",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ]
    }

    fn field_value(&self, pod: &Pod, field: &str) -> Option<String> {
        let spec = pod.spec.as_ref();
        let text = |value: Option<&String>| value.cloned().unwrap_or_default();
        Some(match field {
            "spec.nodeName" | "spec.host" => node_name(pod).to_string(),
            "spec.restartPolicy" => text(spec.and_then(|s| s.restart_policy.as_ref())),
            "spec.schedulerName" => text(spec.and_then(|s| s.scheduler_name.as_ref())),
            "spec.serviceAccountName" => text(spec.and_then(|s| s.service_account_name.as_ref())),
            // Go's strconv.FormatBool; unset is false.
            "spec.hostNetwork" => spec
                .and_then(|s| s.host_network)
                .unwrap_or(false)
                .to_string(),
            "status.phase" => phase(pod).to_string(),
            "status.podIP" => pod_ip(pod).to_string(),
            "status.nominatedNodeName" => text(
                pod.status
                    .as_ref()
                    .and_then(|s| s.nominated_node_name.as_ref()),
            ),
            // Upstream's field label conversion accepts it, but its field set has no value
            // for it: it selects as the empty string.
            "status.podIPs" => String::new(),
            _ => return None,
        })
    }

    fn unsupported_field_message(&self, field: &str) -> String {
        format!("field label not supported: {field}")
    }

    /// Only what [`PodStrategy::field_value`] reads: the watch cache decodes every pod it is
    /// given, and a pod's containers, volumes and conditions are most of it.
    fn selectable_object(&self, from: capstan_registry::cache::SelectableFrom<'_>) -> Option<Pod> {
        use k8s_openapi::api::core::v1::PodSpec;
        #[derive(serde::Deserialize)]
        struct Read {
            metadata: Option<capstan_registry::cache::SelectableMeta>,
            spec: Option<Spec>,
            status: Option<Status>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            node_name: Option<String>,
            restart_policy: Option<String>,
            scheduler_name: Option<String>,
            service_account_name: Option<String>,
            host_network: Option<bool>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Status {
            phase: Option<String>,
            #[serde(rename = "podIP")]
            pod_ip: Option<String>,
            nominated_node_name: Option<String>,
        }
        let read: Read = from.decode()?;
        Some(Pod {
            metadata: read.metadata.unwrap_or_default().into_object_meta(),
            spec: read.spec.map(|s| PodSpec {
                node_name: s.node_name,
                restart_policy: s.restart_policy,
                scheduler_name: s.scheduler_name,
                service_account_name: s.service_account_name,
                host_network: s.host_network,
                ..PodSpec::default()
            }),
            status: read.status.map(|s| PodStatus {
                phase: s.phase,
                pod_ip: s.pod_ip,
                nominated_node_name: s.nominated_node_name,
                ..PodStatus::default()
            }),
        })
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

    fn cells(&self, pod: &Pod) -> Vec<Value> {
        let containers = pod.spec.as_ref().map_or(0, |s| s.containers.len());
        let ready = if is_ready(pod) { containers } else { 0 };
        let status = if pod.metadata.deletion_timestamp.is_none() {
            phase(pod).to_string()
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
            json!(pod.metadata.name.as_deref().unwrap_or_default()),
            json!(format!("{ready}/{containers}")),
            json!(status),
            json!(0),
            json!(age(&crate::created(&pod.metadata))),
            json!(or_none(pod_ip(pod))),
            json!(or_none(node_name(pod))),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::typed as pod;

    #[test]
    fn host_network_selects_as_go_formats_a_bool() {
        let strategy = PodStrategy;
        let unset = pod(json!({"metadata": {"name": "a"}}));
        let set = pod(
            json!({"metadata": {"name": "b"}, "spec": {"containers": [], "hostNetwork": true}}),
        );
        assert_eq!(
            strategy.field_value(&unset, "spec.hostNetwork").as_deref(),
            Some("false")
        );
        assert_eq!(
            strategy.field_value(&set, "spec.hostNetwork").as_deref(),
            Some("true")
        );
        assert_eq!(strategy.field_value(&set, "spec.ports"), None);
    }

    #[test]
    fn the_cache_reads_every_selectable_field_as_the_whole_pod_gives_it() {
        let strategy = PodStrategy;
        let full = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}, "uid": "u1",
                "annotations": {"a": "b"}},
            "spec": {"nodeName": "n1", "restartPolicy": "Never", "schedulerName": "s",
                "serviceAccountName": "sa", "hostNetwork": true, "hostname": "h",
                "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}],
                "nominatedNodeName": "n2", "conditions": [{"type": "Ready", "status": "True"}]}});
        let bare = json!({"metadata": {"name": "q"}});
        let nulls = json!({"metadata": null, "spec": null, "status": null});
        crate::assert_selects_as_whole(&strategy, [full, bare, nulls]);
    }

    #[test]
    fn pod_ip_wins_over_the_first_pod_ips_entry() {
        let strategy = PodStrategy;
        let mut both =
            pod(json!({"status": {"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.1"}]}}));
        strategy.default(&mut both);
        assert_eq!(
            strategy.field_value(&both, "status.podIP").as_deref(),
            Some("10.0.0.2")
        );
        assert_eq!(pod_ips(&both), ["10.0.0.2"]);
        let mut list_only = pod(json!({"status": {"podIPs": [{"ip": "fd00::1"}]}}));
        strategy.default(&mut list_only);
        assert_eq!(pod_ip(&list_only), "fd00::1");
    }

    #[test]
    fn two_ips_of_one_family_are_refused_like_upstream() {
        let old = pod(json!({}));
        let new = pod(json!({"status": {"podIPs": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}}));
        let texts: Vec<String> = validate_pod_ips(&new, &old)
            .0
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            texts,
            [
                "status.podIPs: Invalid value: [{\"IP\":\"10.0.0.1\"},{\"IP\":\"10.0.0.2\"}]: may specify no more than one IP for each IP family"
            ]
        );
    }
}
