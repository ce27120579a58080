//! Allocation under pressure, through the real server: ranges fill completely and report
//! exhaustion cleanly; concurrent creates, type changes and deletes never hand out an address
//! or port twice; deleting everything frees everything.

mod common;

use std::collections::HashSet;

use common::{Server, raw};
use serde_json::{Value, json};

const SERVICES: &str = "/api/v1/namespaces/default/services";

async fn create(client: &kube::Client, name: &str, kind: &str) -> (u16, Value) {
    let body = json!({"metadata": {"name": name}, "spec": {"type": kind, "selector": {"app": name}, "ports": [{"port": 80}]}});
    post(client, &body).await
}

/// POSTs a Service as JSON; the status code and the answer.
async fn post(client: &kube::Client, body: &Value) -> (u16, Value) {
    let (code, value, _) = common::post_json(client, SERVICES, body).await;
    (code, value)
}

/// Merge-patches the Service `name` to the type `kind`; the status code and the answer.
async fn retype(client: &kube::Client, name: &str, kind: &str) -> (u16, Value) {
    let patch = json!({"spec": {"type": kind, "ports": [{"port": 80}]}});
    let uri = format!("{SERVICES}/{name}");
    let content_type = Some("application/merge-patch+json");
    let (code, value, _) = raw(
        client,
        "PATCH",
        &uri,
        content_type,
        patch.to_string().into(),
    )
    .await;
    (code, value)
}

/// A request without a body (GET, DELETE) for the Service `name`; the status code and the
/// answer.
async fn bodiless(client: &kube::Client, method: &str, name: &str) -> (u16, Value) {
    let (code, value, _) = raw(client, method, &format!("{SERVICES}/{name}"), None, vec![]).await;
    (code, value)
}

async fn services(client: &kube::Client) -> Vec<Value> {
    let (_, list, _) = raw(client, "GET", SERVICES, None, Vec::new()).await;
    list["items"].as_array().cloned().unwrap_or_default()
}

/// Deletes every Service but the built-in one; returns the status code.
async fn delete_all_but_kubernetes(client: &kube::Client) -> u16 {
    let uri = format!("{SERVICES}?fieldSelector=metadata.name%21%3Dkubernetes");
    raw(client, "DELETE", &uri, None, Vec::new()).await.0
}

/// Every cluster IP and node port in use, failing on any duplicate.
fn assert_unique(items: &[Value]) {
    let mut ips = HashSet::new();
    let mut ports = HashSet::new();
    for item in items {
        for ip in item["spec"]["clusterIPs"].as_array().into_iter().flatten() {
            let ip = ip.as_str().unwrap_or_default();
            assert!(
                ip == "None" || ips.insert(ip.to_string()),
                "cluster IP {ip} handed out twice"
            );
        }
        let mut own = HashSet::new();
        for port in item["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(p) = port["nodePort"].as_i64()
                && own.insert(p)
            {
                assert!(ports.insert(p), "node port {p} handed out twice");
            }
        }
    }
}

#[tokio::test]
async fn a_small_range_fills_completely_reports_exhaustion_and_frees_on_delete() {
    // 10.96.0.0/28: 14 usable addresses, 10.96.0.1 held by the kubernetes Service.
    let server = with_ranges("10.96.0.0/28", "30000-30009");
    let client = server.client().await;
    for round in 0..2 {
        let full = "failed to allocate a serviceIP: range is full";
        fill(&client, ("ClusterIP", 13), full, &format!("round {round}")).await;
        assert_unique(&services(&client).await);
        // Deleting everything frees every address: the next round fills the range again.
        assert_eq!(delete_all_but_kubernetes(&client).await, 200);
    }
    // Node ports: 10 in the range.
    let full = "failed to allocate a nodePort: range is full";
    fill(&client, ("NodePort", 10), full, "node ports").await;
}

/// A server with this Service cluster IP range and node port range.
fn with_ranges(cluster_ips: &str, node_ports: &str) -> Server {
    Server::start_with(&[
        "--service-cluster-ip-range",
        cluster_ips,
        "--service-node-port-range",
        node_ports,
    ])
}

/// Creates `count` Services of `kind`, each answered 201, then one too many: answered 500 with
/// the internal error `full`, and not stored.
async fn fill(client: &kube::Client, (kind, count): (&str, usize), full: &str, what: &str) {
    for i in 0..count {
        let (code, body) = create(client, &format!("{kind}-{i}").to_lowercase(), kind).await;
        assert_eq!(code, 201, "{what}, service {i}: {body}");
    }
    let (code, body) = create(client, "one-too-many", kind).await;
    assert_eq!(code, 500, "{what}: {body}");
    assert_eq!(body["message"], format!("Internal error occurred: {full}"));
    let (code, _) = bodiless(client, "GET", "one-too-many").await;
    assert_eq!(code, 404, "{what}: a failed create stores nothing");
}

