//! core/v1 Node, minimal: what EndpointSlice topology (the zone label) and node agents read.
//! No kubelet exists here: whoever plays that part registers the node and writes its status.

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use capstan_machinery::validation;
use capstan_registry::{ResourceInfo, Strategy};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo,
};
use serde_json::{Value, json};

/// Node's identity. Stored where upstream keeps it (`/registry/minions`).
pub static NODE_INFO: ResourceInfo =
    ResourceInfo::of::<Node>(&super::V1, "io.k8s.api.core.v1.Node")
        .short_names(&["no"])
        .with_status()
        .status_on_create()
        .storage_version_hash("XwShjMxG9Fs=")
        .storage_prefix("minions")
        .unconditional_update()
        // NodeStatus's daemonEndpoints and nodeInfo are structs without omitempty.
        .zero(NODE_ZERO)
        // nodeStatusStrategy.GetResetFields.
        .status_resets(&[&["spec"]]);

/// The description of the address columns (`status.addresses`).
const ADDRESSES: &str = "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).";

const NODE_ZERO: &str = r#"{"metadata":{"creationTimestamp":null},"spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}"#;

/// The label the EndpointSlice controller reads a node's zone from.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// A node's zone, if it has one.
pub fn zone(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(ZONE_LABEL))
        .map(String::as_str)
}

/// The Node strategy.
pub struct NodeStrategy;

/// What Go always writes for a node: `spec` and the status structs without `omitempty`; and
/// v1's `podCIDR`, which stands for the first of `podCIDRs` (and wins over it when both are
/// set and differ, as the conversion has it).
fn fill_go_structs(node: &mut Node) {
    let spec = node.spec.get_or_insert_with(NodeSpec::default);
    let single = spec.pod_cidr.clone().filter(|c| !c.is_empty());
    let first = spec.pod_cidrs.as_ref().and_then(|l| l.first()).cloned();
    match (single, first) {
        (Some(single), first) if first.as_ref() != Some(&single) => {
            spec.pod_cidrs = Some(vec![single]);
        }
        (None, Some(first)) => spec.pod_cidr = Some(first),
        _ => {}
    }
    let status = node.status.get_or_insert_with(NodeStatus::default);
    status
        .daemon_endpoints
        .get_or_insert_with(NodeDaemonEndpoints::default)
        .kubelet_endpoint
        .get_or_insert_with(DaemonEndpoint::default);
    status.node_info.get_or_insert_with(NodeSystemInfo::default);
}

/// `validateNodeTaints`, with upstream's paths (under `metadata.taints`, as its code has it).
fn validate_taints(errors: &mut FieldErrors, node: &Node) {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (i, taint) in taints.into_iter().flatten().enumerate() {
        let path = format!("metadata.taints[{i}]");
        errors.check(
            format!("{path}.key"),
            &taint.key,
            validation::qualified_name,
        );
        let value = taint.value.as_deref().unwrap_or_default();
        let problems = validation::label_value(value);
        if !problems.is_empty() {
            errors.push(FieldError::invalid(
                format!("{path}.value"),
                &json!(value),
                problems.join(";"),
            ));
        }
        match taint.effect.as_str() {
            "" => errors.push(FieldError::required(format!("{path}.effect"), "")),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute" => {}
            other => errors.push(FieldError::not_supported(
                format!("{path}.effect"),
                &json!(other),
                &["NoSchedule", "PreferNoSchedule", "NoExecute"],
            )),
        }
        let pair = (taint.key.as_str(), taint.effect.as_str());
        if seen.contains(&pair) {
            // The internal type, without JSON names, is what upstream shows.
            let shown = json!({"Key": taint.key, "Value": value, "Effect": taint.effect,
                "TimeAdded": taint.time_added});
            let mut error = FieldError::duplicate(path.clone(), &shown);
            error.detail = "taints must be unique by key and effect pair".into();
            errors.push(error);
        }
        seen.push(pair);
    }
}

