//! Cluster IPs: the IP family policy and families a Service resolves to (upstream's
//! `initIPFamilyFields`), and the addresses it is given.

use std::net::IpAddr;

use capstan_machinery::ApiError;
use capstan_machinery::field::{FieldError, FieldErrors};
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::allocator::{Allocations, IP_PREFIX, Picker, invalid};

/// What a Service asks for: its cluster IPs, policy and families as sent (or kept).
struct Request {
    ips: Vec<String>,
    policy: String,
    families: Vec<String>,
    headless: bool,
    has_selector: bool,
}

impl Request {
    fn of(spec: &ServiceSpec) -> Self {
        let mut ips = spec.cluster_ips.clone().unwrap_or_default();
        let cluster_ip = super::spec::cluster_ip(spec);
        if !cluster_ip.is_empty() && ips.is_empty() {
            ips.push(cluster_ip.to_string());
        }
        let headless = ips.first().is_some_and(|ip| ip == "None");
        let has_selector = spec.selector.as_ref().is_some_and(|m| !m.is_empty());
        let policy = match spec.ip_family_policy.as_deref().unwrap_or_default() {
            "" if headless && !has_selector => "RequireDualStack".to_string(),
            // Upstream's inferred default: two addresses or two families ask for dual stack.
            "" if ips.len() == 2 || spec.ip_families.as_ref().is_some_and(|f| f.len() == 2) => {
                "RequireDualStack".to_string()
            }
            "" => "SingleStack".to_string(),
            given => given.to_string(),
        };
        Request {
            ips,
            policy,
            families: spec.ip_families.clone().unwrap_or_default(),
            headless,
            has_selector,
        }
    }

    /// An update's downgrade to single-stack releases the secondary address and family; any
    /// other policy may not drop them.
    fn follow_old(&mut self, old: &Service) -> FieldErrors {
        let old_spec = super::spec::of(old);
        let old_ips = old_spec.cluster_ips.clone().unwrap_or_default();
        let old_families = old_spec.ip_families.clone().unwrap_or_default();
        let mut errors = FieldErrors::new();
        if self.policy == "SingleStack" {
            if self.ips == old_ips && self.ips.len() == 2 {
                self.ips.truncate(1);
            }
            if self.families == old_families && self.families.len() == 2 {
                self.families.truncate(1);
            }
            return errors;
        }
        for (released, what) in [
            (old_ips.len() == 2 && self.ips.len() == 1, "cluster IP"),
            (
                old_families.len() == 2 && self.families.len() == 1,
                "IP family",
            ),
        ] {
            if released {
                errors.push(FieldError::invalid(
                    "spec.ipFamilyPolicy",
                    &json!(self.policy),
                    format!("must be 'SingleStack' to release the secondary {what}"),
                ));
            }
        }
        errors
    }

    /// Fills the families from the addresses, the cluster's configuration and the policy, in
    /// `initIPFamilyFields`' order: `errors` (an update's) join the policy and inference checks,
    /// then the headless-selectorless special case, then the cluster's configuration.
    fn resolve_families(
        &mut self,
        configured: &[&'static str],
        mut errors: FieldErrors,
    ) -> FieldErrors {
        let primary = configured[0];
        let other = |family: &str| if family == "IPv4" { "IPv6" } else { "IPv4" };
        // A single-stack Service holds one address of one family.
        if self.policy == "SingleStack" {
            for (count, what) in [
                (self.ips.len(), "cluster IPs"),
                (self.families.len(), "IP families"),
            ] {
                if count == 2 {
                    errors.push(FieldError::invalid(
                        "spec.ipFamilyPolicy",
                        &json!(self.policy),
                        format!("must be 'RequireDualStack' or 'PreferDualStack' when multiple {what} are specified"),
                    ));
                }
            }
        }
        for (i, ip) in self.ips.iter().enumerate() {
            let Ok(addr) = ip.parse::<IpAddr>() else {
                break;
            };
            if i < self.families.len() {
                continue;
            }
            let family = if addr.is_ipv4() { "IPv4" } else { "IPv6" };
            if configured.contains(&family) {
                self.families.push(family.into());
            } else {
                errors.push(FieldError::invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &json!(self.ips),
                    format!("{family} is not configured on this cluster"),
                ));
            }
        }
        if !errors.is_empty() {
            return errors;
        }
        // Headless without a selector may name families the cluster does not serve.
        if self.headless && !self.has_selector {
            if self.families.is_empty() {
                self.families.push(primary.to_string());
            }
            if self.policy != "SingleStack" && self.families.len() == 1 {
                let second = other(&self.families[0]);
                self.families.push(second.to_string());
            }
            return errors;
        }
        if self.policy == "RequireDualStack" && configured.len() < 2 {
            errors.push(FieldError::invalid(
                "spec.ipFamilyPolicy",
                &json!(self.policy),
                "this cluster is not configured for dual-stack services",
            ));
        }
        for (i, family) in self.families.iter().enumerate() {
            if !configured.contains(&&**family) {
                errors.push(FieldError::invalid(
                    format!("spec.ipFamilies[{i}]"),
                    &json!(family),
                    "not configured on this cluster",
                ));
            }
        }
        if !errors.is_empty() {
            return errors;
        }
        if self.families.is_empty() {
            self.families.push(primary.to_string());
        }
        if self.policy != "SingleStack" && self.families.len() == 1 && configured.len() == 2 {
            let second = other(&self.families[0]);
            self.families.push(second.to_string());
        }
        errors
    }
}

