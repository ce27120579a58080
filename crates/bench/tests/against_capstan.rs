//! capstan-bench against a real `capstan serve`: every scenario runs, reports JSON, misses no
//! watch event and cleans up after itself.

#![allow(missing_docs)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../capstan/tests/common/require.rs"]
mod require;

struct Capstan {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Drop for Capstan {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn capstan_binary() -> PathBuf {
    // `cargo test --workspace` builds every binary into the same directory.
    let path = PathBuf::from(env!("CARGO_BIN_EXE_capstan-bench")).with_file_name("capstan");
    assert!(
        path.exists(),
        "build the server first: cargo build -p capstan ({})",
        path.display()
    );
    path
}

fn start() -> Capstan {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let child = Command::new(capstan_binary())
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("capstan starts");
    let kubeconfig = dir.path().join("data/kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !kubeconfig.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    Capstan { child, dir }
}

fn bench(server: &Capstan, args: &[&str]) -> serde_json::Value {
    let report = server.dir.path().join(format!("{}.json", args[0]));
    let out = Command::new(env!("CARGO_BIN_EXE_capstan-bench"))
        .args(args)
        .arg("--kubeconfig")
        .arg(server.dir.path().join("data/kubeconfig"))
        .arg("--json")
        .arg(&report)
        .args(["--server-pid", &server.child.id().to_string()])
        .output()
        .expect("capstan-bench runs");
    assert!(
        out.status.success(),
        "capstan-bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("JSON report")
}

#[test]
fn every_scenario_runs_and_cleans_up() {
    let server = start();
    let create = bench(&server, &["create", "--count", "200", "--concurrency", "8"]);
    assert_eq!(create["create"]["operations"], 200);
    assert!(
        create["create"]["latency_ms"]["p99"]
            .as_f64()
            .is_some_and(|p| p > 0.0)
    );
    assert!(
        create["server"]["peak_rss_mib"]
            .as_f64()
            .is_some_and(|m| m > 1.0)
    );
    // The namespace and the 200 creates.
    assert_eq!(create["server"]["requests"], 201, "{create}");
    assert!(
        create["server"]["cpu_seconds_per_1000_requests"]
            .as_f64()
            .is_some_and(|c| c >= 0.0),
        "{create}"
    );
    for scenario in ["get", "update", "delete"] {
        let report = bench(&server, &[scenario, "--count", "100", "--concurrency", "4"]);
        assert_eq!(report[scenario]["operations"], 100, "{report}");
    }
    let list = bench(&server, &["list", "--count", "300"]);
    for kind in ["list_json", "list_table", "list_paginated"] {
        assert_eq!(list[kind]["operations"], 10, "{list}");
    }
    let watch = bench(&server, &["watch", "--watchers", "20", "--updates", "20"]);
    assert_eq!(watch["watch"]["expected"], 400);
    assert_eq!(watch["watch"]["missed"], 0, "{watch}");
    // Every watch multiplexed on one HTTP/2 connection, as client-go's informers are: the
    // connection holds back what its streams write and writes it out once they are done.
    let watch = bench(
        &server,
        &["watch", "--http2", "--watchers", "50", "--updates", "20"],
    );
    assert_eq!(watch["watch"]["expected"], 1000);
    assert_eq!(watch["watch"]["missed"], 0, "{watch}");
    let mixed = bench(
        &server,
        &["mixed", "--count", "50", "--rate", "100", "--duration", "2"],
    );
    assert_eq!(mixed["mixed"]["errors"], 0, "{mixed}");
    let churn = bench(
        &server,
        &[
            "endpoints-churn",
            "--services",
            "10",
            "--pods",
            "5",
            "--flip-percent",
            "20",
            "--duration",
            "2",
        ],
    );
    let report = &churn["endpoints_churn"];
    assert_eq!(report["errors"], 0, "{churn}");
    assert_eq!(report["missed"], 0, "{churn}");
    assert!(report["flips"].as_u64().unwrap_or(0) >= 15, "{churn}");
    assert_eq!(report["seen"], report["flips"], "{churn}");
    // The aggregation proxy's overhead, when this machine has a non-loopback IPv4 address for
    // the bench's backend (Endpoints refuse loopback).
    let address = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .skip_while(|w| *w != "inet")
                .nth(1)
                .and_then(|cidr| cidr.split('/').next().map(str::to_string))
        });
    match address {
        Some(ip) => {
            let backend = format!("{ip}:{}", 20000 + std::process::id() % 20000);
            let proxy = bench(
                &server,
                &[
                    "apiservice-proxy",
                    "--backend-address",
                    &backend,
                    "--rate",
                    "200",
                    "--duration",
                    "2",
                ],
            );
            let report = &proxy["apiservice_proxy"];
            assert_eq!(report["direct"]["errors"], 0, "{proxy}");
            assert_eq!(report["proxied"]["errors"], 0, "{proxy}");
            assert!(
                report["proxied"]["latency_ms"]["count"]
                    .as_u64()
                    .unwrap_or(0)
                    >= 300,
                "{proxy}"
            );
        }
        // A partial skip, said as `require` says one, but in CI too: whether a machine has a
        // global IPv4 address is up to where it runs (CI machines may have only loopback or
        // IPv6), not something CI can install, so its absence is no reason to fail.
        None => require::skipped("a global IPv4 address, for the apiservice-proxy scenario"),
    }
    // The endpoints controller reports its CPU under its own thread name.
    let threads = report["churn_server"]["threads"].to_string();
    assert!(threads.contains("ep-controller"), "{churn}");
    // Each thread's wait for a CPU, and the machine's idle share, are reported with it.
    assert!(threads.contains("waited_for_cpu_seconds"), "{churn}");
    let idle = report["churn_server"]["machine_idle_share"].as_f64();
    assert!(
        idle.is_some_and(|idle| (0.0..=1.0).contains(&idle)),
        "{churn}"
    );
    // Everything it created is gone: only the built-in Service is left.
    let kubeconfig = server.dir.path().join("data/kubeconfig");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "svc,pods,apiservices", "-A", "-o", "name"])
        .output()
        .expect("kubectl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "service/kubernetes\napiservice.apiregistration.k8s.io/v1.\n\
         apiservice.apiregistration.k8s.io/v1.coordination.k8s.io\n\
         apiservice.apiregistration.k8s.io/v1.discovery.k8s.io"
    );
}
