//! Keeps the built-in `default/kubernetes` Service: created at start-up, re-created when
//! deleted, its type and ports put back when edited (upstream's kube-apiserver controller);
//! and, when the server has an address clients can reach (not loopback, which Endpoints may
//! not hold), its Endpoints and EndpointSlice: the address of every live replica
//! ([`crate::masters`], upstream's `lease` endpoint reconciler) and the secure port.

use std::sync::Arc;
use std::time::Duration;

use capstan_machinery::ApiError;

use crate::runtime::{Backoff, Controller, WorkQueue};
use capstan_registry::object::from_typed;
use capstan_registry::{Object, ReadAt, Registry, Subresource, WriteOptions};
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// How often the Service is checked.
const RESYNC: Duration = Duration::from_secs(10);
const NAMESPACE: &str = "default";
const NAME: &str = "kubernetes";

/// A reconcile that did not complete (retried at the next resync).
#[derive(Debug, thiserror::Error)]
#[error("{step} the kubernetes {kind}: {}", .error.message)]
pub struct ReconcileError {
    /// `creating`, `reading` or `repairing`.
    step: &'static str,
    /// `Service`, `Endpoints` or `EndpointSlice`.
    kind: &'static str,
    error: ApiError,
}

/// The `kubernetes` Service's keeper.
pub struct KubernetesServiceController {
    services: Arc<Registry>,
    wanted: Service,
    /// This replica's address and secure port, published in the endpoints.
    address: Option<(std::net::IpAddr, u16)>,
    endpoints: Option<Arc<Registry>>,
    slices: Option<Arc<Registry>>,
    /// The other replicas' addresses (all of them live ones are published).
    masters: Option<crate::masters::MasterLeases>,
}

