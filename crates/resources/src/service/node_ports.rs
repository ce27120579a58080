//! Node ports (NodePort and LoadBalancer Services) and the health check node port.

use std::collections::BTreeMap;

use capstan_machinery::ApiError;
use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_storage::Storage;
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

use super::allocator::{PORT_PREFIX, ServiceAllocator, invalid};

/// The dry-run placeholder for a dynamic node port: one more than the highest handed out in
/// this request, or 32769 (upstream's dry-run allocator).
fn dry_run_port(used: &[i32]) -> i32 {
    used.iter().max().map_or(32769, |m| m + 1).max(32769)
}

async fn fresh_port(
    allocator: &ServiceAllocator,
    storage: &dyn Storage,
    used: &[i32],
    dry_run: bool,
) -> Result<i32, ApiError> {
    if dry_run {
        Ok(dry_run_port(used))
    } else {
        allocator.dynamic_port(storage, used).await
    }
}

/// Gives `service`'s ports their node ports (requested ones checked; ports sharing a number
/// share one), and its health check node port when it needs one.
pub(super) async fn allocate(
    allocator: &ServiceAllocator,
    storage: &dyn Storage,
    service: &mut Service,
    owner: &str,
    dry_run: bool,
) -> Result<(), ApiError> {
    let snapshot = service.clone();
    let refuse = |i: usize, requested: i32, message: String| {
        invalid(
            &snapshot,
            FieldErrors(vec![FieldError::invalid(
                format!("spec.ports[{i}].nodePort"),
                &json!(requested),
                message,
            )]),
        )
    };
    let Some(spec) = service.spec.as_mut() else {
        return Ok(());
    };
    let range = allocator.ports();
    let kind = super::spec::kind(spec);
    let wants_node_ports = kind == "NodePort"
        || (kind == "LoadBalancer" && spec.allocate_load_balancer_node_ports != Some(false));
    let mut used: Vec<i32> = Vec::new();
    let mut by_port: BTreeMap<i32, i32> = BTreeMap::new();
    for (i, port) in spec.ports.iter_mut().flatten().enumerate() {
        let requested = port.node_port.unwrap_or(0);
        if requested > 0 {
            if !used.contains(&requested) {
                if !dry_run && !range.contains(requested) {
                    return Err(refuse(
                        i,
                        requested,
                        format!(
                            "provided port is not in the valid range. The range of valid ports is {range}"
                        ),
                    ));
                }
                let key = format!("{PORT_PREFIX}{requested}");
                if ServiceAllocator::held_by_other(storage, &key, owner).await? {
                    return Err(refuse(
                        i,
                        requested,
                        "provided port is already allocated".into(),
                    ));
                }
                used.push(requested);
            }
            by_port.entry(port.port).or_insert(requested);
            continue;
        }
        if !wants_node_ports {
            continue;
        }
        let value = match by_port.get(&port.port) {
            Some(shared) => *shared,
            None => {
                let fresh = fresh_port(allocator, storage, &used, dry_run).await?;
                used.push(fresh);
                by_port.insert(port.port, fresh);
                fresh
            }
        };
        port.node_port = Some(value);
    }
    if !super::spec::needs_health_check(spec) {
        return Ok(());
    }
    let requested = spec.health_check_node_port.unwrap_or(0);
    if requested <= 0 {
        spec.health_check_node_port = Some(fresh_port(allocator, storage, &used, dry_run).await?);
        return Ok(());
    }
    let key = format!("{PORT_PREFIX}{requested}");
    if used.contains(&requested) || ServiceAllocator::held_by_other(storage, &key, owner).await? {
        return Err(ApiError::internal(format!(
            "failed to allocate requested HealthCheck NodePort {requested}: provided port is already allocated"
        )));
    }
    if !range.contains(requested) {
        return Err(ApiError::internal(format!(
            "failed to allocate requested HealthCheck NodePort {requested}: provided port is not in the valid range. The range of valid ports is {range}"
        )));
    }
    Ok(())
}

/// `patchAllocatedValues`: a PUT that omits allocated values keeps them.
pub fn keep_allocated_values(new: &mut Service, old: &Service) {
    let Some(old_spec) = old.spec.as_ref() else {
        return;
    };
    let Some(spec) = new.spec.as_mut() else {
        return;
    };
    let (old_type, new_type) = (
        super::spec::kind(old_spec).to_string(),
        super::spec::kind(spec).to_string(),
    );
    if old_type == "ExternalName" || new_type == "ExternalName" {
        return;
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(str::is_empty);
    let none = |v: &Option<Vec<String>>| v.as_ref().is_none_or(Vec::is_empty);
    if blank(&spec.cluster_ip) {
        if old_spec.cluster_ip.is_some() {
            spec.cluster_ip.clone_from(&old_spec.cluster_ip);
        }
        if old_spec.cluster_ips.is_some() {
            spec.cluster_ips.clone_from(&old_spec.cluster_ips);
        }
    } else if none(&spec.cluster_ips)
        && spec.cluster_ip == old_spec.cluster_ip
        && old_spec.cluster_ips.is_some()
    {
        spec.cluster_ips.clone_from(&old_spec.cluster_ips);
    }
    if none(&spec.ip_families) && old_spec.ip_families.is_some() {
        spec.ip_families.clone_from(&old_spec.ip_families);
    }
    if blank(&spec.ip_family_policy) && old_spec.ip_family_policy.is_some() {
        spec.ip_family_policy.clone_from(&old_spec.ip_family_policy);
    }
    if !matches!(&*new_type, "NodePort" | "LoadBalancer") {
        return;
    }
    let old_ports: Vec<(i32, i32)> = old_spec
        .ports
        .iter()
        .flatten()
        .map(|p| (p.port, p.node_port.unwrap_or(0)))
        .collect();
    for port in spec.ports.iter_mut().flatten() {
        if port.node_port.unwrap_or(0) != 0 {
            continue;
        }
        if let Some((_, node_port)) = old_ports.iter().find(|(p, n)| *p == port.port && *n > 0) {
            port.node_port = Some(*node_port);
        }
    }
    if spec.health_check_node_port.is_none() && old_spec.health_check_node_port.is_some() {
        spec.health_check_node_port = old_spec.health_check_node_port;
    }
}
