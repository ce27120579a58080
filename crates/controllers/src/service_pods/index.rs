//! What the Service and Pod informers have shown of selectors and pods.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use capstan_machinery::hash::{HashMap, HashSet};
use k8s_openapi::api::core::v1::Pod;

use crate::runtime::Key;

/// Labels (and selectors): `map[string]string`.
pub(crate) type Labels = BTreeMap<String, String>;

/// What the watches have shown of selectors and pods, so that a pod change finds the Services
/// that select (or selected) it without testing every selector of the namespace, and a sync
/// reads only the pods its selector matches, already decoded.
#[derive(Default)]
pub(crate) struct Index {
    /// Per namespace: every Service with a selector, the anchor lookup and pod memberships.
    pub(super) namespaces: HashMap<String, Namespace>,
}

#[derive(Default)]
pub(super) struct Namespace {
    /// Selector Services by name.
    pub(super) services: HashMap<String, Selected>,
    /// Services by one pair of their selector (its first): a pod can only be selected by the
    /// Services anchored at one of its own labels, so a pod change tests only those.
    anchors: HashMap<(String, String), BTreeSet<String>>,
    /// Pods by name: what the controllers read of each ([`pod_view_of_json`]) and the
    /// Services that select it.
    pods: HashMap<String, (Arc<Pod>, Vec<String>)>,
}

/// A Service's selector (its `key=value` pairs) and the pods it selects, by name: the same
/// views as [`Namespace::pods`], so that a sync reads its pods without a lookup each.
pub(super) struct Selected {
    pub(super) selector: Vec<(String, String)>,
    members: BTreeMap<String, Arc<Pod>>,
}

fn selects(selector: &[(String, String)], labels: Option<&Labels>) -> bool {
    labels.is_some_and(|labels| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl Namespace {
    fn forget_service(&mut self, service: &str) {
        let Some(old) = self.services.remove(service) else {
            return;
        };
        if let Some(anchor) = old.selector.first()
            && let Some(services) = self.anchors.get_mut(anchor)
        {
            services.remove(service);
            if services.is_empty() {
                self.anchors.remove(anchor);
            }
        }
        for pod in old.members.keys() {
            if let Some((_, services)) = self.pods.get_mut(pod) {
                services.retain(|s| s != service);
            }
        }
    }
}

impl Index {
    /// A Service's selector was set, changed or removed (`None`, or an empty map).
    pub(crate) fn set_selector(&mut self, key: &Key, selector: Option<&Labels>) {
        let (namespace, service) = key;
        let ns = self.namespaces.entry(namespace.clone()).or_default();
        ns.forget_service(service);
        let selector: Vec<(String, String)> = selector
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let Some(anchor) = selector.first().cloned() else {
            return;
        };
        let mut members = BTreeMap::new();
        for (name, (pod, services)) in ns.pods.iter_mut() {
            if selects(&selector, labels_of(pod)) {
                members.insert(name.clone(), pod.clone());
                services.push(service.clone());
            }
        }
        ns.anchors
            .entry(anchor)
            .or_default()
            .insert(service.clone());
        ns.services
            .insert(service.clone(), Selected { selector, members });
    }

    /// A pod was written (`Some` view) or deleted (`None`); returns the Services to sync:
    /// those that select it now or selected it before. A write that leaves the pod's view as
    /// it was (a status change beyond IPs and readiness, say) wakes nothing, as upstream's
    /// `podEndpointsChanged`: no sync could give another result.
    pub(crate) fn pod_changed(
        &mut self,
        namespace: &str,
        name: &str,
        pod: Option<Arc<Pod>>,
    ) -> Vec<Key> {
        let ns = self.namespaces.entry(namespace.to_string()).or_default();
        if let (Some(new), Some((old, _))) = (pod.as_deref(), ns.pods.get(name))
            && new == old.as_ref()
        {
            return Vec::new();
        }
        let before = ns.pods.remove(name).map(|(_, s)| s).unwrap_or_default();
        let mut now: Vec<String> = Vec::new();
        if let Some(labels) = pod.as_deref().and_then(labels_of) {
            for (k, v) in labels {
                let Some(anchored) = ns.anchors.get(&(k.clone(), v.clone())) else {
                    continue;
                };
                for service in anchored {
                    if ns
                        .services
                        .get(service)
                        .is_some_and(|s| selects(&s.selector, Some(labels)))
                    {
                        now.push(service.clone());
                    }
                }
            }
        }
        for service in before.iter().filter(|s| !now.contains(s)) {
            if let Some(selected) = ns.services.get_mut(service) {
                selected.members.remove(name);
            }
        }
        if let Some(pod) = &pod {
            for service in &now {
                if let Some(selected) = ns.services.get_mut(service) {
                    selected.members.insert(name.to_string(), pod.clone());
                }
            }
        }
        let mut wake: Vec<Key> = before
            .iter()
            .chain(now.iter())
            .map(|s| (namespace.to_string(), s.clone()))
            .collect();
        wake.sort();
        wake.dedup();
        if let Some(pod) = pod {
            ns.pods.insert(name.to_string(), (pod, now));
        }
        if ns.pods.is_empty() && ns.services.is_empty() {
            self.namespaces.remove(namespace);
        }
        wake
    }

    /// Forgets the selector Services not in `seen` (deleted while a watch was down); returns
    /// them, to be synced (their Endpoints then go).
    pub(crate) fn forget_services_except(&mut self, seen: &HashSet<Key>) -> Vec<Key> {
        let stale = self.keys_except(seen, |n| &n.services);
        for key in &stale {
            self.set_selector(key, None);
        }
        stale
    }

    /// Forgets the pods not in `seen` (deleted while a watch was down); returns the Services
    /// that selected them, to be synced.
    pub(crate) fn forget_pods_except(&mut self, seen: &HashSet<Key>) -> Vec<Key> {
        let stale = self.keys_except(seen, |n| &n.pods);
        stale
            .iter()
            .flat_map(|(namespace, pod)| self.pod_changed(namespace, pod, None))
            .collect()
    }

    /// The (namespace, name) keys of one of a namespace's maps that are not in `seen`.
    fn keys_except<V>(
        &self,
        seen: &HashSet<Key>,
        map: impl Fn(&Namespace) -> &HashMap<String, V>,
    ) -> Vec<Key> {
        self.namespaces
            .iter()
            .flat_map(|(ns, n)| map(n).keys().map(move |name| (ns.clone(), name.clone())))
            .filter(|key| !seen.contains(key))
            .collect()
    }

    /// The views of the pods a Service's selector matches. The index may not have seen the
    /// Service's latest selector yet: when the one it holds is not `selector` (the one a sync
    /// read), each member is checked against `selector`.
    pub(crate) fn members(&self, key: &Key, selector: &Labels) -> Vec<Arc<Pod>> {
        let (namespace, service) = key;
        let Some(selected) = self
            .namespaces
            .get(namespace)
            .and_then(|ns| ns.services.get(service))
        else {
            return Vec::new();
        };
        let pods = selected.members.values();
        let indexed = selected.selector.len() == selector.len()
            && selected
                .selector
                .iter()
                .zip(selector)
                .all(|((k, v), (key, value))| k == key && v == value);
        if indexed {
            pods.cloned().collect()
        } else {
            let pairs: Vec<(String, String)> = selector
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            pods.filter(|pod| selects(&pairs, labels_of(pod)))
                .cloned()
                .collect()
        }
    }
}

fn labels_of(pod: &Pod) -> Option<&Labels> {
    pod.metadata.labels.as_ref()
}
