//! EndpointSlices end to end: kubectl (`get -o wide`, `-w`, `describe`, label selection), a
//! kube-rs reflector following a Service's slices through pod churn, the garbage collector's
//! three propagation policies, and the Python client's typed `DiscoveryV1Api`.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

/// A node in `zone`, and `count` pods `<app>-<i>` on it (ready unless `i` is in `not_ready`).
fn manifests(
    app: &str,
    count: usize,
    not_ready: &[usize],
) -> (String, Vec<(String, String, bool)>) {
    let mut yaml = String::from(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {topology.kubernetes.io/zone: zone-a}}\n",
    );
    let mut pods = Vec::new();
    for i in 0..count {
        let name = format!("{app}-{i}");
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: {app}}}}}\nspec: {{nodeName: n1, containers: [{{name: c, image: x, ports: [{{name: http, containerPort: 8080}}]}}]}}\n"
        ));
        pods.push((
            name,
            format!("10.60.{}.{}", i / 200, i % 200 + 1),
            !not_ready.contains(&i),
        ));
    }
    (yaml, pods)
}

/// A server with a node, `count` pods of app `web` (ready unless listed in `not_ready`) and,
/// when `service` is set, the Service `web` selecting them.
fn serve_web(
    count: usize,
    not_ready: &[usize],
    service: bool,
) -> (Server, Vec<(String, String, bool)>) {
    let server = Server::start();
    let (yaml, pods) = manifests("web", count, not_ready);
    server.apply("pods.yaml", &yaml);
    for (name, ip, ready) in &pods {
        common::set_pod_status(&server, name, ip, *ready);
    }
    if service {
        server.apply("service.yaml", WEB_SERVICE);
    }
    (server, pods)
}

fn wait_for(server: &Server, what: &str, args: &[&str], done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = server.kubectl(args);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}: last output {text}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

const WEB_SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: http}]}\n";

/// Services `web-0`.. selecting the `web` pods, applied in one go.
fn create_web_services(server: &Server, count: usize) {
    let services: String = (0..count)
        .map(|i| WEB_SERVICE.replace("name: web}", &format!("name: web-{i}}}")))
        .collect::<Vec<_>>()
        .join("---\n");
    server.apply("services.yaml", &services);
}

