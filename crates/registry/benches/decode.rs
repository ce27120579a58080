//! Decoding a stored object into its type, as the controllers read the watch cache: all of it,
//! or without `metadata.managedFields` (`decode::from_json_without_managed_fields`), and from a
//! decoded `Value` as the write path's rules read it (`decode::for_rules`). The object
//! is an EndpointSlice of 50 endpoints with the managedFields its create recorded, as the
//! EndpointSlice controller reads on every sync of a Service with 50 pods.
//!
//! `cargo bench -p capstan-registry --bench decode` (env `CAPSTAN_BENCH_ITERATIONS`, default
//! 20,000).

mod common;

use capstan_registry::cache::{CachedObject, Projection, Selectable};
use capstan_registry::decode::{for_rules, from_json_without_managed_fields};
use capstan_registry::managed::{Tracking, record_update};
use capstan_registry::{ResourceInfo, Subresource};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

static SLICE: ResourceInfo = ResourceInfo::of::<EndpointSlice>(
    &capstan_machinery::testdata::ENDPOINT_SLICE,
    "io.k8s.api.discovery.v1.EndpointSlice",
)
.zero(r#"{"metadata":{"creationTimestamp":null}}"#);

/// A slice of 50 ready endpoints on 5 nodes, as the controller writes it.
fn slice() -> Value {
    let endpoints: Vec<Value> = (0..50)
        .map(|i| {
            json!({"addresses": [format!("10.244.{}.{}", i / 200, i % 200 + 2)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", i % 5), "zone": "zone-a",
                "targetRef": {"kind": "Pod", "namespace": "bench", "name": format!("svc-000001-pod-{i:03}"),
                    "uid": format!("5f0c7a3e-0000-4000-8000-{i:012}")}})
        })
        .collect();
    json!({"metadata": {"name": "svc-000001-abcde", "namespace": "bench",
            "uid": "0b4b7c1e-1111-4000-8000-000000000001", "generation": 7,
            "creationTimestamp": "2026-11-26T10:00:00Z",
            "labels": {"kubernetes.io/service-name": "svc-000001",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-26T10:00:01Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "svc-000001",
                "uid": "0b4b7c1e-2222-4000-8000-000000000002", "controller": true, "blockOwnerDeletion": true}]},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})
}

fn main() {
    let iterations = common::iterations();
    let schema = capstan_machinery::testdata::endpoint_slice();
    let tracking = Tracking::new(&SLICE, schema, Subresource::Main);
    let mut stored = slice();
    record_update(&mut stored, None, "kube-controller-manager", &tracking);
    let json = serde_json::to_vec(&stored).unwrap_or_default();
    println!(
        "an EndpointSlice of 50 endpoints: {} bytes stored",
        json.len()
    );
    let decoders: [(&str, &dyn Fn() -> EndpointSlice); 3] = [
        ("serde_json::from_slice::<EndpointSlice>", &|| {
            serde_json::from_slice(&json).unwrap_or_default()
        }),
        ("from_json_without_managed_fields", &|| {
            from_json_without_managed_fields(&json).unwrap_or_default()
        }),
        ("for_rules (from the decoded Value)", &|| {
            for_rules(&stored).unwrap_or_default()
        }),
    ];
    for (label, decode) in decoders {
        common::time(label, "object", iterations, || {
            std::hint::black_box(decode());
        });
    }
    // What the garbage collector's and the EndpointSlice controller's watches read of each
    // event: a few metadata fields, from the whole object (as they did) or through
    // `CachedObject::decode_metadata`, which reads the stored bytes' metadata member alone.
    #[derive(serde::Deserialize, Default)]
    struct Fields {
        #[serde(rename = "uid")]
        _uid: Option<String>,
        #[serde(rename = "generation")]
        _generation: Option<i64>,
    }
    #[derive(serde::Deserialize, Default)]
    struct Whole {
        #[serde(default, rename = "metadata")]
        _metadata: Fields,
    }
    // The bytes as Capstan stores them: `kind` and `apiVersion` first.
    let mut shaped = json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1"});
    if let (Some(head), Some(members)) = (shaped.as_object_mut(), stored.as_object()) {
        head.extend(members.clone());
    }
    let bytes = bytes::Bytes::from(serde_json::to_vec(&shaped).unwrap_or_default());
    let projection = Projection::of_objects(|object: &Value| Selectable::new(object, []));
    let Some(cached) = CachedObject::decode("/slices/bench/s".into(), &bytes, 1, &projection)
    else {
        panic!("the watch cache does not take the slice");
    };
    common::time(
        "uid and generation, from the whole object",
        "object",
        iterations,
        || {
            std::hint::black_box(serde_json::from_slice::<Whole>(&json).unwrap_or_default());
        },
    );
    common::time(
        "uid and generation, CachedObject::decode_metadata",
        "object",
        iterations,
        || {
            std::hint::black_box(cached.decode_metadata::<Fields>().unwrap_or_default());
        },
    );
}
