//! The fault suite: the store's disk fills up, the server is killed with SIGKILL in the middle
//! of writes, and etcd stops and comes back under load. Through each: no acknowledged write is
//! lost, no cluster IP or node port is handed out twice, readiness is false while the store is
//! broken and true again after, and a watcher misses no acknowledged change.
//!
//! The disk-full case mounts a small tmpfs in a mount namespace of its own (`unshare`), which
//! needs root, as CI has; the etcd case needs the `etcd` feature and an `etcd` binary.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::require::{have, is_root, require};
use common::{Server, watch_service_names as start_watcher};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// What an acknowledged create was given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allocated {
    cluster_ip: String,
    node_port: Option<i32>,
}

fn allocated(service: &Service) -> Allocated {
    let spec = service.spec.clone().unwrap_or_default();
    Allocated {
        cluster_ip: spec.cluster_ip.unwrap_or_default(),
        node_port: spec
            .ports
            .unwrap_or_default()
            .first()
            .and_then(|p| p.node_port),
    }
}

fn node_port_service(name: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"type": "NodePort", "ports": [{"port": 80}]},
    }))
    .expect("service")
}

/// Acknowledged creates, by name.
type Acknowledged = Arc<Mutex<BTreeMap<String, Allocated>>>;

/// Writers creating NodePort Services (a cluster IP and a node port each) as fast as they
/// can until `stop`; every create answered 201 is recorded.
fn start_writers(
    api: Api<Service>,
    prefix: &str,
    writers: usize,
    acknowledged: Acknowledged,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    (0..writers)
        .map(|w| {
            let (api, acknowledged, stop, prefix) = (
                api.clone(),
                acknowledged.clone(),
                stop.clone(),
                prefix.to_string(),
            );
            tokio::spawn(async move {
                let mut failures = 0;
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("{prefix}-{w}-{i}");
                    i += 1;
                    match api
                        .create(&PostParams::default(), &node_port_service(&name))
                        .await
                    {
                        Ok(created) => {
                            acknowledged
                                .lock()
                                .expect("lock")
                                .insert(name, allocated(&created));
                        }
                        Err(_) => {
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                failures
            })
        })
        .collect()
}

/// `/readyz` answers, polled every 100 ms: (seen false, latest).
fn start_readiness(
    client: kube::Client,
) -> (Arc<Mutex<(bool, bool)>>, tokio::task::JoinHandle<()>) {
    let state = Arc::new(Mutex::new((false, true)));
    let task = tokio::spawn({
        let state = state.clone();
        async move {
            loop {
                let request = http::Request::get("/readyz")
                    .body(kube::client::Body::empty())
                    .expect("request");
                let ready = matches!(
                    tokio::time::timeout(Duration::from_secs(3), client.send(request)).await,
                    Ok(Ok(response)) if response.status() == 200
                );
                {
                    let mut state = state.lock().expect("lock");
                    state.0 |= !ready;
                    state.1 = ready;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    (state, task)
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every acknowledged Service is stored with what its create answered, no cluster IP or node
/// port is held twice, and the watcher saw every acknowledged Service.
async fn verify(
    api: &Api<Service>,
    acknowledged: &Acknowledged,
    seen: &Arc<Mutex<HashSet<String>>>,
) {
    let stored: BTreeMap<String, Allocated> = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), allocated(s)))
        .collect();
    let acknowledged = acknowledged.lock().expect("lock").clone();
    assert!(!acknowledged.is_empty(), "no write was acknowledged at all");
    for (name, given) in &acknowledged {
        assert_eq!(
            stored.get(name),
            Some(given),
            "acknowledged {name} lost or changed"
        );
    }
    let mut ips = HashSet::new();
    let mut ports = HashSet::new();
    for (name, held) in &stored {
        assert!(
            ips.insert(held.cluster_ip.clone()),
            "{name}: cluster IP {} twice",
            held.cluster_ip
        );
        if let Some(port) = held.node_port {
            assert!(ports.insert(port), "{name}: node port {port} twice");
        }
    }
    wait_until(
        "the watcher saw every acknowledged Service",
        Duration::from_secs(30),
        || {
            let seen = seen.lock().expect("lock");
            acknowledged.keys().all(|name| seen.contains(name))
        },
    )
    .await;
}

/// Writers, a watcher and a readiness probe against one server: the load a fault is injected
/// under, and the checks after it.
struct Load {
    api: Api<Service>,
    acknowledged: Acknowledged,
    stop: Arc<std::sync::atomic::AtomicBool>,
    writers: Vec<tokio::task::JoinHandle<usize>>,
    seen: Arc<Mutex<HashSet<String>>>,
    watcher: tokio::task::JoinHandle<()>,
    readiness: Arc<Mutex<(bool, bool)>>,
    probe: tokio::task::JoinHandle<()>,
}

impl Load {
    /// Starts once the server is ready: 8 writers creating `<prefix>-…` Services.
    async fn start(client: kube::Client, prefix: &str) -> Load {
        let api: Api<Service> = Api::namespaced(client.clone(), "default");
        let (seen, watcher) = start_watcher(api.clone());
        let (readiness, probe) = start_readiness(client);
        wait_until("ready at start", Duration::from_secs(20), || {
            readiness.lock().expect("lock").1
        })
        .await;
        readiness.lock().expect("lock").0 = false;
        let acknowledged = Acknowledged::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers = start_writers(api.clone(), prefix, 8, acknowledged.clone(), stop.clone());
        Load {
            api,
            acknowledged,
            stop,
            writers,
            seen,
            watcher,
            readiness,
            probe,
        }
    }

    fn acknowledged(&self) -> usize {
        self.acknowledged.lock().expect("lock").len()
    }

    /// Waits for readiness to have failed.
    async fn unready(&self, what: &str) {
        wait_until(what, Duration::from_secs(30), || {
            self.readiness.lock().expect("lock").0
        })
        .await;
    }

    /// Waits for readiness to be back and writes to be acknowledged again.
    async fn recovered(&self, what: &str, within: Duration) {
        wait_until(what, within, || self.readiness.lock().expect("lock").1).await;
        let resumed = self.acknowledged();
        wait_until("writes succeed again", within, || {
            self.acknowledged() > resumed + 10
        })
        .await;
    }

    /// Stops the writers and checks what the fault left.
    async fn finish(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for writer in self.writers {
            let _ = writer.await;
        }
        verify(&self.api, &self.acknowledged, &self.seen).await;
        self.watcher.abort();
        self.probe.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_writes_loses_no_acknowledged_write() {
    let mut server = Server::start();
    let client = server.client().await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let (seen, watcher) = start_watcher(api.clone());
    let acknowledged = Acknowledged::default();
    for round in 0..3 {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers = start_writers(
            api.clone(),
            &format!("r{round}"),
            16,
            acknowledged.clone(),
            stop.clone(),
        );
        tokio::time::sleep(Duration::from_millis(700 + fastrand::u64(..800))).await;
        server.kill();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for writer in writers {
            let _ = writer.await;
        }
        server.launch();
    }
    verify(&api, &acknowledged, &seen).await;
    watcher.abort();
}

/// A server confined to a mount namespace where its data directory is a small tmpfs.
struct Confined {
    child: Child,
    dir: tempfile::TempDir,
}

impl Confined {
    /// Starts the server confined; `None` when it did not write its kubeconfig in 20 s.
    fn start() -> Option<Confined> {
        let dir = tempfile::tempdir().expect("dir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("mount point");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let log = std::fs::File::create(dir.path().join("log")).expect("log");
        let script = format!(
            // A wide node port range: the writers must fill the disk before they run out of
            // node ports (the default range holds 2,768).
            "mount -t tmpfs -o size=48m tmpfs '{}' && exec '{}' serve --data-dir '{}' --bind-address 127.0.0.1 --port {port} --service-node-port-range 20000-60000",
            data.display(),
            env!("CARGO_BIN_EXE_capstan"),
            data.display()
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .ok()?;
        let confined = Confined { child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if confined.data().join("kubeconfig").exists() {
                return Some(confined);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The data directory as this process can reach it: through the server's own root.
    fn data(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.child.id()))
            .join(self.dir.path().strip_prefix("/").unwrap_or(self.dir.path()))
            .join("data")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    async fn client(&self) -> kube::Client {
        common::client_for(&self.data().join("kubeconfig")).await
    }
}

impl Drop for Confined {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fills the file system holding `dir` to the last byte.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0u8; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    let small = [0u8; 512];
    while file.write_all(&small).is_ok() {}
    let _ = file.sync_all();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_fails_readiness_and_recovers_when_space_returns() {
    // Mounting a tmpfs in a mount namespace of its own needs root (CI runs as root).
    if !(require("root, to mount a tmpfs", is_root())
        && require("unshare (util-linux)", have("unshare", "--version")))
    {
        return;
    }
    let Some(server) = Confined::start() else {
        panic!("the confined server did not start");
    };
    let load = Load::start(server.client().await, "df").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let filler = fill(&server.data());
    load.unready("readiness fails while the disk is full").await;
    // Reads still work from memory while writes are refused.
    assert!(load.api.list(&ListParams::default()).await.is_ok());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stalled = load.acknowledged();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        load.acknowledged(),
        stalled,
        "writes were acknowledged on a full disk"
    );
    std::fs::remove_file(&filler).expect("space returns");
    load.recovered("ready again once space returns", Duration::from_secs(30))
        .await;
    load.finish().await;
    assert!(!server.log().contains("panicked"), "{}", server.log());
}

/// An etcd of the test's own on free loopback ports; stoppable and restartable on its data.
#[cfg(feature = "etcd")]
struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

#[cfg(feature = "etcd")]
impl Etcd {
    /// Starts etcd, which must then work: a missing `etcd` is for [`require`] to catch first.
    fn start() -> Etcd {
        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("port")
        };
        let mut etcd = Etcd {
            child: None,
            dir: tempfile::tempdir().expect("dir"),
            client_port: port(),
            peer_port: port(),
        };
        let url = etcd.url();
        assert!(etcd.launch(), "etcd did not listen on {url} within 20 s");
        etcd
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts etcd on its data; whether it listens within 20 s.
    fn launch(&mut self) -> bool {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let Ok(child) = Command::new("etcd")
            .args(["--name", "faults", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &self.url(),
                "--advertise-client-urls",
                &self.url(),
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("faults={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        else {
            return false;
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.client_port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(feature = "etcd")]
impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_and_restarted_under_load_loses_nothing() {
    let installed = have("etcd", "--version");
    if !require("an etcd binary (.ci/run installs etcd-server)", installed) {
        return;
    }
    let mut etcd = Etcd::start();
    let server = Server::start_with(&["--storage", "etcd", "--etcd-servers", &etcd.url()]);
    let load = Load::start(server.client().await, "etcd").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    etcd.stop();
    load.unready("readiness fails while etcd is down").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(etcd.launch(), "etcd restarts");
    load.recovered("ready again once etcd is back", Duration::from_secs(60))
        .await;
    load.finish().await;
    assert!(!server.log().contains("panicked"), "{}", server.log());
}
