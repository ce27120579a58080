//! Hostile and clumsy clients against the real binary: every limit is bounded, answered with
//! upstream's status, and loses nothing (the issue "Hardening", items 1–6, 8–10).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Server, assert_status, delete, get, patch, pod_status_patch, raw};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Where a raw client connects: the server's port, CA and token.
#[derive(Clone)]
struct Target {
    port: u16,
    data_dir: std::path::PathBuf,
    token: String,
}

fn target(server: &Server) -> Target {
    Target {
        port: server.port,
        data_dir: server.data_dir(),
        token: server.token(),
    }
}

/// A TLS connection to the server, trusting its CA, speaking HTTP/1.1.
async fn tls(server: &Target) -> std::io::Result<Tls> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port)).await?;
    tls_over(server, stream).await
}

/// TLS over an open TCP connection to the server.
async fn tls_over(server: &Target, stream: tokio::net::TcpStream) -> std::io::Result<Tls> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(server.data_dir.join("ca.crt"))
        .expect("ca.crt")
    {
        roots.add(cert.expect("CA")).expect("root");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
}

/// Reads an HTTP/1.1 response to its end (the request said `Connection: close`).
async fn read_response(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> (u16, String, String) {
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes).await;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_string())
}

/// One request on its own connection (no client-side retries: kube's client retries 429s).
async fn request(server: &Target, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let mut stream = tls(server).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        server.token,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    read_response(&mut stream).await
}

/// Sends the head of a request with a body of `length` bytes, then the body one byte at a
/// time every `pace`, until the connection ends; returns the response.
async fn trickle(
    server: &Target,
    method: &str,
    path: &str,
    length: usize,
    pace: Duration,
) -> (u16, String, String) {
    let mut stream = tls(server).await.expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n",
        server.token
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let (mut reader, mut writer) = tokio::io::split(stream);
    let sender = tokio::spawn(async move {
        for _ in 0..length {
            tokio::time::sleep(pace).await;
            if writer.write_all(b" ").await.is_err() || writer.flush().await.is_err() {
                return;
            }
        }
    });
    let response = read_response(&mut reader).await;
    sender.abort();
    response
}

fn no_panic(server: &Server) {
    let log = server.log();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
}

