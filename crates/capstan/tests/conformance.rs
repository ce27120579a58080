//! The conformance cases (the project's `conformance-cases.md`), as data: every `tests/conformance/*.json`
//! file holds cases, and each case is its own test (`cargo test --test conformance -- <id>`
//! runs one). Cases run against the real binary, one server per cluster fixture, in order
//! within a cluster; after each case, everything it created is deleted (found through
//! discovery, so a new kind is cleaned up without touching this file).
//!
//! Fixtures: `S` single-stack, `D` dual-stack (as the spec), `N` a two-port node port range.
//! A case file is checked as it loads: an unknown key, cluster or expectation fails the run
//! instead of being silently ignored.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use common::{Server, raw, raw_accepting, warnings};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::{Value, json};

/// The cluster fixtures and their flags.
const CLUSTERS: &[(&str, &[&str])] = &[
    (
        "S",
        &[
            "--service-cluster-ip-range",
            "10.96.0.0/16",
            "--service-node-port-range",
            "30000-32767",
        ],
    ),
    (
        "D",
        &[
            "--service-cluster-ip-range",
            "10.96.0.0/16,fd00:10:96::/108",
            "--service-node-port-range",
            "30000-32767",
        ],
    ),
    (
        "N",
        &[
            "--service-cluster-ip-range",
            "10.96.0.0/16",
            "--service-node-port-range",
            "30000-30001",
        ],
    ),
];

const CASE_KEYS: &[&str] = &[
    "id",
    "cluster",
    "setup",
    "request",
    "expect",
    "eventually",
    "skip",
    "xfail",
    "source",
];
const REQUEST_KEYS: &[&str] = &[
    "method",
    "path",
    "content_type",
    "accept",
    "body",
    "raw",
    "repeat",
];
const EXPECT_KEYS: &[&str] = &[
    "code",
    "subset",
    "absent",
    "checks",
    "causes",
    "message",
    "message_contains",
    "warnings",
    "headers",
];
const CHECK_KEYS: &[&str] = &[
    "path",
    "equals",
    "in_cidr",
    "not_in",
    "equals_path",
    "regex",
    "range",
    "length",
];

/// What is wrong with a case's shape, if anything.
fn shape_problems(case: &Value) -> Vec<String> {
    fn unknown(value: &Value, allowed: &[&str], at: &str, out: &mut Vec<String>) {
        match value.as_object() {
            Some(map) => out.extend(
                map.keys()
                    .filter(|k| !allowed.contains(&k.as_str()))
                    .map(|k| format!("unknown key {at}{k}")),
            ),
            None => out.push(format!("{at} is not an object")),
        }
    }
    let mut out = Vec::new();
    unknown(case, CASE_KEYS, "", &mut out);
    if !case["id"].is_string() {
        out.push("no id".into());
    }
    if !CLUSTERS.iter().any(|(c, _)| case["cluster"] == *c) {
        out.push(format!("unknown cluster {}", case["cluster"]));
    }
    unknown(&case["request"], REQUEST_KEYS, "request.", &mut out);
    for setup in case["setup"].as_array().into_iter().flatten() {
        unknown(setup, REQUEST_KEYS, "setup[].", &mut out);
    }
    unknown(&case["expect"], EXPECT_KEYS, "expect.", &mut out);
    if !case["expect"]["code"].is_u64() {
        out.push("expect.code missing".into());
    }
    for check in case["expect"]["checks"].as_array().into_iter().flatten() {
        unknown(check, CHECK_KEYS, "expect.checks[].", &mut out);
        if check.as_object().map(|m| m.len()) != Some(2) || !check["path"].is_string() {
            out.push(format!("a check is a path and one test: {check}"));
        }
    }
    out
}

/// The value at a dotted path (`items.0.metadata.name`); a key with dots in it (a label)
/// escapes them (`labels.kubernetes\\.io/service-name`).
fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut steps = Vec::new();
    let mut step = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => step.extend(chars.next()),
            '.' => steps.push(std::mem::take(&mut step)),
            c => step.push(c),
        }
    }
    steps.push(step);
    steps
        .iter()
        .try_fold(value, |v, step| match step.parse::<usize>() {
            Ok(i) if v.is_array() => v.get(i),
            _ => v.get(step.as_str()),
        })
}

/// Whether `want` is contained in `have`: objects by key (recursively), everything else equal.
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| contains(hv, wv))),
        _ => have == want,
    }
}