#[tokio::test]
async fn concurrent_creates_type_changes_and_deletes_never_share_an_address() {
    let server = with_ranges("10.96.0.0/26", "30000-30039");
    let client = server.client().await;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(worker);
            for step in 0..40 {
                let name = format!("w{worker}-{}", rng.usize(..6));
                match rng.u8(..4) {
                    0 | 1 => {
                        let kind = if rng.bool() { "NodePort" } else { "ClusterIP" };
                        let (code, body) = create(&client, &name, kind).await;
                        assert!(
                            matches!(code, 201 | 409 | 500),
                            "step {step}: {code} {body}"
                        );
                    }
                    2 => {
                        let kind = if rng.bool() { "NodePort" } else { "ClusterIP" };
                        let (code, body) = retype(&client, &name, kind).await;
                        assert!(
                            matches!(code, 200 | 404 | 422 | 500),
                            "step {step}: {code} {body}"
                        );
                    }
                    _ => {
                        let (code, body) = bodiless(&client, "DELETE", &name).await;
                        assert!(matches!(code, 200 | 404), "step {step}: {code} {body}");
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    assert_unique(&services(&client).await);
    // Everything deleted: the whole range (62 usable, one held by kubernetes) is free again.
    assert_eq!(delete_all_but_kubernetes(&client).await, 200);
    for i in 0..61 {
        let (code, body) = create(&client, &format!("refill{i}"), "ClusterIP").await;
        assert_eq!(code, 201, "refill {i}: {body}");
    }
    for i in 0..40 {
        let (code, body) = retype(&client, &format!("refill{i}"), "NodePort").await;
        assert_eq!(code, 200, "node port refill {i}: {body}");
    }
    assert_unique(&services(&client).await);
}

#[tokio::test]
async fn the_startup_repair_check_fixes_a_damaged_allocation_table() {
    use capstan_storage::{EmbeddedOptions, EmbeddedStore, Op, Storage, Txn};
    let mut server = Server::start();
    let client = server.client().await;
    let body = json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.96.200.200", "ports": [{"port": 80}]}});
    let (code, _) = post(&client, &body).await;
    assert_eq!(code, 201);
    assert_eq!(server.stop(), Some(0));
    {
        // Damage the table by hand: lose a's allocation, leak an address no Service holds.
        let store = EmbeddedStore::open(EmbeddedOptions::new(server.data_dir())).expect("store");
        let txn = Txn::new()
            .then(Op::Delete("ranges/serviceips/10.96.200.200".into()))
            .then(Op::Put(
                "ranges/serviceips/10.96.200.201".into(),
                "default/ghost".into(),
            ));
        store.txn(txn).await.expect("txn");
    }
    server.launch();
    let client = server.client().await;
    let taken = json!({"metadata": {"name": "b"}, "spec": {"clusterIP": "10.96.200.200", "ports": [{"port": 80}]}});
    let (code, body) = post(&client, &taken).await;
    assert_eq!(code, 422, "a's address was recorded again: {body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("provided IP is already allocated")
    );
    let leaked = json!({"metadata": {"name": "c"}, "spec": {"clusterIP": "10.96.200.201", "ports": [{"port": 80}]}});
    let (code, body) = post(&client, &leaked).await;
    assert_eq!(code, 201, "the leaked address was released: {body}");
}

/// Conformance case ALC-22 (not expressible as one request in `conformance/services.json`).
#[tokio::test]
async fn alc_22_two_hundred_concurrent_creates_get_distinct_dynamic_addresses() {
    let server = Server::start_with(&["--service-cluster-ip-range", "10.96.0.0/16"]);
    let client = server.client().await;
    let mut tasks = Vec::new();
    for i in 1..=200 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            create(&client, &format!("c{i}"), "ClusterIP").await
        }));
    }
    let mut ips = HashSet::new();
    for task in tasks {
        let (code, body) = task.await.expect("task");
        assert_eq!(code, 201, "{body}");
        let ip: std::net::Ipv4Addr = body["spec"]["clusterIP"]
            .as_str()
            .unwrap_or_default()
            .parse()
            .expect("IPv4");
        let offset = u32::from(ip) - u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0));
        assert!(
            offset > 256,
            "{ip} is in the static band 10.96.0.1-10.96.1.0"
        );
        assert!(ips.insert(ip), "{ip} handed out twice");
    }
}

/// A LoadBalancer Service that asks for a health check node port gets its other node ports
/// elsewhere: with two ports in the range, the one it did not ask for (a random pick could
/// take the asked-for one, and the create then failed).
#[tokio::test]
async fn a_requested_health_check_port_is_not_handed_to_the_services_own_ports() {
    let server = Server::start_with(&["--service-node-port-range", "31100-31101"]);
    let client = server.client().await;
    for round in 0..8 {
        let body = json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer",
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 31100,
            "selector": {"app": "lb"}, "ports": [{"port": 80}]}});
        let (code, created) = post(&client, &body).await;
        assert_eq!(code, 201, "round {round}: {created}");
        assert_eq!(created["spec"]["healthCheckNodePort"], 31100);
        assert_eq!(created["spec"]["ports"][0]["nodePort"], 31101);
        assert_eq!(delete_all_but_kubernetes(&client).await, 200);
    }
}
