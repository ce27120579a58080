//! End-to-end: the real `capstan` binary driven by `/usr/bin/kubectl`.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Server, path_str, pod_status_patch};

const WEB: &str = "apiVersion: v1
kind: Service
metadata: {name: web, labels: {app: web, tier: front}}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
";

#[test]
fn create_get_describe_delete_a_service() {
    let server = Server::start();
    let file = server.apply_file("web.yaml", WEB);
    assert_eq!(
        server.ok(&["create", "-f", path_str(&file)]).trim(),
        "service/web created"
    );

    let object: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "svc", "web", "-o", "json"])).expect("json");
    let ip = object["spec"]["clusterIP"].as_str().expect("clusterIP");
    assert!(ip.starts_with("10."), "{ip}");
    assert_eq!(object["spec"]["clusterIPs"][0], ip);
    assert_eq!(object["spec"]["ports"][0]["protocol"], "TCP");
    assert_eq!(object["spec"]["sessionAffinity"], "None");
    assert_eq!(object["status"], serde_json::json!({"loadBalancer": {}}));
    assert!(
        object["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );

    let table = server.ok(&["get", "svc", "web"]);
    let header = table.lines().next().unwrap_or_default();
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        columns,
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..5],
        ["web", "ClusterIP", ip, "<none>", "80/TCP"],
        "{table}"
    );

    let wide = server.ok(&["get", "svc", "web", "-o", "wide"]);
    assert!(
        wide.lines()
            .next()
            .unwrap_or_default()
            .ends_with("SELECTOR"),
        "{wide}"
    );
    assert!(wide.contains("app=web"));

    let yaml = server.ok(&["get", "svc", "web", "-o", "yaml"]);
    assert!(yaml.contains("kind: Service") && yaml.contains(&format!("clusterIP: {ip}")));

    let described = server.ok(&["describe", "svc", "web"]);
    assert!(
        described.contains("Selector:") && described.contains("app=web"),
        "{described}"
    );

    assert!(
        server
            .fails(&["create", "-f", path_str(&file)])
            .contains("already exists")
    );
    assert_eq!(
        server.ok(&["delete", "svc", "web"]).trim(),
        "service \"web\" deleted"
    );
    let missing = server.fails(&["get", "svc", "web"]);
    assert!(missing.contains("services \"web\" not found"), "{missing}");
}

#[test]
fn kubectl_create_service_generators_and_server_dry_run() {
    let server = Server::start();
    server.ok(&["create", "service", "clusterip", "c1", "--tcp=80:8080"]);
    server.ok(&["create", "service", "nodeport", "n1", "--tcp=80:8080"]);
    server.ok(&[
        "create",
        "service",
        "externalname",
        "e1",
        "--external-name=foo.example.com",
    ]);
    let node_port: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "svc", "n1", "-o", "json"])).expect("json");
    let port = node_port["spec"]["ports"][0]["nodePort"]
        .as_i64()
        .expect("nodePort");
    assert!((30000..=32767).contains(&port));
    assert_eq!(node_port["spec"]["externalTrafficPolicy"], "Cluster");
    let external = server.ok(&["get", "svc", "e1", "--no-headers"]);
    assert!(
        external.contains("ExternalName") && external.contains("foo.example.com"),
        "{external}"
    );

    let dry = server.ok(&[
        "create",
        "service",
        "clusterip",
        "dry",
        "--tcp=80:80",
        "--dry-run=server",
        "-o",
        "json",
    ]);
    let dry: serde_json::Value = serde_json::from_str(&dry).expect("json");
    assert!(dry["metadata"]["uid"].is_string());
    assert!(dry["metadata"].get("resourceVersion").is_none());
    assert!(server.fails(&["get", "svc", "dry"]).contains("not found"));
}

/// kubectl's typed clients ask for `application/vnd.kubernetes.protobuf,application/json`:
/// the created object, and the Status of a refused create, reach them as protobuf, and what
/// kubectl decodes is what the JSON API shows.
#[test]
fn typed_clients_get_protobuf_answers() {
    let server = Server::start();
    let create = [
        "-v=8",
        "create",
        "service",
        "nodeport",
        "pb",
        "--tcp=80:8080",
    ];
    let out = server.kubectl(&[&create[..], &["-o", "json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.lines()
            .any(|line| line.contains("Accept: application/vnd.kubernetes.protobuf")),
        "kubectl no longer asks for protobuf: {log}"
    );
    // The headers logged after the POST's "Response Headers:" are the create's answer's.
    let answer = log
        .split_once("] POST https://")
        .and_then(|(_, after)| after.split("Response Headers:").nth(1))
        .and_then(|rest| rest.lines().find(|line| line.contains("Content-Type:")))
        .unwrap_or_default();
    assert!(
        answer
            .trim_end()
            .ends_with("Content-Type: application/vnd.kubernetes.protobuf"),
        "the answer was not protobuf: {log}"
    );
    let decoded: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let stored: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "svc", "pb", "-o", "json"])).expect("json");
    assert_eq!(decoded["spec"], stored["spec"]);
    assert_eq!(decoded["metadata"], stored["metadata"]);
    assert!(
        decoded["spec"]["ports"][0]["nodePort"]
            .as_i64()
            .is_some_and(|p| p >= 30000)
    );
    // The refusal is a protobuf Status kubectl reads.
    let again = server.kubectl(&create);
    assert!(!again.status.success());
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(log.contains("services \"pb\" already exists"), "{log}");
    assert!(
        log.lines().any(|line| line.contains("409 Conflict")),
        "{log}"
    );
}

