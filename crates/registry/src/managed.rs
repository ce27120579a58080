//! `metadata.managedFields` for Update operations: which manager set which fields.
//!
//! Field sets are computed from the object's shape: maps are granular, lists are owned whole.
//! (Upstream's list-map keys — `k:{"port":80,"protocol":"TCP"}` — need the OpenAPI schema and
//! arrive with server-side apply.)

use std::collections::BTreeSet;

use capstan_machinery::meta;
use serde_json::{Map, Value, json};

type Path = Vec<String>;

const SYSTEM_METADATA: &[&str] = &[
    "name",
    "namespace",
    "generateName",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

fn collect(value: &Value, path: &mut Path, out: &mut BTreeSet<Path>, top: bool) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                if top && (key == "kind" || key == "apiVersion" || key == "status") {
                    continue;
                }
                if path.len() == 1
                    && path[0] == "metadata"
                    && SYSTEM_METADATA.contains(&key.as_str())
                {
                    continue;
                }
                path.push(key.clone());
                collect(child, path, out, false);
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                out.insert(path.clone());
            }
        }
    }
}

/// The leaf paths an object sets (system metadata and status excluded).
fn field_set(object: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    collect(object, &mut Vec::new(), &mut out, true);
    out
}

fn lookup<'a>(object: &'a Value, path: &Path) -> Option<&'a Value> {
    path.iter().try_fold(object, |v, k| v.get(k.as_str()))
}

fn to_fields_v1(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for (i, key) in path.iter().enumerate() {
            let entry = node
                .entry(format!("f:{key}"))
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(child) = entry else { break };
            if i + 1 < path.len() && child.is_empty() && i > 0 {
                // Granular maps below the top level carry the "." marker, as upstream's
                // `labels`/`annotations` do.
            }
            node = child;
        }
    }
    mark_maps(&mut root, 0);
    Value::Object(root)
}

fn mark_maps(node: &mut Map<String, Value>, depth: usize) {
    for (key, child) in node.iter_mut() {
        if let Value::Object(map) = child
            && !map.is_empty()
        {
            mark_maps(map, depth + 1);
            if depth == 1 && matches!(key.as_str(), "f:labels" | "f:annotations") {
                map.insert(".".into(), json!({}));
            }
        }
    }
    // Keep "." first, as upstream serializes it.
    if node.contains_key(".") {
        let marker = node.remove(".");
        let rest = std::mem::take(node);
        if let Some(marker) = marker {
            node.insert(".".into(), marker);
        }
        node.extend(rest);
    }
}

fn from_fields_v1(value: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = value.as_object() else { return };
    let children: Vec<(&String, &Value)> =
        map.iter().filter(|(k, _)| k.starts_with("f:")).collect();
    if children.is_empty() && !path.is_empty() {
        out.insert(path.clone());
        return;
    }
    for (key, child) in children {
        path.push(key[2..].to_string());
        from_fields_v1(child, path, out);
        path.pop();
    }
}

/// Records an `Update` by `manager` (at `api_version`, through `subresource`) on `new`, given the
/// stored `old` object (None on create).
pub fn record_update(
    new: &mut Value,
    old: Option<&Value>,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
) {
    let now = meta::now_rfc3339();
    let new_fields = field_set(new);
    let mut entries: Vec<Value> = old
        .and_then(|o| meta::metadata(o))
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let changed: BTreeSet<Path> = match old {
        None => new_fields.clone(),
        Some(old) => {
            let old_fields = field_set(old);
            new_fields
                .iter()
                .filter(|p| lookup(new, p) != lookup(old, p))
                .chain(old_fields.iter().filter(|p| !new_fields.contains(*p)))
                .cloned()
                .collect()
        }
    };
    let is_mine = |entry: &Value| {
        entry.get("manager").and_then(Value::as_str) == Some(manager)
            && entry.get("operation").and_then(Value::as_str) == Some("Update")
            && entry.get("apiVersion").and_then(Value::as_str) == Some(api_version)
            && entry.get("subresource").and_then(Value::as_str) == subresource
    };
    let mut mine_found = false;
    for entry in entries.iter_mut() {
        let mut owned = BTreeSet::new();
        if let Some(fields) = entry.get("fieldsV1") {
            from_fields_v1(fields, &mut Vec::new(), &mut owned);
        }
        let before = owned.clone();
        if is_mine(entry) {
            mine_found = true;
            owned.extend(changed.iter().filter(|p| new_fields.contains(*p)).cloned());
        } else {
            owned.retain(|p| !changed.contains(p));
        }
        owned.retain(|p| new_fields.contains(p));
        if owned != before {
            entry["fieldsV1"] = to_fields_v1(&owned);
            if is_mine(entry) {
                entry["time"] = json!(now);
            }
        }
        if owned.is_empty() {
            entry["fieldsV1"] = json!({});
        }
    }
    if !mine_found {
        let owned: BTreeSet<Path> = changed
            .into_iter()
            .filter(|p| new_fields.contains(p))
            .collect();
        if !owned.is_empty() {
            let mut entry = Map::new();
            entry.insert("manager".into(), json!(manager));
            entry.insert("operation".into(), json!("Update"));
            entry.insert("apiVersion".into(), json!(api_version));
            entry.insert("time".into(), json!(now));
            entry.insert("fieldsType".into(), json!("FieldsV1"));
            entry.insert("fieldsV1".into(), to_fields_v1(&owned));
            if let Some(sub) = subresource {
                entry.insert("subresource".into(), json!(sub));
            }
            entries.push(Value::Object(entry));
        }
    }
    entries.retain(|e| {
        e.get("fieldsV1")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
    });
    let meta = meta::metadata_mut(new);
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

fn without_times(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(entries) = copy
        .pointer_mut("/metadata/managedFields")
        .and_then(Value::as_array_mut)
    {
        for entry in entries {
            if let Some(map) = entry.as_object_mut() {
                map.remove("time");
            }
        }
    }
    copy
}

/// Whether an update changes nothing but managedFields timestamps (then it is not written).
pub fn same_ignoring_times(new: &Value, old: &Value) -> bool {
    without_times(new) == without_times(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_records_every_set_field() {
        let mut object = json!({"metadata":{"name":"web","labels":{"app":"web"}},"spec":{"type":"ClusterIP","ports":[{"port":80}]},"status":{}});
        record_update(&mut object, None, "kubectl", "v1", None);
        let entry = &object["metadata"]["managedFields"][0];
        assert_eq!(entry["manager"], "kubectl");
        assert_eq!(
            entry["fieldsV1"],
            json!({"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:type":{},"f:ports":{}}})
        );
    }

    #[test]
    fn update_moves_changed_fields_to_the_new_manager() {
        let mut old = json!({"metadata":{"labels":{"a":"1"}},"spec":{"type":"ClusterIP"}});
        record_update(&mut old, None, "first", "v1", None);
        let mut new = old.clone();
        new["metadata"]["labels"]["a"] = json!("2");
        record_update(&mut new, Some(&old), "second", "v1", None);
        let entries = new["metadata"]["managedFields"]
            .as_array()
            .expect("entries");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0]["fieldsV1"], json!({"f:spec":{"f:type":{}}}));
        assert_eq!(
            entries[1]["fieldsV1"],
            json!({"f:metadata":{"f:labels":{".":{},"f:a":{}}}})
        );
    }
}