/// `spec.podCIDRs`: valid CIDRs, at most one per family, `podCIDR` its first entry.
fn validate_pod_cidrs(errors: &mut FieldErrors, node: &Node) {
    let Some(spec) = node.spec.as_ref() else {
        return;
    };
    let cidrs = spec.pod_cidrs.clone().unwrap_or_default();
    for (i, cidr) in cidrs.iter().enumerate() {
        let problem = match capstan_machinery::ip::parse_cidr(cidr) {
            None => Some("must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"),
            Some(_) => capstan_machinery::ip::strict_cidr_problem(cidr),
        };
        if let Some(problem) = problem {
            errors.push(FieldError::invalid(
                format!("spec.podCIDRs[{i}]"),
                &json!(cidr),
                problem,
            ));
        }
    }
    // At most one CIDR of each family.
    let v4 = cidrs.iter().filter(|c| !c.contains(':')).count();
    if cidrs.len() > 2 || (cidrs.len() == 2 && v4 != 1) {
        let detail = "may specify no more than one CIDR for each IP family";
        errors.push(FieldError::invalid("spec.podCIDRs", &json!(cidrs), detail));
    }
}

fn validate(node: &Node) -> FieldErrors {
    let mut errors = FieldErrors::new();
    validate_taints(&mut errors, node);
    validate_pod_cidrs(&mut errors, node);
    errors
}

/// The status column: `Ready`, `NotReady` or `Unknown` by the Ready condition, and
/// `SchedulingDisabled` for an unschedulable node.
fn status_cell(node: &Node) -> String {
    let ready = node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "Ready");
    let mut status = vec![match ready {
        Some(c) if c.status == "True" => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    }];
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        status.push("SchedulingDisabled".to_string());
    }
    status.join(",")
}

/// The roles column: `node-role.kubernetes.io/<role>` labels and `kubernetes.io/role`, sorted.
fn roles(node: &Node) -> String {
    let mut roles = std::collections::BTreeSet::new();
    for (key, value) in node.metadata.labels.iter().flatten() {
        if let Some(role) = key.strip_prefix("node-role.kubernetes.io/") {
            if !role.is_empty() {
                roles.insert(role.to_string());
            }
        } else if key == "kubernetes.io/role" && !value.is_empty() {
            roles.insert(value.clone());
        }
    }
    if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    }
}

/// The first address of a type, or `<none>`.
fn address(node: &Node, kind: &str) -> String {
    node.status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .find(|a| a.type_ == kind)
        .map_or_else(|| "<none>".to_string(), |a| a.address.clone())
}

impl Strategy for NodeStrategy {
    type Object = Node;

    fn info(&self) -> &ResourceInfo {
        &NODE_INFO
    }

    /// Go's always-written structs. `nodeStrategy.PrepareForCreate` keeps the status given
    /// (the kubelet registers its node with it): [`NODE_INFO`] says `status_on_create`.
    fn default(&self, node: &mut Node) {
        fill_go_structs(node);
    }

    fn validate_create(&self, node: &Node) -> FieldErrors {
        validate(node)
    }

    /// `ValidateNode` then `ValidateNodeUpdate`, which validates the taints again (upstream
    /// reports a bad taint twice on an update).
    fn validate_update(&self, new: &Node, old: &Node) -> FieldErrors {
        let mut errors = validate(new);
        validate_taints(&mut errors, new);
        let spec = |n: &Node| n.spec.clone().unwrap_or_default();
        let (new_spec, old_spec) = (spec(new), spec(old));
        // podCIDRs may be set once; providerID likewise.
        let old_cidrs = old_spec.pod_cidrs.clone().unwrap_or_default();
        if !old_cidrs.is_empty() && new_spec.pod_cidrs.clone().unwrap_or_default() != old_cidrs {
            errors.push(FieldError::forbidden(
                "spec.podCIDRs",
                "node updates may not change podCIDR except from \"\" to valid",
            ));
        }
        let old_provider = old_spec.provider_id.clone().unwrap_or_default();
        if !old_provider.is_empty() && new_spec.provider_id.unwrap_or_default() != old_provider {
            errors.push(FieldError::forbidden(
                "spec.providerID",
                "node updates may not change providerID except from \"\" to valid",
            ));
        }
        errors
    }

