//! The controllers a replica runs while it holds the controllers' Lease (or always, with
//! `--leader-elect=false`): endpoints and EndpointSlices, mirroring, the garbage collector,
//! namespaces, APIService availability, the `kubernetes` Service and the allocator repair.

use std::sync::Arc;
use std::time::Duration;

use capstan_controllers::Group;
use capstan_registry::Registry;
use capstan_resources::core::service::ServiceStrategy;
use capstan_storage::Storage;

use crate::registry_for;

/// How often the allocation records are checked against the Services (upstream's repair
/// loops run every 3 minutes).
const REPAIR_INTERVAL: Duration = Duration::from_secs(180);

/// Everything the elected controllers are built from, so a replica can start them afresh
/// each time it becomes the leader.
#[derive(Clone)]
pub(crate) struct Controllers {
    pub registries: Vec<Arc<Registry>>,
    pub services: Arc<ServiceStrategy>,
    pub store: Arc<dyn Storage>,
    /// Whether the endpoints and EndpointSlice controllers run.
    pub endpoints: bool,
    pub max_endpoints_per_slice: usize,
    /// Concurrent syncs: of Endpoints, and of EndpointSlices.
    pub workers: (usize, usize),
    pub proxy_client: Option<Arc<capstan_aggregation::ProxyClient>>,
    /// The port, and the address (if any) the `kubernetes` Service's endpoints publish.
    pub port: u16,
    pub advertise: Option<std::net::IpAddr>,
    /// The replicas' address records the `kubernetes` Service publishes.
    pub masters: capstan_controllers::masters::MasterLeases,
}

impl Controllers {
    /// Starts every controller; stopping the returned group stops them all.
    pub fn start(&self) -> Group {
        let group = Group::new();
        if let Err(error) = self.start_on(&group) {
            tracing::error!(%error, "starting the controllers");
        }
        group
    }

    fn start_on(&self, group: &Group) -> anyhow::Result<()> {
        let registries = &self.registries;
        if self.endpoints {
            use capstan_controllers::{EndpointSliceController, EndpointsController, ServicePods};
            let shared = Arc::new(ServicePods::new(
                registry_for(registries, "services")?,
                registry_for(registries, "pods")?,
            ));
            let endpoints = registry_for(registries, "endpoints")?;
            EndpointsController::new(shared.clone(), endpoints, self.workers.0).start(group)?;
            let slices = registry_for(registries, "endpointslices")?;
            let nodes = registry_for(registries, "nodes")?;
            let max = self.max_endpoints_per_slice;
            EndpointSliceController::new(shared.clone(), (slices, nodes), max, self.workers.1)
                .start(group)?;
            // After its subscribers: each is fed from the first event on.
            shared.start(group)?;
        }
        let this = self.clone();
        group.spawn("controllers", async move {
            if let Err(error) = this.run().await {
                tracing::error!(%error, "starting the controllers");
            }
            std::future::pending::<()>().await
        })?;
        Ok(())
    }

    /// The controllers that share the `controllers` thread; they run until its runtime is
    /// dropped.
    async fn run(self) -> anyhow::Result<()> {
        let registries = &self.registries;
        let services = registry_for(registries, "services")?;
        let slices = registry_for(registries, "endpointslices")?;
        let endpoints = registry_for(registries, "endpoints")?;
        let (allocator, store) = (self.services.allocator().clone(), self.store.clone());
        tokio::spawn(async move {
            loop {
                // Each replica checked at its start; the leader checks again from time to time.
                tokio::time::sleep(REPAIR_INTERVAL).await;
                match allocator.repair(store.as_ref()).await {
                    Ok(0) => {}
                    Ok(fixed) => tracing::warn!(fixed, "allocation repair fixed mismatches"),
                    Err(error) => tracing::warn!(error = %error.message, "allocation repair"),
                }
            }
        });
        capstan_controllers::GarbageCollector::new(registries.clone()).start();
        capstan_controllers::MirroringController::new(
            services.clone(),
            endpoints.clone(),
            slices.clone(),
        )
        .start();
        capstan_controllers::NamespaceController::new(
            registry_for(registries, "namespaces")?,
            registries
                .iter()
                .filter(|r| r.strategy().info().namespaced)
                .cloned()
                .collect(),
        )
        .start();
        capstan_aggregation::AvailabilityController::new(
            registry_for(registries, "apiservices")?,
            services.clone(),
            slices.clone(),
        )
        .with_proxy_client(self.proxy_client.clone())
        .start();
        let mut keeper = capstan_controllers::KubernetesServiceController::new(
            services,
            &self.services.allocator().primary().first_host(),
            self.port,
        );
        if let Some(address) = self.advertise {
            keeper = keeper
                .with_endpoints((endpoints, slices), address, self.port)
                .with_master_leases(self.masters.clone());
        }
        if let Err(error) = keeper.reconcile().await {
            tracing::warn!(%error, "reconciling the kubernetes Service");
        }
        keeper.start();
        Ok(())
    }
}
