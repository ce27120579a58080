//! What Capstan's node agents (`capstan proxy`, `capstan dns`) share: the API client they read
//! through, the watches they follow (a relist delivered whole, kube-runtime's backoff after
//! errors), and a Service's cluster IPs as they read them.

use std::net::IpAddr;
use std::path::Path;

use anyhow::Context;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ServiceSpec;
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

/// A watch's news, a relist delivered whole.
pub enum Change<K> {
    /// Every object, after a (re)list.
    Listed(Vec<K>),
    /// An object added or changed.
    Applied(K),
    /// An object deleted (its last state).
    Deleted(K),
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
