//! Node ports (NodePort and LoadBalancer Services) and the health check node port.

use std::collections::BTreeMap;

use capstan_machinery::ApiError;
use capstan_machinery::field::{FieldError, FieldErrors};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::allocator::{PORT_PREFIX, Picker, invalid};

/// The dry-run placeholder for a dynamic node port: one more than the highest handed out in
/// this request, or 32769 (upstream's dry-run allocator).
fn dry_run_port(used: &[i32]) -> i32 {
    used.iter().max().map_or(32769, |m| m + 1).max(32769)
}

/// A node port nobody holds, other than `used` (a dry run's is a placeholder).
async fn fresh_port(picker: &Picker<'_>, used: &[i32]) -> Result<i32, ApiError> {
    if picker.dry_run {
        Ok(dry_run_port(used))
    } else {
        picker.allocator.dynamic_port(picker.storage, used).await
    }
}

/// Gives `service`'s ports their node ports, and its health check node port when it needs one.
pub(super) async fn allocate(
    picker: &Picker<'_>,
    service: &mut Service,
    creating: bool,
) -> Result<(), ApiError> {
    let Some(spec) = service.spec.as_mut() else {
        return Ok(());
    };
    let used = assign_node_ports(picker, &service.metadata, spec, creating).await?;
    if super::spec::needs_health_check(spec) {
        assign_health_check_port(picker, spec, &used).await?;
    }
    Ok(())
}

/// Checks each requested node port and, when the type wants node ports, picks the missing
/// ones, in port order (a dry run's placeholders depend on it), as upstream's allocator does on
/// create ([`init_node_ports`]) and on update ([`update_node_ports`]). Returns the node ports
/// in use.
async fn assign_node_ports(
    picker: &Picker<'_>,
    metadata: &ObjectMeta,
    spec: &mut ServiceSpec,
    creating: bool,
) -> Result<Vec<i32>, ApiError> {
    // Only NodePort and LoadBalancer Services take node ports (upstream's txnAllocNodePorts);
    // any other asking for one is refused by validation.
    let wants_node_ports = match super::spec::kind(spec) {
        "NodePort" => true,
        "LoadBalancer" => spec.allocate_load_balancer_node_ports != Some(false),
        _ => return Ok(Vec::new()),
    };
    // A health check node port the Service asks for is not handed out to one of its ports.
    let health_check = spec
        .health_check_node_port
        .filter(|p| *p > 0 && super::spec::needs_health_check(spec));
    let mut ports = Ports {
        picker,
        metadata,
        health_check,
        used: Vec::new(),
    };
    if let Some(list) = spec.ports.as_mut() {
        if creating {
            init_node_ports(&mut ports, list, wants_node_ports).await?;
        } else {
            update_node_ports(&mut ports, list, wants_node_ports).await?;
        }
    }
    Ok(ports.used)
}

/// The node ports one write hands out.
struct Ports<'a> {
    picker: &'a Picker<'a>,
    metadata: &'a ObjectMeta,
    health_check: Option<i32>,
    /// Handed out so far, in order.
    used: Vec<i32>,
}

impl Ports<'_> {
    /// Port `i`'s requested node port, checked against the range, other Services and (`here`)
    /// this write's own.
    async fn claim(&mut self, i: usize, requested: i32, here: bool) -> Result<(), ApiError> {
        let taken: &[i32] = if here { &self.used } else { &[] };
        check_requested(self.picker, self.metadata, i, requested, taken).await?;
        self.used.push(requested);
        Ok(())
    }

    /// A node port nobody holds.
    async fn pick(&mut self) -> Result<i32, ApiError> {
        let avoided: Vec<i32> = self.used.iter().copied().chain(self.health_check).collect();
        let fresh = fresh_port(self.picker, &avoided).await?;
        self.used.push(fresh);
        Ok(fresh)
    }
}

/// Upstream's `initNodePorts`: a port number's first port takes what any port of that number
/// asked for (or a fresh one), later ports of the number share it; every request is allocated
/// in turn, so a second port asking for a node port this Service already took is refused
/// ("already allocated") before validation could call it a duplicate.
async fn init_node_ports(
    ports: &mut Ports<'_>,
    list: &mut [ServicePort],
    wants_node_ports: bool,
) -> Result<(), ApiError> {
    let mut by_number: BTreeMap<i32, i32> = BTreeMap::new();
    for i in 0..list.len() {
        let (requested, number) = (list[i].node_port.unwrap_or(0), list[i].port);
        if requested == 0 && !wants_node_ports {
            continue;
        }
        match by_number.get(&number).copied() {
            None => {
                let asked = list
                    .iter()
                    .find(|p| p.port == number && p.node_port.unwrap_or(0) != 0)
                    .and_then(|p| p.node_port);
                let value = match asked {
                    Some(asked) => {
                        ports.claim(i, asked, true).await?;
                        asked
                    }
                    None => ports.pick().await?,
                };
                by_number.insert(number, value);
                list[i].node_port = Some(value);
            }
            Some(shared) if requested == 0 => list[i].node_port = Some(shared),
            Some(shared) if requested != shared => ports.claim(i, requested, true).await?,
            Some(_) => {}
        }
    }
    Ok(())
}

