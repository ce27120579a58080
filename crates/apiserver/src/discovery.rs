//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, legacy and aggregated (v2).

use std::sync::Arc;

use capstan_registry::{Registry, ResourceInfo};
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

/// The registries of one group/version, by resource name.
fn served<'a>(
    registries: &'a [Arc<Registry>],
    group: &str,
    version: &str,
) -> Vec<&'a Arc<Registry>> {
    let mut served: Vec<&Arc<Registry>> = registries
        .iter()
        .filter(|r| {
            let info = r.strategy().info();
            info.group == group && info.version == version
        })
        .collect();
    served.sort_by_key(|r| r.strategy().info().plural);
    served
}

fn core(registries: &[Arc<Registry>]) -> Vec<&Arc<Registry>> {
    served(registries, "", "v1")
}

/// The API groups Capstan serves itself besides core, as the registered kinds name them:
/// `(group, version, group priority)`, highest priority first (`apiregistration.k8s.io`'s
/// 20001 puts it first in `/apis`, as upstream).
pub fn local_groups(registries: &[Arc<Registry>]) -> Vec<(&'static str, &'static str, i64)> {
    let mut groups: Vec<(&'static str, &'static str, i64)> = Vec::new();
    for registry in registries {
        let info = registry.strategy().info();
        if !info.group.is_empty()
            && !groups
                .iter()
                .any(|(g, v, _)| *g == info.group && *v == info.version)
        {
            groups.push((info.group, info.version, info.priority.0));
        }
    }
    groups.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(b.0)));
    groups
}

/// Whether Capstan serves `group` itself.
pub fn is_local_group(registries: &[Arc<Registry>], group: &str) -> bool {
    !group.is_empty()
        && registries
            .iter()
            .any(|r| r.strategy().info().group == group)
}

/// Whether Capstan serves this group/version itself.
pub fn serves(registries: &[Arc<Registry>], group: &str, version: &str) -> bool {
    !group.is_empty() && !served(registries, group, version).is_empty()
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
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": legacy_entries(&core(registries))})
}

/// `/apis/<group>/<version>` of a locally served group (legacy `APIResourceList`).
pub fn group_resources(registries: &[Arc<Registry>], group: &str, version: &str) -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"),
        "resources": legacy_entries(&served(registries, group, version)),
    })
}

fn legacy_entries(registries: &[&Arc<Registry>]) -> Vec<Value> {
    let mut resources = Vec::new();
    for info in registries.iter().map(|r| r.strategy().info()) {
        let mut entry = json!({
            "name": info.plural,
            "singularName": info.singular(),
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
        for (subresource, verbs) in subresources(info) {
            resources.push(json!({
                "name": format!("{}/{subresource}", info.plural),
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": info.kind,
                "verbs": verbs,
            }));
        }
    }
    resources
}

/// Whether Capstan serves some version of this group itself.
pub fn serves_group(registries: &[Arc<Registry>], group: &str) -> bool {
    !group.is_empty()
        && registries
            .iter()
            .any(|r| r.strategy().info().group == group)
}

/// `/apis/<group>` of a locally served group.
pub fn local_group(registries: &[Arc<Registry>], group: &str) -> Value {
    let mut versions: Vec<String> = registries
        .iter()
        .map(|r| r.strategy().info())
        .filter(|info| info.group == group)
        .map(|info| info.version.to_string())
        .collect();
    versions.sort_by(|a, b| version_order(a, b));
    versions.dedup();
    with_group_type(api_group(group, &versions))
}

/// An `APIGroup` served on its own (`/apis/<group>`): with its kind and apiVersion first, where
/// Go writes TypeMeta.
pub fn with_group_type(group: Value) -> Value {
    let mut document = serde_json::Map::new();
    document.insert("kind".into(), json!("APIGroup"));
    document.insert("apiVersion".into(), json!("v1"));
    if let Value::Object(members) = group {
        document.extend(members);
    }
    Value::Object(document)
}

/// One `APIGroup` of legacy discovery: versions in the given order, the first preferred.
pub fn api_group(name: &str, versions: &[String]) -> Value {
    let entries: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": entries,
        "preferredVersion": entries.first().cloned().unwrap_or(json!({})),
    })
}

