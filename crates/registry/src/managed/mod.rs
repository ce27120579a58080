//! `metadata.managedFields` for Update operations: which manager set which fields.
//!
//! Field sets follow the kind's OpenAPI schema as upstream's structured-merge-diff does: struct
//! fields `f:<name>`, granular maps `f:<key>` under a `.` marker, list-map entries
//! `k:{"port":80,"protocol":"TCP"}`, set entries `v:<value>`, and atomic values owned whole.

use std::collections::{BTreeSet, HashMap, HashSet};

use capstan_machinery::meta;
use capstan_machinery::schema::{Shape, shape};
use capstan_machinery::smp::value_key;
use serde_json::{Map, Value, json};

mod apply;
#[cfg(test)]
mod tests;

pub use apply::{Conflict, apply};

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

/// An object's field set, with the node at every path it visited (a path's value, or for a
/// `.` marker the node it marks), so comparisons between two objects are lookups.
struct Fields<'a> {
    set: BTreeSet<Path>,
    /// Filled only when the fields are compared with another object's.
    nodes: Option<HashMap<Path, &'a Value>>,
}

impl Fields<'_> {
    /// Whether the value at a path differs from `other`'s. For a `.` marker only the marked
    /// node's existence counts.
    fn differs(&self, other: &Fields<'_>, path: &Path) -> bool {
        fn node<'v>(fields: &Fields<'v>, path: &[String]) -> Option<&'v Value> {
            fields.nodes.as_ref().and_then(|n| n.get(path).copied())
        }
        match path.split_last() {
            Some((last, parent)) if last == "." => {
                node(self, parent).is_some() != node(other, parent).is_some()
            }
            _ => node(self, path) != node(other, path),
        }
    }
}

/// The step naming a list-map entry: `k:` and its keys as JSON; a key left out names the
/// entry by its schema default (ServicePort's protocol), without the field itself being set.
fn entry_step(element: &Value, items: &'static Value, keys: &[Value]) -> String {
    let defaults = match shape(items) {
        Shape::Struct(properties) => Some(properties),
        _ => None,
    };
    let mut key = Map::new();
    for name in keys.iter().filter_map(Value::as_str) {
        let default = || {
            defaults
                .and_then(|p| p.get(name))
                .map(capstan_machinery::schema::resolve)
                .and_then(|p| p.get("default"))
        };
        if let Some(v) = element.get(name).or_else(default) {
            key.insert(name.to_string(), v.clone());
        }
    }
    format!("k:{}", Value::Object(key))
}

/// The shape a value takes: its schema's, or a map / atomic value without one.
fn shape_of(value: &Value, schema: Option<&'static Value>) -> Shape<'static> {
    schema.map(shape).unwrap_or(match value {
        Value::Object(_) => Shape::Map(None),
        _ => Shape::Atomic,
    })
}

fn collect<'a>(
    value: &'a Value,
    schema: Option<&'static Value>,
    path: &mut Path,
    out: &mut Fields<'a>,
    depth: usize,
    status: bool,
) {
    if let Some(nodes) = out.nodes.as_mut() {
        nodes.entry(path.clone()).or_insert(value);
    }
    let mark = |path: &Path, out: &mut Fields<'a>| {
        let mut marker = path.clone();
        marker.push(".".into());
        out.set.insert(marker);
    };
    match (shape_of(value, schema), value) {
        (Shape::Struct(properties), Value::Object(map)) if !map.is_empty() => {
            for (key, child) in map {
                // A write through /status owns only status; any other write never does.
                if depth == 0
                    && (matches!(key.as_str(), "kind" | "apiVersion")
                        || (key == "status") != status)
                {
                    continue;
                }
                if depth == 1 && path[0] == "f:metadata" && SYSTEM_METADATA.contains(&key.as_str())
                {
                    continue;
                }
                path.push(format!("f:{key}"));
                collect(child, properties.get(key), path, out, depth + 1, status);
                path.pop();
            }
        }
        (Shape::Map(values), Value::Object(map)) if !map.is_empty() => {
            mark(path, out);
            for (key, child) in map {
                path.push(format!("f:{key}"));
                collect(child, values, path, out, depth + 1, status);
                path.pop();
            }
        }
        (Shape::ListMap(items, keys), Value::Array(list)) if !list.is_empty() => {
            mark(path, out);
            for element in list {
                path.push(entry_step(element, items, keys));
                mark(path, out);
                collect(element, Some(items), path, out, depth + 1, status);
                path.pop();
            }
        }
        (Shape::Set, Value::Array(list)) if !list.is_empty() => {
            mark(path, out);
            for element in list {
                path.push(format!("v:{element}"));
                if let Some(nodes) = out.nodes.as_mut() {
                    nodes.entry(path.clone()).or_insert(element);
                }
                out.set.insert(path.clone());
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                out.set.insert(path.clone());
            }
        }
    }
}

/// Whether a path lies in the part of the object a write covers: status for a write through
/// `/status`, everything else otherwise.
fn in_scope(path: &Path, status: bool) -> bool {
    (path.first().map(String::as_str) == Some("f:status")) == status
}

