//! The index of selectors and pods, and the pod view.

use std::sync::Arc;

use capstan_machinery::hash::HashSet;
use k8s_openapi::api::core::v1::Pod;

use super::index::Index;
use super::pods::{canonical, pod_view, pod_view_of_json};
use super::*;
use serde_json::json;

fn labelled(name: &str, app: &str) -> Option<Arc<Pod>> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": app, "tier": "x"}},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}]},
    }))
    .ok()?;
    Some(Arc::new(pod_view(&pod)))
}

/// The members of a Service, read with the selector the index holds for it.
fn names(index: &Index, service: &str) -> Vec<String> {
    let held: Labels = index
        .namespaces
        .get("ns")
        .and_then(|ns| ns.services.get(service))
        .map(|s| s.selector.iter().cloned().collect())
        .unwrap_or_default();
    names_selected(index, service, &held)
}

fn names_selected(index: &Index, service: &str, selector: &Labels) -> Vec<String> {
    index
        .members(&("ns".into(), service.into()), selector)
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[test]
fn a_pods_view_decoded_from_its_json_is_the_view_of_the_pod() {
    let full = json!({"kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web"},
            "deletionTimestamp": "2026-01-01T00:00:00Z", "annotations": {"a": "b"},
            "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {}}}]},
        "spec": {"hostname": "h", "subdomain": "web", "nodeName": "n1",
            "containers": [{"name": "c", "image": "i", "env": [{"name": "E", "value": "v"}],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}],
            "initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always",
                "ports": [{"name": "side", "containerPort": 9090}]}]},
        "status": {"phase": "Running", "podIP": "10.0.0.2",
            "podIPs": [{"ip": "10.0.0.2"}, {"ip": "fd00::2"}],
            "conditions": [{"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let bare = json!({"metadata": {"name": "q"}, "spec": {"containers": []}});
    let nulls = json!({"metadata": null, "spec": {"containers": null}, "status": null});
    for object in [full, bare, nulls] {
        let json = serde_json::to_vec(&object).expect("json");
        let pod: Pod = serde_json::from_slice(&json).expect("a pod");
        assert_eq!(pod_view_of_json(&json), Some(pod_view(&pod)));
    }
}

#[test]
fn an_address_is_written_in_canonical_form() {
    for text in [
        "10.0.0.1",
        "010.0.0.1",
        "10.00.0.1",
        "1.2.3.004",
        "0.0.0.0",
        "255.255.255.255",
        "100.20.3.0",
        "fe80::0001",
        "2001:DB8::1",
        "::ffff:1.2.3.4",
    ] {
        let ip = capstan_machinery::ip::parse_sloppy(text).expect(text);
        assert_eq!(canonical(&ip, text), ip.to_string(), "{text}");
    }
}

#[test]
fn a_sync_reads_each_pods_latest_view_and_a_newer_selector() {
    let mut index = Index::default();
    let key: Key = ("ns".into(), "web".into());
    index.set_selector(&key, Some(&selector(&[("app", "web"), ("tier", "x")])));
    index.pod_changed("ns", "p1", labelled("p1", "web"));
    index.pod_changed("ns", "p2", labelled("p2", "web"));
    let moved: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1", "namespace": "ns", "labels": {"app": "web", "tier": "x"}},
        "status": {"podIP": "10.0.0.9"},
    }))
    .expect("a pod");
    assert_eq!(
        index.pod_changed("ns", "p1", Some(Arc::new(pod_view(&moved)))),
        vec![key.clone()]
    );
    let held = selector(&[("app", "web"), ("tier", "x")]);
    let ips: Vec<Option<String>> = index
        .members(&key, &held)
        .iter()
        .map(|p| p.status.as_ref().and_then(|s| s.pod_ip.clone()))
        .collect();
    assert_eq!(
        ips,
        [Some("10.0.0.9".to_string()), Some("10.0.0.1".to_string())],
        "the changed pod is read as it is now"
    );
    // A sync that read a selector the index has not seen yet keeps only what it selects.
    let newer = selector(&[("app", "web"), ("tier", "y")]);
    assert!(names_selected(&index, "web", &newer).is_empty());
    let wider = selector(&[("app", "web")]);
    assert_eq!(names_selected(&index, "web", &wider), ["p1", "p2"]);
}

fn selector(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_index_follows_labels_selectors_and_deletions() {
    let mut index = Index::default();
    let key: Key = ("ns".into(), "web".into());
    index.pod_changed("ns", "p1", labelled("p1", "web"));
    index.pod_changed("ns", "p2", labelled("p2", "db"));
    index.set_selector(&key, Some(&selector(&[("app", "web"), ("tier", "x")])));
    assert_eq!(names(&index, "web"), ["p1"]);
    // A pod that starts to match wakes the Service and joins it.
    assert_eq!(
        index.pod_changed("ns", "p2", labelled("p2", "web")),
        vec![key.clone()]
    );
    assert_eq!(names(&index, "web"), ["p1", "p2"]);
    // A pod that stops matching wakes it once more and leaves.
    assert_eq!(
        index.pod_changed("ns", "p1", labelled("p1", "db")),
        vec![key.clone()]
    );
    assert_eq!(names(&index, "web"), ["p2"]);
    // Unrelated pods wake nothing; another namespace is another world.
    assert!(
        index
            .pod_changed("ns", "p3", labelled("p3", "db"))
            .is_empty()
    );
    assert!(
        index
            .pod_changed("other", "p4", labelled("p4", "web"))
            .is_empty()
    );
    // A write that leaves the pod as the controller sees it wakes nothing.
    assert!(
        index
            .pod_changed("ns", "p2", labelled("p2", "web"))
            .is_empty()
    );
    assert_eq!(names(&index, "web"), ["p2"]);
    // Deletion wakes the Service that selected the pod.
    assert_eq!(index.pod_changed("ns", "p2", None), vec![key.clone()]);
    assert!(names(&index, "web").is_empty());
    // A changed selector re-reads the pods; a removed one forgets them.
    index.set_selector(&key, Some(&selector(&[("app", "db")])));
    assert_eq!(names(&index, "web"), ["p1", "p3"]);
    // A Service not replayed after a watch restart was deleted meanwhile: forgotten.
    assert_eq!(
        index.forget_services_except(&HashSet::default()),
        vec![key.clone()]
    );
    assert!(names(&index, "web").is_empty());
    index.set_selector(&key, Some(&selector(&[("app", "db")])));
    index.set_selector(&key, None);
    assert!(names(&index, "web").is_empty());
    assert!(
        index
            .pod_changed("ns", "p1", labelled("p1", "db"))
            .is_empty()
    );
}

#[test]
fn the_pod_view_keeps_what_the_controller_reads() {
    let view = labelled("p1", "web").expect("a pod");
    let view = serde_json::to_value(&*view).expect("json");
    assert_eq!(view["metadata"]["labels"]["app"], "web");
    assert_eq!(view["status"]["podIP"], "10.0.0.1");
    assert_eq!(
        view["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}])
    );
}
