//! `capstan dns` end to end with a real resolver client, `dig` (Debian's `dnsutils`): every
//! record type of the Kubernetes DNS specification over UDP and TCP, against `capstan dns`
//! reading the API and against `capstan serve --dns`; a change's delay (printed); and a
//! headless Service of 500 endpoints, whose UDP answer is truncated and retried over TCP.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, free_port, until};

/// A process killed on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `dig` against the server at `port`: the full output.
fn dig(port: u16, args: &[&str]) -> String {
    let out = Command::new("dig")
        .args(["+time=2", "+tries=1", "-p", &port.to_string(), "@127.0.0.1"])
        .args(args)
        .output()
        .expect("dig runs (Debian's dnsutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `dig +short`: the answers, sorted.
fn short(port: u16, args: &[&str]) -> Vec<String> {
    let mut all = vec!["+short"];
    all.extend_from_slice(args);
    let mut lines: Vec<String> = dig(port, &all)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort();
    lines
}

fn status(port: u16, args: &[&str]) -> String {
    let out = dig(port, args);
    out.split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("")
        .to_owned()
}

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: dz}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: dz}
spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}, {name: dns, port: 53, protocol: UDP}]}
---
apiVersion: v1
kind: Service
metadata: {name: hl, namespace: dz}
spec: {clusterIP: None, selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: dz}
spec: {type: ExternalName, externalName: db.example.org}
---
apiVersion: v1
kind: Service
metadata: {name: big, namespace: dz}
spec: {clusterIP: None, ports: [{name: http, port: 80}]}
"#;

fn setup(server: &Server) {
    server.apply_file("objects.yaml", OBJECTS);
    server.ok(&[
        "apply",
        "-f",
        common::path_str(&server.dir.path().join("objects.yaml")),
    ]);
    // A status condition timed as client-go leaves an unset time (null): the agents read the
    // Service all the same (k8s_openapi's Service refuses it, so they read its spec alone).
    let condition = r#"{"status":{"conditions":[{"type":"Checked","status":"True","reason":"R","message":"m","lastTransitionTime":null}]}}"#;
    server.ok(&[
        "-n",
        "dz",
        "patch",
        "service",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        condition,
    ]);
    for i in 1..=3 {
        let pod = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p{i}","namespace":"dz","labels":{{"app":"web"}}}},"spec":{{"hostname":"h{i}","subdomain":"hl","containers":[{{"name":"c","image":"x"}}]}}}}"#
        );
        server.apply(&format!("p{i}.json"), &pod);
        set_pod_status(server, i, i != 3);
    }
    // 500 endpoints in one slice of a selector-less headless Service.
    let endpoints: Vec<String> = (0..500)
        .map(|i| {
            format!(
                r#"{{"addresses":["10.250.{}.{}"],"conditions":{{"ready":true}}}}"#,
                i / 250,
                i % 250 + 1
            )
        })
        .collect();
    let slice = format!(
        r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"big-1","namespace":"dz","labels":{{"kubernetes.io/service-name":"big"}}}},"addressType":"IPv4","ports":[{{"name":"http","port":80,"protocol":"TCP"}}],"endpoints":[{}]}}"#,
        endpoints.join(",")
    );
    let path = server.apply_file("big.json", &slice);
    server.ok(&["create", "-f", common::path_str(&path)]);
}