/// The fields an object sets (system metadata excluded; status only (`status`) or all but
/// status), with the nodes they name, for comparing with another object's.
fn fields<'a>(object: &'a Value, schema: Option<&'static Value>, status: bool) -> Fields<'a> {
    let mut out = Fields {
        set: BTreeSet::new(),
        nodes: Some(HashMap::new()),
    };
    collect(object, schema, &mut Vec::new(), &mut out, 0, status);
    out
}

/// Just the field set.
fn field_set(object: &Value, schema: Option<&'static Value>, status: bool) -> BTreeSet<Path> {
    let mut out = Fields {
        set: BTreeSet::new(),
        nodes: None,
    };
    collect(object, schema, &mut Vec::new(), &mut out, 0, status);
    out.set
}

/// Whether any path of `set` lies under `node` (or is `node`): one ordered lookup, since the
/// paths under a node sort right after it.
fn owns_under(set: &BTreeSet<Path>, node: &[String]) -> bool {
    set.range(node.to_vec()..)
        .next()
        .is_some_and(|p| p.starts_with(node))
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
    if let Some(marker) = node.shift_remove(".") {
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

/// A managedFields entry owning `fields`.
fn entry(
    manager: &str,
    operation: &str,
    api_version: &str,
    time: &str,
    subresource: Option<&str>,
    fields: &BTreeSet<Path>,
) -> Value {
    let mut entry = Map::new();
    entry.insert("manager".into(), json!(manager));
    entry.insert("operation".into(), json!(operation));
    entry.insert("apiVersion".into(), json!(api_version));
    entry.insert("time".into(), json!(time));
    entry.insert("fieldsType".into(), json!("FieldsV1"));
    entry.insert("fieldsV1".into(), to_fields_v1(fields));
    if let Some(sub) = subresource {
        entry.insert("subresource".into(), json!(sub));
    }
    Value::Object(entry)
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
    let status = subresource == Some("status");
    let (new_fields, changed) = match old {
        // A create: everything it sets changed; nothing to compare with.
        None => {
            let set = field_set(new, schema, status);
            (set.clone(), set)
        }
        Some(old) => {
            let new_index = fields(new, schema, status);
            let old_index = fields(old, schema, status);
            let changed: BTreeSet<Path> = new_index
                .set
                .iter()
                .filter(|p| new_index.differs(&old_index, p))
                .chain(old_index.set.iter().filter(|p| !new_index.set.contains(*p)))
                .cloned()
                .collect();
            (new_index.set, changed)
        }
    };
    let mut entries: Vec<Value> = old
        .and_then(meta::metadata)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
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
        // Only fields inside this write's scope (status, or everything but status) can have
        // gone; other managers' fields outside it are untouched.
        owned.retain(|p| !in_scope(p, status) || new_fields.contains(p));
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
            entries.push(entry(
                manager,
                "Update",
                api_version,
                &now,
                subresource,
                &owned,
            ));
        }
    }
    entries.retain(|e| {
        e.get("fieldsV1")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
    });
    cap_updates(&mut entries);
    let meta = meta::metadata_mut(new);
    if entries.is_empty() {
        meta.shift_remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

/// The most `Update` entries kept; older ones are merged into one named `ancient-changes`.
const MAX_UPDATES: usize = 10;
const ANCIENT: &str = "ancient-changes";

/// Upstream's cap on `Update` entries: while there are more than ten, the oldest (by `time`,
/// then position) is merged into the `ancient-changes` entry (created from it when there is
/// none yet).
fn cap_updates(entries: &mut Vec<Value>) {
    let is_update = |e: &Value| e.get("operation").and_then(Value::as_str) == Some("Update");
    let is_ancient =
        |e: &Value| is_update(e) && e.get("manager").and_then(Value::as_str) == Some(ANCIENT);
    while entries.iter().filter(|e| is_update(e)).count() > MAX_UPDATES {
        let time = |e: &Value| meta::text(e.get("time")).to_string();
        let Some(oldest) = (0..entries.len())
            .filter(|i| is_update(&entries[*i]) && !is_ancient(&entries[*i]))
            .min_by(|a, b| time(&entries[*a]).cmp(&time(&entries[*b])).then(a.cmp(b)))
        else {
            return;
        };
        match entries.iter().position(&is_ancient) {
            Some(ancient) => {
                let mut fields = BTreeSet::new();
                for i in [ancient, oldest] {
                    if let Some(f) = entries[i].get("fieldsV1") {
                        from_fields_v1(f, &mut Vec::new(), &mut fields);
                    }
                }
                if let Some(entry) = entries[ancient].as_object_mut() {
                    entry.insert("fieldsV1".into(), to_fields_v1(&fields));
                }
                entries.remove(oldest);
            }
            None => {
                if let Some(entry) = entries[oldest].as_object_mut() {
                    entry.insert("manager".into(), json!(ANCIENT));
                    entry.shift_remove("subresource");
                }
            }
        }
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
                map.shift_remove("time");
            }
        }
    }
    copy
}

/// Whether an update changes nothing but managedFields timestamps (then it is not written).
pub fn same_ignoring_times(new: &Value, old: &Value) -> bool {
    without_times(new) == without_times(old)
}
