//! Several replicas on one etcd: the controllers run on the replica holding the
//! `kube-system/capstan-controllers` Lease and move to another when it dies (SIGKILL: once the
//! lease expires; SIGTERM: at once, the lease released), reads on one replica see what another
//! acknowledged, and allocation stays unique when replicas race.
//!
//! Needs the etcd engine and an etcd (`CAPSTAN_TEST_ETCD_ENDPOINTS`, which `.ci/run` sets).

#![cfg(feature = "etcd")]

mod common;

use std::time::{Duration, Instant};

use common::{Server, set_pod_status, until};

/// The etcd to use, and a key prefix of this test's own there; without an etcd the test fails
/// under CI and skips visibly elsewhere ([`common::etcd_endpoints`]).
#[track_caller]
fn cluster(name: &str) -> Option<(String, String)> {
    let endpoints = common::etcd_endpoints()?;
    Some((
        endpoints,
        format!("/capstan-{name}-{}/", std::process::id()),
    ))
}

/// Short election timings, so the test waits seconds, not the defaults' 15.
const LEASE: Duration = Duration::from_secs(3);

fn replica(endpoints: &str, prefix: &str) -> Server {
    replica_with(endpoints, prefix, &[])
}

fn replica_with(endpoints: &str, prefix: &str, extra: &[&str]) -> Server {
    let mut flags = vec![
        "--storage",
        "etcd",
        "--etcd-servers",
        endpoints,
        "--etcd-prefix",
        prefix,
        "--leader-elect-lease-duration",
        "3s",
        "--leader-elect-renew-deadline",
        "2s",
        "--leader-elect-retry-period",
        "500ms",
    ];
    flags.extend(extra);
    Server::start_with(&flags)
}

