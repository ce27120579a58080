//! What every cluster has, made at start: the built-in namespaces, the `kubernetes` Service,
//! and (through `capstan-aggregation`) the local APIServices of the groups Capstan serves.

use std::sync::Arc;

use capstan_registry::{Registry, WriteOptions};
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
    capstan_aggregation::register_local_apiservices(registries, &options).await?;
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
