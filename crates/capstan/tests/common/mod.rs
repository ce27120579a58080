//! Starts the real `capstan` binary and drives it with `/usr/bin/kubectl` and the `kube` crate.

#![allow(dead_code, missing_docs)]

pub mod require;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    /// A network namespace the server and kubectl run in (`ip netns exec`).
    netns: Option<String>,
}

/// A command, run inside a network namespace when one is given.
fn command_in(netns: Option<&str>, program: &str) -> Command {
    match netns {
        Some(ns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", ns, program]);
            command
        }
        None => Command::new(program),
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Server {
    /// Starts `capstan serve` on a fresh data directory and waits until `/readyz` answers.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts with extra `capstan serve` flags.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_in(None, extra)
    }

    /// Starts inside a network namespace (kubectl then runs there too).
    pub fn start_in(netns: Option<&str>, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Server {
            dir,
            port: free_port(),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            netns: netns.map(str::to_string),
        };
        // The port was free when picked; another test's server may take it before this one
        // binds (the tests run in parallel): then it starts again on another.
        for _ in 0..5 {
            match server.try_launch() {
                Err(log) if log.contains("Address already in use") => {
                    server.port = free_port();
                }
                Err(log) => panic!("capstan did not become ready: {log}"),
                Ok(()) => return server,
            }
        }
        panic!("capstan found no free port: {}", server.log());
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir().join("kubeconfig")
    }

    /// Starts the server again on its data directory and port, and waits until it is ready.
    pub fn launch(&mut self) {
        if let Err(log) = self.try_launch() {
            panic!("capstan did not become ready: {log}");
        }
    }

    /// [`Server::launch`], answering the log when the server exits or is not ready in 20 s.
    fn try_launch(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("log")).expect("log file");
        let child = command_in(self.netns.as_deref(), env!("CARGO_BIN_EXE_capstan"))
            .arg("serve")
            .arg("--data-dir")
            .arg(self.data_dir())
            .args([
                "--bind-address",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
            ])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("capstan starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.kubeconfig().exists()
                && self.kubectl(&["get", "--raw", "/readyz"]).status.success()
            {
                return Ok(());
            }
            let exited = self.child.as_mut().map(|c| c.try_wait());
            if let Some(Ok(Some(_))) = exited {
                self.child = None;
                return Err(self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(self.log())
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's resident memory in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits; returns the exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        child.wait().ok().and_then(|s| s.code())
    }

    /// Kills the server with SIGKILL (no shutdown of any kind) and waits for it; the data
    /// directory stays for [`Server::launch`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// `kubectl` set up for this server, for a caller to give its arguments, environment and
    /// output to (a watch to spawn, an `EDITOR`).
    pub fn kubectl_command(&self) -> Command {
        let mut command = command_in(self.netns.as_deref(), "kubectl");
        command
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .env("KUBECACHEDIR", self.dir.path().join("kube-cache"));
        command
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command()
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    /// Runs kubectl and returns stdout, failing the test when kubectl fails.
    pub fn ok(&self, args: &[&str]) -> String {
        succeeded(&format!("kubectl {args:?}"), &self.kubectl(args))
    }

    /// Runs kubectl expecting failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn apply_file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("write manifest");
        path
    }

    /// `kubectl get <what> -o jsonpath=<path>`.
    pub fn jsonpath(&self, what: &[&str], path: &str) -> String {
        let path = format!("jsonpath={path}");
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend(["-o", &path]);
        self.ok(&args)
    }

    /// Writes `contents` to the manifest `name` and `kubectl apply`s it; kubectl's output.
    pub fn apply(&self, name: &str, contents: &str) -> String {
        let path = self.apply_file(name, contents);
        self.ok(&["apply", "-f", path_str(&path)])
    }

    /// Writes `contents` to the manifest `name` and `kubectl create`s it; kubectl's output.
    pub fn create(&self, name: &str, contents: &str) -> String {
        let path = self.apply_file(name, contents);
        self.ok(&["create", "-f", path_str(&path)])
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("admin.token"))
            .expect("token")
            .trim()
            .to_string()
    }

    pub async fn client(&self) -> kube::Client {
        client_for(&self.kubeconfig()).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The stdout of `what`, a command that must have succeeded: else the test fails with its
/// output.
#[track_caller]
pub fn succeeded(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A raw request through the kube client (TLS and token from the kubeconfig).
pub async fn raw(
    client: &kube::Client,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, serde_json::Value, http::HeaderMap) {
    raw_accepting(client, method, uri, content_type, None, body).await
}

/// [`raw`] GETting `uri`.
pub async fn get(client: &kube::Client, uri: &str) -> (u16, serde_json::Value, http::HeaderMap) {
    raw(client, "GET", uri, None, Vec::new()).await
}

/// [`raw`] DELETEing `uri`, with no options.
pub async fn delete(client: &kube::Client, uri: &str) -> (u16, serde_json::Value, http::HeaderMap) {
    raw(client, "DELETE", uri, None, Vec::new()).await
}

/// [`raw`] PATCHing `uri` with `body`, sent as `content_type`.
pub async fn patch(
    client: &kube::Client,
    uri: &str,
    content_type: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value, http::HeaderMap) {
    let body = serde_json::to_vec(body).expect("encode");
    raw(client, "PATCH", uri, Some(content_type), body).await
}

/// Asserts that `body`, answered with `code` to `what`, is upstream's Status `want`: its code,
/// reason and message.
#[track_caller]
pub fn assert_status(what: &str, code: u16, body: &serde_json::Value, want: (u16, &str, &str)) {
    let (want_code, reason, message) = want;
    assert_eq!(code, want_code, "{what}: {body}");
    assert_eq!(body["reason"], reason, "{what}: {body}");
    assert_eq!(body["message"], message, "{what}: {body}");
}

/// [`raw`] POSTing `body` as JSON to `uri`.
pub async fn post_json(
    client: &kube::Client,
    uri: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value, http::HeaderMap) {
    raw(
        client,
        "POST",
        uri,
        Some("application/json"),
        body.to_string().into_bytes(),
    )
    .await
}

/// [`raw`] with an `Accept` header.
pub async fn raw_accepting(
    client: &kube::Client,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    accept: Option<&str>,
    body: Vec<u8>,
) -> (u16, serde_json::Value, http::HeaderMap) {
    let headers: Vec<(&str, &str)> = [("content-type", content_type), ("accept", accept)]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect();
    let (status, headers, bytes) = send(client, method, uri, &headers, body).await;
    let value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::String(
        String::from_utf8_lossy(&bytes).into_owned(),
    ));
    (status, value, headers)
}

/// A request through the kube client with these headers: the status, the headers and the body
/// as sent.
pub async fn send(
    client: &kube::Client,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    let mut builder = http::Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(kube::client::Body::from(body))
        .expect("request");
    let response = client.send(request).await.expect("response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, headers, bytes.to_vec())
}

/// The texts of the `Warning: 299 - "<text>"` headers of a response.
pub fn warnings(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            let quoted = v.strip_prefix("299 - \"").unwrap_or(v);
            quoted
                .strip_suffix('"')
                .unwrap_or(quoted)
                .replace("\\\"", "\"")
        })
        .collect()
}

/// A watcher (kube's, with its relists and re-watches) recording the name of every Service it is
/// told about.
pub fn watch_service_names(
    api: kube::Api<k8s_openapi::api::core::v1::Service>,
) -> (
    std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    tokio::task::JoinHandle<()>,
) {
    use futures_util::StreamExt;
    use kube::runtime::WatchStreamExt;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut stream = kube::runtime::watcher(api, Default::default())
                .default_backoff()
                .boxed();
            while let Some(event) = stream.next().await {
                if let Ok(
                    kube::runtime::watcher::Event::Apply(s)
                    | kube::runtime::watcher::Event::InitApply(s),
                ) = event
                {
                    seen.lock()
                        .expect("lock")
                        .insert(s.metadata.name.unwrap_or_default());
                }
            }
        }
    });
    (seen, task)
}

