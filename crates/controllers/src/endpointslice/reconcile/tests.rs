//! The reconciler's plans.

use super::*;
use serde_json::json;

fn service() -> Service {
    serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns", "uid": "svc-1",
        "labels": {"app": "web"}},
        "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"],
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}}))
    .expect("service")
}

fn pod(i: usize, ready: bool) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": format!("p{i:03}"), "namespace": "ns", "uid": format!("u{i}")},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": format!("10.0.{}.{}", i / 250, i % 250 + 1),
                "podIPs": [{"ip": format!("10.0.{}.{}", i / 250, i % 250 + 1)}],
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
        .expect("pod"),
    )
}

fn zones() -> HashMap<String, Option<String>> {
    [("n1".to_string(), Some("zone-a".to_string()))]
        .into_iter()
        .collect()
}

/// How many creates, updates and deletes a plan has.
fn counts(plan: &Plan) -> (usize, usize, usize) {
    (plan.creates.len(), plan.updates.len(), plan.deletes.len())
}

fn inputs_of<'a>(
    service: &'a Service,
    pods: &'a [Arc<Pod>],
    zones: &'a HashMap<String, Option<String>>,
) -> Inputs<'a> {
    Inputs {
        service,
        pods,
        zones,
        nodeless: zones.is_empty(),
        max: 100,
    }
}

/// The plan applied as the server would (names given to creates).
fn apply(existing: &mut Vec<EndpointSlice>, plan: Plan) {
    for delete in &plan.deletes {
        existing.retain(|s| s.metadata.name != delete.metadata.name);
    }
    for update in plan.updates {
        existing.retain(|s| s.metadata.name != update.metadata.name);
        existing.push(update);
    }
    for (i, mut create) in plan.creates.into_iter().enumerate() {
        create.metadata.name = Some(format!("web-{}-{i}", existing.len()));
        create.metadata.uid = None;
        existing.push(create);
    }
}

fn port_names(slice: &EndpointSlice) -> Vec<&str> {
    let ports = slice.ports.iter().flatten();
    ports.filter_map(|p| p.name.as_deref()).collect()
}

#[test]
fn a_slices_ports_are_in_upstreams_hash_order() {
    // Go's `portsInOrder` for these (FNV-128a of their spew dumps): b, then a.
    let mut service = service();
    service.spec.as_mut().expect("spec").ports = Some(
        serde_json::from_value(json!([
            {"name": "a", "port": 80, "targetPort": 80, "protocol": "TCP"},
            {"name": "b", "port": 81, "targetPort": 81, "protocol": "TCP"}]))
        .expect("ports"),
    );
    let pods = [pod(0, true)];
    let zones = zones();
    let plan = reconcile(&inputs_of(&service, &pods, &zones), Vec::new());
    assert_eq!(port_names(&plan.creates[0]), ["b", "a"]);
    // A slice stored with its ports in another order (by an older Capstan) is written
    // again in this order when it is updated, as upstream's NewPortMapKey sorts it.
    let mut existing = Vec::new();
    apply(&mut existing, plan);
    if let Some(ports) = existing[0].ports.as_mut() {
        ports.reverse();
    }
    existing[0].metadata.resource_version = Some("5".into());
    let pods = [pod(0, true), pod(1, true)];
    let plan = reconcile(&inputs_of(&service, &pods, &zones), existing);
    assert_eq!(counts(&plan), (0, 1, 0));
    assert_eq!(port_names(&plan.updates[0]), ["b", "a"]);
    // Reordered, it is no longer the slice as read: nothing is kept for the write.
    assert!(plan.read.is_empty());
    assert_eq!(plan.updates[0].metadata.resource_version, None);
}

