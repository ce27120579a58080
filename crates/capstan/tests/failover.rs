//! Three Capstan replicas on a three-member etcd cluster (all on loopback): Service creates,
//! updates and deletes and pod readiness flips go through all three while the replica holding
//! the controllers' Lease, an etcd follower and the etcd leader are killed and restarted in
//! turn. Afterwards every acknowledged write is there (and every acknowledged delete gone), no
//! cluster IP is held twice, every replica lists the same objects at the same
//! resourceVersion, a watcher that moved to another replica whenever its own failed saw every
//! change once and in order, and the controllers (on whichever replica leads) keep the
//! Endpoints equal to the pods.
//!
//! Also: a replica talking to an etcd that serves TLS and asks for client certificates.
//!
//! Needs the etcd engine and an `etcd` binary (`.ci/run` installs it).

#![cfg(feature = "etcd")]

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::require::{have, require};
use common::{Server, free_port, lease_holder, set_pod_status, until};

/// One etcd member on loopback.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Member {
    fn start(&mut self, cluster: &str, state: &str) {
        self.start_with(cluster, state, &[], "http");
    }

    fn start_with(&mut self, cluster: &str, state: &str, extra: &[&str], scheme: &str) {
        let log = std::fs::File::create(self.dir.join(format!("{}.log", self.name))).expect("log");
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let client = format!("{scheme}://127.0.0.1:{}", self.client);
        let child = Command::new("etcd")
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.dir.join(&self.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &url(self.peer)])
            .args(["--initial-advertise-peer-urls", &url(self.peer)])
            .args(["--initial-cluster", cluster])
            .args(["--initial-cluster-state", state])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether this member is the raft leader (etcd's JSON gateway, through curl).
    fn is_leader(&self) -> Option<bool> {
        let out = Command::new("curl")
            .args(["-s", "-m", "2", "-X", "POST", "-d", "{}"])
            .arg(format!(
                "http://127.0.0.1:{}/v3/maintenance/status",
                self.client
            ))
            .output()
            .ok()?;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let leader = status["leader"].as_str()?;
        Some(status["header"]["member_id"].as_str()? == leader)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The index of the replica holding the controllers' Lease, as `reader` sees it.
fn leader_of(reader: &Server, replicas: &[Server]) -> Option<usize> {
    let holder = lease_holder(reader);
    (!holder.is_empty())
        .then(|| replicas.iter().position(|r| r.log().contains(&holder)))
        .flatten()
}

fn names(server: &Server, query: &str) -> Option<BTreeSet<String>> {
    let path = format!("/api/v1/namespaces/default/services{query}");
    let out = server.kubectl(&["get", "--raw", &path]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let items = list["items"].as_array()?;
    Some(
        items
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str().map(str::to_string))
            .collect(),
    )
}

/// Watches Services from `from` through the replicas' kubeconfigs, starting with `start`,
/// in 2 s watches each resumed from the last resourceVersion seen, moving to the next replica
/// when one fails; until `stop`. Returns every event (type, name, revision) and how many
/// watches it opened.
fn follow(
    kubeconfigs: &[PathBuf],
    start: usize,
    from: &str,
    stop: &AtomicBool,
) -> (Vec<(String, String, i64)>, usize) {
    let (mut replica, mut revision, mut events, mut watches) =
        (start, from.to_string(), Vec::new(), 0);
    // One more watch after the writes stop, to take in the last of them.
    let (mut last, mut failed_after) = (false, 0);
    loop {
        last |= stop.load(Ordering::SeqCst);
        watches += 1;
        let path = format!(
            "/api/v1/namespaces/default/services?watch=1&resourceVersion={revision}&timeoutSeconds=2"
        );
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfigs[replica])
            .args(["get", "--raw", &path, "--request-timeout=10s"])
            .output()
            .ok()
            .filter(|o| o.status.success());
        let Some(out) = out else {
            replica = (replica + 1) % kubeconfigs.len();
            std::thread::sleep(Duration::from_millis(200));
            // After the writes, a few tries on each replica at most.
            failed_after += usize::from(last);
            if failed_after > 3 * kubeconfigs.len() {
                return (events, watches);
            }
            continue;
        };
        let mut clean = true;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if event["type"] == "ERROR" {
                // This replica's history does not reach back that far (it has just started),
                // or its cache is still catching up: another replica, or a later try.
                replica = (replica + 1) % kubeconfigs.len();
                clean = false;
                break;
            }
            let meta = &event["object"]["metadata"];
            let (Some(kind), Some(name), Some(at)) = (
                event["type"].as_str(),
                meta["name"].as_str(),
                meta["resourceVersion"].as_str(),
            ) else {
                continue;
            };
            revision = at.to_string();
            events.push((kind.to_string(), name.to_string(), at.parse().unwrap_or(0)));
        }
        if last && clean {
            return (events, watches);
        }
        failed_after += usize::from(last);
        if failed_after > 3 * kubeconfigs.len() {
            return (events, watches);
        }
        if !clean {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Pods behind the `web` Service.
const PODS: usize = 5;

fn pod_ip(pod: usize) -> String {
    format!("10.244.7.{}", pod + 1)
}

/// What the writer sent and what was acknowledged.
#[derive(Default, Clone)]
struct Log {
    sent: usize,
    /// When each refused write was sent (for the report by phase).
    refused: Vec<Duration>,
    created: BTreeSet<String>,
    /// Deletes sent (acknowledged or not: one may have been applied unanswered).
    delete_sent: BTreeSet<String>,
    deleted: BTreeSet<String>,
    /// Acknowledged label updates: Service, and its `round` label's value.
    labelled: Vec<(String, String)>,
}

/// Writes through the replicas in turn until `stop`: each round creates a Service, every
/// fourth labels the one before, every fourth deletes one three back, and each flips a pod's
/// readiness.
fn write_through(kubeconfigs: &[PathBuf], stop: &AtomicBool, log: &Mutex<Log>, began: Instant) {
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let kubectl = |args: &[&str]| {
            let out = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfigs[i % kubeconfigs.len()])
                .args(args)
                .arg("--request-timeout=5s")
                .output();
            let done = out.is_ok_and(|o| o.status.success());
            let mut log = log.lock().expect("log");
            log.sent += 1;
            if !done {
                log.refused.push(began.elapsed());
            }
            done
        };
        let name = format!("w{i}");
        if kubectl(&["create", "service", "clusterip", &name, "--tcp=80"]) {
            log.lock().expect("log").created.insert(name);
        }
        if i % 4 == 3 {
            let (target, label) = (format!("w{}", i - 1), format!("round={i}"));
            if kubectl(&["label", "service", &target, &label, "--overwrite"]) {
                log.lock()
                    .expect("log")
                    .labelled
                    .push((target, i.to_string()));
            }
        }
        if i.is_multiple_of(4) && i >= 4 {
            let gone = format!("w{}", i - 3);
            log.lock().expect("log").delete_sent.insert(gone.clone());
            if kubectl(&["delete", "service", &gone]) {
                log.lock().expect("log").deleted.insert(gone);
            }
        }
        let (pod, up) = (i % PODS, (i / PODS) % 2 == 1);
        let ready = if up { "True" } else { "False" };
        let ip = pod_ip(pod);
        let status = format!(
            r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"conditions":[{{"type":"Ready","status":"{ready}"}}]}}}}"#
        );
        let pod = format!("web-{pod}");
        kubectl(&[
            "patch",
            "pod",
            &pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ]);
        i += 1;
    }
}

