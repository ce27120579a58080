//! `abuse`: a fuzzing campaign against a running server. Generated requests — random and
//! mutated paths, query parameters, headers, media types, and bodies mutated from valid
//! Services, Endpoints, Pods, APIServices, Namespaces, DeleteOptions and patches of every type —
//! are sent over raw HTTP/1.1 (so nothing is cleaned up or retried by a client library), with a
//! share of malformed HTTP besides. Every answer is classified; a 5xx that is not one the
//! server documents, or a connection the server drops on a well-formed request, is a finding.
//! Afterwards the server must still serve a create, get, list and delete.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::Bench;
use crate::watch::{Dialer, Io};

mod generate;
mod wire;

use generate::Generator;
use wire::{EXCHANGE_TIMEOUT, Outcome, exchange, serialize};

/// Whether a 5xx is one the server documents (README "Limits and failure behaviour").
fn documented(code: u16, body: &[u8], target: &str) -> bool {
    let text = String::from_utf8_lossy(body);
    match code {
        // An aggregated group whose backend is unavailable (or a bad caBundle) answers 503.
        503 | 500
            if target.starts_with("/apis/")
                && !target.starts_with("/apis/apiregistration.k8s.io") =>
        {
            true
        }
        500 => text.contains("etcdserver: request is too large"),
        504 => text.contains("Timeout"),
        _ => false,
    }
}

#[derive(Default)]
struct Tally {
    codes: BTreeMap<u16, u64>,
    documented_5xx: BTreeMap<String, u64>,
    /// The messages of the documented 5xx (their first 60 characters).
    documented_messages: BTreeMap<String, u64>,
    findings: Vec<String>,
    dropped: u64,
    /// Requests sent on a kept-alive connection the server had closed without saying so.
    dead: u64,
    timed_out: u64,
    garbage: u64,
}

