//! Keeps the built-in `default/kubernetes` Service: created at start-up, re-created when
//! deleted, its type and ports put back when edited (upstream's kube-apiserver controller);
//! and, when the server has an address clients can reach (not loopback, which Endpoints may
//! not hold), its Endpoints: that address and the secure port (upstream's endpoint reconciler).

use std::sync::Arc;
use std::time::Duration;

use capstan_machinery::ApiError;
use capstan_registry::strategy::from_typed;
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
    endpoints: Option<(Arc<Registry>, Endpoints)>,
    slice: Option<(Arc<Registry>, EndpointSlice)>,
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
            endpoints: None,
            slice: None,
        }
    }

    /// Also keeps the `kubernetes` Endpoints: `address` and `port` (named `https`).
    pub fn with_endpoints(
        mut self,
        endpoints: Arc<Registry>,
        address: std::net::IpAddr,
        port: u16,
    ) -> Self {
        let wanted = Endpoints {
            metadata: metadata(("endpointslice.kubernetes.io/skip-mirror", "true")),
            subsets: Some(vec![EndpointSubset {
                addresses: Some(vec![EndpointAddress {
                    ip: address.to_string(),
                    ..EndpointAddress::default()
                }]),
                ports: Some(vec![EndpointPort {
                    name: Some("https".into()),
                    port: i32::from(port),
                    protocol: Some("TCP".into()),
                    ..EndpointPort::default()
                }]),
                not_ready_addresses: None,
            }]),
        };
        self.endpoints = Some((endpoints, wanted));
        self
    }

    /// Also keeps the `kubernetes` EndpointSlice that goes with the Endpoints (upstream's
    /// endpoints adapter): named `kubernetes`, labelled only with the Service's name, not
    /// owned and not managed by a controller; its one endpoint only `ready`.
    pub fn with_endpoint_slice(
        mut self,
        slices: Arc<Registry>,
        address: std::net::IpAddr,
        port: u16,
    ) -> Self {
        let wanted = EndpointSlice {
            metadata: metadata(("kubernetes.io/service-name", NAME)),
            address_type: if address.is_ipv6() { "IPv6" } else { "IPv4" }.into(),
            endpoints: Some(vec![Endpoint {
                addresses: vec![address.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    ..EndpointConditions::default()
                }),
                ..Endpoint::default()
            }]),
            ports: Some(vec![k8s_openapi::api::discovery::v1::EndpointPort {
                name: Some("https".into()),
                port: Some(i32::from(port)),
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]),
        };
        self.slice = Some((slices, wanted));
        self
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
        if let Some((endpoints, wanted)) = &self.endpoints {
            keep(endpoints, wanted, "Endpoints", |current, wanted| {
                let drifted = current.subsets != wanted.subsets;
                current.subsets = wanted.subsets.clone();
                drifted
            })
            .await?;
        }
        if let Some((slices, wanted)) = &self.slice {
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