/// `server` with its kube client and a ClusterIP Service `name` (in `default`) to send at.
async fn with_service(server: Server, name: &str) -> (Server, kube::Client) {
    let client = server.client().await;
    server.ok(&["create", "service", "clusterip", name, "--tcp=80"]);
    (server, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_query_strings_and_collection_routes_get_upstreams_answers() {
    let (server, client) = with_service(Server::start(), "a").await;
    // A multi-byte character in a field selector once panicked a worker.
    for selector in [
        "%C3%A9",
        "a%C3%A9%3Db",
        "%5C%C3%A9",
        "metadata.name%3D%5C%C3%A9",
    ] {
        let (code, body, _) = get(
            &client,
            &format!("/api/v1/services?fieldSelector={selector}"),
        )
        .await;
        assert_eq!(code, 400, "fieldSelector={selector}: {body}");
        assert_eq!(body["reason"], "BadRequest");
    }
    let (_, body, _) = get(&client, "/api/v1/services?fieldSelector=%C3%A9").await;
    assert_eq!(
        body["message"],
        "invalid selector: 'é'; can't understand 'é'"
    );
    // Cluster-wide collections of namespaced kinds serve list and watch only.
    for resource in ["services", "endpoints", "pods"] {
        for method in ["DELETE", "POST"] {
            let (code, body, _) = raw(
                &client,
                method,
                &format!("/api/v1/{resource}"),
                Some("application/json"),
                b"{}".to_vec(),
            )
            .await;
            let not_allowed = (
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            );
            assert_status(
                &format!("{method} /api/v1/{resource}"),
                code,
                &body,
                not_allowed,
            );
        }
    }
    // The legacy watch paths serve GET only.
    for method in ["PUT", "POST", "PATCH", "DELETE"] {
        let (code, body, _) = raw(
            &client,
            method,
            "/api/v1/watch/namespaces/default/services/a",
            Some("application/merge-patch+json"),
            b"{}".to_vec(),
        )
        .await;
        assert_eq!(code, 405, "{method} on a watch path: {body}");
    }
    let listed = server.ok(&["get", "services", "-A", "-o", "name"]);
    assert!(
        listed.contains("service/a") && listed.contains("service/kubernetes"),
        "{listed}"
    );
    // The built-in namespaces cannot be deleted (upstream's namespace lifecycle admission).
    for namespace in ["default", "kube-system", "kube-public"] {
        let (code, body, _) = delete(&client, &format!("/api/v1/namespaces/{namespace}")).await;
        assert_eq!(code, 403, "{body}");
        assert_eq!(
            body["message"],
            format!("namespaces \"{namespace}\" is forbidden: this namespace may not be deleted")
        );
    }
    // A malformed `timeout` parameter is a 400 before anything else.
    let (code, body, _) = get(&client, "/api/v1/services?timeout=abc").await;
    assert_eq!(code, 400);
    assert_eq!(
        body["message"],
        "invalid timeout specified in the request URL - time: invalid duration \"abc\""
    );
    // The bearer scheme in any case, as upstream's authenticator reads it.
    let mut stream = tls(&target(&server)).await.expect("connect");
    let request = format!(
        "GET /api/v1/namespaces/default/services/a HTTP/1.1\r\nHost: localhost\r\nAuthorization: bearer {}\r\nConnection: close\r\n\r\n",
        server.token()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let (code, _, _) = read_response(&mut stream).await;
    assert_eq!(code, 200);
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_patch_that_copies_a_map_into_itself_is_refused_at_the_copy_limit() {
    let (server, client) = with_service(Server::start(), "b").await;
    let mut ops =
        vec![json!({"op": "add", "path": "/metadata/annotations", "value": {"x": "a".repeat(80)}})];
    for i in 0..22 {
        ops.push(json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/k{i}")}));
    }
    let before = server.rss_kib().expect("rss");
    let service = "/api/v1/namespaces/default/services/b";
    let (code, body, _) = patch(&client, service, "application/json-patch+json", &json!(ops)).await;
    let invalid = (
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
    );
    assert_status(service, code, &body, invalid);
    let after = server.rss_kib().expect("rss");
    // Before the copy limit this took 2.4 GB; 3 MiB of copies now cost tens of MB at most.
    assert!(after < before + 300 * 1024, "RSS {before} → {after} KiB");
    let annotations = server.jsonpath(&["service", "b"], "{.metadata.annotations}");
    assert_eq!(annotations, "", "nothing was stored");
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_larger_than_the_store_takes_are_refused_as_etcd_refuses_them() {
    let server = Server::start_with(&["--max-request-bytes", "65536"]);
    let (server, client) = with_service(server, "big").await;
    // Annotations have their own bound (256 KiB in all).
    let service = "/api/v1/namespaces/default/services/big";
    let annotations = json!({"metadata": {"annotations": {"big": "x".repeat(300_000)}}});
    let (code, body, _) = patch(
        &client,
        service,
        "application/merge-patch+json",
        &annotations,
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"].as_str().is_some_and(
            |m| m.contains("metadata.annotations: Too long: may not be more than 262144 bytes")
        ),
        "{body}"
    );
    // An object over --max-request-bytes, through each patch type and through update.
    let finalizers: Vec<String> = (0..4000).map(|i| format!("example.com/f-{i:06}")).collect();
    let bodies = [
        (
            "application/merge-patch+json",
            json!({"metadata": {"finalizers": finalizers}}),
        ),
        (
            "application/strategic-merge-patch+json",
            json!({"metadata": {"finalizers": finalizers}}),
        ),
        (
            "application/json-patch+json",
            json!([{"op": "add", "path": "/metadata/finalizers", "value": finalizers}]),
        ),
    ];
    for (content_type, body) in bodies {
        let (code, body, _) = patch(&client, service, content_type, &body).await;
        assert_eq!(code, 500, "{content_type}: {body}");
        assert_eq!(
            body["message"], "etcdserver: request is too large",
            "{content_type}"
        );
        assert!(body.get("reason").is_none(), "{body}");
    }
    let stored = server.jsonpath(&["service", "big"], "{.metadata.finalizers}");
    assert_eq!(stored, "", "nothing was stored");
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lists_in_strategic_merge_and_apply_are_merged_off_the_runtime() {
    let (server, client) = with_service(Server::start(), "long").await;
    // ~1.2 MB of labels-like data in a list the strategic merge unions by value.
    let finalizers: Vec<String> = (0..50_000).map(|i| format!("x.io/{i:07}")).collect();
    let body = json!({"metadata": {"finalizers": finalizers}});
    let service = "/api/v1/namespaces/default/services/long";
    let patching = {
        let client = client.clone();
        let content_type = "application/strategic-merge-patch+json";
        tokio::spawn(async move { patch(&client, service, content_type, &body).await })
    };
    // The server keeps answering others meanwhile.
    let (code, _, _) = get(&client, service).await;
    assert_eq!(code, 200);
    let (code, body, _) = patching.await.expect("patch");
    assert!(
        code == 200 || body["message"] == "etcdserver: request is too large",
        "{code} {body}"
    );
    // Apply of a long set by one manager, then half of it: what it stopped applying goes.
    let config = |n: usize| {
        let finalizers: Vec<String> = (0..n).map(|i| format!("x.io/{i:07}")).collect();
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "applied", "finalizers": finalizers},
            "spec": {"ports": [{"port": 80}]}})
    };
    let applied = "/api/v1/namespaces/default/services/applied?fieldManager=tester";
    for n in [20_000, 10_000] {
        let (code, body, _) =
            patch(&client, applied, "application/apply-patch+yaml", &config(n)).await;
        assert!(code == 200 || code == 201, "{code} {body}");
        assert_eq!(
            body["metadata"]["finalizers"].as_array().map(Vec::len),
            Some(n)
        );
    }
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_at_the_request_timeout_and_the_header_deadline() {
    let server = Server::start_with(&["--request-timeout", "2s"]);
    // Headers never finished: closed at the header read deadline (32 s).
    let unfinished = {
        let mut stream = tls(&target(&server)).await.expect("connect");
        tokio::spawn(async move {
            let started = Instant::now();
            let _ = stream
                .write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await;
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if started.elapsed() > Duration::from_secs(60) {
                    return None;
                }
                if stream.write_all(b"a").await.is_err() {
                    return Some(started.elapsed());
                }
                let mut byte = [0u8; 1];
                match tokio::time::timeout(Duration::from_millis(10), stream.read(&mut byte)).await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
                    _ => {}
                }
            }
        })
    };
    // A body that arrives a byte every half second: 504 at the request timeout.
    let (code, head, body) = trickle(
        &target(&server),
        "POST",
        "/api/v1/namespaces/default/services",
        200,
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(code, 504, "{head}{body}");
    let status: Value = serde_json::from_str(body.trim()).expect("Status");
    assert_eq!(status["reason"], "Timeout");
    assert_eq!(
        status["message"],
        "Timeout: request did not complete within the allotted timeout"
    );
    // A shorter `timeout` parameter is honoured too, and the server still answers.
    let client = server.client().await;
    let (code, _, _) = get(&client, "/api/v1/services?timeout=1s").await;
    assert_eq!(code, 200);
    let closed = unfinished.await.expect("task");
    assert!(closed.is_some(), "unfinished headers were never cut off");
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_wait_until_one_ends() {
    let server = Server::start_with(&["--max-connections", "2"]);
    let first = tls(&target(&server)).await.expect("first");
    let second = tls(&target(&server)).await.expect("second");
    // The third is queued by the kernel, not handshaken while two are open.
    let third = tokio::spawn({
        let to = target(&server);
        async move { tls(&to).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past the cap"
    );
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(20), third)
        .await
        .expect("served once a slot freed")
        .expect("task");
    assert!(third.is_ok());
    drop(second);
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_refused_with_429_and_watches_are_not_counted() {
    let server = Server::start_with(&[
        "--max-requests-inflight",
        "1",
        "--max-mutating-requests-inflight",
        "1",
    ]);
    let client = server.client().await;
    // Two watches open: long-running requests take no slot.
    let mut watches = Vec::new();
    for _ in 0..2 {
        let mut stream = tls(&target(&server)).await.expect("connect");
        let request = format!(
            "GET /api/v1/services?watch=true HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\n\r\n",
            server.token()
        );
        stream.write_all(request.as_bytes()).await.expect("watch");
        watches.push(stream);
    }
    let (code, _, _) = get(&client, "/api/v1/services").await;
    assert_eq!(code, 200, "a list while watches run");
    // A write whose body trickles in holds the one mutating slot …
    let started = Instant::now();
    let slow = tokio::spawn({
        let to = target(&server);
        async move {
            let answer = trickle(
                &to,
                "POST",
                "/api/v1/namespaces/default/services",
                40,
                Duration::from_millis(100),
            )
            .await;
            (answer, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;

    // … so another is refused as upstream refuses it: plain text, Retry-After: 1. (kube's
    // client would retry it until the slot frees.)
    let service = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"},"spec":{"ports":[{"port":80}]}}"#;
    let to = target(&server);
    let create = || request(&to, "POST", "/api/v1/namespaces/default/services", service);
    let (code, head, body) = create().await;
    if code != 429 {
        slow.abort();
        panic!(
            "expected 429, got {code} {body}; the slow write: {:?}",
            slow.await
        );
    }
    assert_eq!(body, "Too many requests, please try again later.\n");
    assert!(head.contains("retry-after: 1\r\n"), "{head}");
    assert!(
        head.contains("content-type: text/plain; charset=utf-8"),
        "{head}"
    );
    // Reads have their own pool; probes are never refused.
    let (code, _, _) = get(&client, "/api/v1/namespaces/default/services").await;
    assert_eq!(code, 200);
    assert!(
        server
            .kubectl(&["get", "--raw", "/readyz"])
            .status
            .success()
    );
    let (_, elapsed) = slow.await.expect("slow write");
    assert!(
        elapsed > Duration::from_secs(2),
        "the slow write held its slot throughout"
    );
    let (code, _, body) = create().await;
    assert_eq!(code, 201, "the slot is free again: {body}");
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_response_loses_its_slot_at_the_request_deadline() {
    let server = Server::start_with(&["--request-timeout", "2s", "--max-requests-inflight", "1"]);
    let to = target(&server);
    // ~6 MB of pods: more than the kernel's socket buffers hold for a client that reads nothing.
    for i in 0..25 {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("big{i}"), "annotations": {"a": "x".repeat(250_000)}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let (code, _, body) = request(
            &to,
            "POST",
            "/api/v1/namespaces/default/pods",
            &pod.to_string(),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small buffer");
    let tcp = socket
        .connect(([127, 0, 0, 1], server.port).into())
        .await
        .expect("connect");
    let mut stalled = tls_over(&to, tcp).await.expect("tls");
    let list = format!(
        "GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\n\r\n",
        to.token
    );
    stalled.write_all(list.as_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The one read slot is held by the unread list …
    let (code, _, _) = request(&to, "GET", "/api/v1/namespaces/default/services", "").await;
    assert_eq!(code, 429);
    // … until the request deadline (2 s, and 5 s to send) closes that connection.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _, _) = request(&to, "GET", "/api/v1/namespaces/default/services", "").await;
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut rest)).await;
    assert!(
        rest.len() < 6_000_000,
        "the whole list arrived ({} bytes)",
        rest.len()
    );
    no_panic(&server);
}

#[test]
fn a_loopback_pod_does_not_keep_the_valid_ones_out_of_the_endpoints() {
    let server = Server::start();
    server.apply(
        "pods.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: good, labels: {app: pz}}\nspec: {nodeName: n1, containers: [{name: c, image: x}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: bad, labels: {app: pz}}\nspec: {nodeName: n1, containers: [{name: c, image: x}]}\n",
    );
    let status = |ip: &str| {
        format!(
            "{{\"status\":{{\"podIP\":\"{ip}\",\"podIPs\":[{{\"ip\":\"{ip}\"}}],\"conditions\":[{{\"type\":\"Ready\",\"status\":\"True\"}}]}}}}"
        )
    };
    server.ok(&pod_status_patch("good", &status("10.244.9.1")));
    // Loopback is a valid pod IP upstream; Endpoints may not hold it.
    server.ok(&pod_status_patch("bad", &status("127.0.0.1")));
    server.ok(&["create", "service", "clusterip", "pz", "--tcp=80"]);
    server.ok(&["set", "selector", "service", "pz", "app=pz"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ips = String::new();
    while Instant::now() < deadline {
        ips = server.jsonpath(&["endpoints", "pz"], "{.subsets[*].addresses[*].ip}");
        if !ips.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ips, "10.244.9.1");
    // Pod IPs are validated as upstream validates them.
    let err = server.fails(&pod_status_patch("good", &status("10.244.09.1")));
    assert!(
        err.contains("status.podIPs[0]: Invalid value: \"10.244.09.1\": must not have leading 0s"),
        "{err}"
    );
    let two_ipv4 =
        r#"{"status":{"podIP":"10.244.9.1","podIPs":[{"ip":"10.244.9.1"},{"ip":"10.244.9.2"}]}}"#;
    let err = server.fails(&pod_status_patch("good", two_ipv4));
    assert!(
        err.contains("may specify no more than one IP for each IP family"),
        "{err}"
    );
    no_panic(&server);
}

#[test]
fn credentials_and_the_store_are_private_and_tightened_on_restart() {
    use std::os::unix::fs::PermissionsExt;
    let mut server = Server::start();
    let mode = |path: std::path::PathBuf| {
        std::fs::metadata(&path)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let dir = server.data_dir();
    let check = |dir: &std::path::Path| {
        assert_eq!(mode(dir.to_path_buf()), 0o700, "data directory");
        for secret in ["ca.key", "admin.token", "kubeconfig", "store.redb"] {
            assert_eq!(mode(dir.join(secret)), 0o600, "{secret}");
        }
        assert_eq!(mode(dir.join("ca.crt")), 0o644, "ca.crt");
    };
    check(&dir);
    server.stop();
    // Files left readable by an older version are tightened at the next start.
    for (path, loose) in [
        (dir.clone(), 0o755),
        (dir.join("ca.key"), 0o644),
        (dir.join("admin.token"), 0o644),
        (dir.join("store.redb"), 0o644),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(loose)).expect("chmod");
    }
    server.launch();
    check(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_stop_at_upstreams_bound_on_errors_too() {
    let server = Server::start();
    let client = server.client().await;
    // 2,000 unknown fields in an invalid Service (no ports): 2,000 warnings of some 70
    // characters each, far past the 4 Ki characters upstream's recorder lets through.
    let mut spec = serde_json::Map::new();
    for i in 0..2000 {
        spec.insert(format!("unknown{i:04}{}", "x".repeat(40)), json!(1));
    }
    let service =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "w"}, "spec": spec});
    let (code, body, headers) =
        common::post_json(&client, "/api/v1/namespaces/default/services", &service).await;
    assert_eq!(code, 422, "{body}");
    let sent = common::warnings(&headers);
    assert!(
        sent.first()
            .is_some_and(|w| w.starts_with("unknown field \"spec.unknown0000")),
        "{sent:?}"
    );
    let chars: usize = sent.iter().map(|w| w.chars().count()).sum();
    assert!(
        chars <= 4096 + 256,
        "{chars} characters in {} warnings",
        sent.len()
    );
    no_panic(&server);
}

/// Reads one HTTP/1.1 response (its length given by `Content-Length`): status, lower-cased
/// head and body; `None` when the connection ends first.
async fn read_one(stream: &mut tokio::io::BufReader<Tls>) -> Option<(u16, String, String)> {
    use tokio::io::AsyncBufReadExt;
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((code, head, String::from_utf8_lossy(&body).into_owned()))
}

/// Sends a request's head, then (a moment later, as a client writing it in two goes does)
/// its body.
async fn send_in_two(
    stream: &mut tokio::io::BufReader<Tls>,
    server: &Target,
    (method, path, content_type, body): (&str, &str, &str, &[u8]),
) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nAccept: application/json\r\nContent-Length: {}\r\n",
        server.token,
        body.len()
    );
    if !content_type.is_empty() {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    let inner = stream.get_mut();
    inner.write_all(head.as_bytes()).await.expect("head");
    inner.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_millis(50)).await;
    if !body.is_empty() {
        // The server may have answered and closed meanwhile: judged by what is read next.
        let _ = inner.write_all(body).await;
        let _ = inner.flush().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_serves_on_after_answers_given_before_the_body_was_read() {
    let (server, _client) = with_service(Server::start(), "web").await;
    let target = target(&server);
    let services = "/api/v1/namespaces/default/services";
    let early: [(&str, &str, &str, Vec<u8>, u16); 5] = [
        ("PUT", services, "text/plain", vec![b'x'; 3000], 405),
        ("POST", services, "text/plain", vec![b'x'; 3000], 415),
        (
            "PATCH",
            "/api/v1/namespaces/default/services/web",
            "application/json",
            b"{}".repeat(1500),
            415,
        ),
        ("POST", services, "application/json", vec![b'{'; 3000], 400),
        (
            "GET",
            "/api/v1/namespaces/default/services/nope",
            "",
            Vec::new(),
            404,
        ),
    ];
    for (method, path, content_type, body, status) in early {
        // As Go's server: up to 256 KiB left unread is discarded, and the connection serves on.
        let mut stream = tokio::io::BufReader::new(tls(&target).await.expect("connect"));
        send_in_two(&mut stream, &target, (method, path, content_type, &body)).await;
        let (code, head, text) = read_one(&mut stream).await.expect("an answer");
        assert_eq!(code, status, "{method} {path}: {text}");
        assert!(
            !head.contains("connection: close"),
            "{method} {path}: {head}"
        );
        send_in_two(&mut stream, &target, ("GET", "/version", "", b"")).await;
        let next = read_one(&mut stream).await;
        assert!(
            next.as_ref().is_some_and(|(code, ..)| *code == 200),
            "after {method} {path} ({code}), the connection's next request: {next:?}"
        );
    }
    // More than that left unread (a body announced at 300 KiB, of which 1 KiB is sent): the
    // answer says the connection closes, and it does.
    let mut stream = tls(&target).await.expect("connect");
    let head = format!(
        "PUT {services} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
        target.token,
        300 << 10
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    stream.write_all(&[b'x'; 1024]).await.expect("body");
    let read = tokio::time::timeout(Duration::from_secs(10), read_response(&mut stream)).await;
    let (code, head, _) = read.expect("the connection closes after the answer");
    assert_eq!(code, 405, "{head}");
    assert!(head.contains("connection: close"), "{head}");
    no_panic(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_watch_gets_its_bookmarks_as_one_row_tables() {
    let (server, _client) = with_service(Server::start(), "web").await;
    let target = target(&server);
    let revision = server.ok(&[
        "get",
        "services",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    let mut stream = tls(&target).await.expect("connect");
    // A bookmark is due two seconds before the watch's end, once a change went by.
    let path = format!(
        "/api/v1/namespaces/default/services?watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds=3",
        revision.trim()
    );
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nAccept: application/json;as=Table;v=v1;g=meta.k8s.io\r\nConnection: close\r\n\r\n",
        target.token
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.ok(&["create", "service", "clusterip", "other", "--tcp=80"]);
    let (code, _, body) = read_response(&mut stream).await;
    assert_eq!(code, 200, "{body}");
    // The chunked body's lines that are events.
    let events: Vec<Value> = body
        .lines()
        .filter(|line| line.starts_with("{\"type\""))
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let bookmark = events
        .iter()
        .find(|event| event["type"] == "BOOKMARK")
        .unwrap_or_else(|| panic!("no bookmark in {body}"));
    assert_eq!(bookmark["object"]["kind"], "Table", "{bookmark}");
    assert_eq!(bookmark["object"]["rows"].as_array().map(Vec::len), Some(1));
    no_panic(&server);
}