/// Upstream's `updateNodePorts`: each node port new to the Service is allocated once (a
/// duplicate within it is left to validation), and each port without one gets a fresh one.
async fn update_node_ports(
    ports: &mut Ports<'_>,
    list: &mut [ServicePort],
    wants_node_ports: bool,
) -> Result<(), ApiError> {
    for (i, port) in list.iter_mut().enumerate() {
        match port.node_port.unwrap_or(0) {
            0 if wants_node_ports => port.node_port = Some(ports.pick().await?),
            0 => {}
            requested if !ports.used.contains(&requested) => {
                ports.claim(i, requested, false).await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// A requested node port must be in the range (a dry run skips that, as upstream's dry-run
/// allocator does) and not held by another Service.
async fn check_requested(
    picker: &Picker<'_>,
    metadata: &ObjectMeta,
    i: usize,
    requested: i32,
    taken: &[i32],
) -> Result<(), ApiError> {
    let refuse = |message: String| {
        invalid(
            metadata,
            FieldErrors(vec![FieldError::invalid(
                format!("spec.ports[{i}].nodePort"),
                &json!(requested),
                message,
            )]),
        )
    };
    let range = picker.allocator.ports();
    if !picker.dry_run && !range.contains(requested) {
        return Err(refuse(format!(
            "provided port is not in the valid range. The range of valid ports is {range}"
        )));
    }
    if taken.contains(&requested)
        || picker
            .held_by_other(&format!("{PORT_PREFIX}{requested}"))
            .await?
    {
        return Err(refuse("provided port is already allocated".into()));
    }
    Ok(())
}

/// The health check node port: a requested one is checked (upstream refuses it with a 500,
/// not a 422), a missing one picked.
async fn assign_health_check_port(
    picker: &Picker<'_>,
    spec: &mut ServiceSpec,
    used: &[i32],
) -> Result<(), ApiError> {
    let requested = spec.health_check_node_port.unwrap_or(0);
    if requested <= 0 {
        spec.health_check_node_port = Some(fresh_port(picker, used).await?);
        return Ok(());
    }
    let key = format!("{PORT_PREFIX}{requested}");
    if used.contains(&requested) || picker.held_by_other(&key).await? {
        return Err(ApiError::internal(format!(
            "failed to allocate requested HealthCheck NodePort {requested}: provided port is already allocated"
        )));
    }
    let range = picker.allocator.ports();
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
        spec.cluster_ip.clone_from(&old_spec.cluster_ip);
    }
    if none(&spec.cluster_ips) && !none(&old_spec.cluster_ips) {
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
    // Node ports are matched by port name (the user may have changed the rest of the port),
    // and one still in use by another port of the new Service is not taken again.
    let used = |ports: &Option<Vec<ServicePort>>| -> Vec<i32> {
        ports
            .iter()
            .flatten()
            .filter_map(|p| p.node_port.filter(|n| *n != 0))
            .collect()
    };
    let (old_used, new_used) = (used(&old_spec.ports), used(&spec.ports));
    let old_ports: Vec<(Option<String>, i32)> = old_spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().filter(|n| !n.is_empty()),
                p.node_port.unwrap_or(0),
            )
        })
        .collect();
    for port in spec.ports.iter_mut().flatten() {
        if port.node_port.unwrap_or(0) != 0 {
            continue;
        }
        let name = port.name.clone().filter(|n| !n.is_empty());
        // Go's map keeps the last old port of a name.
        let Some((_, node_port)) = old_ports.iter().rev().find(|(n, _)| *n == name) else {
            continue;
        };
        if *node_port != 0 && !(old_used.contains(node_port) && new_used.contains(node_port)) {
            port.node_port = Some(*node_port);
        }
    }
    if super::spec::needs_health_check(old_spec)
        && super::spec::needs_health_check(spec)
        && spec.health_check_node_port.unwrap_or(0) == 0
    {
        spec.health_check_node_port = old_spec.health_check_node_port;
    }
}