fn in_cidr(ip: &str, cidr: &str) -> bool {
    match (ip.parse::<std::net::IpAddr>(), cidr.parse::<ipnet::IpNet>()) {
        (Ok(ip), Ok(net)) => net.contains(&ip),
        _ => false,
    }
}

fn check_one(check: &Value, body: &Value) -> bool {
    let value = lookup(body, check["path"].as_str().unwrap_or_default());
    let text = value.and_then(Value::as_str).unwrap_or_default();
    if let Some(want) = check.get("equals") {
        value == Some(want)
    } else if let Some(cidr) = check["in_cidr"].as_str() {
        in_cidr(text, cidr)
    } else if let Some(list) = check["not_in"].as_array() {
        value.is_some() && !list.iter().any(|v| Some(v) == value)
    } else if let Some(other) = check["equals_path"].as_str() {
        value.is_some() && value == lookup(body, other)
    } else if let Some(pattern) = check["regex"].as_str() {
        regex_lite::Regex::new(pattern).is_ok_and(|r| r.is_match(text))
    } else if let Some(range) = check["range"].as_array() {
        let n = value.and_then(Value::as_i64).unwrap_or(i64::MIN);
        n >= range[0].as_i64().unwrap_or(0) && n <= range[1].as_i64().unwrap_or(0)
    } else if let Some(length) = check["length"].as_u64() {
        value.and_then(Value::as_array).map(Vec::len) == usize::try_from(length).ok()
    } else {
        false
    }
}

fn check(expect: &Value, body: &Value, headers: &http::HeaderMap) -> Vec<String> {
    let mut problems = Vec::new();
    let sent = warnings(headers);
    for want in expect["warnings"].as_array().into_iter().flatten() {
        let want = want.as_str().unwrap_or_default();
        if !sent.iter().any(|w| w == want) {
            problems.push(format!("warning {want:?} missing from {sent:?}"));
        }
    }
    for (name, want) in expect["headers"].as_object().into_iter().flatten() {
        let have = headers.get(name.as_str()).and_then(|v| v.to_str().ok());
        if have != want.as_str() {
            problems.push(format!("header {name}: want {want}, have {have:?}"));
        }
    }
    if let Some(subset) = expect.get("subset")
        && !contains(body, subset)
    {
        problems.push(format!("subset {subset} not in {body}"));
    }
    for path in expect["absent"].as_array().into_iter().flatten() {
        let path = path.as_str().unwrap_or_default();
        if lookup(body, path).is_some() {
            problems.push(format!("{path} should be absent"));
        }
    }
    for c in expect["checks"].as_array().into_iter().flatten() {
        if !check_one(c, body) {
            let value = lookup(body, c["path"].as_str().unwrap_or_default());
            problems.push(format!("check {c} failed on {value:?}"));
        }
    }
    if let Some(causes) = expect.get("causes") {
        let have = body
            .pointer("/details/causes")
            .cloned()
            .unwrap_or(json!([]));
        if &have != causes {
            problems.push(format!("causes\n    want {causes}\n    have {have}"));
        }
    }
    if let Some(message) = expect.get("message")
        && body.get("message") != Some(message)
    {
        problems.push(format!(
            "message\n    want {message}\n    have {}",
            body["message"]
        ));
    }
    if let Some(part) = expect["message_contains"].as_str()
        && !body["message"].as_str().unwrap_or_default().contains(part)
    {
        problems.push(format!(
            "message should contain {part:?}: {}",
            body["message"]
        ));
    }
    problems
}

