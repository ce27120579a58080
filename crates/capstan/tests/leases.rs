//! coordination.k8s.io/v1 Leases through real clients (kubectl, the kube crate, the Python
//! client), and the controllers' own Lease on one replica.

mod common;

use std::time::{Duration, Instant};

use common::{Server, path_str};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

const LEASE: &str = "apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: node-a
  labels: {role: heartbeat}
spec:
  holderIdentity: node-a
  leaseDurationSeconds: 40
  renewTime: \"2026-11-26T10:00:00.123456Z\"
";

/// Waits for the controllers' Lease to be held by someone other than `previous`.
fn new_holder(server: &Server, previous: &str) -> (String, Duration) {
    let started = Instant::now();
    loop {
        let holder = common::lease_holder(server);
        if (!holder.is_empty() && holder != previous) || started.elapsed() > Duration::from_secs(10)
        {
            return (holder, started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kubectl_creates_lists_describes_and_deletes_leases() {
    let server = Server::start();
    let manifest = server.apply_file("l.yaml", LEASE);
    server.ok(&["create", "-f", path_str(&manifest)]);
    let table = server.ok(&["get", "leases", "-l", "role=heartbeat"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "HOLDER", "AGE"]
    );
    assert!(
        lines[1].starts_with("node-a") && lines[1].contains("node-a "),
        "{table}"
    );
    // The apiserver's identity Lease, as upstream 1.26+ keeps one per apiserver.
    let identity = server.ok(&[
        "-n",
        "kube-system",
        "get",
        "lease",
        "-l",
        "apiserver.kubernetes.io/identity=kube-apiserver",
        "-o",
        "jsonpath={.items[0].metadata.name} {.items[0].spec.leaseDurationSeconds}",
    ]);
    assert!(
        identity.starts_with("apiserver-") && identity.ends_with(" 3600"),
        "{identity}"
    );
    let all = server.ok(&["get", "leases", "-A"]);
    assert!(
        all.contains("kube-system") && all.contains("capstan-controllers"),
        "{all}"
    );
    let described = server.ok(&["describe", "lease", "node-a"]);
    assert!(
        described.contains("Holder Identity:") && described.contains("40"),
        "{described}"
    );
    // MicroTime keeps its microseconds.
    let renewed = server.jsonpath(&["lease", "node-a"], "{.spec.renewTime}");
    assert_eq!(renewed, "2026-11-26T10:00:00.123456Z");
    let zero = r#"{"spec":{"leaseDurationSeconds":0}}"#;
    let refused = server.fails(&["patch", "lease", "node-a", "--type=merge", "-p", zero]);
    let why = "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0";
    assert!(refused.contains(why), "{refused}");
    server.ok(&["delete", "lease", "node-a"]);
    let gone = server.fails(&["get", "lease", "node-a"]);
    assert!(gone.contains("NotFound"), "{gone}");
}

#[tokio::test]
async fn a_stale_lease_update_conflicts_as_leader_election_needs() {
    let server = Server::start();
    let leases: Api<Lease> = Api::namespaced(server.client().await, "default");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "lock"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }))
    .expect("a lease");
    let created = leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("created");
    let mut first = created.clone();
    first.spec.get_or_insert_default().holder_identity = Some("b".into());
    leases
        .replace("lock", &PostParams::default(), &first)
        .await
        .expect("the first taker wins");
    let mut second = created;
    second.spec.get_or_insert_default().holder_identity = Some("c".into());
    let lost = leases
        .replace("lock", &PostParams::default(), &second)
        .await
        .expect_err("the second, from the same resourceVersion, loses");
    let kube::Error::Api(status) = lost else {
        panic!("want a 409, got {lost}");
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    let held = leases.get("lock").await.expect("read");
    assert_eq!(
        held.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("b")
    );
}

#[test]
fn the_python_client_reads_and_renews_leases() {
    let server = Server::start();
    let script = r#"
import sys, datetime
from kubernetes import client, config
config.load_kube_config(sys.argv[1])
api = client.CoordinationV1Api()
held = api.read_namespaced_lease("capstan-controllers", "kube-system")
assert held.spec.holder_identity and held.spec.lease_duration_seconds == 15, held.spec
now = datetime.datetime(2026, 11, 26, 10, 0, 0, 123456, tzinfo=datetime.timezone.utc)
mine = api.create_namespaced_lease("default", client.V1Lease(
    metadata=client.V1ObjectMeta(name="py"),
    spec=client.V1LeaseSpec(holder_identity="py", lease_duration_seconds=10, renew_time=now)))
assert mine.spec.renew_time == now, mine.spec.renew_time
mine.spec.renew_time = now + datetime.timedelta(seconds=2)
renewed = api.replace_namespaced_lease("py", "default", mine)
assert renewed.spec.renew_time == now + datetime.timedelta(seconds=2)
assert int(renewed.metadata.resource_version) > int(mine.metadata.resource_version)
print("ok")
"#;
    common::run_python(&server, script);
}

#[test]
fn one_replica_holds_the_controllers_lease_across_restarts() {
    let mut server = Server::start();
    let (first, _) = new_holder(&server, "");
    assert!(server.log().contains(&first), "{first}");
    // A clean stop releases the lease; a new process takes it at once.
    server.restart();
    let (second, _) = new_holder(&server, &first);
    assert!(
        server.log().contains(&second),
        "a restarted replica is a new candidate"
    );
    // After a crash the embedded store still admits only this process: it takes the lease
    // over at once instead of waiting for the dead holder's to expire (15 s).
    server.kill();
    server.launch();
    let (third, waited) = new_holder(&server, &second);
    assert!(server.log().contains(&third), "{third}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // The controllers run: a Service gets its Endpoints.
    server.ok(&["create", "service", "clusterip", "web", "--tcp=80"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .kubectl(&["get", "endpoints", "web"])
        .status
        .success()
        .then_some(())
        .is_none()
    {
        assert!(Instant::now() < deadline, "no endpoints: {}", server.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}