/// Every record the specification names, over UDP and TCP.
fn check_records(server: &Server, port: u16) {
    let zone = "cluster.local";
    let cip = server.ok(&[
        "-n",
        "dz",
        "get",
        "svc",
        "web",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert!(
        until(Duration::from_secs(10), || short(
            port,
            &[&format!("hl.dz.svc.{zone}"), "A"]
        )
        .len()
            == 2),
        "headless answers never arrived: {}",
        dig(port, &[&format!("hl.dz.svc.{zone}"), "A"])
    );
    assert_eq!(
        short(port, &[&format!("web.dz.svc.{zone}"), "A"]),
        std::slice::from_ref(&cip)
    );
    assert_eq!(
        short(port, &["+tcp", &format!("web.dz.svc.{zone}"), "A"]),
        std::slice::from_ref(&cip)
    );
    // The name exists without an AAAA: NOERROR, no answer, the zone's SOA as authority.
    let nodata = dig(port, &[&format!("web.dz.svc.{zone}"), "AAAA"]);
    assert!(
        nodata.contains("status: NOERROR") && nodata.contains("ANSWER: 0"),
        "{nodata}"
    );
    assert!(
        nodata.contains("SOA\tns.dns.cluster.local. hostmaster.cluster.local."),
        "{nodata}"
    );
    assert!(nodata.contains("flags: qr aa"), "authoritative: {nodata}");
    assert_eq!(
        short(port, &[&format!("hl.dz.svc.{zone}"), "A"]),
        ["10.244.7.1", "10.244.7.2"]
    );
    assert_eq!(
        short(port, &[&format!("h1.hl.dz.svc.{zone}"), "A"]),
        ["10.244.7.1"]
    );
    assert_eq!(
        short(port, &[&format!("_http._tcp.web.dz.svc.{zone}"), "SRV"]),
        [format!("0 100 80 web.dz.svc.{zone}.")]
    );
    assert_eq!(
        short(port, &[&format!("_dns._udp.web.dz.svc.{zone}"), "SRV"]),
        [format!("0 100 53 web.dz.svc.{zone}.")]
    );
    assert_eq!(
        short(port, &[&format!("_http._tcp.hl.dz.svc.{zone}"), "SRV"]),
        [
            format!("0 50 8080 h1.hl.dz.svc.{zone}."),
            format!("0 50 8080 h2.hl.dz.svc.{zone}.")
        ]
    );
    assert_eq!(
        short(port, &[&format!("ext.dz.svc.{zone}"), "CNAME"]),
        ["db.example.org."]
    );
    assert_eq!(short(port, &["-x", &cip]), [format!("web.dz.svc.{zone}.")]);
    assert_eq!(
        short(port, &["-x", "10.244.7.2"]),
        [format!("h2.hl.dz.svc.{zone}.")]
    );
    assert_eq!(
        short(port, &[&format!("dns-version.{zone}"), "TXT"]),
        ["\"1.1.0\""]
    );
    assert_eq!(
        status(port, &[&format!("nope.dz.svc.{zone}"), "A"]),
        "NXDOMAIN"
    );
    assert_eq!(
        status(port, &[&format!("_nope._tcp.web.dz.svc.{zone}"), "SRV"]),
        "NXDOMAIN"
    );
    assert_eq!(status(port, &[&format!("dz.svc.{zone}"), "A"]), "NOERROR");
    assert_eq!(
        status(port, &[&format!("elsewhere.svc.{zone}"), "A"]),
        "NXDOMAIN"
    );
    // Case does not matter.
    assert_eq!(short(port, &[&format!("WEB.Dz.SVC.{zone}"), "A"]), [cip]);

    // 500 endpoints: the UDP answer does not fit and says so; dig then asks over TCP.
    let big = format!("big.dz.svc.{zone}");
    let udp = dig(port, &["+ignore", "+bufsize=1232", &big, "A"]);
    assert!(udp.contains(" tc"), "truncated over UDP: {udp}");
    assert_eq!(short(port, &[&big, "A"]).len(), 500);
    assert_eq!(short(port, &["+tcp", &big, "A"]).len(), 500);

    // A readiness flip reaches the answers; the delay is printed.
    let headless = format!("hl.dz.svc.{zone}");
    let flip = |ready: bool, want: usize| {
        let t0 = Instant::now();
        set_pod_status(server, 3, ready);
        assert!(until(Duration::from_secs(10), || short(
            port,
            &[&headless, "A"]
        )
        .len()
            == want));
        eprintln!(
            "a readiness flip answered {:?} after its status write",
            t0.elapsed()
        );
    };
    flip(true, 3);
    flip(false, 2);
}

#[test]
fn capstan_dns_answers_the_specification_from_the_api() {
    let server = Server::start();
    setup(&server);
    let port = free_port();
    let metrics = free_port();
    let _dns = Guard(
        Command::new(env!("CARGO_BIN_EXE_capstan"))
            .args([
                "dns",
                "--kubeconfig",
                common::path_str(&server.kubeconfig()),
            ])
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--cluster-domain",
                "cluster.local",
            ])
            .args([
                "--upstream",
                "none",
                "--metrics-bind-address",
                &format!("127.0.0.1:{metrics}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("capstan dns starts"),
    );
    check_records(&server, port);
    // Outside the zone, with no upstream: REFUSED.
    assert_eq!(status(port, &["example.org", "A"]), "REFUSED");
    let out = Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{metrics}/metrics")])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "coredns_dns_requests_total{",
        "coredns_dns_responses_total{",
        "rcode=\"NXDOMAIN\"",
        "coredns_dns_request_duration_seconds_bucket{",
        "coredns_dns_request_size_bytes_bucket{",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
}

#[test]
fn serve_with_dns_answers_in_process() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = Server::start_with(&["--dns", &listen]);
    setup(&server);
    check_records(&server, port);
}

/// Marks pod `p{i}` of `dz` Running at 10.244.7.{i}, Ready or not, through its `/status`.
fn set_pod_status(server: &Server, i: u8, ready: bool) {
    let ready = if ready { "True" } else { "False" };
    let status = format!(
        r#"{{"status":{{"phase":"Running","podIP":"10.244.7.{i}","podIPs":[{{"ip":"10.244.7.{i}"}}],"conditions":[{{"type":"Ready","status":"{ready}"}}]}}}}"#
    );
    let pod = format!("p{i}");
    let patch = ["patch", "pod", &pod, "--subresource=status", "--type=merge"];
    server.ok(&[&["-n", "dz"][..], &patch, &["-p", &status]].concat());
}
