//! Endpoints built from pods.

use k8s_openapi::api::core::v1::{EndpointAddress, Pod, ServiceSpec};
use serde_json::json;

use super::build_subsets;

fn pod(name: &str, ip: &str, ready_status: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": ready_status}]}}))
        .expect("a pod")
}

fn spec(value: serde_json::Value) -> ServiceSpec {
    serde_json::from_value(value).expect("a spec")
}

fn ips(addresses: &Option<Vec<EndpointAddress>>) -> Vec<&str> {
    addresses.iter().flatten().map(|a| &*a.ip).collect()
}

#[test]
fn ready_and_unready_pods_with_a_named_target_port() {
    let spec = spec(
        json!({"clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"], "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]}),
    );
    let pods = [
        pod("p2", "10.244.0.12", "True"),
        pod("p1", "10.244.0.11", "True"),
        pod("p3", "10.244.0.13", "False"),
    ];
    let (subsets, truncated) = build_subsets(&spec, "web", &pods);
    assert!(!truncated);
    assert_eq!(subsets.len(), 1);
    assert_eq!(ips(&subsets[0].addresses), ["10.244.0.11", "10.244.0.12"]);
    assert_eq!(ips(&subsets[0].not_ready_addresses), ["10.244.0.13"]);
    assert_eq!(
        serde_json::to_value(&subsets[0].ports).expect("json"),
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
    let target = subsets[0]
        .addresses
        .as_ref()
        .and_then(|a| a[0].target_ref.as_ref());
    assert_eq!(target.and_then(|t| t.kind.as_deref()), Some("Pod"));
}

#[test]
fn ports_are_in_upstreams_hash_order() {
    // Go's order for these three (FNV-128a of their spew dumps): http, metrics, https; a
    // slice lists the same ports as http, https, metrics.
    let spec = spec(json!({"clusterIP": "10.96.0.10", "ports": [
        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443},
        {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": 9090},
        {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}));
    let (subsets, _) = build_subsets(&spec, "web", &[pod("p1", "10.244.0.11", "True")]);
    let names: Vec<&str> = subsets[0]
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.name.as_deref())
        .collect();
    assert_eq!(names, ["http", "metrics", "https"]);
}

#[test]
fn a_pod_with_an_address_endpoints_cannot_hold_is_left_out() {
    let spec =
        spec(json!({"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": 8080}]}));
    let pods = vec![
        pod("good", "10.244.0.5", "True"),
        pod("loopback", "127.0.0.1", "True"),
        pod("link-local", "169.254.1.1", "True"),
    ];
    let (subsets, _) = build_subsets(&spec, "web", &pods);
    assert_eq!(ips(&subsets[0].addresses), ["10.244.0.5"]);
}

#[test]
fn more_than_a_thousand_addresses_are_truncated() {
    let spec = spec(
        json!({"clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"], "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}]}),
    );
    let pods: Vec<Pod> = (0..1001)
        .map(|i| {
            pod(
                &format!("p{i}"),
                &format!("10.245.{}.{}", i / 250, i % 250 + 1),
                "True",
            )
        })
        .collect();
    let (subsets, truncated) = build_subsets(&spec, "many", &pods);
    assert!(truncated);
    assert_eq!(subsets[0].addresses.as_ref().map(Vec::len), Some(1000));
}
