//! `metadata.managedFields` for Update operations: which manager set which fields.
//!
//! Field sets follow the kind's OpenAPI schema as upstream's structured-merge-diff does: struct
//! fields `f:<name>`, granular maps `f:<key>` under a `.` marker, list-map entries
//! `k:{"port":80,"protocol":"TCP"}`, set entries `v:<value>`, and atomic values owned whole.

use std::collections::BTreeSet;

use capstan_machinery::meta;
use capstan_machinery::schema::{Shape, core_shape};
use serde_json::{Map, Value, json};

/// A path of fieldsV1 keys; a path ending in `.` marks the node itself.
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

fn collect(
    value: &Value,
    schema: Option<&'static Value>,
    path: &mut Path,
    out: &mut BTreeSet<Path>,
    depth: usize,
) {
    let shape = schema.map(core_shape).unwrap_or(match value {
        Value::Object(_) => Shape::Map(None),
        _ => Shape::Atomic,
    });
    let mark = |path: &Path, out: &mut BTreeSet<Path>| {
        let mut marker = path.clone();
        marker.push(".".into());
        out.insert(marker);
    };
    match (shape, value) {
        (Shape::Struct(properties), Value::Object(map)) if !map.is_empty() => {
            for (key, child) in map {
                if depth == 0 && matches!(key.as_str(), "kind" | "apiVersion" | "status") {
                    continue;
                }
                if depth == 1 && path[0] == "f:metadata" && SYSTEM_METADATA.contains(&key.as_str())
                {
                    continue;
                }
                path.push(format!("f:{key}"));
                collect(child, properties.get(key), path, out, depth + 1);
                path.pop();
            }
        }
        (Shape::Map(values), Value::Object(map)) if !map.is_empty() => {
            mark(path, out);
            for (key, child) in map {
                path.push(format!("f:{key}"));
                collect(child, values, path, out, depth + 1);
                path.pop();
            }
        }
        (Shape::ListMap(items, keys), Value::Array(list)) if !list.is_empty() => {
            mark(path, out);
            for element in list {
                let mut key = Map::new();
                for name in keys.iter().filter_map(Value::as_str) {
                    if let Some(v) = element.get(name) {
                        key.insert(name.to_string(), v.clone());
                    }
                }
                path.push(format!("k:{}", Value::Object(key)));
                mark(path, out);
                collect(element, Some(items), path, out, depth + 1);
                path.pop();
            }
        }
        (Shape::Set, Value::Array(list)) if !list.is_empty() => {
            mark(path, out);
            for element in list {
                path.push(format!("v:{element}"));
                out.insert(path.clone());
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

/// The fields an object sets (system metadata and status excluded).
fn field_set(object: &Value, schema: Option<&'static Value>) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    collect(object, schema, &mut Vec::new(), &mut out, 0);
    out
}

/// The value a path points at (`.` markers point at their node).
fn lookup<'a>(object: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut current = object;
    for step in path {
        if step == "." {
            return Some(current);
        }
        current = if let Some(field) = step.strip_prefix("f:") {
            current.get(field)?
        } else if let Some(key) = step.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(key).ok()?;
            current
                .as_array()?
                .iter()
                .find(|e| key.iter().all(|(k, v)| e.get(k) == Some(v)))?
        } else if let Some(value) = step.strip_prefix("v:") {
            let value: Value = serde_json::from_str(value).ok()?;
            current.as_array()?.iter().find(|e| **e == value)?
        } else {
            return None;
        };
    }
    Some(current)
}

/// Whether the value at a path differs. For a `.` marker only its existence counts.
fn differs(new: &Value, old: &Value, path: &Path) -> bool {
    if path.last().map(String::as_str) == Some(".") {
        return lookup(new, path).is_some() != lookup(old, path).is_some();
    }
    lookup(new, path) != lookup(old, path)
}

fn to_fields_v1(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for key in path {
            let entry = node
                .entry(key.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(child) = entry else { break };
            node = child;
        }
    }
    sort_marker_first(&mut root);
    Value::Object(root)
}

fn sort_marker_first(node: &mut Map<String, Value>) {
    for child in node.values_mut() {
        if let Value::Object(map) = child {
            sort_marker_first(map);
        }
    }
    if let Some(marker) = node.remove(".") {
        let rest = std::mem::take(node);
        node.insert(".".into(), marker);
        node.extend(rest);
    }
}

fn from_fields_v1(value: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = value.as_object() else { return };
    if map.is_empty() {
        if !path.is_empty() {
            out.insert(path.clone());
        }
        return;
    }
    for (key, child) in map {
        path.push(key.clone());
        from_fields_v1(child, path, out);
        path.pop();
    }
}

/// Records an `Update` by `manager` (at `api_version`, through `subresource`) on `new`, given the
/// stored `old` object (None on create). `schema` is the kind's OpenAPI definition.
pub fn record_update(
    new: &mut Value,
    old: Option<&Value>,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
    schema: Option<&'static Value>,
) {
    let now = meta::now_rfc3339();
    let new_fields = field_set(new, schema);
    let mut entries: Vec<Value> = old
        .and_then(meta::metadata)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let changed: BTreeSet<Path> = match old {
        None => new_fields.clone(),
        Some(old) => {
            let old_fields = field_set(old, schema);
            new_fields
                .iter()
                .filter(|p| differs(new, old, p))
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
        let mine = is_mine(entry);
        if mine {
            mine_found = true;
            owned.extend(changed.iter().filter(|p| new_fields.contains(*p)).cloned());
        } else {
            owned.retain(|p| !changed.contains(p) || p.last().map(String::as_str) == Some("."));
        }
        owned.retain(|p| new_fields.contains(p));
        if owned != before {
            entry["fieldsV1"] = to_fields_v1(&owned);
            if mine {
                entry["time"] = json!(now);
            }
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

    fn service_schema() -> Option<&'static Value> {
        capstan_machinery::schema::core_schema("io.k8s.api.core.v1.Service")
    }

    #[test]
    fn create_records_fields_as_upstream() {
        // The reference transcript: kube-apiserver 1.36's managedFields for this create.
        let mut object = json!({"metadata":{"name":"web","labels":{"app":"web"}},
            "spec":{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}],
                    "selector":{"app":"web"},"type":"ClusterIP","sessionAffinity":"None","internalTrafficPolicy":"Cluster"},
            "status":{"loadBalancer":{}}});
        record_update(&mut object, None, "curl", "v1", None, service_schema());
        let entry = &object["metadata"]["managedFields"][0];
        assert_eq!(entry["manager"], "curl");
        assert_eq!(
            entry["fieldsV1"],
            json!({"f:metadata":{"f:labels":{".":{},"f:app":{}}},
                   "f:spec":{"f:internalTrafficPolicy":{},
                             "f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},
                             "f:selector":{},"f:sessionAffinity":{},"f:type":{}}})
        );
    }

    #[test]
    fn update_moves_changed_fields_to_the_new_manager() {
        let mut old = json!({"metadata":{"labels":{"a":"1"}},"spec":{"type":"ClusterIP"}});
        record_update(&mut old, None, "first", "v1", None, service_schema());
        let mut new = old.clone();
        new["metadata"]["labels"]["a"] = json!("2");
        record_update(&mut new, Some(&old), "second", "v1", None, service_schema());
        let entries = new["metadata"]["managedFields"]
            .as_array()
            .expect("entries");
        assert_eq!(entries.len(), 2);
        // The map itself stays with its first manager; the changed key moves.
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:metadata":{"f:labels":{".":{}}},"f:spec":{"f:type":{}}})
        );
        assert_eq!(
            entries[1]["fieldsV1"],
            json!({"f:metadata":{"f:labels":{"f:a":{}}}})
        );
    }
}
