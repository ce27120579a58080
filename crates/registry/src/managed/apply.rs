//! Server-side apply: merging an applied configuration by the kind's schema, and the
//! conflicts between managers.

use super::*;

/// A field another manager owns that an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The manager as upstream names it: `"name"`, then ` with subresource "status"` for
    /// writes through /status, then ` using <apiVersion>` for Update-operation managers.
    pub manager: String,
    /// The field in upstream's path syntax, e.g. `.spec.ports[port=80,protocol="TCP"].targetPort`.
    pub field: String,
}

/// Server-side apply, modelled on structured-merge-diff's `Updater.Apply`: merges the applied
/// configuration `config` into `live` (None: the object is created) as `manager`, following
/// the kind's schema (list-map keys, sets, atomic values), removes the fields the manager
/// applied before and no longer applies (unless another manager owns them), and returns the
/// new object with its managedFields. The manager owns exactly the configuration's fields;
/// a field another manager owns that the apply changes is a conflict, and with `force` it
/// changes hands instead.
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    manager: &str,
    tracking: &Tracking,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let schema = tracking.schema;
    let status = tracking.subresource == Some("status");
    let applied = tracking.recordable(field_set(config, schema));
    let mut config = config.clone();
    default_list_keys(&mut config, schema);
    let live_object = live
        .map(without_managed_fields)
        .unwrap_or_else(|| json!({}));
    let now = meta::now_rfc3339();
    let mut entries = entries_of(live);
    // An object that has never recorded managers (created with managedFields cleared) gets its
    // existing fields attributed to `before-first-apply`, so the first apply can conflict
    // with them and does not silently take them over.
    if live.is_some() && entries.is_empty() {
        let existing = tracking.recordable(field_set(&live_object, schema));
        if !existing.is_empty() {
            let first = entry("before-first-apply", "Update", tracking, &now);
            entries.push(Owner::new(first, existing));
        }
    }
    let mine = |owner: &Owner| is_entry_of(&owner.entry, manager, "Apply", tracking);
    let previously: Set = entries
        .iter()
        .find(|owner| mine(owner))
        .map(|owner| owner.owned.clone())
        .unwrap_or_default();

    // Fields this manager applied before and no longer does go, unless someone else owns them.
    let mut object = live_object.clone();
    let gone: Set = {
        let others: Vec<&Set> = entries
            .iter()
            .filter(|owner| !mine(owner))
            .map(|owner| &owner.owned)
            .collect();
        previously
            .difference(&applied)
            .filter(|node| !others.iter().any(|owned| owns_under(owned, node)))
            .cloned()
            .collect()
    };
    prune(&mut object, schema, &mut Vec::new(), &gone);
    merge_into(&mut object, &config, schema, 0, status);

    // Conflicts: fields another manager owns that the apply changes.
    let (changed, removed) = tracking
        .filtered(compare(&live_object, &object, schema))
        .changed_and_removed();
    let mut conflicts = Vec::new();
    for owner in entries.iter_mut().filter(|owner| !mine(owner)) {
        if force {
            owner.retain(|path| !changed.contains(path));
        } else {
            conflicts.extend(owner.owned.intersection(&changed).map(|path| Conflict {
                manager: manager_text(&owner.entry),
                field: render_path(path),
            }));
        }
        owner.retain(|path| !removed.contains(path));
    }
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| (&a.manager, &a.field).cmp(&(&b.manager, &b.field)));
        return Err(conflicts);
    }

    // This manager owns exactly what it applied; the time moves when the object changed
    // (a no-op apply by a new manager records no time at all, as upstream).
    let object_changed = live.is_none() || object != live_object;
    match entries.iter_mut().find(|owner| mine(owner)) {
        Some(owner) => {
            owner.replace(applied);
            owner.entry["apiVersion"] = json!(tracking.api_version);
            if object_changed {
                owner.entry["time"] = json!(now);
            }
        }
        None if !applied.is_empty() => {
            let mut fresh = entry(manager, "Apply", tracking, &now);
            if !object_changed && let Some(map) = fresh.as_object_mut() {
                map.shift_remove("time");
            }
            entries.push(Owner::new(fresh, applied));
        }
        None => {}
    }
    store_entries(&mut object, entries);
    Ok(object)
}

/// Upstream's name for a manager in conflict messages.
fn manager_text(entry: &Value) -> String {
    let name = meta::text(entry.get("manager"));
    let mut text = format!("\"{name}\"");
    if let Some(sub) = entry.get("subresource").and_then(Value::as_str) {
        text.push_str(&format!(" with subresource \"{sub}\""));
    }
    if entry.get("operation").and_then(Value::as_str) == Some("Update") {
        let version = meta::text(entry.get("apiVersion"));
        text.push_str(&format!(" using {version}"));
    }
    text
}

/// A fieldsV1 path in upstream's message syntax: `.spec.ports[port=80,protocol="TCP"].name`.
pub(super) fn render_path(path: &[String]) -> String {
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
    match (shape(schema), value) {
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
            let properties = match shape(items) {
                Shape::Struct(properties) => Some(properties),
                _ => None,
            };
            for element in list.iter_mut() {
                if let (Some(properties), Value::Object(map)) = (properties, &mut *element) {
                    for key in keys.iter().filter_map(Value::as_str) {
                        if !map.contains_key(key)
                            && let Some(default) = properties
                                .get(key)
                                .map(|p| capstan_machinery::schema::resolve(p))
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
    // A removed node goes; so does a list or map whose every entry was removed (upstream's
    // removing walker leaves nothing there).
    let visit = |step: String, child: &mut Value, child_schema, path: &mut Path| {
        path.push(step);
        let mut keep = !remove.contains(path);
        if keep {
            let had = container_len(child);
            prune(child, child_schema, path, remove);
            keep = had == 0 || container_len(child) > 0;
        }
        path.pop();
        keep
    };
    match (shape_of(Some(&*value), schema), value) {
        (Shape::Struct(properties), Value::Object(map)) => {
            map.retain(|key, child| visit(field_step(key), child, properties.get(key), path));
        }
        (Shape::Map(values), Value::Object(map)) => {
            map.retain(|key, child| visit(field_step(key), child, values, path));
        }
        (Shape::ListMap(items, keys), Value::Array(list)) => {
            list.retain_mut(|element| {
                let step = entry_step(element, items, keys);
                visit(step, element, Some(items), path)
            });
        }
        (Shape::Set, Value::Array(list)) => {
            list.retain_mut(|element| visit(super::set_step(element), element, None, path));
        }
        _ => {}
    }
}

fn container_len(value: &Value) -> usize {
    match value {
        Value::Array(list) => list.len(),
        Value::Object(map) => map.len(),
        _ => 0,
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
    let shape = schema.map(shape).unwrap_or(match applied {
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