impl Bench {
    /// The `abuse` scenario: `--count` generated requests from `--concurrency` connections.
    pub async fn abuse(&self) -> anyhow::Result<Value> {
        let args = &self.args;
        let dialer = Arc::new(Dialer::new(&self.config)?);
        let credentials = Arc::new(dialer.credentials().await?);
        let tally = Arc::new(Mutex::new(Tally::default()));
        let next = Arc::new(AtomicUsize::new(0));
        let count = args.count;
        let started = Instant::now();
        let ticker = crate::progress("abuse".into(), next.clone(), count);
        let mut workers = Vec::new();
        for worker in 0..args.concurrency.max(1) {
            let (dialer, credentials, tally, next) = (
                dialer.clone(),
                credentials.clone(),
                tally.clone(),
                next.clone(),
            );
            let mut generator = Generator {
                rng: fastrand::Rng::with_seed(args.seed.wrapping_add(worker as u64)),
                namespace: self.namespace.clone(),
            };
            workers.push(tokio::spawn(async move {
                let mut conn: Option<Box<dyn Io>> = None;
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    let plan = generator.plan(&credentials);
                    crate::REQUESTS.fetch_add(1, Ordering::Relaxed);
                    let (bytes, fresh) = match &plan.raw {
                        Some(raw) => (raw.clone(), true),
                        None => (serialize(&plan, &credentials), false),
                    };
                    // A kept-alive connection the server closed without saying so (Go's server
                    // says `Connection: close` when it will) is counted, and the request is
                    // sent again on a new connection; a failure there is a dropped one.
                    let mut outcome = Outcome::Dropped("not sent".into());
                    for attempt in 0..2 {
                        let reused = conn.is_some() && !fresh;
                        if fresh || conn.is_none() || attempt > 0 {
                            conn = match dialer.connect().await {
                                Ok(c) => Some(c),
                                Err(error) => {
                                    tally
                                        .lock()
                                        .unwrap_or_else(|e| e.into_inner())
                                        .findings
                                        .push(format!("connect failed: {error}"));
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                    None
                                }
                            };
                        }
                        let Some(c) = conn.as_mut() else { break };
                        outcome = match tokio::time::timeout(
                            EXCHANGE_TIMEOUT,
                            exchange(c, &bytes, plan.method == "HEAD"),
                        )
                        .await
                        {
                            Ok(outcome) => outcome,
                            Err(_) => Outcome::TimedOut,
                        };
                        if !(reused && matches!(outcome, Outcome::Dropped(_))) {
                            break;
                        }
                        tally.lock().unwrap_or_else(|e| e.into_inner()).dead += 1;
                    }
                    let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                    match outcome {
                        _ if plan.raw.is_some() => {
                            t.garbage += 1;
                            conn = None;
                        }
                        Outcome::Answered(code, body, closing) => {
                            *t.codes.entry(code).or_default() += 1;
                            if code >= 500 {
                                if documented(code, &body, &plan.target) {
                                    *t.documented_5xx
                                        .entry(format!("{code} {}", plan.what))
                                        .or_default() += 1;
                                    let message = serde_json::from_slice::<Value>(&body)
                                        .ok()
                                        .and_then(|v| {
                                            v.get("message")
                                                .and_then(Value::as_str)
                                                .map(str::to_string)
                                        })
                                        .unwrap_or_else(|| {
                                            String::from_utf8_lossy(&body).into_owned()
                                        });
                                    let message: String = message.chars().take(60).collect();
                                    *t.documented_messages
                                        .entry(format!("{code} {message}"))
                                        .or_default() += 1;
                                } else if t.findings.len() < 50 {
                                    let text: String =
                                        String::from_utf8_lossy(&body).chars().take(300).collect();
                                    t.findings.push(format!(
                                        "{code} for {} {}: {text}",
                                        plan.method,
                                        plan.target.chars().take(200).collect::<String>()
                                    ));
                                }
                            }
                            // Keep-alive, unless the server said otherwise or the body was skipped.
                            if closing || plan.method == "HEAD" {
                                conn = None;
                            }
                        }
                        Outcome::Dropped(why) => {
                            t.dropped += 1;
                            if t.findings.len() < 50 {
                                t.findings.push(format!(
                                    "connection dropped on {} {} ({} body bytes): {why}",
                                    plan.method,
                                    plan.target.chars().take(200).collect::<String>(),
                                    plan.body.len()
                                ));
                            }
                            conn = None;
                        }
                        Outcome::TimedOut => {
                            t.timed_out += 1;
                            conn = None;
                        }
                    }
                }
            }));
        }
        for worker in workers {
            worker.await?;
        }
        ticker.abort();
        let elapsed = started.elapsed();
        eprint!("\r{:80}\r", "");
        // Afterwards the server still does its job.
        let api: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let probe: Service = serde_json::from_value(json!({"metadata": {"name": "after-abuse"},
            "spec": {"ports": [{"port": 80}]}}))?;
        let still_works = async {
            let _ = api.delete("after-abuse", &DeleteParams::default()).await;
            api.create(&PostParams::default(), &probe).await?;
            api.get("after-abuse").await?;
            Api::<Service>::all(self.client.clone())
                .list(&ListParams::default())
                .await?;
            api.delete("after-abuse", &DeleteParams::default()).await?;
            anyhow::Ok(())
        }
        .await;
        // What the campaign created in its namespace, and the APIServices it registered.
        for kind in ["services", "endpoints", "pods"] {
            let request =
                http::Request::delete(format!("/api/v1/namespaces/{}/{kind}", self.namespace))
                    .body(kube::client::Body::empty())?;
            let _ = self.client.send(request).await;
        }
        let apiservices = self.apiservices();
        if let Ok(list) = apiservices.list(&ListParams::default()).await {
            for item in list.items {
                let name = item.metadata.name.unwrap_or_default();
                if name.ends_with(".example.com") {
                    let _ = apiservices.delete(&name, &DeleteParams::default()).await;
                }
            }
        }
        let mut log_panics = None;
        if let Some(path) = &args.server_log {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            log_panics = Some(log.matches("panicked").count());
        }
        let t = tally.lock().unwrap_or_else(|e| e.into_inner());
        let rate = count as f64 / elapsed.as_secs_f64().max(1e-9);
        println!(
            "abuse: {count} requests in {:.1}s ({rate:.0}/s), {} malformed HTTP",
            elapsed.as_secs_f64(),
            t.garbage
        );
        println!("  status codes: {:?}", t.codes);
        println!("  documented 5xx: {:?}", t.documented_5xx);
        println!("  their messages: {:?}", t.documented_messages);
        println!(
            "  dropped connections: {}, client timeouts (watches, slow lists): {}",
            t.dropped, t.timed_out
        );
        println!(
            "  requests that met a dead kept-alive connection: {}",
            t.dead
        );
        println!(
            "  afterwards: {}",
            match &still_works {
                Ok(()) => "create/get/list/delete work".to_string(),
                Err(e) => format!("BROKEN: {e}"),
            }
        );
        if let Some(panics) = log_panics {
            println!("  panics in the server log: {panics}");
        }
        println!("  findings: {}", t.findings.len());
        for finding in &t.findings {
            println!("    - {finding}");
        }
        Ok(json!({
            "requests": count,
            "elapsed_seconds": elapsed.as_secs_f64(),
            "requests_per_second": rate,
            "malformed_http": t.garbage,
            "status_codes": t.codes,
            "documented_5xx": t.documented_5xx,
            "documented_5xx_messages": t.documented_messages,
            "dropped_connections": t.dropped,
            "dead_connections": t.dead,
            "client_timeouts": t.timed_out,
            "findings": t.findings,
            "server_log_panics": log_panics,
            "still_works": still_works.is_ok(),
        }))
    }
}