fn substitute(value: &Value, current: &Value) -> Value {
    match value {
        Value::String(s) if s == "$RV" => current["metadata"]["resourceVersion"].clone(),
        Value::String(s) if s == "$UID" => current["metadata"]["uid"].clone(),
        Value::String(s) if s == "$CLUSTER_IP" => current["spec"]["clusterIP"].clone(),
        Value::Array(items) => Value::Array(items.iter().map(|v| substitute(v, current)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), substitute(v, current)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The request's body: `body` as JSON (with `$RV`, `$UID`, `$CLUSTER_IP` taken from the
/// object at the request's path), `raw` as text, or `repeat` (`{"text", "count"}`).
async fn body_bytes(client: &kube::Client, request: &Value, path: &str) -> Vec<u8> {
    if let Some(text) = request["raw"].as_str() {
        return text.as_bytes().to_vec();
    }
    if let Some(repeat) = request.get("repeat") {
        let count = usize::try_from(repeat["count"].as_u64().unwrap_or(0)).unwrap_or(0);
        return repeat["text"]
            .as_str()
            .unwrap_or_default()
            .repeat(count)
            .into_bytes();
    }
    let Some(body) = request.get("body") else {
        return Vec::new();
    };
    if !body.to_string().contains('$') {
        return body.to_string().into_bytes();
    }
    let object_path = path
        .split('?')
        .next()
        .unwrap_or(path)
        .trim_end_matches("/status")
        .trim_end_matches("/finalize");
    let (_, current, _) = raw(client, "GET", object_path, None, Vec::new()).await;
    substitute(body, &current).to_string().into_bytes()
}

async fn send(client: &kube::Client, request: &Value) -> (u16, Value, http::HeaderMap) {
    let method = request["method"].as_str().unwrap_or("GET");
    let path = request["path"].as_str().unwrap_or_default();
    let bytes = body_bytes(client, request, path).await;
    let content_type = request["content_type"]
        .as_str()
        .unwrap_or("application/json");
    let accept = request["accept"].as_str();
    raw_accepting(client, method, path, Some(content_type), accept, bytes).await
}

/// One cluster fixture: its server, started on first use, and the lock that runs its cases
/// one at a time.
struct Cluster {
    _server: Server,
    client: kube::Client,
    turn: tokio::sync::Mutex<()>,
}

type Clusters = Mutex<HashMap<&'static str, Arc<Cluster>>>;

fn clusters() -> &'static Clusters {
    static CLUSTERS_RUNNING: OnceLock<Clusters> = OnceLock::new();
    CLUSTERS_RUNNING.get_or_init(Default::default)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

async fn cluster(name: &str) -> Result<Arc<Cluster>, Failed> {
    let (id, flags) = CLUSTERS
        .iter()
        .find(|(c, _)| *c == name)
        .ok_or_else(|| Failed::from(format!("unknown cluster {name}")))?;
    if let Some(cluster) = clusters().lock().map_err(|_| "poisoned")?.get(id) {
        return Ok(cluster.clone());
    }
    let server = Server::start_with(flags);
    let client = server.client().await;
    let fresh = Arc::new(Cluster {
        _server: server,
        client,
        turn: tokio::sync::Mutex::new(()),
    });
    let mut running = clusters().lock().map_err(|_| "poisoned")?;
    Ok(running.entry(id).or_insert(fresh).clone())
}

/// Every listable resource the server serves itself, as (collection path, namespaced): core,
/// and the groups discovery lists that no remote APIService claims (a case's remote
/// APIService names a group no backend serves, and the client would retry its 503 for ever).
async fn discovered(client: &kube::Client) -> Vec<(String, bool)> {
    let (_, apiservices, _) = raw(
        client,
        "GET",
        "/apis/apiregistration.k8s.io/v1/apiservices",
        None,
        Vec::new(),
    )
    .await;
    let remote: Vec<&str> = apiservices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| !a["spec"]["service"].is_null())
        .filter_map(|a| a["spec"]["group"].as_str())
        .collect();
    let mut roots = vec!["/api/v1".to_string()];
    let (_, groups, _) = raw(client, "GET", "/apis", None, Vec::new()).await;
    for group in groups["groups"].as_array().into_iter().flatten() {
        if let (Some(name), Some(version)) = (
            group["name"].as_str(),
            group["preferredVersion"]["groupVersion"].as_str(),
        ) && !remote.contains(&name)
        {
            roots.push(format!("/apis/{version}"));
        }
    }
    let mut out = Vec::new();
    for root in roots {
        let (_, list, _) = raw(client, "GET", &root, None, Vec::new()).await;
        for resource in list["resources"].as_array().into_iter().flatten() {
            let name = resource["name"].as_str().unwrap_or_default();
            let listable = resource["verbs"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v == "list"));
            if listable && !name.contains('/') {
                out.push((
                    format!("{root}/{name}"),
                    resource["namespaced"].as_bool() == Some(true),
                ));
            }
        }
    }
    out
}

/// The path of every object the server holds, by discovery.
async fn inventory(client: &kube::Client) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (collection, namespaced) in discovered(client).await {
        let (_, list, _) = raw(client, "GET", &collection, None, Vec::new()).await;
        let (root, plural) = collection.rsplit_once('/').unwrap_or_default();
        for item in list["items"].as_array().into_iter().flatten() {
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            let path = match item["metadata"]["namespace"].as_str() {
                Some(ns) if namespaced => format!("{root}/namespaces/{ns}/{plural}/{name}"),
                _ => format!("{collection}/{name}"),
            };
            out.insert(path);
        }
    }
    out
}

