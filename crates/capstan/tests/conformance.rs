//! The concrete cases of `spec/conformance-cases.md` (Service sections), as data:
//! `tests/conformance/services.json`, run against the real binary. Adding a case is adding an
//! entry. Each case runs on a clean `default` namespace (only the `kubernetes` Service).
//! Fixtures: `S` single-stack, `D` dual-stack (as the spec), `N` a two-port node port range.

mod common;

use common::{Server, raw, raw_accepting, warnings};
use serde_json::{Value, json};

fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |v, step| match step.parse::<usize>() {
            Ok(i) if v.is_array() => v.get(i),
            _ => v.get(step),
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
    let Some((net, bits)) = cidr.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u32>() else {
        return false;
    };
    match (
        ip.parse::<std::net::IpAddr>(),
        net.parse::<std::net::IpAddr>(),
    ) {
        (Ok(std::net::IpAddr::V4(a)), Ok(std::net::IpAddr::V4(n))) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (Ok(std::net::IpAddr::V6(a)), Ok(std::net::IpAddr::V6(n))) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn check(case: &Value, body: &Value, warnings: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let expect = &case["expect"];
    for want in expect["warnings"].as_array().into_iter().flatten() {
        let want = want.as_str().unwrap_or_default();
        if !warnings.iter().any(|w| w == want) {
            problems.push(format!("warning {want:?} missing from {warnings:?}"));
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
        let path = c["path"].as_str().unwrap_or_default();
        let value = lookup(body, path);
        let text = value.and_then(Value::as_str).unwrap_or_default();
        let ok = if let Some(cidr) = c["in_cidr"].as_str() {
            in_cidr(text, cidr)
        } else if let Some(list) = c["not_in"].as_array() {
            value.is_some() && !list.iter().any(|v| Some(v) == value)
        } else if let Some(other) = c["equals_path"].as_str() {
            value.is_some() && value == lookup(body, other)
        } else if let Some(pattern) = c["regex"].as_str() {
            simple_regex(pattern, text)
        } else if let Some(range) = c["range"].as_array() {
            let n = value.and_then(Value::as_i64).unwrap_or(i64::MIN);
            n >= range[0].as_i64().unwrap_or(0) && n <= range[1].as_i64().unwrap_or(0)
        } else if let Some(length) = c["length"].as_u64() {
            value.and_then(Value::as_array).map(Vec::len) == Some(length as usize)
        } else {
            false
        };
        if !ok {
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

fn simple_regex(pattern: &str, text: &str) -> bool {
    regex_lite::Regex::new(pattern).is_ok_and(|r| r.is_match(text))
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

async fn send(client: &kube::Client, request: &Value) -> (u16, Value, Vec<String>) {
    let method = request["method"].as_str().unwrap_or("GET");
    let path = request["path"].as_str().unwrap_or_default();
    let mut body = request.get("body").cloned();
    if let Some(b) = &body
        && b.to_string().contains('$')
    {
        let name = path
            .trim_end_matches("/status")
            .rsplit('/')
            .next()
            .unwrap_or_default();
        let (_, current, _) = raw(
            client,
            "GET",
            &format!("/api/v1/namespaces/default/services/{name}"),
            None,
            Vec::new(),
        )
        .await;
        body = Some(substitute(b, &current));
    }
    let content_type = request["content_type"]
        .as_str()
        .unwrap_or("application/json");
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let accept = request["accept"].as_str();
    let (code, value, headers) =
        raw_accepting(client, method, path, Some(content_type), accept, bytes).await;
    (code, value, warnings(&headers))
}

async fn run_cluster(
    cluster: &str,
    flags: &[&str],
    cases: &[Value],
) -> (usize, usize, Vec<String>) {
    let server = Server::start_with(flags);
    let client = server.client().await;
    let (mut ran, mut skipped, mut failures) = (0, 0, Vec::new());
    for case in cases.iter().filter(|c| c["cluster"] == cluster) {
        let id = case["id"].as_str().unwrap_or("?");
        if case.get("skip").is_some() {
            skipped += 1;
            continue;
        }
        ran += 1;
        let mut problems = Vec::new();
        for (i, setup) in case["setup"].as_array().into_iter().flatten().enumerate() {
            let (code, body, _) = send(&client, setup).await;
            if !(200..300).contains(&code) {
                problems.push(format!("setup #{i} answered {code}: {body}"));
            }
        }
        if problems.is_empty() {
            // `eventually`: the request is repeated until the expectations hold (5 s), for
            // outcomes a controller produces asynchronously.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let (code, body, warnings) = send(&client, &case["request"]).await;
                let mut attempt = Vec::new();
                if Some(u64::from(code)) != case["expect"]["code"].as_u64() {
                    attempt.push(format!(
                        "code {code}, want {}: {body}",
                        case["expect"]["code"]
                    ));
                } else {
                    attempt.extend(check(case, &body, &warnings));
                }
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
        // `xfail` marks a case known to fail, with the reason; it must keep failing, so a
        // fix is noticed and the marker removed.
        match (case["xfail"].as_str(), problems.is_empty()) {
            (None, false) => failures.push(format!("{id}: {}", problems.join("\n  "))),
            (Some(_), true) => failures.push(format!("{id}: passes now; remove its xfail")),
            _ => {}
        }
        for collection in [
            "/api/v1/namespaces/default/services?fieldSelector=metadata.name%21%3Dkubernetes",
            "/api/v1/namespaces/default/endpoints",
            "/api/v1/namespaces/default/pods?gracePeriodSeconds=0",
        ] {
            let _ = raw(&client, "DELETE", collection, None, Vec::new()).await;
        }
    }
    (ran, skipped, failures)
}

/// Every case file in `tests/conformance/` (`services.json`, `endpoints.json`, …).
fn load_cases() -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("conformance directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("case file");
            serde_json::from_str::<Vec<Value>>(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

#[tokio::test]
async fn service_conformance_cases() {
    let cases = load_cases();
    let single = [
        "--service-cluster-ip-range",
        "10.96.0.0/16",
        "--service-node-port-range",
        "30000-32767",
    ];
    let dual = [
        "--service-cluster-ip-range",
        "10.96.0.0/16,fd00:10:96::/108",
        "--service-node-port-range",
        "30000-32767",
    ];
    let (ran_s, skipped_s, mut failures) = run_cluster("S", &single, &cases).await;
    let (ran_d, skipped_d, failures_d) = run_cluster("D", &dual, &cases).await;
    failures.extend(failures_d);
    let tiny = [
        "--service-cluster-ip-range",
        "10.96.0.0/16",
        "--service-node-port-range",
        "30000-30001",
    ];
    let (ran_n, skipped_n, failures_n) = run_cluster("N", &tiny, &cases).await;
    failures.extend(failures_n);
    let (ran_d, skipped_d) = (ran_d + ran_n, skipped_d + skipped_n);
    eprintln!(
        "{} cases ran, {} skipped, {} failed",
        ran_s + ran_d,
        skipped_s + skipped_d,
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
