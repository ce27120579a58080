//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, legacy and aggregated (v2).

use std::sync::Arc;

use capstan_registry::Registry;
use serde_json::{Value, json};
use sha2::Digest;

/// Uppercase hex SHA-512, as kube-apiserver's discovery and OpenAPI ETags use.
pub fn sha512_hex(bytes: &[u8]) -> String {
    let digest = sha2::Sha512::digest(bytes);
    digest.iter().map(|b| format!("{b:02X}")).collect()
}

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "36",
        "emulationMajor": "1",
        "emulationMinor": "36",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "35",
        "gitVersion": "v1.36.2",
        "gitCommit": concat!("capstan-", env!("CARGO_PKG_VERSION")),
        "gitTreeState": "clean",
        "buildDate": "2026-11-21T00:00:00Z",
        "goVersion": "n/a (capstan is written in Rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, match std::env::consts::ARCH { "x86_64" => "amd64", "aarch64" => "arm64", other => other }),
    })
}

fn core(registries: &[Arc<Registry>]) -> Vec<&Arc<Registry>> {
    let mut core: Vec<&Arc<Registry>> = registries
        .iter()
        .filter(|r| r.strategy().info().group.is_empty())
        .collect();
    core.sort_by_key(|r| r.strategy().info().plural);
    core
}

/// `/api` (legacy).
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `/api/v1` (legacy `APIResourceList`).
pub fn core_resources(registries: &[Arc<Registry>]) -> Value {
    let mut resources = Vec::new();
    for registry in core(registries) {
        let info = registry.strategy().info();
        let mut entry = json!({
            "name": info.plural,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": info.verbs,
        });
        if !info.short_names.is_empty() {
            entry["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            entry["categories"] = json!(info.categories);
        }
        entry["storageVersionHash"] = json!(info.storage_version_hash);
        resources.push(entry);
        if info.has_status {
            resources.push(json!({
                "name": format!("{}/status", info.plural),
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": info.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})
}

/// `/apis` (legacy `APIGroupList`).
pub fn api_groups() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
}

/// `/api` as aggregated discovery (`APIGroupDiscoveryList`, `v2` or `v2beta1`).
pub fn aggregated_core(registries: &[Arc<Registry>], version: &str) -> Value {
    let mut resources = Vec::new();
    for registry in core(registries) {
        let info = registry.strategy().info();
        let mut entry = json!({
            "resource": info.plural,
            "responseKind": {"group": "", "version": "", "kind": info.kind},
            "scope": if info.namespaced { "Namespaced" } else { "Cluster" },
            "singularResource": info.singular,
            "verbs": info.verbs,
        });
        if !info.short_names.is_empty() {
            entry["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            entry["categories"] = json!(info.categories);
        }
        if info.has_status {
            entry["subresources"] = json!([{
                "subresource": "status",
                "responseKind": {"group": "", "version": "", "kind": info.kind},
                "verbs": ["get", "patch", "update"],
            }]);
        }
        resources.push(entry);
    }
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": [{"metadata": {}, "versions": [{"version": "v1", "resources": resources, "freshness": "Current"}]}],
    })
}

/// `/apis` as aggregated discovery.
pub fn aggregated_groups(version: &str) -> Value {
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": [],
    })
}

/// Which aggregated discovery version an Accept header asks for, if any.
pub fn wants_aggregated(accept: &str) -> Option<&'static str> {
    for range in capstan_machinery::media::parse_accept(accept) {
        if range.param("as") == Some("APIGroupDiscoveryList")
            && range.param("g") == Some("apidiscovery.k8s.io")
        {
            match range.param("v") {
                Some("v2") => return Some("v2"),
                Some("v2beta1") => return Some("v2beta1"),
                _ => continue,
            }
        }
        range.param("as")?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_go_gets_aggregated_discovery() {
        assert_eq!(
            wants_aggregated(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            ),
            Some("v2")
        );
        assert_eq!(wants_aggregated("application/json"), None);
        assert_eq!(wants_aggregated(""), None);
    }
}
