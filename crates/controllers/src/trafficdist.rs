//! Topology hints on the EndpointSlice controller's slices: upstream's
//! `staging/src/k8s.io/endpointslice/trafficdist` (`spec.trafficDistribution`) and, for every
//! other Service, `topologycache.RemoveHintsFromSlices`.
//!
//! A Service asking for close traffic (`PreferClose`, `PreferSameZone`, `PreferSameNode`, the
//! last two behind a feature gate that is on and locked in 1.36) has each ready endpoint hinted
//! to its own zone, and with `PreferSameNode` to its own node too; kube-proxy then prefers
//! those endpoints. Any other Service has every hint removed, even from slices nothing else
//! would change. The `service.kubernetes.io/topology-mode: Auto` annotation (and its
//! deprecated `topology-aware-hints` form) overrides `trafficDistribution`, as upstream; its
//! proportional allocation needs the nodes' allocatable CPU, which Capstan's minimal Nodes do
//! not model, so such a Service gets no hints, as upstream's does when node information is
//! insufficient.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{EndpointHints, EndpointSlice, ForNode, ForZone};

const TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
const TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";

/// How a Service's slices are hinted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Hints {
    /// No hints at all (upstream's `defaultHeuristic` and `RemoveHintsFromSlices`).
    None,
    /// Each ready endpoint to its zone, and to its node when `nodes` (`preferCloseHeuristic`).
    Close { nodes: bool },
}

impl Hints {
    /// What a Service asks for.
    pub(crate) fn of(service: &Service) -> Hints {
        let distribution = service
            .spec
            .as_ref()
            .and_then(|s| s.traffic_distribution.as_deref());
        let close = matches!(
            distribution,
            Some("PreferClose" | "PreferSameZone" | "PreferSameNode")
        );
        if close && !topology_mode_auto(service) {
            Hints::Close {
                nodes: distribution == Some("PreferSameNode"),
            }
        } else {
            Hints::None
        }
    }

    /// Hints the slices about to be written, and moves to `updates` each slice that would
    /// otherwise stay as it is but whose hints are not what they should be.
    pub(crate) fn reconcile(
        self,
        creates: &mut [EndpointSlice],
        updates: &mut Vec<EndpointSlice>,
        unchanged: Vec<EndpointSlice>,
    ) {
        updates.extend(unchanged.into_iter().filter(|s| self.needs_update(s)));
        for slice in creates.iter_mut().chain(updates.iter_mut()) {
            self.update(slice);
        }
    }

    fn needs_update(self, slice: &EndpointSlice) -> bool {
        let endpoints = slice.endpoints.iter().flatten();
        match self {
            Hints::None => endpoints.into_iter().any(|e| e.hints.is_some()),
            Hints::Close { nodes } => endpoints.filter(|e| ready(e)).any(|e| {
                let hints = e.hints.as_ref();
                let zones = hints
                    .and_then(|h| h.for_zones.as_deref())
                    .unwrap_or_default();
                let for_nodes = hints
                    .and_then(|h| h.for_nodes.as_deref())
                    .unwrap_or_default();
                let zone_wrong = match &e.zone {
                    Some(zone) => !matches!(zones, [only] if &only.name == zone),
                    None => !zones.is_empty(),
                };
                let node_wrong = match (&e.node_name, nodes) {
                    (Some(node), true) => !matches!(for_nodes, [only] if &only.name == node),
                    _ => !for_nodes.is_empty(),
                };
                zone_wrong || node_wrong
            }),
        }
    }

    fn update(self, slice: &mut EndpointSlice) {
        for endpoint in slice.endpoints.iter_mut().flatten() {
            match self {
                Hints::None => endpoint.hints = None,
                // Endpoints that are not ready keep what they have, as upstream's.
                Hints::Close { .. } if !ready(endpoint) => {}
                Hints::Close { nodes } => {
                    let for_zones = endpoint
                        .zone
                        .as_ref()
                        .map(|zone| vec![ForZone { name: zone.clone() }]);
                    let for_nodes = endpoint
                        .node_name
                        .as_ref()
                        .filter(|_| nodes)
                        .map(|node| vec![ForNode { name: node.clone() }]);
                    endpoint.hints =
                        (for_zones.is_some() || for_nodes.is_some()).then_some(EndpointHints {
                            for_zones,
                            for_nodes,
                        });
                }
            }
        }
    }
}

/// Upstream's `hintsEnabled`: the deprecated annotation wins over `topology-mode` when both
/// are set.
fn topology_mode_auto(service: &Service) -> bool {
    let annotations = service.metadata.annotations.as_ref();
    let value = annotations.and_then(|a| a.get(TOPOLOGY_AWARE_HINTS).or(a.get(TOPOLOGY_MODE)));
    matches!(value.map(String::as_str), Some("Auto" | "auto"))
}

fn ready(endpoint: &k8s_openapi::api::discovery::v1::Endpoint) -> bool {
    endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(true)
}
