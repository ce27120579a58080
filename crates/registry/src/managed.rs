//! `metadata.managedFields` for Update operations: which manager set which fields.
//!
//! Field sets follow the kind's OpenAPI schema as upstream's structured-merge-diff does: struct
//! fields `f:<name>`, granular maps `f:<key>` under a `.` marker, list-map entries
//! `k:{"port":80,"protocol":"TCP"}`, set entries `v:<value>`, and atomic values owned whole.

use std::collections::{BTreeSet, HashMap, HashSet};

use capstan_machinery::meta;
use capstan_machinery::schema::{Shape, core_shape};
use capstan_machinery::smp::value_key;
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
    let defaults = match core_shape(items) {
        Shape::Struct(properties) => Some(properties),
        _ => None,
    };
    let mut key = Map::new();
    for name in keys.iter().filter_map(Value::as_str) {
        let default = || {
            defaults
                .and_then(|p| p.get(name))
                .map(capstan_machinery::schema::core_resolve)
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
    schema.map(core_shape).unwrap_or(match value {
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
        let time = |e: &Value| {
            e.get("time")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
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

/// A field another manager owns that an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The manager as upstream names it: `"name"`, then ` with subresource "status"` for
    /// writes through /status, then ` using <apiVersion>` for Update-operation managers.
    pub manager: String,
    /// The field in upstream's path syntax, e.g. `.spec.ports[port=80,protocol="TCP"].targetPort`.
    pub field: String,
}

/// Server-side apply (`spec/api-machinery.md` §10.5), modelled on structured-merge-diff:
/// merges the applied configuration `config` into `live` (None: the object is created) as
/// `manager`, following the kind's schema (list-map keys, sets, atomic values), removes the
/// fields the manager applied before and no longer applies (unless another manager owns them),
/// and returns the new object with its managedFields. Fields another manager owns with a
/// different value are conflicts; with `force` they change hands instead.
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
    schema: Option<&'static Value>,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let status = subresource == Some("status");
    let applied = field_set(config, schema, status);
    let mut config = config.clone();
    default_list_keys(&mut config, schema);
    let empty = json!({});
    let live_object = live.unwrap_or(&empty);
    let mut entries: Vec<(Value, BTreeSet<Path>)> = live
        .and_then(meta::metadata)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|entry| {
                    let mut owned = BTreeSet::new();
                    if let Some(fields) = entry.get("fieldsV1") {
                        from_fields_v1(fields, &mut Vec::new(), &mut owned);
                    }
                    (entry.clone(), owned)
                })
                .collect()
        })
        .unwrap_or_default();
    // An object that has never recorded managers (created with managedFields cleared) gets its
    // existing fields attributed to `before-first-apply`, so the first apply can conflict
    // with them and does not silently take them over.
    if let Some(live) = live
        && entries.is_empty()
    {
        let existing = field_set(live, schema, status);
        if !existing.is_empty() {
            let first = entry(
                "before-first-apply",
                "Update",
                api_version,
                &meta::now_rfc3339(),
                subresource,
                &existing,
            );
            entries.push((first, existing));
        }
    }
    let is_mine = |entry: &Value| {
        entry.get("manager").and_then(Value::as_str) == Some(manager)
            && entry.get("operation").and_then(Value::as_str) == Some("Apply")
            && entry.get("subresource").and_then(Value::as_str) == subresource
    };
    let previously: BTreeSet<Path> = entries
        .iter()
        .find(|(entry, _)| is_mine(entry))
        .map(|(_, owned)| owned.clone())
        .unwrap_or_default();

    // Conflicts: fields this apply sets to a value other than the live one, owned by others.
    let mut conflicts = Vec::new();
    let config_index = fields(&config, schema, status);
    let live_index = fields(live_object, schema, status);
    for path in applied
        .iter()
        .filter(|p| p.last().map(String::as_str) != Some("."))
    {
        if !config_index.differs(&live_index, path) {
            continue;
        }
        for (entry, owned) in entries.iter_mut() {
            if is_mine(entry) || !owned.contains(path) {
                continue;
            }
            if force {
                owned.remove(path);
            } else {
                conflicts.push(Conflict {
                    manager: manager_text(entry),
                    field: render_path(path),
                });
            }
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| (&a.manager, &a.field).cmp(&(&b.manager, &b.field)));
        return Err(conflicts);
    }

    drop((config_index, live_index));
    // Fields this manager applied before and no longer does go, unless someone else owns them.
    let mut object = live_object.clone();
    let others: Vec<&BTreeSet<Path>> = entries
        .iter()
        .filter(|(entry, _)| !is_mine(entry))
        .map(|(_, owned)| owned)
        .collect();
    let gone: BTreeSet<Path> = previously
        .difference(&applied)
        .map(|path| match path.split_last() {
            Some((last, parent)) if last == "." => parent.to_vec(),
            _ => path.clone(),
        })
        .filter(|node| !node.is_empty() && !others.iter().any(|owned| owns_under(owned, node)))
        .collect();
    prune(&mut object, schema, &mut Vec::new(), &gone);
    merge_into(&mut object, &config, schema, 0, status);

    // managedFields: this manager owns exactly what it applied; fields no longer in the
    // object leave every set.
    let present = field_set(&object, schema, status);
    let now = meta::now_rfc3339();
    let mut found = false;
    let mut out = Vec::new();
    for (mut entry, mut owned) in entries {
        let before = entry
            .get("fieldsV1")
            .map(|f| {
                let mut set = BTreeSet::new();
                from_fields_v1(f, &mut Vec::new(), &mut set);
                set
            })
            .unwrap_or_default();
        if is_mine(&entry) {
            found = true;
            owned = applied.clone();
        }
        owned.retain(|p| !in_scope(p, status) || present.contains(p));
        if owned.is_empty() {
            continue;
        }
        if owned != before {
            entry["fieldsV1"] = to_fields_v1(&owned);
            if is_mine(&entry) {
                entry["time"] = json!(now);
                entry["apiVersion"] = json!(api_version);
            }
        }
        out.push(entry);
    }
    let owned: BTreeSet<Path> = applied
        .into_iter()
        .filter(|p| present.contains(p))
        .collect();
    if !found && !owned.is_empty() {
        out.push(entry(
            manager,
            "Apply",
            api_version,
            &now,
            subresource,
            &owned,
        ));
    }
    let metadata = meta::metadata_mut(&mut object);
    if out.is_empty() {
        metadata.shift_remove("managedFields");
    } else {
        metadata.insert("managedFields".into(), Value::Array(out));
    }
    Ok(object)
}