/// `isMatchingPreferDualStackClusterIPFields`: an update that keeps a PreferDualStack Service's
/// type, addresses and families is not upgraded or downgraded after the cluster's families
/// changed.
fn keeps_prefer_dual_stack(spec: &ServiceSpec, old: &Service) -> bool {
    let old_spec = super::spec::of(old);
    let kind = |s: &ServiceSpec| s.type_.clone().unwrap_or_default();
    let prefer = |s: &ServiceSpec| s.ip_family_policy.as_deref() == Some("PreferDualStack");
    kind(spec) == kind(&old_spec)
        && matches!(&*kind(spec), "ClusterIP" | "NodePort" | "LoadBalancer")
        && prefer(spec)
        && prefer(&old_spec)
        && spec.cluster_ips.clone().unwrap_or_default()
            == old_spec.cluster_ips.clone().unwrap_or_default()
        && spec.ip_families.clone().unwrap_or_default()
            == old_spec.ip_families.clone().unwrap_or_default()
}

/// Resolves `service`'s families and policy and gives it its cluster IPs (requested ones
/// checked against the range and other Services; the rest picked). A dry run reserves nothing.
pub(super) async fn allocate(
    picker: &Picker<'_>,
    service: &mut Service,
    old: Option<&Service>,
) -> Result<(), ApiError> {
    let old_spec = old.map(super::spec::of);
    let problems = super::validation::validate_cluster_ip_fields(
        &super::spec::of(service),
        old_spec.as_deref(),
    );
    if !problems.is_empty() {
        return Err(invalid(&service.metadata, problems));
    }
    let Some(spec) = service.spec.as_ref() else {
        return Err(ApiError::bad_request("spec is required"));
    };
    let mut request = Request::of(spec);
    if !old.is_some_and(|old| keeps_prefer_dual_stack(spec, old)) {
        let errors = old.map(|old| request.follow_old(old)).unwrap_or_default();
        let errors = request.resolve_families(&picker.allocator.families(), errors);
        if !errors.is_empty() {
            return Err(invalid(&service.metadata, errors));
        }
    }
    let addresses = if request.headless {
        vec!["None".to_string()]
    } else {
        let held = old.map(Allocations::of).unwrap_or_default().ips;
        addresses(picker, &service.metadata, &request, &held).await?
    };
    let Some(spec) = service.spec.as_mut() else {
        return Err(ApiError::bad_request("spec is required"));
    };
    spec.ip_family_policy = Some(request.policy);
    spec.ip_families = Some(request.families);
    if let Some(first) = addresses.first() {
        spec.cluster_ip = Some(first.clone());
    }
    spec.cluster_ips = Some(addresses);
    Ok(())
}

/// One address per family: the requested one (if the Service held it already, or it is in
/// range and free), else a fresh pick (a dry run's placeholder is the network address).
async fn addresses(
    picker: &Picker<'_>,
    metadata: &ObjectMeta,
    request: &Request,
    held: &[String],
) -> Result<Vec<String>, ApiError> {
    let allocator = picker.allocator;
    let refuse = |message: String| {
        invalid(
            metadata,
            FieldErrors(vec![FieldError::invalid(
                "spec.clusterIPs",
                &json!(request.ips),
                message,
            )]),
        )
    };
    let mut allocated = Vec::new();
    for (i, family) in request.families.iter().enumerate() {
        let Some(index) = allocator.ranges().iter().position(|r| r.family() == family) else {
            continue;
        };
        let range = &allocator.ranges()[index];
        match request.ips.get(i) {
            Some(requested) if held.contains(requested) => allocated.push(requested.clone()),
            Some(requested) => {
                if range.offset_of(requested).is_none() {
                    return Err(refuse(if range.contains_network(requested) {
                        format!(
                            "failed to allocate IP {requested}: the provided IP ({requested}) is not in the valid range. The range of valid IPs is {range}"
                        )
                    } else {
                        format!(
                            "failed to allocate IP {requested}: the provided network does not match the current range"
                        )
                    }));
                }
                // A dry run checks the range only, as upstream's dry-run allocator does.
                let key = format!("{IP_PREFIX}{requested}");
                if !picker.dry_run && picker.held_by_other(&key).await? {
                    return Err(refuse(format!(
                        "failed to allocate IP {requested}: provided IP is already allocated"
                    )));
                }
                allocated.push(requested.clone());
            }
            None if picker.dry_run => allocated.push(range.address(0)),
            None => allocated.push(allocator.dynamic_ip(picker.storage, index).await?),
        }
    }
    Ok(allocated)
}

/// `normalizeClusterIPs`: guesses what a client meant when it set only one of `clusterIP` and
/// `clusterIPs`. On create a `clusterIP` alone fills `clusterIPs`; on update (`old`) a changed
/// `clusterIP` with `clusterIPs` as they were takes `clusterIPs` along (cleared with it, or
/// becoming it), so that validation reports the change itself ("may not change once set").
pub fn normalize(service: &mut Service, old: Option<&Service>) {
    let Some(spec) = service.spec.as_mut() else {
        return;
    };
    let ip = super::spec::cluster_ip(spec).to_string();
    let ips = spec.cluster_ips.clone().unwrap_or_default();
    let Some(old) = old else {
        if !ip.is_empty() && ips.is_empty() {
            spec.cluster_ips = Some(vec![ip]);
        }
        return;
    };
    let old_spec = super::spec::of(old);
    let old_ip = super::spec::cluster_ip(&old_spec);
    let old_ips = old_spec.cluster_ips.as_deref().unwrap_or_default();
    if !old_ips.is_empty() && ips.is_empty() && old_ip == ip {
        spec.cluster_ips = old_spec.cluster_ips.clone();
    }
    let same = spec.cluster_ips.as_deref().unwrap_or_default() == old_ips;
    if old_ip != ip && same {
        spec.cluster_ips = if !old_ip.is_empty() && ip.is_empty() {
            None
        } else {
            Some(vec![ip])
        };
    }
}