/// The kubectl arguments that merge `patch` into a pod's `/status` (as a kubelet writes it).
pub fn pod_status_patch<'a>(pod: &'a str, patch: &'a str) -> [&'a str; 7] {
    [
        "patch",
        "pod",
        pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    ]
}

/// Marks a pod Running with `ip`, Ready or not, through its `/status` (as a kubelet would).
#[allow(dead_code)]
pub fn set_pod_status(server: &Server, pod: &str, ip: &str, ready: bool) {
    let ready = if ready { "True" } else { "False" };
    let status = format!(
        r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"conditions":[{{"type":"Ready","status":"{ready}"}}]}}}}"#
    );
    server.ok(&pod_status_patch(pod, &status));
}

/// A kube client from a kubeconfig file.
pub async fn client_for(kubeconfig: &std::path::Path) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// The etcd the etcd tests use (`CAPSTAN_TEST_ETCD_ENDPOINTS`; `.ci/run` starts one). Unset:
/// fails the test under CI, else `None` with a `SKIPPED` note ([`require::require`]).
#[track_caller]
pub fn etcd_endpoints() -> Option<String> {
    let endpoints = std::env::var("CAPSTAN_TEST_ETCD_ENDPOINTS")
        .ok()
        .filter(|e| !e.trim().is_empty());
    let what = "an etcd at CAPSTAN_TEST_ETCD_ENDPOINTS (.ci/run starts one)";
    if !require::require(what, endpoints.is_some()) {
        return None;
    }
    endpoints
}

/// Who holds the controllers' Lease, as `server` reads it ("" for no one).
pub fn lease_holder(server: &Server) -> String {
    let path = "jsonpath={.spec.holderIdentity}";
    let lease = [
        "-n",
        "kube-system",
        "get",
        "lease",
        "capstan-controllers",
        "-o",
        path,
    ];
    String::from_utf8_lossy(&server.kubectl(&lease).stdout)
        .trim()
        .to_string()
}

/// Runs a Python client script (`pip install kubernetes`) with the server's kubeconfig as its
/// argument; the script prints `ok` when its checks hold.
pub fn run_python(server: &Server, script: &str) {
    let out = Command::new("python3")
        .args(["-c", script, path_str(&server.kubeconfig())])
        .output()
        .expect("python3");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "the Python client (pip install kubernetes): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `what` every 100 ms until it holds (`true`) or `within` has passed (`false`).
pub fn until(within: Duration, what: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if what() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The cluster IPs of every Service, as `server` lists them, and whether none is held twice.
pub fn cluster_ips(server: &Server) -> (Vec<String>, bool) {
    let each = "jsonpath={range .items[*]}{.spec.clusterIP}{\"\\n\"}{end}";
    let listed = server.ok(&["get", "services", "-A", "-o", each]);
    let ips: Vec<String> = listed.lines().map(str::to_string).collect();
    let unique: std::collections::BTreeSet<&String> = ips.iter().collect();
    let distinct = unique.len() == ips.len();
    (ips, distinct)
}