/// Upstream's name for a manager in conflict messages.
fn manager_text(entry: &Value) -> String {
    let name = entry.get("manager").and_then(Value::as_str).unwrap_or("");
    let mut text = format!("\"{name}\"");
    if let Some(sub) = entry.get("subresource").and_then(Value::as_str) {
        text.push_str(&format!(" with subresource \"{sub}\""));
    }
    if entry.get("operation").and_then(Value::as_str) == Some("Update") {
        let version = entry
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        text.push_str(&format!(" using {version}"));
    }
    text
}

/// A fieldsV1 path in upstream's message syntax: `.spec.ports[port=80,protocol="TCP"].name`.
fn render_path(path: &Path) -> String {
    let mut out = String::new();
    for step in path {
        if let Some(field) = step.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(key) = step.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(value) = step.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        } else if let Some(index) = step.strip_prefix("i:") {
            out.push_str(&format!("[{index}]"));
        }
    }
    out
}

/// List-map keys left out of an applied object take their schema default (ServicePort's
/// `protocol: TCP`), as upstream does before merging, so `port: 80` names the same entry as
/// the stored `port: 80, protocol: TCP`.
fn default_list_keys(value: &mut Value, schema: Option<&'static Value>) {
    let Some(schema) = schema else { return };
    match (core_shape(schema), value) {
        (Shape::Struct(properties), Value::Object(map)) => {
            for (key, child) in map.iter_mut() {
                default_list_keys(child, properties.get(key));
            }
        }
        (Shape::Map(Some(values)), Value::Object(map)) => {
            for child in map.values_mut() {
                default_list_keys(child, Some(values));
            }
        }
        (Shape::ListMap(items, keys), Value::Array(list)) => {
            let properties = match core_shape(items) {
                Shape::Struct(properties) => Some(properties),
                _ => None,
            };
            for element in list.iter_mut() {
                if let (Some(properties), Value::Object(map)) = (properties, &mut *element) {
                    for key in keys.iter().filter_map(Value::as_str) {
                        if !map.contains_key(key)
                            && let Some(default) = properties
                                .get(key)
                                .map(|p| capstan_machinery::schema::core_resolve(p))
                                .and_then(|p| p.get("default"))
                        {
                            map.insert(key.to_string(), default.clone());
                        }
                    }
                }
                default_list_keys(element, Some(items));
            }
        }
        _ => {}
    }
}