    /// `ValidateNodeUpdate` alone: taints, and no address listed twice.
    fn validate_status_update(&self, new: &Node, _old: &Node) -> FieldErrors {
        let mut errors = FieldErrors::new();
        validate_taints(&mut errors, new);
        let addresses = new.status.iter().flat_map(|s| s.addresses.iter().flatten());
        let mut seen = Vec::new();
        for (i, address) in addresses.enumerate() {
            let pair = (address.type_.clone(), address.address.clone());
            if seen.contains(&pair) {
                errors.push(FieldError::duplicate(
                    format!("status.addresses[{i}]"),
                    &json!({"Type": pair.0, "Address": pair.1}),
                ));
            }
            seen.push(pair);
        }
        errors
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.unschedulable"]
    }

    fn field_value(&self, node: &Node, field: &str) -> Option<String> {
        match field {
            "spec.unschedulable" => Some(
                node.spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false)
                    .to_string(),
            ),
            _ => None,
        }
    }

    fn unsupported_field_message(&self, field: &str) -> String {
        format!("field label not supported: {field}")
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            NAME_COLUMN,
            Column::text("Status", "The status of the node", 0),
            Column::text("Roles", "The roles of the node", 0),
            AGE_COLUMN,
            Column::text("Version", "Kubelet Version reported by the node.", 0),
            Column::text("Internal-IP", ADDRESSES, 1),
            Column::text("External-IP", ADDRESSES, 1),
            Column::text(
                "OS-Image",
                "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
                1,
            ),
            Column::text(
                "Kernel-Version",
                "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
                1,
            ),
            Column::text(
                "Container-Runtime",
                "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
                1,
            ),
        ]
    }

    fn cells(&self, node: &Node) -> Vec<Value> {
        let info = node.status.as_ref().and_then(|s| s.node_info.clone());
        let info = info.unwrap_or_default();
        let or_unknown = |text: &str| {
            let shown = Some(text).filter(|t| !t.is_empty());
            shown.unwrap_or("<unknown>").to_string()
        };
        vec![
            json!(node.metadata.name.as_deref().unwrap_or_default()),
            json!(status_cell(node)),
            json!(roles(node)),
            json!(age(&crate::created(&node.metadata))),
            json!(info.kubelet_version),
            json!(address(node, "InternalIP")),
            json!(address(node, "ExternalIP")),
            json!(or_unknown(&info.os_image)),
            json!(if info.architecture.is_empty() {
                or_unknown(&info.kernel_version)
            } else {
                format!(
                    "{} ({})",
                    or_unknown(&info.kernel_version),
                    info.architecture
                )
            }),
            json!(or_unknown(&info.container_runtime_version)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typed;

    #[test]
    fn a_bare_node_prints_like_upstream() {
        let mut node: Node = typed(json!({"metadata": {"name": "n1",
            "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "edge"}},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]}}));
        NodeStrategy.default(&mut node);
        let cells = NodeStrategy.cells(&node);
        assert_eq!(cells[1], "Unknown");
        assert_eq!(cells[2], "control-plane,edge");
        assert_eq!(cells[4], "");
        assert_eq!(cells[5], "192.0.2.1");
        assert_eq!(cells[6], "<none>");
        assert_eq!(cells[7], "<unknown>");
    }

    #[test]
    fn defaulting_writes_the_structs_go_always_has() {
        let mut node: Node = typed(json!({"metadata": {"name": "n1"}}));
        NodeStrategy.default(&mut node);
        let value = capstan_registry::object::from_typed(&node);
        let zero: Value = serde_json::from_str(NODE_ZERO).expect("zero");
        assert_eq!(value["status"], zero["status"]);
        assert_eq!(value["spec"], json!({}));
    }

    #[test]
    fn taints_need_a_known_effect() {
        let node: Node = typed(json!({"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}}));
        let errors: Vec<String> = validate(&node).0.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "metadata.taints[0].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
            ]
        );
    }
}
