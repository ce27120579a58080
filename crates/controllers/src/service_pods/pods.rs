//! What the controllers read of a pod: the view kept per pod, its Ready condition, the target
//! port a Service port has on it, its addresses in canonical form.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodSpec, PodStatus, ServicePort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::index::Labels;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The view of a decoded pod ([`pod_view_of_json`]'s tests check it decodes the same).
#[cfg(test)]
pub(crate) fn pod_view(pod: &Pod) -> Pod {
    let container = |c: &Container| Container {
        name: c.name.clone(),
        ports: c.ports.clone(),
        restart_policy: c.restart_policy.clone(),
        ..Container::default()
    };
    let spec = pod.spec.as_ref().map(|spec| PodSpec {
        hostname: spec.hostname.clone(),
        subdomain: spec.subdomain.clone(),
        node_name: spec.node_name.clone(),
        containers: spec.containers.iter().map(container).collect(),
        init_containers: spec
            .init_containers
            .as_ref()
            .map(|list| list.iter().map(container).collect()),
        ..PodSpec::default()
    });
    let status = pod.status.as_ref().map(|status| PodStatus {
        phase: status.phase.clone(),
        pod_ip: status.pod_ip.clone(),
        pod_ips: status.pod_ips.clone(),
        conditions: status
            .conditions
            .as_ref()
            .map(|c| c.iter().filter(|c| c.type_ == "Ready").cloned().collect()),
        ..PodStatus::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            labels: pod.metadata.labels.clone(),
            deletion_timestamp: pod.metadata.deletion_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec,
        status,
    }
}

/// The part of a pod the controllers read (labels, identity, hostname and subdomain, node,
/// container ports, IPs, phase, the Ready condition), kept per pod from the pod watch so a
/// sync decodes nothing: a Service of 50 pods costs 50 map lookups, not 50 JSON decodes. It
/// is decoded straight from the pod's JSON: the rest of the pod (images, environment,
/// volumes, managedFields, other conditions) is skipped, not built.
pub(crate) fn pod_view_of_json(json: &[u8]) -> Option<Pod> {
    use k8s_openapi::api::core::v1::{ContainerPort, PodCondition, PodIP};
    #[derive(serde::Deserialize)]
    struct Read {
        metadata: Option<Meta>,
        spec: Option<Spec>,
        status: Option<Status>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        labels: Option<Labels>,
        deletion_timestamp: Option<Time>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        hostname: Option<String>,
        subdomain: Option<String>,
        node_name: Option<String>,
        containers: Option<Vec<Port>>,
        init_containers: Option<Vec<Port>>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Port {
        name: Option<String>,
        ports: Option<Vec<ContainerPort>>,
        restart_policy: Option<String>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        phase: Option<String>,
        #[serde(rename = "podIP")]
        pod_ip: Option<String>,
        #[serde(rename = "podIPs")]
        pod_ips: Option<Vec<PodIP>>,
        conditions: Option<Vec<PodCondition>>,
    }
    let read: Read = serde_json::from_slice(json).ok()?;
    let metadata = read.metadata.unwrap_or_default();
    let container = |c: Port| Container {
        name: c.name.unwrap_or_default(),
        ports: c.ports,
        restart_policy: c.restart_policy,
        ..Container::default()
    };
    Some(Pod {
        metadata: ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            labels: metadata.labels,
            deletion_timestamp: metadata.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: read.spec.map(|spec| PodSpec {
            hostname: spec.hostname,
            subdomain: spec.subdomain,
            node_name: spec.node_name,
            containers: spec
                .containers
                .into_iter()
                .flatten()
                .map(container)
                .collect(),
            init_containers: spec
                .init_containers
                .map(|list| list.into_iter().map(container).collect()),
            ..PodSpec::default()
        }),
        status: read.status.map(|status| PodStatus {
            phase: status.phase,
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            conditions: status
                .conditions
                .map(|c| c.into_iter().filter(|c| c.type_ == "Ready").collect()),
            ..PodStatus::default()
        }),
    })
}

/// An address as Endpoints and slices hold it: canonical. `parsed_from` is the text `ip` was
/// parsed from (by std or [`capstan_machinery::ip::parse_sloppy`]): for IPv4 four decimal
/// parts, and when it is as short as the canonical form it has no leading zero, so it is that
/// form and is copied, not formatted again.
pub(crate) fn canonical(ip: &IpAddr, parsed_from: &str) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let digits = |o: &u8| match *o {
                100.. => 3,
                10.. => 2,
                _ => 1,
            };
            let len = v4.octets().iter().map(digits).sum::<usize>() + 3;
            if parsed_from.len() == len {
                parsed_from.to_string()
            } else {
                ip.to_string()
            }
        }
        IpAddr::V6(_) => ip.to_string(),
    }
}

pub(crate) fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The target port of a Service port for one pod (upstream's `FindPort`: a number as it is,
/// a name from the pod's containers, then its sidecars, with the port's protocol).
pub(crate) fn target_port(service_port: &ServicePort, pod: &Pod) -> Option<i32> {
    let protocol = service_port.protocol.as_deref().unwrap_or("TCP");
    let name = match &service_port.target_port {
        Some(IntOrString::Int(n)) => return Some(*n),
        Some(IntOrString::String(name)) => name,
        None => return Some(service_port.port),
    };
    let spec = pod.spec.as_ref()?;
    let search = |containers: &[Container], sidecars_only: bool| {
        containers
            .iter()
            .filter(|c| !sidecars_only || c.restart_policy.as_deref() == Some("Always"))
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| {
                p.name.as_deref() == Some(name.as_str())
                    && p.protocol.as_deref().unwrap_or("TCP") == protocol
            })
            .map(|p| p.container_port)
    };
    search(&spec.containers, false)
        .or_else(|| search(spec.init_containers.as_deref().unwrap_or_default(), true))
}