/// `/apis` (legacy `APIGroupList`): the local groups first, then the aggregated ones.
pub fn api_groups(registries: &[Arc<Registry>], aggregated: Vec<Value>) -> Value {
    let mut groups: Vec<Value> = local_groups(registries)
        .iter()
        .map(|(group, version, _)| api_group(group, &[version.to_string()]))
        .collect();
    groups.extend(aggregated);
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The aggregated-discovery resources of a set of registries.
fn aggregated_entries(registries: &[&Arc<Registry>]) -> Vec<Value> {
    let mut resources = Vec::new();
    for info in registries.iter().map(|r| r.strategy().info()) {
        let mut entry = json!({
            "resource": info.plural,
            "responseKind": {"group": "", "version": "", "kind": info.kind},
            "scope": if info.namespaced { "Namespaced" } else { "Cluster" },
            "singularResource": info.singular(),
            "verbs": info.verbs,
        });
        if !info.short_names.is_empty() {
            entry["shortNames"] = json!(info.short_names);
        }
        if !info.categories.is_empty() {
            entry["categories"] = json!(info.categories);
        }
        let subresources: Vec<Value> = subresources(info)
            .into_iter()
            .map(|(subresource, verbs)| {
                json!({
                    "subresource": subresource,
                    "responseKind": {"group": "", "version": "", "kind": info.kind},
                    "verbs": verbs,
                })
            })
            .collect();
        if !subresources.is_empty() {
            entry["subresources"] = json!(subresources);
        }
        resources.push(entry);
    }
    resources
}

/// A kind's subresources and their verbs, in upstream's (alphabetical) order.
fn subresources(info: &ResourceInfo) -> Vec<(&'static str, &'static [&'static str])> {
    let mut out: Vec<(&'static str, &'static [&'static str])> = Vec::new();
    if info.has_finalize {
        out.push(("finalize", &["update"]));
    }
    if info.has_status {
        out.push(("status", &["get", "patch", "update"]));
    }
    out
}

fn aggregated_list(version: &str, items: Vec<Value>) -> Value {
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

/// `/api` as aggregated discovery (`APIGroupDiscoveryList`, `v2` or `v2beta1`).
pub fn aggregated_core(registries: &[Arc<Registry>], version: &str) -> Value {
    let resources = aggregated_entries(&core(registries));
    aggregated_list(
        version,
        vec![
            json!({"metadata": {}, "versions": [{"version": "v1", "resources": resources, "freshness": "Current"}]}),
        ],
    )
}

/// `/apis` as aggregated discovery: the local groups, then the aggregated ones, each given
/// as `(priority, group name, APIGroupDiscovery)`; ordered by priority, then name.
pub fn aggregated_groups(
    registries: &[Arc<Registry>],
    version: &str,
    mut remote: Vec<(i64, String, Value)>,
) -> Value {
    for (group, group_version, priority) in local_groups(registries) {
        let resources = aggregated_entries(&served(registries, group, group_version));
        remote.push((
            priority,
            group.to_string(),
            json!({"metadata": {"name": group}, "versions": [{"version": group_version, "resources": resources, "freshness": "Current"}]}),
        ));
    }
    remote.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    aggregated_list(version, remote.into_iter().map(|(_, _, g)| g).collect())
}

/// Converts a backend's `APIResourceList` into one aggregated-discovery version: resources
/// with a `/` become subresources of their parent.
pub fn version_from_resource_list(version: &str, list: &Value) -> Value {
    let mut resources: Vec<Value> = Vec::new();
    let entries = list
        .get("resources")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let kind_of = |e: &Value| {
        json!({"group": e.get("group").cloned().unwrap_or(json!("")),
               "version": e.get("version").cloned().unwrap_or(json!("")),
               "kind": e.get("kind").cloned().unwrap_or(json!(""))})
    };
    for entry in entries.iter().filter(|e| {
        !e.get("name")
            .and_then(Value::as_str)
            .unwrap_or("/")
            .contains('/')
    }) {
        let mut resource = json!({
            "resource": entry.get("name").cloned().unwrap_or(json!("")),
            "responseKind": kind_of(entry),
            "scope": if entry.get("namespaced").and_then(Value::as_bool).unwrap_or(false) { "Namespaced" } else { "Cluster" },
            "singularResource": entry.get("singularName").cloned().unwrap_or(json!("")),
            "verbs": entry.get("verbs").cloned().unwrap_or(json!([])),
        });
        for field in ["shortNames", "categories"] {
            if let Some(value) = entry
                .get(field)
                .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            {
                resource[field] = value.clone();
            }
        }
        resources.push(resource);
    }
    for entry in &entries {
        let Some((parent, sub)) = entry
            .get("name")
            .and_then(Value::as_str)
            .and_then(|n| n.split_once('/'))
        else {
            continue;
        };
        if let Some(resource) = resources
            .iter_mut()
            .find(|r| r.get("resource").and_then(Value::as_str) == Some(parent))
        {
            let subresource = json!({"subresource": sub, "responseKind": kind_of(entry),
                "verbs": entry.get("verbs").cloned().unwrap_or(json!([]))});
            match resource
                .get_mut("subresources")
                .and_then(Value::as_array_mut)
            {
                Some(list) => list.push(subresource),
                None => resource["subresources"] = json!([subresource]),
            }
        }
    }
    json!({"version": version, "resources": resources, "freshness": "Current"})
}

/// Kube-aware version order: GA before beta before alpha, higher numbers first, then
/// anything else alphabetically. `Less` means `a` sorts first.
pub fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn parse(v: &str) -> Option<(u8, u64, u64)> {
        let rest = v.strip_prefix('v')?;
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let major: u64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((2, major, 0));
        }
        let (stability, number) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            return None;
        };
        if number.is_empty() || !number.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        Some((stability, major, number.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.cmp(b),
    }
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

/// `/`: upstream's `RootPaths`, every path its mux lists, sorted: discovery for the core
/// group and each group served here or by another server, OpenAPI, health and `/version`.
pub fn root_paths(registries: &[Arc<Registry>], remote: &[Value]) -> Value {
    let mut paths: Vec<String> = [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/",
        "/openapi/v2",
        "/openapi/v3",
        "/openapi/v3/",
        "/version",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    for endpoint in ["healthz", "livez", "readyz"] {
        paths.push(format!("/{endpoint}"));
        paths.extend(
            crate::HEALTH_CHECKS
                .iter()
                .chain(if endpoint == "readyz" {
                    crate::READY_CHECKS
                } else {
                    &[]
                })
                .map(|check| format!("/{endpoint}/{check}")),
        );
    }
    for (group, version, _) in local_groups(registries) {
        paths.push(format!("/apis/{group}"));
        paths.push(format!("/apis/{group}/{version}"));
    }
    for group in remote {
        let name = group["name"].as_str().unwrap_or_default();
        paths.push(format!("/apis/{name}"));
        for version in group["versions"].as_array().into_iter().flatten() {
            paths.push(format!(
                "/apis/{}",
                version["groupVersion"].as_str().unwrap_or_default()
            ));
        }
    }
    paths.sort();
    paths.dedup();
    json!({ "paths": paths })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_as_kubernetes_sorts_them() {
        let mut versions = vec![
            "v11alpha2",
            "foo10",
            "v1",
            "v10beta3",
            "v2",
            "zeta",
            "v12alpha1",
            "v3beta1",
            "v10",
            "foo1",
            "v11beta2",
        ];
        versions.sort_by(|a, b| version_order(a, b));
        assert_eq!(
            versions,
            [
                "v10",
                "v2",
                "v1",
                "v11beta2",
                "v10beta3",
                "v3beta1",
                "v12alpha1",
                "v11alpha2",
                "foo1",
                "foo10",
                "zeta"
            ]
        );
    }

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