/// A directory for etcd members' data, when an `etcd` binary is there to run them: without
/// one the test fails under CI and skips visibly elsewhere ([`require`]).
#[track_caller]
fn etcd_workspace() -> Option<tempfile::TempDir> {
    let installed = have("etcd", "--version");
    if !require("an etcd binary (.ci/run installs etcd-server)", installed) {
        return None;
    }
    Some(tempfile::tempdir().expect("temp dir"))
}

#[test]
fn three_replicas_on_three_etcd_members_survive_kills() {
    // Who leads etcd is asked through its JSON gateway, with curl.
    if !require("curl", have("curl", "--version")) {
        return;
    }
    let Some(dir) = etcd_workspace() else {
        return;
    };
    let mut members: Vec<Member> = (0..3)
        .map(|i| Member {
            name: format!("m{i}"),
            client: free_port(),
            peer: free_port(),
            dir: dir.path().to_path_buf(),
            child: None,
        })
        .collect();
    let cluster = members
        .iter()
        .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
        .collect::<Vec<_>>()
        .join(",");
    for member in &mut members {
        member.start(&cluster, "new");
    }
    assert!(
        until(Duration::from_secs(20), || members
            .iter()
            .any(|m| m.is_leader() == Some(true))),
        "the etcd cluster elects a leader"
    );
    let endpoints = members
        .iter()
        .map(|m| format!("http://127.0.0.1:{}", m.client))
        .collect::<Vec<_>>()
        .join(",");
    let flags = [
        "--storage",
        "etcd",
        "--etcd-servers",
        &endpoints,
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-deadline",
        "3s",
        "--leader-elect-retry-period",
        "500ms",
    ];
    let mut replicas: Vec<Server> = (0..3).map(|_| Server::start_with(&flags)).collect();
    assert!(until(Duration::from_secs(10), || leader_of(
        &replicas[0],
        &replicas
    )
    .is_some()));

    // Pods the controllers follow throughout; the writer flips their readiness.
    replicas[0].ok(&["create", "service", "clusterip", "web", "--tcp=80"]);
    replicas[0].ok(&["set", "selector", "service", "web", "app=web"]);
    for pod in 0..PODS {
        replicas[0].ok(&[
            "run",
            &format!("web-{pod}"),
            "--image=x",
            "--labels=app=web",
        ]);
        set_pod_status(&replicas[0], &format!("web-{pod}"), &pod_ip(pod), true);
    }

    // The writer: through each replica in turn, creates, updates, deletes and pod readiness
    // flips; what was acknowledged counts.
    let log = Arc::new(Mutex::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let kubeconfigs: Vec<PathBuf> = replicas.iter().map(Server::kubeconfig).collect();
    // A watcher that starts on the replica about to be killed and, whenever its replica
    // fails it, watches again on the next from the last resourceVersion it saw.
    let first = leader_of(&replicas[0], &replicas).expect("a leader");
    let rv = "jsonpath={.metadata.resourceVersion}";
    let from = replicas[0].ok(&["get", "svc", "web", "-o", rv]);
    let watcher = {
        let (stop, kubeconfigs) = (stop.clone(), kubeconfigs.clone());
        std::thread::spawn(move || follow(&kubeconfigs, first, &from, &stop))
    };
    let writer = {
        let (log, stop, kubeconfigs) = (log.clone(), stop.clone(), kubeconfigs.clone());
        std::thread::spawn(move || write_through(&kubeconfigs, &stop, &log, began))
    };
    let mut phases = vec![("start", began.elapsed())];
    // (a) The replica holding the controllers' Lease dies.
    let leader = leader_of(&replicas[0], &replicas).expect("a leader");
    let reader = (leader + 1) % 3;
    replicas[leader].kill();
    let killed = Instant::now();
    assert!(
        until(Duration::from_secs(20), || leader_of(
            &replicas[reader],
            &replicas
        )
        .is_some_and(|l| l != leader)),
        "another replica takes the controllers over"
    );
    eprintln!(
        "controllers took over {:?} after the leader was killed",
        killed.elapsed()
    );
    replicas[leader].launch();
    phases.push(("replica killed and restarted", began.elapsed()));

    // (b) An etcd follower dies and comes back; (c) then the etcd leader.
    for want_leader in [false, true] {
        let victim = members
            .iter()
            .position(|m| m.is_leader() == Some(want_leader))
            .expect("a member in that role");
        members[victim].kill();
        std::thread::sleep(Duration::from_secs(3));
        members[victim].start(&cluster, "existing");
        assert!(
            until(Duration::from_secs(20), || members[victim]
                .is_leader()
                .is_some()),
            "member {victim} rejoins"
        );
        std::thread::sleep(Duration::from_secs(2));
        let what = if want_leader {
            "etcd leader"
        } else {
            "etcd follower"
        };
        phases.push((what, began.elapsed()));
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
    let log = log.lock().expect("log").clone();
    let (events, rewatches) = watcher.join().expect("watcher");
    eprintln!(
        "{} writes sent, {} creates and {} deletes acknowledged; the watcher watched {rewatches} times and saw {} events",
        log.sent,
        log.created.len(),
        log.deleted.len(),
        events.len()
    );
    for pair in phases.windows(2) {
        let (from, to) = (pair[0].1, pair[1].1);
        let failed = log
            .refused
            .iter()
            .filter(|t| **t >= from && **t < to)
            .count();
        eprintln!("{}: {failed} writes refused in {:?}", pair[1].0, to - from);
    }
    assert!(
        log.created.len() > 10,
        "writes went through: {}",
        log.created.len()
    );
    // The watcher saw each change once, in order, and every acknowledged create and delete.
    let keys: BTreeSet<(&str, &str, i64)> = events
        .iter()
        .map(|(k, n, r)| (k.as_str(), n.as_str(), *r))
        .collect();
    assert_eq!(keys.len(), events.len(), "an event seen twice");
    assert!(
        events.windows(2).all(|w| w[0].2 < w[1].2),
        "events out of order"
    );
    let seen = |kind: &str| -> BTreeSet<String> {
        events
            .iter()
            .filter(|e| e.0 == kind)
            .map(|e| e.1.clone())
            .collect()
    };
    let (added, deleted) = (seen("ADDED"), seen("DELETED"));
    let missed: Vec<&String> = log.created.difference(&added).collect();
    assert!(missed.is_empty(), "creates the watcher missed: {missed:?}");
    let missed: Vec<&String> = log.deleted.difference(&deleted).collect();
    assert!(missed.is_empty(), "deletes the watcher missed: {missed:?}");

    // Every replica lists every acknowledged write, and the same objects at one revision.
    let out = replicas[0].ok(&["get", "--raw", "/api/v1/namespaces/default/services"]);
    let list: serde_json::Value = serde_json::from_str(&out).expect("a list");
    let revision = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let exact = format!("?resourceVersion={revision}&resourceVersionMatch=Exact");
    let mut seen = Vec::new();
    for replica in &replicas {
        assert!(
            until(Duration::from_secs(20), || names(replica, &exact).is_some()),
            "replica lists at {revision}: {}",
            replica.log()
        );
        let listed = names(replica, &exact).expect("a list");
        let kept: BTreeSet<String> = log.created.difference(&log.delete_sent).cloned().collect();
        let missing: Vec<&String> = kept.difference(&listed).collect();
        assert!(missing.is_empty(), "acknowledged but missing: {missing:?}");
        let back: Vec<&String> = log.deleted.intersection(&listed).collect();
        assert!(back.is_empty(), "deleted but listed: {back:?}");
        // Each acknowledged update is there (no Service is labelled twice or deleted).
        for (service, round) in &log.labelled {
            let path = "jsonpath={.metadata.labels.round}";
            let have = replica.ok(&["get", "service", service, "-o", path]);
            assert_eq!(&have, round, "the label update of {service}");
        }
        seen.push(listed);
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "replicas list alike");

    // No cluster IP twice.
    let (ips, distinct) = common::cluster_ips(&replicas[1]);
    assert!(distinct, "a cluster IP held twice: {ips:?}");

    // The controllers, wherever they run now, keep the Endpoints equal to the pods: each
    // pod's readiness is set once more (acknowledged), then read back.
    let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
    for pod in 0..PODS {
        let up = pod.is_multiple_of(2);
        set_pod_status(&replicas[pod % 3], &format!("web-{pod}"), &pod_ip(pod), up);
        if up {
            ready.push(pod_ip(pod))
        } else {
            not_ready.push(pod_ip(pod))
        }
    }
    let read = |field: &str| {
        let path = format!("jsonpath={{.subsets[*].{field}[*].ip}}");
        let out = replicas[1].kubectl(&["get", "endpoints", "web", "-o", &path]);
        let mut ips: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        ips.sort();
        ips
    };
    assert!(
        until(Duration::from_secs(20), || read("addresses") == ready
            && read("notReadyAddresses") == not_ready),
        "the endpoints follow the pods after the failovers: {:?} / {:?}",
        read("addresses"),
        read("notReadyAddresses")
    );
    for replica in &mut replicas {
        replica.stop();
    }
}

/// A certificate signed by `issuer` for `names`, written as `<stem>.crt` and `<stem>.key`.
fn signed(
    dir: &std::path::Path,
    stem: &str,
    names: &[&str],
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
) -> (PathBuf, PathBuf) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let params = rcgen::CertificateParams::new(names).expect("params");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, issuer).expect("certificate");
    let (cert_path, key_path) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

#[test]
fn a_replica_speaks_tls_to_etcd_with_a_client_certificate() {
    let Some(dir) = etcd_workspace() else {
        return;
    };
    let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let ca = params.self_signed(&ca_key).expect("CA");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, ca.pem()).expect("write CA");
    let issuer = rcgen::Issuer::new(params, ca_key);
    let (server_cert, server_key) =
        signed(dir.path(), "etcd", &["127.0.0.1", "localhost"], &issuer);
    let (client_cert, client_key) = signed(dir.path(), "capstan", &["capstan"], &issuer);
    let mut member = Member {
        name: "tls".into(),
        client: free_port(),
        peer: free_port(),
        dir: dir.path().to_path_buf(),
        child: None,
    };
    let cluster = format!("tls=http://127.0.0.1:{}", member.peer);
    let path = |p: &PathBuf| p.to_string_lossy().into_owned();
    let tls = [
        "--cert-file".to_string(),
        path(&server_cert),
        "--key-file".into(),
        path(&server_key),
        "--client-cert-auth".into(),
        "--trusted-ca-file".into(),
        path(&ca_path),
    ];
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    member.start_with(&cluster, "new", &tls, "https");
    let listening = || std::net::TcpStream::connect(("127.0.0.1", member.client)).is_ok();
    assert!(until(Duration::from_secs(20), listening), "etcd listens");
    let endpoint = format!("https://127.0.0.1:{}", member.client);
    let (ca_path, client_cert, client_key) =
        (path(&ca_path), path(&client_cert), path(&client_key));
    let server = Server::start_with(&[
        "--storage",
        "etcd",
        "--etcd-servers",
        &endpoint,
        "--etcd-cafile",
        &ca_path,
        "--etcd-certfile",
        &client_cert,
        "--etcd-keyfile",
        &client_key,
    ]);
    server.ok(&["create", "service", "clusterip", "secure", "--tcp=80"]);
    let listed = server.ok(&["get", "service", "secure", "-o", "name"]);
    assert_eq!(listed.trim(), "service/secure");
}