/// Deletes what a case created (what the server holds now and did not before), until none is
/// left: finalizers a case set are cleared (no controller here would ever remove them), and
/// controllers recreate some objects for a moment (Endpoints of a deleted Service).
async fn clean_up(client: &kube::Client, before: &BTreeSet<String>) -> Result<(), Failed> {
    for _ in 0..50 {
        let now = inventory(client).await;
        let created: Vec<&String> = now.difference(before).collect();
        if created.is_empty() {
            return Ok(());
        }
        for path in created {
            let _ = raw_accepting(
                client,
                "PATCH",
                path,
                Some("application/merge-patch+json"),
                None,
                br#"{"metadata":{"finalizers":null}}"#.to_vec(),
            )
            .await;
            // A namespace's own finalizer (no namespace controller waits 5 s here): lifted
            // through `/finalize`.
            if path.starts_with("/api/v1/namespaces/") && path.matches('/').count() == 4 {
                let (_, mut namespace, _) = raw(client, "GET", path, None, Vec::new()).await;
                namespace["spec"]["finalizers"] = json!([]);
                let finalize = format!("{path}/finalize");
                let body = namespace.to_string().into_bytes();
                let _ = raw(client, "PUT", &finalize, Some("application/json"), body).await;
            }
            // Immediately, for kinds that delete gracefully (Pods).
            let path = format!("{path}?gracePeriodSeconds=0");
            let _ = raw(client, "DELETE", &path, None, Vec::new()).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Err("objects the case created could not be deleted".into())
}

async fn run_case(case: Value) -> Result<(), Failed> {
    let cluster = cluster(case["cluster"].as_str().unwrap_or_default()).await?;
    let _turn = cluster.turn.lock().await;
    let client = &cluster.client;
    let before = inventory(client).await;
    let mut problems = Vec::new();
    for (i, setup) in case["setup"].as_array().into_iter().flatten().enumerate() {
        let (code, body, _) = send(client, setup).await;
        if !(200..300).contains(&code) {
            problems.push(format!("setup #{i} answered {code}: {body}"));
        }
    }
    if problems.is_empty() {
        // `eventually`: the request is repeated until the expectations hold (5 s), for
        // outcomes a controller produces asynchronously.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let (code, body, headers) = send(client, &case["request"]).await;
            let expect = &case["expect"];
            let attempt = if Some(u64::from(code)) == expect["code"].as_u64() {
                check(expect, &body, &headers)
            } else {
                vec![format!("code {code}, want {}: {body}", expect["code"])]
            };
            if attempt.is_empty()
                || case["eventually"].as_bool() != Some(true)
                || std::time::Instant::now() > deadline
            {
                problems.extend(attempt);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    let cleaned = clean_up(client, &before).await;
    // `xfail` marks a case known to fail, with the reason; it must keep failing, so a fix is
    // noticed and the marker removed.
    match (case["xfail"].as_str(), problems.is_empty()) {
        (None, false) => return Err(problems.join("\n  ").into()),
        (Some(_), true) => return Err("passes now; remove its xfail".into()),
        _ => {}
    }
    cleaned
}

/// Every case of every file in `tests/conformance/`, as `(file stem, case)`.
fn load_cases() -> Result<Vec<(String, Value)>, String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    let mut ids = BTreeSet::new();
    for path in files {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let cases: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        for case in cases {
            let problems = shape_problems(&case);
            if !problems.is_empty() {
                return Err(format!(
                    "{}: case {}: {}",
                    path.display(),
                    case["id"],
                    problems.join("; ")
                ));
            }
            if !ids.insert(case["id"].as_str().unwrap_or_default().to_string()) {
                return Err(format!(
                    "{}: duplicate case id {}",
                    path.display(),
                    case["id"]
                ));
            }
            out.push((stem.clone(), case));
        }
    }
    Ok(out)
}

fn main() -> std::process::ExitCode {
    let arguments = Arguments::from_args();
    let trials = match load_cases() {
        Ok(cases) => cases
            .into_iter()
            .map(|(file, case)| {
                let name = format!("{file}::{}", case["id"].as_str().unwrap_or_default());
                let ignored = case.get("skip").is_some();
                Trial::test(name, move || runtime().block_on(run_case(case)))
                    .with_ignored_flag(ignored)
            })
            .collect(),
        // A malformed case file is one failing test, not a silently shorter run.
        Err(problem) => vec![Trial::test("case files", move || Err(problem.into()))],
    };
    let conclusion = libtest_mimic::run(&arguments, trials);
    // The servers stop when their fixtures drop.
    if let Ok(mut running) = clusters().lock() {
        running.clear();
    }
    conclusion.exit_code()
}
