//! A real etcd server for tests and benchmarks: `etcd` from Debian's `etcd-server` package,
//! started on free loopback ports with a temporary data directory.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd. It stops when this value is dropped — and, because it is started through a
/// shell that waits on its standard input, also when the test process dies without dropping it.
pub struct EtcdServer {
    child: Child,
    /// The client URL, e.g. `http://127.0.0.1:23790`.
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl EtcdServer {
    /// Starts etcd and waits until it answers.
    pub fn start() -> Self {
        let binary = std::env::var("CAPSTAN_ETCD_BINARY").unwrap_or_else(|_| "etcd".into());
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let script = format!(
            "{binary} --name capstan-test --data-dir {dir} \
             --listen-client-urls {endpoint} --advertise-client-urls {endpoint} \
             --listen-peer-urls http://127.0.0.1:{peer} \
             --initial-advertise-peer-urls http://127.0.0.1:{peer} \
             --initial-cluster capstan-test=http://127.0.0.1:{peer} \
             >{dir}/etcd.log 2>&1 & pid=$!; echo started; read _; kill $pid; wait $pid 2>/dev/null",
            dir = dir.path().display(),
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh to start etcd");
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line).ok();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(
                Instant::now() < deadline,
                "etcd did not start (is Debian's etcd-server installed? log: {})",
                std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            endpoint,
            _dir: dir,
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // Closing the shell's stdin makes it stop etcd and wait for it.
        self.child.stdin.take();
        let _ = self.child.wait();
    }
}