#[test]
fn selectors_filter_lists() {
    let server = Server::start();
    server.create("web.yaml", WEB);
    server.ok(&["create", "service", "clusterip", "db", "--tcp=5432:5432"]);
    assert_eq!(
        server
            .ok(&["get", "svc", "-l", "tier=front", "-o", "name"])
            .trim(),
        "service/web"
    );
    assert_eq!(
        server
            .ok(&["get", "svc", "-l", "tier!=front,app", "-o", "name"])
            .trim(),
        "service/db"
    );
    assert_eq!(
        server
            .ok(&["get", "svc", "-l", "tier=back", "-o", "name"])
            .trim(),
        ""
    );
    assert_eq!(
        server
            .ok(&[
                "get",
                "svc",
                "--field-selector",
                "metadata.name=db",
                "-o",
                "name"
            ])
            .trim(),
        "service/db"
    );
    let bad = server.fails(&["get", "svc", "--field-selector", "spec.ports=80"]);
    assert!(
        bad.contains("field label not supported: spec.ports"),
        "{bad}"
    );
    let bad = server.fails(&["get", "svc", "-l", "a b"]);
    assert!(
        bad.contains("found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        "{bad}"
    );
    let everywhere = server.ok(&["get", "svc", "-A", "-o", "name"]);
    assert!(everywhere.contains("service/kubernetes") && everywhere.contains("service/db"));
}

/// Lists and watches select by what a Service is after each write: its labels and its
/// selectable fields as written, created, changed and changed back.
#[test]
fn selectors_follow_each_write() {
    let server = Server::start();
    server.ok(&["create", "service", "clusterip", "db", "--tcp=5432:5432"]);
    let names = |selector: &[&str]| {
        let mut args = vec!["get", "svc", "-o", "name"];
        args.extend_from_slice(selector);
        server.ok(&args).trim().to_string()
    };
    let node_ports = ["--field-selector", "spec.type=NodePort"];
    let cluster_ips = ["--field-selector", "spec.type=ClusterIP,metadata.name=db"];
    assert_eq!(names(&node_ports), "");
    assert_eq!(names(&cluster_ips), "service/db");
    server.ok(&[
        "patch",
        "svc",
        "db",
        "-p",
        r#"{"spec":{"type":"NodePort"}}"#,
    ]);
    assert_eq!(names(&node_ports), "service/db");
    assert_eq!(names(&cluster_ips), "");
    server.ok(&["label", "svc", "db", "tier=data"]);
    assert_eq!(names(&["-l", "tier=data"]), "service/db");
    server.ok(&["label", "svc", "db", "tier=cache", "--overwrite"]);
    assert_eq!(names(&["-l", "tier=data"]), "");
    assert_eq!(
        names(&["-l", "tier=cache", "--field-selector", "spec.type=NodePort"]),
        "service/db"
    );
    let ip = server.jsonpath(&["svc", "db"], "{.spec.clusterIP}");
    let by_ip = format!("spec.clusterIP={}", ip.trim());
    assert_eq!(names(&["--field-selector", &by_ip]), "service/db");
    server.ok(&["patch", "svc", "db", "--type=json", "-p",
        r#"[{"op":"replace","path":"/spec/type","value":"ClusterIP"},{"op":"remove","path":"/spec/ports/0/nodePort"}]"#]);
    assert_eq!(names(&node_ports), "");
    assert_eq!(names(&cluster_ips), "service/db");
}

#[test]
fn chunked_lists_return_everything_from_one_snapshot() {
    let server = Server::start();
    for i in 0..12 {
        server.ok(&[
            "create",
            "service",
            "clusterip",
            &format!("s{i:02}"),
            "--tcp=80:80",
        ]);
    }
    let names = server.ok(&["get", "svc", "--chunk-size=5", "-o", "name"]);
    assert_eq!(
        names.lines().filter(|l| l.starts_with("service/s")).count(),
        12
    );

    let page: serde_json::Value = serde_json::from_str(&server.ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/services?limit=5",
    ]))
    .expect("json");
    assert_eq!(page["kind"], "ServiceList");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(5));
    // 13 services: kubernetes + 12.
    assert_eq!(page["metadata"]["remainingItemCount"], 8);
    let token = page["metadata"]["continue"].as_str().expect("continue");
    let rv = page["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    // Changes after the first page: later pages still show the snapshot (served from the
    // watch cache's history, as kube-apiserver 1.36 serves them from its cache).
    server.ok(&["create", "service", "clusterip", "late", "--tcp=80:80"]);
    server.ok(&["label", "service", "s11", "changed=yes"]);
    server.ok(&["delete", "service", "s10"]);
    let mut seen = 5;
    let mut later = Vec::new();
    let mut token = token.to_string();
    loop {
        let next: serde_json::Value = serde_json::from_str(&server.ok(&[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/default/services?limit=5&continue={token}"),
        ]))
        .expect("json");
        assert_eq!(
            next["metadata"]["resourceVersion"],
            rv.as_str(),
            "pages share a snapshot"
        );
        seen += next["items"].as_array().map_or(0, Vec::len);
        later.extend(next["items"].as_array().into_iter().flatten().cloned());
        match next["metadata"]["continue"].as_str() {
            Some(t) if !t.is_empty() => {
                // Counted in the snapshot too, not among the current objects.
                assert_eq!(next["metadata"]["remainingItemCount"], 13 - seen);
                token = t.to_string();
            }
            _ => {
                assert!(next["metadata"].get("remainingItemCount").is_none());
                break;
            }
        }
    }
    assert_eq!(
        seen, 13,
        "the service created mid-list is not in the snapshot"
    );
    let named = |name: &str| later.iter().find(|s| s["metadata"]["name"] == name);
    assert!(
        named("s10").is_some(),
        "deleted after the first page, still in the snapshot"
    );
    assert!(
        named("s11").is_some_and(|s| s["metadata"]["labels"]["changed"].is_null()),
        "changed after the first page: the snapshot's version"
    );
    let bad = server.fails(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/services?limit=5&continue=garbage!",
    ]);
    assert!(bad.contains("invalid continue token"), "{bad}");
}

