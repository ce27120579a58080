//! What Capstan's node agents (`capstan proxy`, `capstan dns`) share: the API client they read
//! through, the watches they follow (a relist delivered whole, kube-runtime's backoff after
//! errors), and a Service's cluster IPs as they read them.

use std::net::IpAddr;
use std::path::Path;

use anyhow::Context;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

/// A client of the API server `kubeconfig` names (default: $KUBECONFIG, ~/.kube/config, or
/// the in-cluster service account).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// A Service as the node agents read it: its metadata and spec, never its status. Go's
/// clients read a status whose conditions carry `null` times (a zero `metav1.Time`, which
/// client-go writes), and the API server keeps them; `k8s_openapi`'s `Service` refuses them,
/// which would stop an agent's whole Service watch at such an object.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct ServiceView {
    /// The Service's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The Service's spec.
    pub spec: Option<ServiceSpec>,
}

impl k8s_openapi::Resource for ServiceView {
    const API_VERSION: &'static str = <Service as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Service as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Service as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Service as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Service as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Service as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for ServiceView {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<ServiceView> for Service {
    fn from(view: ServiceView) -> Service {
        Service {
            metadata: view.metadata,
            spec: view.spec,
            status: None,
        }
    }
}

/// A watch's news, a relist delivered whole.
pub enum Change<K> {
    /// Every object, after a (re)list.
    Listed(Vec<K>),
    /// An object added or changed.
    Applied(K),
    /// An object deleted (its last state).
    Deleted(K),
}

impl<K> Change<K> {
    /// The same news, of each object made into another type.
    pub fn map<T>(self, into: impl Fn(K) -> T) -> Change<T> {
        match self {
            Change::Listed(all) => Change::Listed(all.into_iter().map(into).collect()),
            Change::Applied(object) => Change::Applied(into(object)),
            Change::Deleted(object) => Change::Deleted(into(object)),
        }
    }
}

/// Follows a watch (with kube-runtime's backoff after errors) until the process ends, handing
/// each change to `handle`; `what` names the watch in logs.
pub async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &str,
    mut handle: impl FnMut(Change<K>),
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut buffer = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => buffer.clear(),
            Ok(Event::InitApply(object)) => buffer.push(object),
            Ok(Event::InitDone) => handle(Change::Listed(std::mem::take(&mut buffer))),
            Ok(Event::Apply(object)) => handle(Change::Applied(object)),
            Ok(Event::Delete(object)) => handle(Change::Deleted(object)),
            Err(err) => tracing::warn!(%err, "watching {what}"),
        }
    }
}

/// A Service's cluster IPs: `clusterIPs`, or `clusterIP` when that list is empty; what does
/// not parse as an address (`None`, of a headless Service) is left out.
pub fn cluster_ips(spec: &ServiceSpec) -> Vec<IpAddr> {
    match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
        _ => spec
            .cluster_ip
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect(),
    }
}
