//! Keeps the built-in `default/kubernetes` Service: created at start-up, re-created when
//! deleted, its type and ports put back when edited (upstream's kube-apiserver controller);
//! and, when the server has an address clients can reach (not loopback, which Endpoints may
//! not hold), its Endpoints: that address and the secure port (upstream's endpoint reconciler).

use std::sync::Arc;
use std::time::Duration;

use capstan_registry::{ReadAt, Registry, Subresource, WriteOptions};
use serde_json::Value;

/// How often the Service is checked.
const RESYNC: Duration = Duration::from_secs(10);

/// The `kubernetes` Service's keeper.
pub struct KubernetesServiceController {
    services: Arc<Registry>,
    wanted: Value,
    endpoints: Option<(Arc<Registry>, Value)>,
}

impl KubernetesServiceController {
    /// Keeps `wanted` (the Service as the server would create it) in `services`.
    pub fn new(services: Arc<Registry>, wanted: Value) -> Self {
        KubernetesServiceController {
            services,
            wanted,
            endpoints: None,
        }
    }

    /// Also keeps the `kubernetes` Endpoints: `address` and `port` (named `https`).
    pub fn with_endpoints(
        mut self,
        endpoints: Arc<Registry>,
        address: std::net::IpAddr,
        port: u16,
    ) -> Self {
        let wanted = serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": [{"addresses": [{"ip": address.to_string()}],
                         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
        });
        self.endpoints = Some((endpoints, wanted));
        self
    }

    async fn reconcile_endpoints(&self) -> Result<(), String> {
        let Some((endpoints, wanted)) = &self.endpoints else {
            return Ok(());
        };
        let options = Self::options();
        match endpoints.get("default", "kubernetes", ReadAt::Latest).await {
            Err(e) if e.is_not_found() => {
                match endpoints.create("default", wanted.clone(), &options).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.is_conflict() => Ok(()),
                    Err(e) => Err(format!("creating the kubernetes Endpoints: {}", e.message)),
                }
            }
            Err(e) => Err(format!("reading the kubernetes Endpoints: {}", e.message)),
            Ok(current) => {
                if current.get("subsets") == wanted.get("subsets") {
                    return Ok(());
                }
                let mut fixed = current;
                fixed["subsets"] = wanted["subsets"].clone();
                endpoints
                    .update("default", "kubernetes", fixed, &options, Subresource::Main)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("repairing the kubernetes Endpoints: {}", e.message))
            }
        }
    }

    fn options() -> WriteOptions {
        WriteOptions {
            dry_run: false,
            field_manager: "kube-apiserver".into(),
            applied: false,
        }
    }

    /// Creates the Service (and Endpoints) if missing, or puts them back if they drifted.
    pub async fn reconcile(&self) -> Result<(), String> {
        self.reconcile_service().await?;
        self.reconcile_endpoints().await
    }

    async fn reconcile_service(&self) -> Result<(), String> {
        let options = Self::options();
        match self
            .services
            .get("default", "kubernetes", ReadAt::Latest)
            .await
        {
            Err(e) if e.is_not_found() => {
                match self
                    .services
                    .create("default", self.wanted.clone(), &options)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if e.is_conflict() => Ok(()),
                    Err(e) => Err(format!("creating the kubernetes Service: {}", e.message)),
                }
            }
            Err(e) => Err(format!("reading the kubernetes Service: {}", e.message)),
            Ok(current) => {
                let drifted = current.pointer("/spec/type") != self.wanted.pointer("/spec/type")
                    || current.pointer("/spec/ports") != self.wanted.pointer("/spec/ports");
                if !drifted {
                    return Ok(());
                }
                let mut fixed = current;
                fixed["spec"]["type"] = self.wanted["spec"]["type"].clone();
                fixed["spec"]["ports"] = self.wanted["spec"]["ports"].clone();
                self.services
                    .update("default", "kubernetes", fixed, &options, Subresource::Main)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("repairing the kubernetes Service: {}", e.message))
            }
        }
    }

    /// Reconciles every [`RESYNC`] in a background task.
    pub fn start(self) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RESYNC);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(error) = self.reconcile().await {
                    tracing::warn!(%error, "reconciling the kubernetes Service");
                }
            }
        });
    }
}