/// What the watch `kubectl <args>` prints while `writes` run: it starts 1.5 s before them and
/// stops `settle` after them.
fn watched_while(
    server: &Server,
    args: &[&str],
    writes: impl FnOnce(),
    settle: Duration,
) -> String {
    let mut watch = server
        .kubectl_command()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl watch");
    std::thread::sleep(Duration::from_millis(1500));
    writes();
    std::thread::sleep(settle);
    let _ = watch.kill();
    let output = watch.wait_with_output().expect("watch output");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn watch_sees_added_modified_deleted() {
    let server = Server::start();
    let events = [
        "get",
        "svc",
        "--watch-only",
        "-o",
        "json",
        "--output-watch-events",
    ];
    let writes = || {
        server.ok(&["create", "service", "clusterip", "watched", "--tcp=81:81"]);
        server.ok(&["label", "svc", "watched", "x=y"]);
        server.ok(&["delete", "svc", "watched"]);
    };
    let text = watched_while(&server, &events, writes, Duration::from_millis(1500));
    let added = text.find("\"ADDED\"").expect("ADDED event");
    let modified = text.find("\"MODIFIED\"").expect("MODIFIED event");
    let deleted = text.find("\"DELETED\"").expect("DELETED event");
    assert!(added < modified && modified < deleted, "{text}");
}

#[test]
fn watch_with_table_output_prints_rows() {
    let server = Server::start();
    let writes = || {
        server.ok(&["create", "service", "clusterip", "tbl", "--tcp=81:81"]);
    };
    let text = watched_while(
        &server,
        &["get", "svc", "-w"],
        writes,
        Duration::from_millis(1000),
    );
    assert!(text.starts_with("NAME"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("kubernetes ")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("tbl ") && l.contains("81/TCP")),
        "{text}"
    );
}

#[test]
fn discovery_and_explain_work_for_kubectl() {
    let server = Server::start();
    let resources = server.ok(&["api-resources"]);
    assert!(
        resources
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["services", "svc", "v1", "true", "Service"]),
        "{resources}"
    );
    assert!(server.ok(&["api-versions"]).lines().any(|l| l == "v1"));
    let explained = server.ok(&["explain", "service.spec.ports"]);
    assert!(explained.contains("targetPort"), "{explained}");
    let core: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "--raw", "/api/v1"])).expect("json");
    assert!(
        core.get("apiVersion").is_none(),
        "legacy /api/v1 has no apiVersion"
    );
    let services = core["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "services"))
        .cloned()
        .expect("services listed");
    assert_eq!(services["storageVersionHash"], "0/CO1lhkEBI=");
    assert_eq!(services["shortNames"], serde_json::json!(["svc"]));
    let version: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "--raw", "/version"])).expect("json");
    assert_eq!(version["major"], "1");
    assert_eq!(server.ok(&["get", "--raw", "/readyz"]), "ok");
}