#[test]
fn an_updated_slice_is_kept_as_read_for_the_write() {
    let service = service();
    let zones = zones();
    let pods: Vec<Arc<Pod>> = (0..3).map(|i| pod(i, true)).collect();
    let mut existing = Vec::new();
    apply(
        &mut existing,
        reconcile(&inputs_of(&service, &pods, &zones), Vec::new()),
    );
    existing[0].metadata.resource_version = Some("5".into());
    let as_read = existing[0].clone();
    let flipped: Vec<Arc<Pod>> = (0..3).map(|i| pod(i, i != 1)).collect();
    let plan = reconcile(&inputs_of(&service, &flipped, &zones), existing);
    assert_eq!(counts(&plan), (0, 1, 0));
    assert_eq!(plan.read, [as_read]);
    assert_eq!(
        plan.updates[0].metadata.resource_version.as_deref(),
        Some("5")
    );
    assert_ne!(plan.updates[0].endpoints, plan.read[0].endpoints);
}

#[test]
fn pods_are_packed_a_hundred_a_slice_with_conditions_and_zones() {
    let service = service();
    let pods: Vec<Arc<Pod>> = (0..150).map(|i| pod(i, i != 2)).collect();
    let zones = zones();
    let inputs = inputs_of(&service, &pods, &zones);
    let plan = reconcile(&inputs, Vec::new());
    assert_eq!(plan.creates.len(), 2);
    assert_eq!(len(&plan.creates[0]) + len(&plan.creates[1]), 150);
    let first = &plan.creates[0];
    assert_eq!(
        first.ports.as_deref().unwrap_or_default()[0].port,
        Some(8080)
    );
    let endpoint = &first.endpoints.as_deref().unwrap_or_default()[2];
    assert_eq!(
        endpoint.conditions.as_ref().and_then(|c| c.ready),
        Some(false)
    );
    assert_eq!(endpoint.zone.as_deref(), Some("zone-a"));
    let labels = first.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(SERVICE_NAME_LABEL).map(String::as_str),
        Some("web")
    );
    assert_eq!(labels.get("app").map(String::as_str), Some("web"));
}

#[test]
fn a_readiness_flip_updates_one_slice_in_place_and_a_second_sync_writes_nothing() {
    let service = service();
    let zones = zones();
    let mut pods: Vec<Arc<Pod>> = (0..150).map(|i| pod(i, true)).collect();
    let mut slices = Vec::new();
    let inputs = inputs_of(&service, &pods, &zones);
    apply(&mut slices, reconcile(&inputs, Vec::new()));
    pods[120] = pod(120, false);
    let inputs = inputs_of(&service, &pods, &zones);
    let plan = reconcile(&inputs, slices.clone());
    assert_eq!(counts(&plan), (0, 1, 0));
    apply(&mut slices, plan);
    let again = reconcile(&inputs, slices.clone());
    assert_eq!(counts(&again), (0, 0, 0));
}

/// The hints of each endpoint, in order (`None`: no hints; zones and nodes by name).
fn hints(slices: &[EndpointSlice]) -> Vec<Option<(Vec<String>, Vec<String>)>> {
    let mut all: Vec<&k8s_openapi::api::discovery::v1::Endpoint> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .collect();
    all.sort_by_key(|e| e.addresses.clone());
    all.iter()
        .map(|e| {
            e.hints.as_ref().map(|h| {
                let zones = h.for_zones.iter().flatten().map(|z| z.name.clone());
                let nodes = h.for_nodes.iter().flatten().map(|n| n.name.clone());
                (zones.collect(), nodes.collect())
            })
        })
        .collect()
}

