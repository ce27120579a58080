//! managedFields bookkeeping per write, in process: the create `capstan-bench create` sends,
//! and an update changing one label of the object that create stored.
//!
//! `cargo bench -p capstan-registry --bench managed` (env `CAPSTAN_BENCH_ITERATIONS`, default
//! 20,000).

mod common;

use capstan_registry::managed::{Tracking, record_update};
use capstan_registry::{ResourceInfo, Subresource};
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

static SERVICE: ResourceInfo = ResourceInfo::of::<Service>(
    &capstan_machinery::testdata::SERVICE,
    "io.k8s.api.core.v1.Service",
)
.with_status()
.zero(r#"{"metadata":{"creationTimestamp":null},"spec":{},"status":{"loadBalancer":{}}}"#);

/// A Service as the create handler hands it over: defaulted, without managedFields.
fn created() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "svc-000001", "namespace": "bench", "labels": {"app": "svc-000001"}},
        "spec": {"selector": {"app": "svc-000001"},
                 "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                 "type": "ClusterIP", "sessionAffinity": "None", "ipFamilyPolicy": "SingleStack",
                 "internalTrafficPolicy": "Cluster", "clusterIP": "10.96.1.1",
                 "clusterIPs": ["10.96.1.1"], "ipFamilies": ["IPv4"]},
        "status": {"loadBalancer": {}}})
}

fn main() {
    let iterations = common::iterations();
    let schema = capstan_machinery::testdata::service();
    let tracking = Tracking::new(&SERVICE, schema, Subresource::Main);
    let template = created();
    common::time(
        "create (from the Go zero value)",
        "write",
        iterations,
        || {
            let mut object = template.clone();
            record_update(&mut object, None, "capstan-bench", &tracking);
            std::hint::black_box(&object);
        },
    );
    let mut stored = template.clone();
    record_update(&mut stored, None, "capstan-bench", &tracking);
    let mut changed = stored.clone();
    changed["metadata"]["labels"]["tier"] = json!("web");
    common::time(
        "update (one label added, another manager)",
        "write",
        iterations,
        || {
            let mut object = changed.clone();
            record_update(&mut object, Some(&stored), "kubectl-edit", &tracking);
            std::hint::black_box(&object);
        },
    );
    common::time(
        "clone of the object alone (baseline)",
        "write",
        iterations,
        || {
            std::hint::black_box(template.clone());
        },
    );
}