impl KubernetesServiceController {
    /// Keeps the `kubernetes` Service in `services`: ClusterIP `cluster_ip` (the first address
    /// of the primary range), port 443 named `https` to the server's secure `port`.
    pub fn new(services: Arc<Registry>, cluster_ip: &str, port: u16) -> Self {
        let wanted = Service {
            metadata: ObjectMeta {
                name: Some(NAME.into()),
                labels: Some(
                    [
                        ("component".into(), "apiserver".into()),
                        ("provider".into(), "kubernetes".into()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                cluster_ip: Some(cluster_ip.into()),
                session_affinity: Some("None".into()),
                ip_family_policy: Some("SingleStack".into()),
                ports: Some(vec![ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    protocol: Some("TCP".into()),
                    target_port: Some(IntOrString::Int(i32::from(port))),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        };
        KubernetesServiceController {
            services,
            wanted,
            address: None,
            endpoints: None,
            slices: None,
            masters: None,
        }
    }

    /// Also keeps the `kubernetes` Endpoints, and the EndpointSlice that goes with them
    /// (upstream's endpoints adapter: named `kubernetes`, labelled only with the Service's
    /// name, not owned and not managed by a controller, its endpoints only `ready`): this
    /// replica's `address` and `port` (named `https`).
    pub fn with_endpoints(
        mut self,
        (endpoints, slices): (Arc<Registry>, Arc<Registry>),
        address: std::net::IpAddr,
        port: u16,
    ) -> Self {
        self.endpoints = Some(endpoints);
        self.slices = Some(slices);
        self.address = Some((address, port));
        self
    }

    /// Publishes every replica with a live record in `masters`, not only this one.
    pub fn with_master_leases(mut self, masters: crate::masters::MasterLeases) -> Self {
        self.masters = Some(masters);
        self
    }

    /// The addresses to publish: this replica's, and those of the other live replicas (of
    /// the same family).
    async fn addresses(&self, own: std::net::IpAddr) -> Vec<std::net::IpAddr> {
        let mut addresses = match &self.masters {
            Some(masters) => masters.live().await.unwrap_or_else(|error| {
                tracing::warn!(%error, "reading the replicas' endpoint records");
                Vec::new()
            }),
            None => Vec::new(),
        };
        addresses.retain(|a| a.is_ipv6() == own.is_ipv6());
        if !addresses.contains(&own) {
            addresses.push(own);
        }
        addresses.sort();
        addresses
    }

    fn options() -> WriteOptions {
        WriteOptions {
            dry_run: false,
            field_manager: "kube-apiserver".into(),
            applied: false,
        }
    }

    /// Creates the Service (and Endpoints) if missing, or puts them back if they drifted.
    pub async fn reconcile(&self) -> Result<(), ReconcileError> {
        keep(
            &self.services,
            &self.wanted,
            "Service",
            |current, wanted| {
                let (spec, want) = (current.spec.get_or_insert_default(), wanted.spec.as_ref());
                let drifted = spec.type_ != want.and_then(|w| w.type_.clone())
                    || spec.ports != want.and_then(|w| w.ports.clone());
                spec.type_ = want.and_then(|w| w.type_.clone());
                spec.ports = want.and_then(|w| w.ports.clone());
                drifted
            },
        )
        .await?;
        let Some((own, port)) = self.address else {
            return Ok(());
        };
        let addresses = self.addresses(own).await;
        if let Some(endpoints) = &self.endpoints {
            let wanted = wanted_endpoints(&addresses, port);
            keep(endpoints, &wanted, "Endpoints", |current, wanted| {
                let drifted = current.subsets != wanted.subsets;
                current.subsets = wanted.subsets.clone();
                drifted
            })
            .await?;
        }
        if let Some(slices) = &self.slices {
            let wanted = &wanted_slice(&addresses, port);
            // A slice of the other address type is replaced (its type cannot change).
            if let Ok(current) = slices
                .get_typed::<EndpointSlice>(NAMESPACE, NAME, ReadAt::Latest)
                .await
                && current.address_type != wanted.address_type
            {
                let _ = slices
                    .delete(NAMESPACE, NAME, &capstan_registry::DeleteOptions::default())
                    .await;
            }
            keep(slices, wanted, "EndpointSlice", |current, wanted| {
                let drifted = current.endpoints != wanted.endpoints
                    || current.ports != wanted.ports
                    || current.metadata.labels != wanted.metadata.labels;
                current.endpoints = wanted.endpoints.clone();
                current.ports = wanted.ports.clone();
                current.metadata.labels = wanted.metadata.labels.clone();
                drifted
            })
            .await?;
        }
        Ok(())
    }

    /// Reconciles every [`RESYNC`] in a background task: one key, rechecked as upstream's
    /// reconciler loop; a failed pass is logged and left to the next.
    pub fn start(self) {
        let keeper = Arc::new(self);
        let queue = WorkQueue::with_backoff(Backoff::new(RESYNC, RESYNC, Some(0)));
        Controller::new("kubernetes service", Arc::new(queue))
            .every(RESYNC, || vec![()])
            .run(move |()| {
                let keeper = keeper.clone();
                async move { keeper.reconcile().await }
            });
    }
}

/// The `kubernetes` Endpoints: `addresses` at `port` (named `https`).
fn wanted_endpoints(addresses: &[std::net::IpAddr], port: u16) -> Endpoints {
    Endpoints {
        metadata: metadata(("endpointslice.kubernetes.io/skip-mirror", "true")),
        subsets: Some(vec![EndpointSubset {
            addresses: Some(
                addresses
                    .iter()
                    .map(|a| EndpointAddress {
                        ip: a.to_string(),
                        ..EndpointAddress::default()
                    })
                    .collect(),
            ),
            ports: Some(vec![EndpointPort {
                name: Some("https".into()),
                port: i32::from(port),
                protocol: Some("TCP".into()),
                ..EndpointPort::default()
            }]),
            not_ready_addresses: None,
        }]),
    }
}

/// The `kubernetes` EndpointSlice: one ready endpoint per address.
fn wanted_slice(addresses: &[std::net::IpAddr], port: u16) -> EndpointSlice {
    let v6 = addresses.first().is_some_and(std::net::IpAddr::is_ipv6);
    EndpointSlice {
        metadata: metadata(("kubernetes.io/service-name", NAME)),
        address_type: if v6 { "IPv6" } else { "IPv4" }.into(),
        endpoints: Some(
            addresses
                .iter()
                .map(|a| Endpoint {
                    addresses: vec![a.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        ..EndpointConditions::default()
                    }),
                    ..Endpoint::default()
                })
                .collect(),
        ),
        ports: Some(vec![k8s_openapi::api::discovery::v1::EndpointPort {
            name: Some("https".into()),
            port: Some(i32::from(port)),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]),
    }
}

/// `default/kubernetes` with one label.
fn metadata((key, value): (&str, &str)) -> ObjectMeta {
    ObjectMeta {
        name: Some(NAME.into()),
        namespace: Some(NAMESPACE.into()),
        labels: Some([(key.to_string(), value.to_string())].into()),
        ..ObjectMeta::default()
    }
}

/// Creates `wanted` if missing; otherwise `repair` puts back what drifted (returning whether
/// anything did), and the repaired object is written.
async fn keep<T: Object>(
    registry: &Registry,
    wanted: &T,
    kind: &'static str,
    repair: impl FnOnce(&mut T, &T) -> bool,
) -> Result<(), ReconcileError> {
    let failed = |step, error| ReconcileError { step, kind, error };
    let options = KubernetesServiceController::options();
    match registry
        .get_typed::<T>(NAMESPACE, NAME, ReadAt::Latest)
        .await
    {
        Err(e) if e.is_not_found() => {
            match registry
                .create(NAMESPACE, from_typed(wanted), &options)
                .await
            {
                Err(e) if !e.is_conflict() => Err(failed("creating", e)),
                _ => Ok(()),
            }
        }
        Err(e) => Err(failed("reading", e)),
        Ok(mut current) => {
            if !repair(&mut current, wanted) {
                return Ok(());
            }
            let fixed = from_typed(&current);
            registry
                .update(NAMESPACE, NAME, fixed, &options, Subresource::Main)
                .await
                .map(|_| ())
                .map_err(|e| failed("repairing", e))
        }
    }
}