#[test]
fn stale_replace_conflicts_and_status_is_ignored_on_the_main_resource() {
    let server = Server::start();
    server.create("web.yaml", WEB);
    let stale = server.ok(&["get", "svc", "web", "-o", "json"]);
    server.ok(&["label", "svc", "web", "a=b"]);
    let file = server.apply_file("stale.json", &stale);
    let conflict = server.fails(&["replace", "-f", path_str(&file)]);
    assert!(
        conflict.contains("the object has been modified; please apply your changes to the latest version and try again"),
        "{conflict}"
    );
    let mut object: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "svc", "web", "-o", "json"])).expect("json");
    object["status"] = serde_json::json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}});
    object["metadata"]["labels"]["replaced"] = "yes".into();
    let file = server.apply_file("replace.json", &object.to_string());
    server.ok(&["replace", "-f", path_str(&file)]);
    let after: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "svc", "web", "-o", "json"])).expect("json");
    assert_eq!(after["metadata"]["labels"]["replaced"], "yes");
    assert_eq!(after["status"], serde_json::json!({"loadBalancer": {}}));
}

#[test]
fn services_survive_a_restart_and_sigterm_exits_cleanly() {
    let mut server = Server::start();
    server.ok(&["create", "service", "clusterip", "keep", "--tcp=80:80"]);
    let before = server.jsonpath(&["svc", "keep"], "{.spec.clusterIP}");
    assert_eq!(server.stop(), Some(0), "SIGTERM exits 0: {}", server.log());
    server.launch();
    assert_eq!(
        server.jsonpath(&["svc", "keep"], "{.spec.clusterIP}"),
        before
    );
    let ns = server.ok(&["get", "ns", "-o", "name"]);
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(ns.contains(&format!("namespace/{name}")), "{ns}");
    }
}

#[test]
fn namespaces_gate_creation() {
    let server = Server::start();
    let create_x_in = |namespace| {
        [
            "create",
            "service",
            "clusterip",
            "x",
            "--tcp=80:80",
            "-n",
            namespace,
        ]
    };
    let missing = server.fails(&create_x_in("nowhere"));
    assert!(
        missing.contains("namespaces \"nowhere\" not found"),
        "{missing}"
    );
    server.ok(&["create", "namespace", "team"]);
    server.ok(&create_x_in("team"));
    assert_eq!(
        server
            .ok(&["get", "svc", "-n", "team", "-o", "name"])
            .trim(),
        "service/x"
    );
}

#[test]
fn deleting_a_namespace_deletes_what_it_holds() {
    let server = Server::start();
    server.ok(&["create", "namespace", "life"]);
    let created: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "ns", "life", "-o", "json"])).expect("json");
    assert_eq!(
        created["spec"]["finalizers"],
        serde_json::json!(["kubernetes"])
    );
    assert_eq!(created["status"]["phase"], "Active");
    let content = server.apply_file(
        "content.yaml",
        "apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: v1
kind: Pod
metadata: {name: p, labels: {app: web}}
spec: {containers: [{name: c, image: x}]}
---
apiVersion: v1
kind: Endpoints
metadata: {name: manual}
subsets: [{addresses: [{ip: 192.0.2.10}], ports: [{port: 5432}]}]
",
    );
    server.ok(&["-n", "life", "apply", "-f", path_str(&content)]);

    // The DELETE answers at once; the namespace is Terminating and takes no new content.
    server.ok(&["delete", "namespace", "life", "--wait=false"]);
    let phase = server.jsonpath(&["ns", "life"], "{.status.phase}");
    assert_eq!(phase, "Terminating");
    let refused = server.fails(&[
        "-n",
        "life",
        "create",
        "service",
        "clusterip",
        "late",
        "--tcp=80",
    ]);
    assert!(
        refused.contains(
            "unable to create new content in namespace life because it is being terminated"
        ),
        "{refused}"
    );
    // Deleted again while terminating: upstream answers with the namespace, as it stands.
    let again = server.ok(&["delete", "namespace", "life", "--wait=false"]);
    assert!(again.contains("namespace \"life\" deleted"), "{again}");

    // `kubectl delete --wait` returns once the namespace controller is done: nothing left.
    server.ok(&["wait", "--for=delete", "namespace/life", "--timeout=30s"]);
    for kind in ["services", "pods", "endpoints"] {
        let left = server.ok(&[
            "get",
            kind,
            "-A",
            "-o",
            "name",
            "--field-selector",
            "metadata.namespace=life",
        ]);
        assert_eq!(left.trim(), "", "{kind} left in the deleted namespace");
    }
    server.fails(&["get", "ns", "life"]);
}