/// Removes the nodes `remove` names (fields, list-map entries, set values) in one walk of the
/// object, visiting only the branches that hold one.
fn prune(
    value: &mut Value,
    schema: Option<&'static Value>,
    path: &mut Path,
    remove: &BTreeSet<Path>,
) {
    if !owns_under(remove, path) {
        return;
    }
    let visit = |step: String, child: &mut Value, child_schema, path: &mut Path| {
        path.push(step);
        let gone = remove.contains(path);
        if !gone {
            prune(child, child_schema, path, remove);
        }
        path.pop();
        !gone
    };
    match (shape_of(value, schema), value) {
        (Shape::Struct(properties), Value::Object(map)) => {
            map.retain(|key, child| visit(format!("f:{key}"), child, properties.get(key), path));
        }
        (Shape::Map(values), Value::Object(map)) => {
            map.retain(|key, child| visit(format!("f:{key}"), child, values, path));
        }
        (Shape::ListMap(items, keys), Value::Array(list)) => {
            list.retain_mut(|element| {
                let step = entry_step(element, items, keys);
                visit(step, element, Some(items), path)
            });
        }
        (Shape::Set, Value::Array(list)) => {
            list.retain_mut(|element| visit(format!("v:{element}"), element, None, path));
        }
        _ => {}
    }
}

