//! What every cluster has, made at start: the built-in namespaces, the `kubernetes` Service,
//! and the local APIServices of the groups Capstan serves itself.

use std::sync::Arc;

use capstan_registry::{Registry, Subresource, WriteOptions};
use capstan_resources::core::service::ServiceStrategy;

use crate::registry_for;

/// Creates what every cluster has: the built-in namespaces and the `kubernetes` Service.
pub(crate) async fn bootstrap(
    registries: &[Arc<Registry>],
    services: &ServiceStrategy,
    (port, advertise): (u16, Option<std::net::IpAddr>),
    masters: &capstan_controllers::masters::MasterLeases,
) -> anyhow::Result<()> {
    let options = WriteOptions {
        dry_run: false,
        field_manager: "kube-apiserver".into(),
        applied: false,
    };
    let namespaces = registry_for(registries, "namespaces")?;
    for name in capstan_resources::core::namespace::BUILT_IN {
        let object = serde_json::json!({"metadata": {"name": name}});
        match namespaces.create("", object, &options).await {
            Ok(_) => {}
            Err(e) if e.is_conflict() => {}
            Err(e) => anyhow::bail!("creating namespace {name}: {}", e.message),
        }
    }
    register_local_apiservices(registries, &options).await?;
    let mut keeper = capstan_controllers::KubernetesServiceController::new(
        registry_for(registries, "services")?,
        &services.allocator().primary().first_host(),
        port,
    );
    if let Some(address) = advertise {
        keeper = keeper
            .with_endpoints(
                (
                    registry_for(registries, "endpoints")?,
                    registry_for(registries, "endpointslices")?,
                ),
                address,
                port,
            )
            .with_master_leases(masters.clone());
    }
    // Each replica makes sure the Service exists before it serves (upstream's bootstrap
    // post-start hook); the leader keeps it afterwards.
    keeper.reconcile().await?;
    Ok(())
}

/// The local APIServices of the groups Capstan serves itself (`v1.`, `v1.discovery.k8s.io`,
/// …; the aggregator's own group is not registered, as upstream), with the priorities
/// discovery gives them. Created when missing; the spec reset at start while it carries the
/// `onstart` label; left alone without it.
async fn register_local_apiservices(
    registries: &[Arc<Registry>],
    options: &WriteOptions,
) -> anyhow::Result<()> {
    let mut groups: Vec<(&str, &str, (i64, i64))> = Vec::new();
    for registry in registries {
        let info = registry.strategy().info();
        let priority = if info.group.is_empty() {
            (18000, 1)
        } else {
            info.priority
        };
        let entry = (info.group, info.version, priority);
        if info.group != "apiregistration.k8s.io" && !groups.contains(&entry) {
            groups.push(entry);
        }
    }
    let apiservices = registry_for(registries, "apiservices")?;
    for (group, version, (group_priority, version_priority)) in groups {
        let mut spec = serde_json::json!({"version": version,
            "groupPriorityMinimum": group_priority, "versionPriority": version_priority});
        if !group.is_empty() {
            spec["group"] = group.into();
        }
        register_local_apiservice(&apiservices, &format!("{version}.{group}"), spec, options)
            .await?;
    }
    Ok(())
}

async fn register_local_apiservice(
    apiservices: &Registry,
    name: &str,
    spec: serde_json::Value,
    options: &WriteOptions,
) -> anyhow::Result<()> {
    use capstan_resources::apiregistration::apiservice::AUTOMANAGED;
    match apiservices
        .get("", name, capstan_registry::ReadAt::Latest)
        .await
    {
        Ok(mut existing) => {
            let managed = existing
                .pointer("/metadata/labels")
                .and_then(|l| l.get(AUTOMANAGED))
                .and_then(serde_json::Value::as_str)
                == Some("onstart");
            if managed && existing.is_object() && existing.get("spec") != Some(&spec) {
                existing["spec"] = spec;
                // In its type's form (field order included), as an update's object must be.
                let existing = apiservices
                    .strategy()
                    .decode(existing)
                    .map_err(|e| anyhow::anyhow!("resetting APIService {name}: {e}"))?;
                apiservices
                    .update("", name, existing, options, Subresource::Main)
                    .await
                    .map_err(|e| anyhow::anyhow!("resetting APIService {name}: {}", e.message))?;
            }
        }
        Err(e) if e.is_not_found() => {
            let object = serde_json::json!({
                "metadata": {"name": name, "labels": {AUTOMANAGED: "onstart"}},
                "spec": spec,
            });
            match apiservices.create("", object, options).await {
                Ok(_) => {}
                Err(e) if e.is_conflict() => {}
                Err(e) => anyhow::bail!("registering APIService {name}: {}", e.message),
            }
        }
        Err(e) => anyhow::bail!("reading APIService {name}: {}", e.message),
    }
    Ok(())
}