#[test]
fn kubectl_lists_watches_selects_and_describes_endpointslices() {
    let (server, _) = serve_web(3, &[2], true);

    // Label selection by the Service's name, and the wide listing's columns.
    let listed = wait_for(
        &server,
        "the slice of web with its three pods",
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "wide",
        ],
        |out| out.contains("10.60.0.1") && out.contains("10.60.0.3"),
    );
    let header = listed.lines().next().unwrap_or_default();
    for column in ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"] {
        assert!(header.contains(column), "{listed}");
    }
    let row = listed.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("web-") && row.contains(" IPv4 ") && row.contains(" 8080 "),
        "{listed}"
    );
    let name = row
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    let other = server.ok(&[
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=other",
    ]);
    assert!(other.trim().is_empty(), "{other}");

    // describe shows the endpoints with their conditions and topology.
    let described = server.ok(&["describe", "endpointslice", &name]);
    for part in [
        "AddressType:  IPv4",
        "kubernetes.io/service-name=web",
        "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io",
        "http  8080  TCP",
        "10.60.0.3",
        "Ready:    false",
        "NodeName:   n1",
        "Zone:       zone-a",
        "TargetRef:  Pod/web-0",
    ] {
        assert!(described.contains(part), "{part:?} not in {described}");
    }

    // kubectl get -w prints the slice again when a pod's readiness changes it.
    let mut watch = Command::new("/usr/bin/kubectl")
        .args(["--kubeconfig", common::path_str(&server.kubeconfig())])
        .args(["get", "endpointslices", "-w", "-o", "wide"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let stdout = watch.stdout.take().expect("stdout");
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let first = seen.recv_timeout(Duration::from_secs(10)).expect("header");
    assert!(first.contains("ADDRESSTYPE"), "{first}");
    std::thread::sleep(Duration::from_millis(500));
    common::set_pod_status(&server, "web-2", "10.60.0.3", true);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut updates = 0;
    while Instant::now() < deadline {
        if let Ok(line) = seen.recv_timeout(Duration::from_millis(200))
            && line.starts_with(&name)
        {
            updates += 1;
            if updates >= 2 {
                break;
            }
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(updates >= 2, "the watch showed the slice {updates} times");
    let ready = server.jsonpath(
        &["endpointslice", &name],
        "{.endpoints[*].conditions.ready}",
    );
    assert_eq!(ready, "true true true");
}

#[test]
fn garbage_collection_orphans_cascades_in_the_foreground_and_in_the_background() {
    let (server, _) = serve_web(1, &[], false);
    let slices_of = |service: &str| {
        server.ok(&[
            "get",
            "endpointslices",
            "-l",
            &format!("kubernetes.io/service-name={service}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.ownerReferences[*].name}{\"\\n\"}{end}",
        ])
    };
    for service in ["orphaned", "foreground", "background"] {
        let manifest = WEB_SERVICE.replace("name: web", &format!("name: {service}"));
        server.apply(&format!("{service}.yaml"), &manifest);
        wait_for(
            &server,
            "a slice owned by the Service",
            &[
                "get",
                "endpointslices",
                "-l",
                &format!("kubernetes.io/service-name={service}"),
            ],
            |out| out.contains("10.60.0.1"),
        );
    }
    // Orphan: the slice stays, without its owner.
    server.ok(&["delete", "service", "orphaned", "--cascade=orphan"]);
    wait_for(&server, "the orphaned slice", &["get", "services"], |out| {
        !out.contains("orphaned")
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while slices_of("orphaned").contains(" orphaned") {
        assert!(Instant::now() < deadline, "{}", slices_of("orphaned"));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(slices_of("orphaned").lines().count(), 1);
    // Foreground: kubectl waits for the Service, which goes after its slice.
    server.ok(&["delete", "service", "foreground", "--cascade=foreground"]);
    assert!(slices_of("foreground").trim().is_empty());
    // Background: the slice follows its Service.
    server.ok(&["delete", "service", "background"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !slices_of("background").trim().is_empty() {
        assert!(Instant::now() < deadline, "{}", slices_of("background"));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_foreground_delete_through_a_cycle_of_blocking_owners_completes() {
    let server = Server::start();
    for pod in ["a", "b", "c"] {
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: cyc-{pod}}}\nspec: {{containers: [{{name: c, image: x}}]}}\n"
        );
        server.apply(&format!("{pod}.yaml"), &manifest);
    }
    let uid = |pod: &str| server.jsonpath(&["pod", &format!("cyc-{pod}")], "{.metadata.uid}");
    // a is owned by c, b by a, c by b: each blocks its owner's deletion.
    for (dependent, owner) in [("a", "c"), ("b", "a"), ("c", "b")] {
        let reference = format!(
            r#"{{"metadata":{{"ownerReferences":[{{"apiVersion":"v1","kind":"Pod","name":"cyc-{owner}","uid":"{}","blockOwnerDeletion":true}}]}}}}"#,
            uid(owner)
        );
        server.ok(&[
            "patch",
            "pod",
            &format!("cyc-{dependent}"),
            "--type=merge",
            "-p",
            &reference,
        ]);
    }
    // Upstream's collector unblocks the references of the object that closes the cycle, and
    // all three go.
    server.ok(&[
        "delete",
        "pod",
        "cyc-a",
        "--cascade=foreground",
        "--wait=false",
    ]);
    wait_for(
        &server,
        "the three pods gone",
        &["get", "pods", "-o", "name"],
        |out| !out.contains("cyc-"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflector_follows_a_services_slices_through_pod_churn() {
    use futures_util::StreamExt;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::runtime::{WatchStreamExt, reflector, watcher};

    let (server, mut pods) = serve_web(120, &[], false);
    let client = server.client().await;
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(client, "default");
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels("kubernetes.io/service-name=web");
    let follow = tokio::spawn(
        reflector(writer, watcher(api, config))
            .default_backoff()
            .for_each(|_| async {}),
    );
    server.apply("service.yaml", WEB_SERVICE);

    // Churn: readiness flips, deletions and new pods, while the reflector follows.
    for (i, (name, ip, ready)) in pods.iter_mut().enumerate() {
        if i % 7 == 0 {
            *ready = !*ready;
            common::set_pod_status(&server, name, ip, *ready);
        }
    }
    let gone: Vec<String> = pods.iter().step_by(11).map(|p| p.0.clone()).collect();
    for name in &gone {
        server.ok(&["delete", "pod", name, "--grace-period=0", "--force"]);
    }
    pods.retain(|p| !gone.contains(&p.0));
    let (more, extra) = manifests("web", 140, &[]);
    // Only the new pods (a document per object; the node and the first 120 are left out).
    let more: Vec<&str> = more.split("---\n").skip(121).collect();
    server.apply("more.yaml", &more.join("---\n"));
    for (name, ip, ready) in extra.into_iter().skip(120) {
        common::set_pod_status(&server, &name, &ip, ready);
        pods.push((name, ip, ready));
    }

    // The reflector ends equal to the pods: every address once, ready as its pod is, in
    // slices of at most 100.
    let want: BTreeSet<(String, bool)> = pods.iter().map(|(_, ip, r)| (ip.clone(), *r)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let have = loop {
        let slices = store.state();
        let have: Vec<(String, bool)> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .flat_map(|e| {
                let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                e.addresses.iter().map(move |a| (a.clone(), ready))
            })
            .collect();
        let unique: BTreeSet<(String, bool)> = have.iter().cloned().collect();
        if unique == want && have.len() == want.len() {
            assert!(
                slices
                    .iter()
                    .all(|s| s.endpoints.as_ref().map_or(0, Vec::len) <= 100)
            );
            break have;
        }
        assert!(
            Instant::now() < deadline,
            "reflector has {} endpoints, want {}",
            have.len(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(have.len(), 129);
    follow.abort();
}

/// Many Services over the same 150 pods, created at once: each ends with every pod in exactly
/// one of its two slices. A sync that ran after the controller's own slice reached the watch
/// cache but before the controller had filed it under its Service once created the second
/// slice's 50 endpoints again, in a third slice no later event would remove.
#[test]
fn services_created_together_get_each_pod_in_exactly_one_slice() {
    const SERVICES: usize = 30;
    let (server, pods) = serve_web(150, &[], false);
    create_web_services(&server, SERVICES);
    let want: BTreeSet<&str> = pods.iter().map(|(_, ip, _)| ip.as_str()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list: serde_json::Value =
            serde_json::from_str(&server.ok(&["get", "endpointslices", "-o", "json"]))
                .expect("slice list");
        let mut sizes: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        let mut addresses: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for slice in list["items"].as_array().into_iter().flatten() {
            let service = slice["metadata"]["labels"]["kubernetes.io/service-name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let endpoints = slice["endpoints"].as_array().cloned().unwrap_or_default();
            sizes
                .entry(service.clone())
                .or_default()
                .push(endpoints.len());
            addresses.entry(service).or_default().extend(
                endpoints
                    .iter()
                    .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                    .filter_map(|a| a.as_str().map(str::to_string)),
            );
        }
        let wrong: Vec<String> = (0..SERVICES)
            .map(|i| format!("web-{i}"))
            .filter(|name| {
                let mut have = sizes.get(name).cloned().unwrap_or_default();
                have.sort_unstable();
                let listed = addresses.get(name).cloned().unwrap_or_default();
                let unique: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
                have != [50, 100] || listed.len() != 150 || unique != want
            })
            .map(|name| format!("{name}: slices {:?}", sizes.get(&name)))
            .collect();
        if wrong.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not one slice per pod: {wrong:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A mirrored slice is replaced whole when its Endpoints change, as upstream's update of a
/// freshly built slice: a finalizer someone added, and the `generateName` it was created with,
/// are gone. A node whose zone label is empty gives its endpoints no zone, and a Service that
/// prefers the same node has its ready endpoints hinted to their node.
#[test]
fn mirrored_slices_are_replaced_whole_and_endpoints_get_their_zone_and_hints() {
    let server = Server::start();
    let endpoints = |ips: &[&str]| {
        let addresses: Vec<String> = ips
            .iter()
            .map(|ip| format!("{{ip: {ip}, nodeName: n0}}"))
            .collect();
        format!(
            "apiVersion: v1\nkind: Endpoints\nmetadata: {{name: ext}}\nsubsets: [{{addresses: [{}], ports: [{{port: 5432}}]}}]\n",
            addresses.join(", ")
        )
    };
    server.apply(
        "ext.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: ext}}\nspec: {{ports: [{{port: 5432}}]}}\n---\n{}",
            endpoints(&["192.0.2.30"])
        ),
    );
    let slices_of = |service: &str, output: &str, what: &str, done: &dyn Fn(&str) -> bool| {
        let selector = format!("kubernetes.io/service-name={service}");
        let args = ["get", "endpointslices", "-l", &selector, "-o", output];
        wait_for(&server, what, &args, done)
    };
    let name = slices_of("ext", "name", "the mirrored slice", &|out| {
        out.starts_with("endpointslice.discovery.k8s.io/ext-")
    });
    let name = name.trim().to_string();
    let generate_name = server.jsonpath(&[&name], "{.metadata.generateName}");
    assert_eq!(generate_name, "ext-");
    server.ok(&[
        "patch",
        &name,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/keep"]}}"#,
    ]);
    server.apply("ext2.yaml", &endpoints(&["192.0.2.30", "192.0.2.31"]));
    let slice = wait_for(
        &server,
        "the mirrored slice with both addresses",
        &["get", &name, "-o", "json"],
        |out| out.contains("192.0.2.31"),
    );
    let slice: serde_json::Value = serde_json::from_str(&slice).expect("slice");
    assert_eq!(slice["metadata"]["finalizers"], serde_json::Value::Null);
    assert_eq!(slice["metadata"]["generateName"], serde_json::Value::Null);

    // A Service with a selector, its pod on a node whose zone label is empty.
    let (yaml, pods) = manifests("web", 1, &[]);
    let yaml = yaml.replace(
        "topology.kubernetes.io/zone: zone-a",
        "topology.kubernetes.io/zone: ''",
    );
    server.apply("pods.yaml", &yaml);
    for (pod, ip, ready) in &pods {
        common::set_pod_status(&server, pod, ip, *ready);
    }
    let service = WEB_SERVICE.replace("spec: {", "spec: {trafficDistribution: PreferSameNode, ");
    server.apply("service.yaml", &service);
    let slice = slices_of("web", "json", "web's slice with its pod", &|out| {
        out.contains(&pods[0].1)
    });
    let slices: serde_json::Value = serde_json::from_str(&slice).expect("slices");
    let endpoint = &slices["items"][0]["endpoints"][0];
    assert_eq!(endpoint["nodeName"], "n1");
    assert_eq!(endpoint["zone"], serde_json::Value::Null, "{endpoint}");
    assert_eq!(
        endpoint["hints"],
        serde_json::json!({"forNodes": [{"name": "n1"}]}),
        "{endpoint}"
    );
}

/// Whether a Service's Endpoints are mirrored follows its selector, both ways: none while it
/// has one, a mirrored slice once it is dropped and the Endpoints are written by hand, and
/// the mirrored slice gone again once a selector comes back.
#[test]
fn a_services_selector_decides_whether_its_endpoints_are_mirrored() {
    let server = Server::start();
    let mirrored = "endpointslice.kubernetes.io/managed-by=endpointslicemirroring-controller.k8s.io,kubernetes.io/service-name=ext";
    let mirrored_slices = ["get", "endpointslices", "-l", mirrored, "-o", "name"];
    server.apply(
        "ext.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: ext}\nspec: {selector: {app: ext}, ports: [{port: 5432}]}\n",
    );
    // The endpoints controller's own (empty) Endpoints are not mirrored.
    wait_for(
        &server,
        "ext's Endpoints",
        &["get", "endpoints", "ext", "-o", "name"],
        |out| out.trim() == "endpoints/ext",
    );
    server.ok(&[
        "patch",
        "service",
        "ext",
        "--type=json",
        "-p",
        r#"[{"op": "remove", "path": "/spec/selector"}]"#,
    ]);
    server.apply(
        "ext-endpoints.yaml",
        "apiVersion: v1\nkind: Endpoints\nmetadata: {name: ext}\nsubsets: [{addresses: [{ip: 192.0.2.40}], ports: [{port: 5432}]}]\n",
    );
    wait_for(&server, "the mirrored slice", &mirrored_slices, |out| {
        out.starts_with("endpointslice.discovery.k8s.io/ext-")
    });
    server.ok(&[
        "patch",
        "service",
        "ext",
        "--type=merge",
        "-p",
        r#"{"spec": {"selector": {"app": "ext"}}}"#,
    ]);
    wait_for(&server, "no mirrored slice", &mirrored_slices, |out| {
        out.trim().is_empty()
    });
}

/// A restart writes nothing: the controllers start their syncs only once their indexes hold
/// what exists (upstream's cache sync). Before, a sync that ran ahead of the slice or pod
/// replay created slices again and deleted them, or wrote Endpoints without their pods.
#[test]
fn a_restart_rewrites_no_endpoints_and_no_slices() {
    const SERVICES: usize = 10;
    let (mut server, _) = serve_web(150, &[], false);
    create_web_services(&server, SERVICES);
    let versions = |server: &Server| {
        let jsonpath =
            "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}";
        let slices = server.ok(&["get", "endpointslices", "-o", jsonpath]);
        let endpoints = server.ok(&["get", "endpoints", "-o", jsonpath]);
        let mut all: Vec<String> = format!("{slices} {endpoints}")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        all.sort();
        all
    };
    wait_for(
        &server,
        "every Service's two slices",
        &["get", "endpointslices", "-o", "name"],
        |out| out.lines().filter(|l| l.contains("/web-")).count() == 2 * SERVICES,
    );
    // Settled: nothing changes from one look to the next.
    let mut before = versions(&server);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = versions(&server);
        if now == before {
            break;
        }
        assert!(Instant::now() < deadline, "the slices never settled");
        before = now;
    }
    server.restart();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        versions(&server),
        before,
        "objects written after the restart"
    );
}

/// A slice the controller wrote and someone else deleted comes back with its endpoints (as
/// upstream's tracker: the Service is synced again).
#[test]
fn a_deleted_slice_of_the_controller_comes_back() {
    let (server, pods) = serve_web(2, &[], true);
    let names_and_addresses =
        "jsonpath={.items[*].metadata.name} {.items[*].endpoints[*].addresses[0]}";
    let args = [
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=web",
        "-o",
        names_and_addresses,
    ];
    let has_pods = |out: &str| pods.iter().all(|(_, ip, _)| out.contains(ip.as_str()));
    let first = wait_for(&server, "web's slice with both pods", &args, has_pods);
    let name = first
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    server.ok(&["delete", "endpointslice", &name]);
    wait_for(&server, "a new slice with both pods", &args, |out| {
        !out.split_whitespace().any(|word| word == name) && has_pods(out)
    });
}

#[test]
fn the_python_client_reads_slices_and_nodes_through_its_typed_apis() {
    let (server, _) = serve_web(2, &[1], true);
    wait_for(
        &server,
        "the slice",
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
        ],
        |out| out.contains("10.60.0.2"),
    );
    let script = r#"
import sys
from kubernetes import client, config
config.load_kube_config(sys.argv[1])
discovery = client.DiscoveryV1Api()
slices = discovery.list_namespaced_endpoint_slice("default", label_selector="kubernetes.io/service-name=web")
(s,) = slices.items
assert s.address_type == "IPv4", s.address_type
assert [(p.name, p.port, p.protocol) for p in s.ports] == [("http", 8080, "TCP")], s.ports
seen = sorted((e.addresses[0], e.conditions.ready, e.zone, e.target_ref.name) for e in s.endpoints)
assert seen == [("10.60.0.1", True, "zone-a", "web-0"), ("10.60.0.2", False, "zone-a", "web-1")], seen
assert s.metadata.owner_references[0].kind == "Service"
mine = discovery.create_namespaced_endpoint_slice("default", client.V1EndpointSlice(
    metadata=client.V1ObjectMeta(name="by-python"), address_type="IPv4",
    endpoints=[client.V1Endpoint(addresses=["192.0.2.7"])],
    ports=[client.DiscoveryV1EndpointPort(port=5432)]))
assert mine.ports[0].protocol == "TCP" and mine.metadata.generation == 1
nodes = client.CoreV1Api().list_node()
assert [n.metadata.labels["topology.kubernetes.io/zone"] for n in nodes.items] == ["zone-a"]
print("ok")
"#;
    common::run_python(&server, script);
}

#[test]
fn ports_come_in_upstreams_hash_order_in_endpoints_and_slices() {
    // kube-controller-manager lists these three as http, admin, https in both kinds: sorted by
    // the FNV-128a hash of each port's go-spew dump, not by name, number or the Service's order.
    let (server, _) = serve_web(1, &[], false);
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: multi}\nspec: {selector: {app: web}, ports: [{name: https, port: 443, targetPort: 8443}, {name: admin, port: 9000, targetPort: 9000}, {name: http, port: 80, targetPort: 8080}]}\n";
    server.apply("multi.yaml", service);
    let endpoints = "jsonpath={.subsets[0].ports[*].name}";
    let slice = "jsonpath={.items[0].ports[*].name}";
    let selector = "kubernetes.io/service-name=multi";
    let by_name: &[&str] = &["get", "endpoints", "multi", "-o", endpoints];
    let by_label: &[&str] = &["get", "endpointslices", "-l", selector, "-o", slice];
    for args in [by_name, by_label] {
        let out = wait_for(&server, "multi's ports", args, |out| !out.trim().is_empty());
        assert_eq!(out.trim(), "http admin https", "{}", args[1]);
    }
}

/// A slice's JSON has `metadata` right after `kind` and `apiVersion`, as kube-apiserver writes
/// it (its Go type's order), whether the controller wrote it from its type (k8s-openapi puts
/// `addressType` first) or a client sent its members in another order.
#[test]
fn a_slices_json_has_its_metadata_first_as_kube_apiserver_writes_it() {
    let (server, _) = serve_web(1, &[], true);
    let name_args = [
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=web",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ];
    let written = wait_for(&server, "web's slice", &name_args, |out| !out.is_empty());
    let by_hand = server.apply_file(
        "slice.json",
        r#"{"addressType": "IPv4", "apiVersion": "discovery.k8s.io/v1",
            "endpoints": [{"addresses": ["10.0.0.1"]}], "kind": "EndpointSlice",
            "metadata": {"name": "by-hand"}, "ports": [{"port": 80}]}"#,
    );
    server.ok(&["create", "-f", common::path_str(&by_hand)]);
    for name in [written.trim(), "by-hand"] {
        let path = format!("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/{name}");
        let raw = server.ok(&["get", "--raw", &path]);
        assert!(
            raw.starts_with(
                r#"{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"#
            ),
            "{raw}"
        );
        let (metadata, address_type) = (raw.find(r#""metadata""#), raw.find(r#""addressType""#));
        assert!(metadata < address_type, "{raw}");
    }
}