#[cfg(feature = "etcd")]
#[test]
fn serves_services_from_etcd() {
    let Some(endpoints) = common::etcd_endpoints() else {
        return;
    };
    let prefix = format!("/capstan-e2e-{}/", std::process::id());
    let mut server = Server::start_with(&[
        "--storage",
        "etcd",
        "--etcd-servers",
        &endpoints,
        "--etcd-prefix",
        &prefix,
    ]);
    server.create("web.yaml", WEB);
    server.ok(&["label", "svc", "web", "stored=etcd"]);
    server.restart();
    assert_eq!(
        server
            .ok(&["get", "svc", "-l", "stored=etcd", "-o", "name"])
            .trim(),
        "service/web"
    );
    assert_eq!(
        server.jsonpath(&["svc", "kubernetes"], "{.spec.clusterIP}"),
        "10.96.0.1"
    );
}

#[test]
fn unknown_fields_follow_field_validation() {
    let server = Server::start();
    let with_unknown = server.apply_file(
        "unknown.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: u}\nspec:\n  foo: 1\n  ports: [{port: 80, nodeport: 3}]\n",
    );
    // kubectl create defaults to --validate=strict, which the server enforces.
    let strict = server.fails(&["create", "-f", path_str(&with_unknown)]);
    assert!(
        strict.contains(r#"strict decoding error: unknown field "spec.foo", unknown field "spec.ports[0].nodeport""#),
        "{strict}"
    );
    assert!(server.fails(&["get", "svc", "u"]).contains("not found"));
    // --validate=false sends fieldValidation=Ignore: the fields are dropped.
    server.ok(&["create", "--validate=false", "-f", path_str(&with_unknown)]);
    let stored = server.ok(&["get", "svc", "u", "-o", "json"]);
    assert!(
        !stored.contains("\"foo\"") && !stored.contains("nodeport"),
        "{stored}"
    );
    // A merge patch gets the default, Warn: it succeeds with a warning.
    let out = server.kubectl(&[
        "patch",
        "svc",
        "u",
        "--type=merge",
        "-p",
        r#"{"spec":{"bar":1}}"#,
    ]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(r#"Warning: unknown field "spec.bar""#),
        "{stderr}"
    );
}

#[test]
fn dual_stack_expose_style_manifests_and_kubectl_error_text() {
    let server = Server::start_with(&[
        "--service-cluster-ip-range",
        "10.96.0.0/16,fd00:10:96::/108",
    ]);
    server.create(
        "dual.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: ds}\nspec:\n  ipFamilyPolicy: PreferDualStack\n  selector: {app: ds}\n  ports: [{port: 80}]\n",
    );
    let families = server.jsonpath(&["svc", "ds"], "{.spec.ipFamilies}");
    assert_eq!(families, r#"["IPv4","IPv6"]"#);
    let ips = server.jsonpath(&["svc", "ds"], "{.spec.clusterIPs[1]}");
    assert!(ips.starts_with("fd00:10:96::"), "{ips}");
    // What `kubectl expose deployment web --port=80 --target-port=8080` sends.
    server.create(
        "expose.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, labels: {app: web}}\nspec:\n  selector: {app: web}\n  ports: [{protocol: TCP, port: 80, targetPort: 8080}]\n",
    );
    assert!(
        server
            .ok(&["get", "svc", "web", "--no-headers"])
            .contains("80/TCP")
    );
    let invalid = server.apply_file(
        "invalid.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad}\nspec:\n  type: ClusterIP\n  ports: [{port: 0, protocol: TCPX}]\n",
    );
    let error = server.fails(&["create", "-f", path_str(&invalid)]);
    assert!(
        error.contains(r#"The Service "bad" is invalid: "#)
            && error.contains("spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive")
            && error.contains(r#"spec.ports[0].protocol: Unsupported value: "TCPX": supported values: "SCTP", "TCP", "UDP""#),
        "{error}"
    );
}

#[test]
fn the_kubernetes_service_comes_back_when_deleted_or_edited() {
    let server = Server::start();
    server.ok(&["delete", "svc", "kubernetes"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    loop {
        let out = server.kubectl(&[
            "get",
            "svc",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP} {.spec.ports[0].port}",
        ]);
        if out.status.success() && String::from_utf8_lossy(&out.stdout) == "10.96.0.1 443" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the kubernetes Service was not re-created"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    server.ok(&[
        "patch",
        "svc",
        "kubernetes",
        "--type=merge",
        "-p",
        r#"{"spec":{"ports":[{"name":"https","port":8443,"protocol":"TCP","targetPort":6443}]}}"#,
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    while server.jsonpath(&["svc", "kubernetes"], "{.spec.ports[0].port}") != "443" {
        assert!(
            std::time::Instant::now() < deadline,
            "the kubernetes Service's port was not put back"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

#[test]
fn kubectl_patch_and_client_side_apply_use_strategic_merge() {
    let server = Server::start();
    let created = server.apply(
        "apply.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: app, labels: {app: app}}\nspec:\n  selector: {app: app}\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n",
    );
    assert!(created.contains("service/app created"), "{created}");
    // A strategic merge patch adds a port (merge key: port); upstream's list merge puts an
    // item the live list lacks before the live ones.
    server.ok(&[
        "patch",
        "svc",
        "app",
        "-p",
        r#"{"spec":{"ports":[{"name":"https","port":443}]}}"#,
    ]);
    let ports = server.jsonpath(&["svc", "app"], "{.spec.ports[*].port}");
    assert_eq!(ports, "443 80");
    // Re-applying a changed manifest: kubectl computes a three-way patch from the
    // last-applied annotation; fields the manifest dropped go, fields it never had stay.
    let second = "apiVersion: v1\nkind: Service\nmetadata: {name: app, labels: {app: app, tier: web}}\nspec:\n  selector: {app: app}\n  ports:\n  - {name: http, port: 80, targetPort: 9090}\n";
    let configured = server.apply("apply.yaml", second);
    assert!(
        configured.contains("service/app configured"),
        "{configured}"
    );
    let object: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "svc", "app", "-o", "json"])).expect("json");
    assert_eq!(object["metadata"]["labels"]["tier"], "web");
    assert_eq!(object["spec"]["ports"][1]["port"], 80);
    assert_eq!(object["spec"]["ports"][1]["targetPort"], 9090);
    assert_eq!(
        object["spec"]["ports"][0]["port"], 443,
        "the patched port was never in the manifest, and keeps its place"
    );
    assert!(
        object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|a| a.contains("9090"))
    );
    // Applying the same manifest again changes nothing: not even the resourceVersion (kubectl
    // still sends a `$setElementOrder` patch here, as it would to kube-apiserver).
    let before = server.jsonpath(&["svc", "app"], "{.metadata.resourceVersion}");
    server.apply("apply.yaml", second);
    let after = server.jsonpath(&["svc", "app"], "{.metadata.resourceVersion}");
    assert_eq!(before, after);
}

#[test]
fn endpoints_api_table_deprecation_warning_and_deletion_with_their_service() {
    let server = Server::start();
    // Selector-less: its Endpoints are the user's, not the controller's.
    server.create(
        "db.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec:\n  ports: [{port: 5432}]\n",
    );
    let ep = server.apply_file(
        "ep.yaml",
        "apiVersion: v1\nkind: Endpoints\nmetadata: {name: db}\nsubsets:\n- addresses: [{ip: 10.244.0.11}, {ip: 10.244.0.12}]\n  ports: [{port: 5432}]\n",
    );
    let out = server.kubectl(&["create", "-f", path_str(&ep)]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(
        "Warning: v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"
    ));
    let table = server.ok(&["get", "endpoints", "db"]);
    assert!(
        table.contains("10.244.0.11:5432,10.244.0.12:5432"),
        "{table}"
    );
    assert_eq!(
        server.jsonpath(&["ep", "db"], "{.subsets[0].ports[0].protocol}"),
        "TCP"
    );
    let bad = server.apply_file(
        "bad-ep.yaml",
        "apiVersion: v1\nkind: Endpoints\nmetadata: {name: bad}\nsubsets:\n- ports: [{port: 80}]\n",
    );
    let error = server.fails(&["create", "-f", path_str(&bad)]);
    assert!(
        error.contains(
            "subsets[0]: Required value: must specify `addresses` or `notReadyAddresses`"
        ),
        "{error}"
    );
    server.ok(&["delete", "svc", "db"]);
    assert!(
        server
            .fails(&["get", "ep", "db"])
            .contains("endpoints \"db\" not found")
    );
}

#[test]
fn the_endpoints_controller_follows_pods_and_services() {
    let server = Server::start();
    for (name, ip, ready) in [
        ("p1", "10.244.0.11", true),
        ("p2", "10.244.0.12", true),
        ("p3", "10.244.0.13", false),
    ] {
        server.apply(
            &format!("{name}.yaml"),
            &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: web}}}}\nspec: {{nodeName: n1, containers: [{{name: c, image: nginx, ports: [{{name: http, containerPort: 8080}}]}}]}}\n"),
        );
        common::set_pod_status(&server, name, ip, ready);
    }
    server.apply(
        "web.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: http}]}\n",
    );
    let wait_for = |jsonpath: &str, want: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let out = server.kubectl(&["get", "ep", "web", "-o", &format!("jsonpath={jsonpath}")]);
            let have = String::from_utf8_lossy(&out.stdout).to_string();
            if have == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{jsonpath}: want {want:?}, have {have:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    wait_for("{.subsets[0].addresses[*].ip}", "10.244.0.11 10.244.0.12");
    wait_for("{.subsets[0].notReadyAddresses[*].ip}", "10.244.0.13");
    wait_for("{.subsets[0].ports[0].port}", "8080");
    let ready = r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#;
    server.ok(&pod_status_patch("p3", ready));
    wait_for(
        "{.subsets[0].addresses[*].ip}",
        "10.244.0.11 10.244.0.12 10.244.0.13",
    );
    // A scheduled pod is deleted gracefully: it stays, terminating, and leaves the Endpoints;
    // with no kubelet to confirm, a second delete with grace 0 removes it.
    server.ok(&["delete", "pod", "p1", "--wait=false"]);
    wait_for("{.subsets[0].addresses[*].ip}", "10.244.0.12 10.244.0.13");
    let pod: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "pod", "p1", "-o", "json"])).expect("pod");
    assert!(pod["metadata"]["deletionTimestamp"].is_string(), "{pod}");
    assert_eq!(pod["metadata"]["deletionGracePeriodSeconds"], 30);
    server.ok(&["delete", "pod", "p1", "--grace-period=0", "--force"]);
    assert!(server.fails(&["get", "pod", "p1"]).contains("not found"));
    server.ok(&["delete", "svc", "web"]);
    assert!(server.fails(&["get", "ep", "web"]).contains("not found"));
}

