//! Every registered kind is whole: served by discovery (legacy and aggregated), described by
//! the OpenAPI document it names, and listable and deletable, which is what the conformance
//! runner's clean-up (driven by discovery) relies on. A kind added to
//! `capstan_resources::registered` without one of these fails here.

mod common;

use std::sync::Arc;

use capstan_resources::core::service::{IpRange, PortRange, ServiceAllocator, ServiceStrategy};
use common::{Server, raw, raw_accepting};
use serde_json::Value;

fn registered() -> Vec<capstan_registry::ResourceInfo> {
    let ranges = vec![IpRange::parse("10.96.0.0/16").expect("range")];
    let ports = PortRange::parse("30000-32767").expect("ports");
    let services = Arc::new(ServiceStrategy::new(ServiceAllocator::new(ranges, ports)));
    capstan_resources::registered(services)
        .iter()
        .map(|kind| kind.info().clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_registered_kind_is_discovered_described_and_cleanable() {
    let server = Server::start();
    let client = server.client().await;
    let kinds = registered();
    assert!(kinds.len() >= 5, "{} kinds registered", kinds.len());
    let (_, index, _) = raw(&client, "GET", "/openapi/v3", None, Vec::new()).await;
    let (_, aggregated, _) = raw_accepting(
        &client,
        "GET",
        "/apis",
        None,
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
        Vec::new(),
    )
    .await;
    for info in kinds {
        let root = if info.group.is_empty() {
            format!("/api/{}", info.version)
        } else {
            format!("/apis/{}/{}", info.group, info.version)
        };
        // Legacy discovery, with the verbs the clean-up needs.
        let (code, list, _) = raw(&client, "GET", &root, None, Vec::new()).await;
        assert_eq!(code, 200, "{root}: {list}");
        let entry = list["resources"]
            .as_array()
            .and_then(|r| r.iter().find(|e| e["name"] == info.plural))
            .unwrap_or_else(|| panic!("{} missing from {root}", info.plural));
        assert_eq!(entry["kind"], info.kind);
        assert_eq!(entry["namespaced"], info.namespaced);
        for verb in ["list", "delete"] {
            assert!(
                entry["verbs"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v == verb)),
                "{}: no {verb} verb",
                info.plural
            );
        }
        // Aggregated discovery (non-core groups are listed under /apis).
        if !info.group.is_empty() {
            let group = aggregated["items"]
                .as_array()
                .and_then(|g| g.iter().find(|g| g["metadata"]["name"] == info.group))
                .unwrap_or_else(|| panic!("{} missing from aggregated /apis", info.group));
            assert!(
                group
                    .to_string()
                    .contains(&format!("\"resource\":\"{}\"", info.plural)),
                "{} missing from {group}",
                info.plural
            );
        }
        // The OpenAPI document it names is served and defines it.
        let path = info.data.openapi_path;
        let url = index["paths"][path]["serverRelativeURL"]
            .as_str()
            .unwrap_or_else(|| panic!("/openapi/v3 does not list {path}"))
            .to_string();
        let (code, document, _) = raw(&client, "GET", &url, None, Vec::new()).await;
        assert_eq!(code, 200, "{url}");
        assert!(
            document["components"]["schemas"]
                .get(info.definition)
                .is_some_and(Value::is_object),
            "{path} does not define {}",
            info.definition
        );
        // Listable where the clean-up lists it.
        let (code, items, _) = raw(
            &client,
            "GET",
            &format!("{root}/{}", info.plural),
            None,
            Vec::new(),
        )
        .await;
        assert_eq!(code, 200, "{}: {items}", info.plural);
        assert_eq!(items["kind"], info.list_kind());
    }
}