#[test]
fn traffic_distribution_hints_ready_endpoints_close_and_nothing_else_keeps_hints() {
    let mut service = service();
    let zones = zones();
    let pods = vec![pod(1, true), pod(2, false)];
    let set = |service: &mut Service, distribution: Option<&str>| {
        service.spec.as_mut().expect("spec").traffic_distribution =
            distribution.map(str::to_string);
    };
    let both = Some((vec!["zone-a".to_string()], vec!["n1".to_string()]));
    let zone = Some((vec!["zone-a".to_string()], vec![]));

    // PreferSameNode: the ready endpoint to its zone and node, the other unhinted.
    set(&mut service, Some("PreferSameNode"));
    let mut slices = Vec::new();
    let plan = reconcile(&inputs_of(&service, &pods, &zones), Vec::new());
    assert_eq!(hints(&plan.creates), [both, None]);
    apply(&mut slices, plan);
    let steady = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
    assert_eq!(counts(&steady), (0, 0, 0));

    // PreferClose: a slice nothing else changes is updated for its hints alone.
    set(&mut service, Some("PreferClose"));
    let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
    assert_eq!(counts(&plan), (0, 1, 0));
    assert_eq!(hints(&plan.updates), [zone.clone(), None]);
    apply(&mut slices, plan);
    let steady = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
    assert_eq!(counts(&steady), (0, 0, 0));

    // The topology-mode annotation overrides it; without Capstan's nodes' CPU, no hints.
    service.metadata.annotations =
        Some([(TOPOLOGY_MODE_ANNOTATION.to_string(), "Auto".to_string())].into());
    let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
    assert_eq!(counts(&plan), (0, 1, 0));
    assert_eq!(hints(&plan.updates), [None, None]);
    service.metadata.annotations = None;

    // No trafficDistribution: every hint goes, and then nothing is written.
    set(&mut service, None);
    let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
    assert_eq!(counts(&plan), (0, 1, 0));
    assert_eq!(hints(&plan.updates), [None, None]);
    apply(&mut slices, plan);
    let steady = reconcile(&inputs_of(&service, &pods, &zones), slices);
    assert_eq!(counts(&steady), (0, 0, 0));
}

const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";

#[test]
fn no_pods_leave_one_placeholder_that_is_kept() {
    let service = service();
    let zones = zones();
    let inputs = inputs_of(&service, &[], &zones);
    let mut slices = Vec::new();
    let plan = reconcile(&inputs, Vec::new());
    assert_eq!(plan.creates.len(), 1);
    assert!(
        plan.creates[0]
            .ports
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    );
    apply(&mut slices, plan);
    let again = reconcile(&inputs, slices.clone());
    assert_eq!(counts(&again), (0, 0, 0));
    // An orphaned placeholder (another owner, or none) that otherwise fits is kept too:
    // upstream's comparison reads only the namespace and labels of its metadata.
    slices[0].metadata.owner_references = None;
    let orphaned = reconcile(&inputs, slices);
    assert_eq!(counts(&orphaned), (0, 0, 0));
}

#[test]
fn a_service_pending_deletion_leaves_the_slices_it_no_longer_owns() {
    let mut service = service();
    let zones = zones();
    let pods = vec![pod(1, true)];
    let mut slices = Vec::new();
    apply(
        &mut slices,
        reconcile(&inputs_of(&service, &pods, &zones), Vec::new()),
    );
    // The garbage collector orphans the slice (`kubectl delete --cascade=orphan`).
    slices[0].metadata.owner_references = None;
    // A Service not being deleted replaces a slice it does not own.
    let plan = reconcile(&inputs_of(&service, &pods, &zones), slices.clone());
    assert_eq!(counts(&plan), (1, 0, 1));
    // One being deleted leaves it, and creates nothing in its place (at the write).
    service.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2026-11-26T00:00:00Z")).expect("a time"));
    let plan = reconcile(&inputs_of(&service, &pods, &zones), slices);
    assert!(plan.deletes.is_empty());
}

#[test]
fn a_pod_on_an_unknown_node_is_left_out_and_reported() {
    let service = service();
    let pods = vec![pod(1, true)];
    let zones = HashMap::from_iter([("n2".to_owned(), None)]);
    let inputs = inputs_of(&service, &pods, &zones);
    let plan = reconcile(&inputs, Vec::new());
    assert_eq!(plan.missing_nodes, ["n1"]);
    // Only the placeholder.
    assert_eq!(plan.creates.len(), 1);
    assert_eq!(len(&plan.creates[0]), 0);
    // With no Node at all, the pod is published (without a zone).
    let none = HashMap::new();
    let plan = reconcile(&inputs_of(&service, &pods, &none), Vec::new());
    assert!(plan.missing_nodes.is_empty());
    assert_eq!(len(&plan.creates[0]), 1);
}