#[test]
fn after_a_restart_the_controller_rewrites_no_unchanged_endpoints() {
    let mut server = Server::start();
    server.apply(
        "p.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {app: r}}\nspec: {nodeName: n1, containers: [{name: c, image: nginx}]}\n",
    );
    let running = r#"{"status":{"phase":"Running","podIP":"10.244.1.1","conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-01-02T03:04:05Z"}]}}"#;
    server.ok(&pod_status_patch("p", running));
    server.apply(
        "r.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: r}\nspec: {selector: {app: r}, ports: [{port: 80}]}\n",
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server
        .kubectl(&[
            "get",
            "ep",
            "r",
            "-o",
            "jsonpath={.subsets[0].addresses[0].ip}",
        ])
        .stdout
        != b"10.244.1.1"
    {
        assert!(
            std::time::Instant::now() < deadline,
            "endpoints never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let trigger = server.ok(&[
        "get",
        "ep",
        "r",
        "-o",
        r"jsonpath={.metadata.annotations.endpoints\.kubernetes\.io/last-change-trigger-time}",
    ]);
    assert!(!trigger.is_empty(), "the trigger-time annotation is set");
    let before = server.jsonpath(&["ep", "r"], "{.metadata.resourceVersion}");
    server.restart();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let after = server.jsonpath(&["ep", "r"], "{.metadata.resourceVersion}");
    assert_eq!(
        before, after,
        "unchanged Endpoints are not rewritten after a restart"
    );
}

#[test]
fn server_side_apply_with_two_managers_a_conflict_and_force() {
    let server = Server::start();
    let manifest = |target: u16, ports: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: ssa, labels: {{team: a}}}}\nspec:\n  selector: {{app: ssa}}\n  ports:\n  - {{name: http, port: 80, targetPort: {target}}}\n{ports}"
        )
    };
    let first = server.apply_file(
        "ssa.yaml",
        &manifest(8080, "  - {name: metrics, port: 9100}\n"),
    );
    let out = server.ok(&[
        "apply",
        "--server-side",
        "--field-manager=alice",
        "-f",
        path_str(&first),
    ]);
    assert!(out.contains("service/ssa serverside-applied"), "{out}");
    let object: serde_json::Value = serde_json::from_str(&server.ok(&[
        "get",
        "svc",
        "ssa",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    let alice = &object["metadata"]["managedFields"][0];
    assert_eq!(alice["manager"], "alice");
    assert_eq!(alice["operation"], "Apply");
    assert!(alice["fieldsV1"]["f:spec"]["f:ports"]["k:{\"port\":80,\"protocol\":\"TCP\"}"]["f:targetPort"].is_object());
    // A second manager applying another value for alice's field: 409 naming alice and the field.
    let second = server.apply_file("ssa2.yaml", &manifest(9999, ""));
    let err = server.fails(&[
        "apply",
        "--server-side",
        "--field-manager=bob",
        "-f",
        path_str(&second),
    ]);
    assert!(
        err.contains(r#"Apply failed with 1 conflict: conflict with "alice": .spec.ports[port=80,protocol="TCP"].targetPort"#),
        "{err}"
    );
    assert_eq!(
        server.jsonpath(&["svc", "ssa"], "{.spec.ports[0].targetPort}"),
        "8080"
    );
    // --force-conflicts takes the field over; bob's config has no metrics port, but alice
    // still applies it, so it stays.
    server.ok(&[
        "apply",
        "--server-side",
        "--field-manager=bob",
        "--force-conflicts",
        "-f",
        path_str(&second),
    ]);
    assert_eq!(
        server.jsonpath(&["svc", "ssa"], "{.spec.ports[*].targetPort}"),
        "9999 9100"
    );
    // Alice drops the metrics port from her config: no one else owns it, so it goes.
    let third = server.apply_file("ssa3.yaml", &manifest(9999, ""));
    server.ok(&[
        "apply",
        "--server-side",
        "--field-manager=alice",
        "-f",
        path_str(&third),
    ]);
    assert_eq!(
        server.jsonpath(&["svc", "ssa"], "{.spec.ports[*].port}"),
        "80"
    );
    // A client-side change is an Update by another manager; applying over it conflicts with
    // "<manager>" using v1.
    server.ok(&["label", "svc", "ssa", "team=b", "--overwrite"]);
    let err = server.fails(&[
        "apply",
        "--server-side",
        "--field-manager=alice",
        "-f",
        path_str(&third),
    ]);
    assert!(
        err.contains(r#"conflict with "kubectl-label" using v1: .metadata.labels.team"#),
        "{err}"
    );
}

#[test]
fn the_kubernetes_endpoints_publish_the_advertised_address() {
    // Bound to loopback, there is no address Endpoints may hold: none are published.
    let server = Server::start();
    assert!(
        server
            .fails(&["get", "ep", "kubernetes"])
            .contains("not found")
    );
    drop(server);
    let server = Server::start_with(&["--advertise-address", "10.20.30.40"]);
    let port = server.port.to_string();
    let out = server.jsonpath(
        &["ep", "kubernetes"],
        "{.subsets[0].addresses[0].ip} {.subsets[0].ports[0].name} {.subsets[0].ports[0].port}",
    );
    assert_eq!(out, format!("10.20.30.40 https {port}"));
    // The endpoints controller leaves them alone (the Service has no selector).
    let table = server.ok(&["get", "ep", "kubernetes"]);
    assert!(table.contains(&format!("10.20.30.40:{port}")), "{table}");
}

#[test]
fn kubectl_edit_diff_label_annotate_set_selector_and_patch_types() {
    let server = Server::start();
    let manifest = server.apply_file(
        "web.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n",
    );
    server.ok(&["apply", "-f", common::path_str(&manifest)]);
    // diff: nothing to show right after apply (exit 0), a change after an out-of-band edit (exit 1).
    assert!(
        server
            .kubectl(&["diff", "-f", common::path_str(&manifest)])
            .status
            .success()
    );
    // edit with an EDITOR script (kubectl sends a strategic merge patch as kubectl-edit).
    let editor = server.dir.path().join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i -e 's/sessionAffinity: None/sessionAffinity: ClientIP/' -e 's/targetPort: 8080/targetPort: 7070/' \"$1\"\n",
    )
    .expect("editor");
    Command::new("chmod")
        .arg("+x")
        .arg(&editor)
        .status()
        .expect("chmod");
    let edit = server
        .kubectl_command()
        .args(["edit", "svc", "web"])
        .env("EDITOR", &editor)
        .output()
        .expect("kubectl edit");
    common::succeeded("kubectl edit", &edit);
    assert_eq!(
        server.jsonpath(&["svc", "web"], "{.spec.sessionAffinity}"),
        "ClientIP"
    );
    let diff = server.kubectl(&["diff", "-f", common::path_str(&manifest)]);
    assert_eq!(diff.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&diff.stdout).contains("targetPort: 7070"));
    // label, annotate (JSON merge patches), set selector.
    server.ok(&["label", "svc", "web", "tier=fe"]);
    server.ok(&["annotate", "svc", "web", "note=hello"]);
    server.ok(&["set", "selector", "svc", "web", "app=web2"]);
    let object: serde_json::Value = serde_json::from_str(&server.ok(&[
        "get",
        "svc",
        "web",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    assert_eq!(object["metadata"]["labels"]["tier"], "fe");
    assert_eq!(object["metadata"]["annotations"]["note"], "hello");
    assert_eq!(
        object["spec"]["selector"],
        serde_json::json!({"app": "web2"})
    );
    let managers: Vec<&str> = object["metadata"]["managedFields"]
        .as_array()
        .map(|l| l.iter().filter_map(|e| e["manager"].as_str()).collect())
        .unwrap_or_default();
    for manager in [
        "kubectl-client-side-apply",
        "kubectl-edit",
        "kubectl-label",
        "kubectl-annotate",
        "kubectl-set",
    ] {
        assert!(
            managers.contains(&manager),
            "{manager} missing from {managers:?}"
        );
    }
    // The three patch types.
    server.ok(&[
        "patch",
        "svc",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/ports/0/targetPort","value":9090}]"#,
    ]);
    server.ok(&[
        "patch",
        "svc",
        "web",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"m":"1"}}}"#,
    ]);
    server.ok(&[
        "patch",
        "svc",
        "web",
        "--type=strategic",
        "-p",
        r#"{"spec":{"ports":[{"name":"metrics","port":9100}]}}"#,
    ]);
    assert_eq!(
        server.jsonpath(
            &["svc", "web"],
            "{.spec.ports[*].targetPort} {.metadata.labels.m}"
        ),
        "9100 9090 1",
        "the strategic patch's new port goes first, as upstream's list merge puts it"
    );
}