/// Merges an applied value into a live one by the schema: structs and granular maps field by
/// field, list-maps entry by entry (matched on their keys; new entries appended), sets by
/// value, anything atomic replaced whole. `status` is never taken from an apply to the main
/// resource (the strategy keeps the stored one).
fn merge_into(
    live: &mut Value,
    applied: &Value,
    schema: Option<&'static Value>,
    depth: usize,
    status: bool,
) {
    let shape = schema.map(core_shape).unwrap_or(match applied {
        Value::Object(_) => Shape::Map(None),
        _ => Shape::Atomic,
    });
    match (shape, applied) {
        (Shape::Struct(properties), Value::Object(fields)) if live.is_object() => {
            for (key, value) in fields {
                if depth == 0 && (key == "status") != status && key != "metadata" {
                    continue;
                }
                if let Some(map) = live.as_object_mut() {
                    match map.get_mut(key) {
                        Some(existing) => {
                            merge_into(existing, value, properties.get(key), depth + 1, status)
                        }
                        None => {
                            map.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
        }
        (Shape::Map(values), Value::Object(fields)) if live.is_object() => {
            for (key, value) in fields {
                if let Some(map) = live.as_object_mut() {
                    match map.get_mut(key) {
                        Some(existing) => merge_into(existing, value, values, depth + 1, status),
                        None => {
                            map.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
        }
        (Shape::ListMap(items, keys), Value::Array(elements)) if live.is_array() => {
            let keys: Vec<&str> = keys.iter().filter_map(Value::as_str).collect();
            let identity = |e: &Value| {
                let parts: Vec<Value> = keys
                    .iter()
                    .map(|k| e.get(*k).cloned().unwrap_or(Value::Null))
                    .collect();
                value_key(&Value::Array(parts))
            };
            let Some(list) = live.as_array_mut() else {
                return;
            };
            let mut positions: HashMap<String, usize> = HashMap::new();
            for (i, e) in list.iter().enumerate() {
                positions.entry(identity(e)).or_insert(i);
            }
            for element in elements {
                match positions.get(&identity(element)) {
                    Some(&i) => merge_into(&mut list[i], element, Some(items), depth + 1, status),
                    None => {
                        positions.insert(identity(element), list.len());
                        list.push(element.clone());
                    }
                }
            }
        }
        (Shape::Set, Value::Array(elements)) if live.is_array() => {
            if let Some(list) = live.as_array_mut() {
                let mut present: HashSet<String> = list.iter().map(value_key).collect();
                for element in elements {
                    if present.insert(value_key(element)) {
                        list.push(element.clone());
                    }
                }
            }
        }
        _ => *live = applied.clone(),
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
    fn applied(
        live: Option<&Value>,
        config: Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, Vec<Conflict>> {
        apply(live, &config, manager, "v1", None, service_schema(), force)
    }

    fn owned(object: &Value, manager: &str) -> Value {
        object["metadata"]["managedFields"]
            .as_array()
            .and_then(|l| l.iter().find(|e| e["manager"] == manager))
            .map(|e| e["fieldsV1"].clone())
            .unwrap_or(Value::Null)
    }

    fn web(target: i64) -> Value {
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"},
               "ports": [{"name": "http", "port": 80, "targetPort": target}]}})
    }

    #[test]
    fn apply_creates_and_owns_what_it_sent_with_defaulted_keys() {
        let object = applied(None, web(8080), "alice", false).expect("no conflicts");
        let entry = &object["metadata"]["managedFields"][0];
        assert_eq!(entry["operation"], "Apply");
        assert_eq!(entry["manager"], "alice");
        // The entry is named with the defaulted protocol; the protocol field itself is not owned.
        assert_eq!(
            entry["fieldsV1"],
            json!({"f:spec": {"f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}":
                {".": {}, "f:name": {}, "f:port": {}, "f:targetPort": {}}}, "f:selector": {}}})
        );
        // Applying the same again changes nothing, not even the time.
        let again = applied(Some(&object), web(8080), "alice", false).expect("no conflicts");
        assert_eq!(again, object);
    }

    #[test]
    fn a_different_value_conflicts_and_force_moves_ownership() {
        let mut live = applied(None, web(8080), "alice", false).expect("no conflicts");
        live["spec"]["ports"][0]["protocol"] = json!("TCP"); // as defaulting stores it
        let conflicts = applied(Some(&live), web(9999), "bob", false).expect_err("conflict");
        assert_eq!(
            conflicts,
            [Conflict {
                manager: "\"alice\"".into(),
                field: ".spec.ports[port=80,protocol=\"TCP\"].targetPort".into(),
            }]
        );
        let forced = applied(Some(&live), web(9999), "bob", true).expect("forced");
        assert_eq!(forced["spec"]["ports"][0]["targetPort"], 9999);
        assert_eq!(forced["spec"]["ports"].as_array().map(Vec::len), Some(1));
        let alice = owned(&forced, "alice").to_string();
        assert!(!alice.contains("targetPort"), "{alice}");
        assert!(owned(&forced, "bob").to_string().contains("targetPort"));
    }

    #[test]
    fn the_same_value_is_shared_and_a_field_dropped_by_one_owner_stays() {
        let live = applied(None, web(8080), "alice", false).expect("no conflicts");
        let shared = applied(Some(&live), web(8080), "bob", false).expect("same value: shared");
        assert!(owned(&shared, "alice").to_string().contains("targetPort"));
        assert!(owned(&shared, "bob").to_string().contains("targetPort"));
        // Alice stops applying the ports; Bob still owns them, so they stay.
        let without = json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}}});
        let after = applied(Some(&shared), without.clone(), "alice", false).expect("ok");
        assert_eq!(after["spec"]["ports"][0]["targetPort"], 8080);
        // Once no one else owns them, dropping them removes them.
        let alone = applied(Some(&live), without, "alice", false).expect("ok");
        assert!(alone["spec"].get("ports").is_none(), "{alone}");
    }

    #[test]
    fn update_managers_are_named_with_their_version_in_conflicts() {
        let mut live = web(8080);
        live["spec"]["ports"][0]["protocol"] = json!("TCP");
        record_update(
            &mut live,
            None,
            "kubectl-client-side-apply",
            "v1",
            None,
            service_schema(),
        );
        let conflicts = applied(Some(&live), web(1234), "kubectl", false).expect_err("conflict");
        assert_eq!(
            conflicts[0].manager,
            "\"kubectl-client-side-apply\" using v1"
        );
        assert_eq!(
            render_path(&vec![
                "f:spec".into(),
                "f:externalIPs".into(),
                "v:\"1.2.3.4\"".into()
            ]),
            ".spec.externalIPs[=\"1.2.3.4\"]"
        );
    }

    #[test]
    fn writes_through_status_own_status_only() {
        let old = json!({"metadata": {"name": "web"}, "spec": {"type": "ClusterIP"}, "status": {}});
        let mut new = old.clone();
        new["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
        record_update(
            &mut new,
            Some(&old),
            "lb",
            "v1",
            Some("status"),
            service_schema(),
        );
        let entry = &new["metadata"]["managedFields"][0];
        assert_eq!(entry["subresource"], "status");
        assert_eq!(
            entry["fieldsV1"],
            json!({"f:status": {"f:loadBalancer": {"f:ingress": {}}}})
        );
        let config = json!({"metadata": {"name": "web"}, "spec": {"type": "NodePort"},
                            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.2"}]}}});
        let applied = apply(
            Some(&old),
            &config,
            "lb",
            "v1",
            Some("status"),
            service_schema(),
            false,
        )
        .expect("no conflicts");
        assert_eq!(
            applied["spec"]["type"], "ClusterIP",
            "spec is not applied through /status"
        );
        assert_eq!(
            applied["status"]["loadBalancer"]["ingress"][0]["ip"],
            "192.0.2.2"
        );
    }

    #[test]
    fn applying_and_dropping_long_lists_is_linear() {
        // Long lists: every step (field sets, comparisons, merge, removal of what the manager
        // stopped applying) is a hash or ordered lookup; `capstan-bench abuse` times it.
        let finalizers: Vec<Value> = (0..20_000).map(|i| json!(format!("f{i}"))).collect();
        let ports: Vec<Value> = (0..4_000)
            .map(|i| json!({"port": i + 1, "protocol": "TCP", "targetPort": 80}))
            .collect();
        let config = json!({"metadata": {"name": "web", "finalizers": finalizers},
                            "spec": {"ports": ports}});
        let live = applied(None, config, "alice", false).expect("created");
        let half = json!({"metadata": {"name": "web", "finalizers": finalizers[..10_000]},
                          "spec": {"ports": ports[..2_000]}});
        let after = applied(Some(&live), half, "alice", false).expect("applied");
        assert_eq!(
            after["metadata"]["finalizers"].as_array().map(Vec::len),
            Some(10_000)
        );
        assert_eq!(after["spec"]["ports"].as_array().map(Vec::len), Some(2_000));
        // A second manager sharing the same values owns them too: nothing conflicts.
        let mut shared = after.clone();
        record_update(
            &mut shared,
            Some(&after),
            "bob",
            "v1",
            None,
            service_schema(),
        );
        assert!(
            applied(
                Some(&shared),
                json!({"metadata": {"name": "web"}}),
                "carol",
                false
            )
            .is_ok()
        );
    }

    #[test]
    fn more_than_ten_update_managers_fold_into_ancient_changes() {
        let mut object = json!({"metadata": {"name": "web", "labels": {}}});
        for i in 0..12 {
            let old = object.clone();
            object["metadata"]["labels"][format!("l{i}")] = json!("x");
            record_update(
                &mut object,
                Some(&old),
                &format!("m{i:02}"),
                "v1",
                None,
                service_schema(),
            );
        }
        let entries = object["metadata"]["managedFields"]
            .as_array()
            .expect("entries");
        assert_eq!(entries.len(), 10);
        let ancient: Vec<&Value> = entries
            .iter()
            .filter(|e| e["manager"] == "ancient-changes")
            .collect();
        assert_eq!(ancient.len(), 1);
        let owned = ancient[0]["fieldsV1"].to_string();
        assert!(
            owned.contains("f:l0") && owned.contains("f:l1") && owned.contains("f:l2"),
            "{owned}"
        );
    }

    #[test]
    fn the_first_apply_to_an_unmanaged_object_meets_before_first_apply() {
        let live = json!({"metadata": {"name": "web"}, "spec": {"type": "ClusterIP",
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}});
        let conflicts = apply(
            Some(&live),
            &web(9090),
            "kubectl",
            "v1",
            None,
            service_schema(),
            false,
        )
        .expect_err("the existing value conflicts");
        assert_eq!(conflicts[0].manager, "\"before-first-apply\" using v1");
        let forced = apply(
            Some(&live),
            &web(9090),
            "kubectl",
            "v1",
            None,
            service_schema(),
            true,
        )
        .expect("forced");
        let managers: Vec<&str> = forced["metadata"]["managedFields"]
            .as_array()
            .map(|l| l.iter().filter_map(|e| e["manager"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(managers, ["before-first-apply", "kubectl"]);
    }

    #[test]
    fn a_status_write_keeps_the_main_resource_managers_and_the_reverse() {
        let mut object = applied(None, web(8080), "alice", false).expect("created");
        object["status"] = json!({});
        let old = object.clone();
        object["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
        record_update(
            &mut object,
            Some(&old),
            "lb",
            "v1",
            Some("status"),
            service_schema(),
        );
        assert!(
            owned(&object, "alice").to_string().contains("targetPort"),
            "{object}"
        );
        let old = object.clone();
        object["metadata"]["labels"] = json!({"a": "b"});
        record_update(
            &mut object,
            Some(&old),
            "labeller",
            "v1",
            None,
            service_schema(),
        );
        assert!(
            owned(&object, "lb").to_string().contains("f:loadBalancer"),
            "{object}"
        );
        // Apply again after the status write: still the owner, so dropping a port removes it.
        let mut config = web(8080);
        config["spec"]["ports"] = json!([]);
        let after = applied(Some(&object), config, "alice", false).expect("no conflict");
        assert!(
            after["spec"]["ports"].as_array().is_none_or(Vec::is_empty),
            "{after}"
        );
    }
}