/// Waits until `server` sees the lease held by one of `replicas`; returns that replica's index.
fn leader_among(server: &Server, replicas: &[&Server], within: Duration) -> Option<usize> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let holder = common::lease_holder(server);
        if !holder.is_empty()
            && let Some(i) = replicas.iter().position(|r| r.log().contains(&holder))
        {
            return Some(i);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// The addresses of an Endpoints' `field` (`addresses`, `notReadyAddresses`).
fn ips_of(server: &Server, name: &str, field: &str) -> String {
    let path = format!("jsonpath={{.subsets[*].{field}[*].ip}}");
    let out = server.kubectl(&["get", "endpoints", name, "-o", &path]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn endpoint_ips(server: &Server, field: &str) -> String {
    ips_of(server, "web", field)
}

#[test]
fn controllers_fail_over_between_replicas() {
    let Some((endpoints, prefix)) = cluster("replicas") else {
        return;
    };
    let mut servers = [replica(&endpoints, &prefix), replica(&endpoints, &prefix)];
    let leader = {
        let [a, b] = &servers;
        leader_among(a, &[a, b], Duration::from_secs(10)).expect("one replica leads")
    };
    let follower = 1 - leader;

    // What one replica acknowledges, the other reads at once.
    servers[follower].ok(&["create", "service", "clusterip", "seen", "--tcp=80"]);
    servers[leader].ok(&["get", "service", "seen"]);

    // The leader's controllers keep Endpoints, whichever replica the pod is written on.
    servers[follower].ok(&["create", "service", "clusterip", "web", "--tcp=80"]);
    servers[follower].ok(&["set", "selector", "service", "web", "app=web"]);
    servers[follower].ok(&["run", "web", "--image=x", "--labels=app=web"]);
    set_pod_status(&servers[follower], "web", "10.244.3.1", true);
    assert!(
        until(Duration::from_secs(10), || endpoint_ips(
            &servers[leader],
            "addresses"
        ) == "10.244.3.1"),
        "endpoints follow the pod"
    );

    // The leader dies without a word: the other replica takes over once the lease expires.
    // The leader dies without a word, right after a pod changed: the other replica takes
    // over once the lease expires, and its controllers write the change.
    servers[leader].kill();
    let killed = Instant::now();
    let survivor = &servers[follower];
    set_pod_status(survivor, "web", "10.244.3.1", false);
    let took_over = leader_among(survivor, &[survivor], LEASE * 4).is_some();
    let failover = killed.elapsed();
    assert!(
        took_over,
        "the survivor holds the lease: {}",
        survivor.log()
    );
    assert!(
        failover < LEASE + Duration::from_secs(3),
        "took over within the lease duration and a retry: {failover:?}"
    );
    let updated = until(Duration::from_secs(10), || {
        endpoint_ips(survivor, "notReadyAddresses") == "10.244.3.1"
    });
    assert!(updated, "the survivor's controllers keep the endpoints");
    eprintln!(
        "lease taken {failover:?} and the Endpoints updated {:?} after the leader was killed",
        killed.elapsed()
    );

    // The dead replica comes back as a candidate; the leader is stopped properly and
    // releases the lease, so the other takes over without waiting for it to expire.
    servers[leader].launch();
    let back = &servers[leader];
    assert!(
        until(Duration::from_secs(5), || !common::lease_holder(back)
            .is_empty()),
        "the restarted replica reads the lease"
    );
    servers[follower].stop();
    let stopped = Instant::now();
    let back = &servers[leader];
    assert!(
        leader_among(back, &[back], LEASE * 4).is_some(),
        "the restarted replica leads: {}",
        back.log()
    );
    assert!(
        stopped.elapsed() < LEASE,
        "a released lease is taken at once: {:?}",
        stopped.elapsed()
    );
    set_pod_status(back, "web", "10.244.3.1", true);
    assert!(
        until(Duration::from_secs(10), || endpoint_ips(back, "addresses")
            == "10.244.3.1"),
        "the new leader's controllers keep the endpoints"
    );
}

#[test]
fn a_follower_takes_a_released_lease_without_waiting_for_its_retry() {
    let Some((endpoints, prefix)) = cluster("released") else {
        return;
    };
    // A retry period far longer than the wait below: a follower that only polled would
    // almost never see the release in time.
    let slow = |endpoints: &str| {
        let mut flags = vec!["--storage", "etcd", "--etcd-servers", endpoints];
        flags.extend([
            "--etcd-prefix",
            &prefix,
            "--leader-elect-lease-duration",
            "60s",
        ]);
        flags.extend(["--leader-elect-renew-deadline", "40s"]);
        flags.extend(["--leader-elect-retry-period", "30s"]);
        Server::start_with(&flags)
    };
    let mut servers = [slow(&endpoints), slow(&endpoints)];
    let leader = {
        let [a, b] = &servers;
        leader_among(a, &[a, b], Duration::from_secs(10)).expect("one replica leads")
    };
    let follower = 1 - leader;
    // SIGTERM: the leader stops its controllers and releases the lease; the follower, which
    // follows the lease through its informer, takes it at once.
    servers[leader].stop();
    let stopped = Instant::now();
    let survivor = &servers[follower];
    let took = leader_among(survivor, &[survivor], Duration::from_secs(10));
    assert!(
        took.is_some(),
        "the follower took the released lease {:?} after the leader stopped: {}",
        stopped.elapsed(),
        survivor.log()
    );
}

#[test]
fn racing_replicas_allocate_unique_cluster_ips() {
    let Some((endpoints, prefix)) = cluster("race") else {
        return;
    };
    // A /28 holds 14 addresses: 1 for `kubernetes`, 12 for the racers, 1 left.
    let range = ["--service-cluster-ip-range", "10.97.0.0/28"];
    let a = replica_with(&endpoints, &prefix, &range);
    let b = replica_with(&endpoints, &prefix, &range);
    std::thread::scope(|scope| {
        for i in 0..6 {
            for (server, side) in [(&a, "a"), (&b, "b")] {
                scope.spawn(move || {
                    let name = format!("{side}{i}");
                    server.ok(&["create", "service", "clusterip", &name, "--tcp=80"]);
                });
            }
        }
    });
    for server in [&a, &b] {
        let (ips, distinct) = common::cluster_ips(server);
        assert_eq!(ips.len(), 13, "{ips:?}");
        assert!(distinct, "no address twice: {ips:?}");
    }
    // The last address goes to one of two racers; the other hears the range is full.
    let (x, y) = std::thread::scope(|scope| {
        let x = scope.spawn(|| a.kubectl(&["create", "service", "clusterip", "x", "--tcp=80"]));
        let y = scope.spawn(|| b.kubectl(&["create", "service", "clusterip", "y", "--tcp=80"]));
        (x.join().expect("x"), y.join().expect("y"))
    });
    assert_ne!(
        x.status.success(),
        y.status.success(),
        "exactly one racer gets the last address"
    );
    let refused = if x.status.success() { &y } else { &x };
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("range is full"), "{message}");
}

#[test]
fn the_kubernetes_service_lists_every_live_replica() {
    let Some((endpoints, prefix)) = cluster("masters") else {
        return;
    };
    let addresses = ["10.0.0.1", "10.0.0.2"];
    let mut servers =
        addresses.map(|a| replica_with(&endpoints, &prefix, &["--advertise-address", a]));
    let published = |server: &Server| {
        let out = server.kubectl(&[
            "get",
            "endpointslice",
            "kubernetes",
            "-o",
            "jsonpath={.endpoints[*].addresses[0]}",
        ]);
        let slice = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (ips_of(server, "kubernetes", "addresses"), slice)
    };
    let both = (
        "10.0.0.1 10.0.0.2".to_string(),
        "10.0.0.1 10.0.0.2".to_string(),
    );
    assert!(
        until(Duration::from_secs(15), || published(&servers[0]) == both),
        "both replicas are published: {:?}",
        published(&servers[0])
    );
    // A replica that dies without a word drops out once its record lapses (15 s) and the
    // leader next reconciles (every 10 s).
    let leader = {
        let [a, b] = &servers;
        leader_among(a, &[a, b], Duration::from_secs(10)).expect("one replica leads")
    };
    let victim = 1 - leader;
    servers[victim].kill();
    let survivor = addresses[leader].to_string();
    let alone = (survivor.clone(), survivor);
    assert!(
        until(Duration::from_secs(40), || published(&servers[leader])
            == alone),
        "the dead replica dropped out: {:?}",
        published(&servers[leader])
    );
}

#[test]
fn a_watch_resumes_on_another_replica_without_gaps_or_repeats() {
    let Some((endpoints, prefix)) = cluster("resume") else {
        return;
    };
    let (a, b) = (replica(&endpoints, &prefix), replica(&endpoints, &prefix));
    for name in ["first", "second", "third"] {
        a.ok(&["create", "service", "clusterip", name, "--tcp=80"]);
    }
    // What a watcher on A saw last: the first create.
    let seen = a.jsonpath(&["svc"], "{.items[0].metadata.resourceVersion}");
    a.ok(&["delete", "service", "first"]);
    // The watcher saw `first` on A; it goes on from there on B.
    let path = format!(
        "/api/v1/namespaces/default/services?watch=1&resourceVersion={seen}&timeoutSeconds=2"
    );
    let stream = b.ok(&["get", "--raw", &path]);
    let events: Vec<String> = stream
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap_or_default(),
                e["object"]["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        events,
        ["ADDED second", "ADDED third", "DELETED first"],
        "{stream}"
    );
}
