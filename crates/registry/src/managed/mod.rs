//! `metadata.managedFields`: which manager set which fields, by structured-merge-diff's rules.
//!
//! A field set is a set of member paths, walked by the kind's OpenAPI schema: struct fields
//! `f:<name>`, granular map keys `f:<key>`, list-map entries `k:{"port":80,"protocol":"TCP"}`,
//! set entries `v:<value>`; atomic values are leaves. In `fieldsV1`, a member that also has
//! members below it carries a `.` key.
//!
//! - An **Update** (`record_update`) compares the stored object with the new one
//!   (structured-merge-diff's `Compare`): changed leaves are *modified*, and a node that is new
//!   or gone is *added* or *removed* itself — which is where a `.` comes from. The writer gains
//!   what was modified or added, every other manager loses it, and everyone loses what was
//!   removed. A create compares with the kind's Go zero value, so the structs Go always has
//!   (`metadata`, `spec`) are never added, while a new map, list or list entry is.
//! - An **Apply** owns exactly the applied configuration's fields (`ToFieldSet`: leaves, list
//!   entries, empty maps and granular map entries — not the maps and lists holding them), and
//!   conflicts with every other manager owning a field the apply changes.
//! - The fields the subresource resets (status for the main resource; spec and more for
//!   `/status`) are never recorded for that write, and system metadata (name, uid, …) never.

use std::collections::BTreeSet;

use capstan_machinery::hash::{HashMap, HashMapExt, HashSet, HashSetExt};

use capstan_machinery::meta;
use capstan_machinery::schema::{Shape, shape};
use capstan_machinery::smp::value_key;
use serde_json::{Map, Value, json};

use crate::{ResourceInfo, Subresource};
pub use unchanged::{same_ignoring_times, same_ignoring_times_current};

mod apply;
mod create;
mod current;
mod fields_v1;
#[cfg(test)]
mod tests;
mod unchanged;

pub use apply::{Conflict, apply};
use create::{Changes, record_create};
pub use current::record_update_current;
use fields_v1::{from_fields_v1, to_fields_v1};

/// A path of fieldsV1 steps (`f:spec`, `k:{…}`, `v:…`).
type Path = Vec<String>;
/// A field set: its member paths.
type Set = BTreeSet<Path>;

/// The paths upstream's `stripMetaManager` takes out of every write's set.
const STRIPPED: &[&[&str]] = &[
    &["f:apiVersion"],
    &["f:kind"],
    &["f:metadata"],
    &["f:metadata", "f:name"],
    &["f:metadata", "f:namespace"],
    &["f:metadata", "f:creationTimestamp"],
    &["f:metadata", "f:selfLink"],
    &["f:metadata", "f:uid"],
    &["f:metadata", "f:clusterName"],
    &["f:metadata", "f:generation"],
    &["f:metadata", "f:managedFields"],
    &["f:metadata", "f:resourceVersion"],
];

/// What managedFields bookkeeping needs to know about a write: the kind's schema, version
/// and Go zero value, and the subresource it goes through with the fields that resets.
#[derive(Debug, Clone)]
pub struct Tracking {
    /// The kind's OpenAPI definition.
    pub schema: Option<&'static Value>,
    /// The entries' `apiVersion`.
    pub api_version: String,
    /// The entries' `subresource`.
    pub subresource: Option<&'static str>,
    resets: &'static [&'static [&'static str]],
    zero: &'static str,
}

impl Tracking {
    /// The bookkeeping of a write of `info`'s kind through `subresource`.
    pub fn new(
        info: &ResourceInfo,
        schema: Option<&'static Value>,
        subresource: Subresource,
    ) -> Self {
        Tracking {
            schema,
            api_version: info.api_version(),
            subresource: subresource.name(),
            resets: info.resets(subresource),
            zero: info.zero,
        }
    }

    /// The kind's Go zero value.
    fn zero(&self) -> &'static Value {
        crate::info::parsed_zero(self.zero)
    }

    /// Whether a path is a reset field or lies under one.
    fn resets_path(&self, path: &[String]) -> bool {
        self.resets.iter().any(|reset| {
            reset.len() <= path.len()
                && reset
                    .iter()
                    .zip(path)
                    .all(|(field, step)| step.strip_prefix("f:") == Some(field))
        })
    }

    /// `comparison` without the reset fields (upstream's `FilterFields` on the comparison).
    fn filtered(&self, mut comparison: Comparison) -> Comparison {
        if !self.resets.is_empty() {
            for set in [
                &mut comparison.added,
                &mut comparison.modified,
                &mut comparison.removed,
            ] {
                set.retain(|p| !self.resets_path(p));
            }
        }
        comparison
    }

    /// `set` as this write records it: without the reset fields (and everything under them)
    /// and without system metadata.
    fn recordable(&self, mut set: Set) -> Set {
        set.retain(|path| self.records(path));
        set
    }

    /// Whether a changed path is recorded (neither reset nor system metadata).
    fn records(&self, path: &[String]) -> bool {
        !self.resets_path(path)
            && !STRIPPED.iter().any(|stripped| {
                stripped.len() == path.len() && stripped.iter().zip(path).all(|(a, b)| a == b)
            })
    }

    /// Whether a comparison sets anything this write records (then the manager's entry
    /// takes a new time).
    fn records_any(&self, comparison: &Comparison) -> bool {
        comparison
            .added
            .iter()
            .chain(&comparison.modified)
            .any(|path| self.records(path))
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
    json_step(b"k:", &Value::Object(key))
}

/// The step of a set's element: `v:` and the element's JSON.
pub(crate) fn set_step(element: &Value) -> String {
    json_step(b"v:", element)
}

/// `prefix` and `value`'s JSON, as structured-merge-diff writes a step (with Go's escapes: its
/// encoder escapes `<`, `>` and `&`). Written straight into the step (`format!` through
/// `Display` costs several times more).
fn json_step(prefix: &[u8], value: &Value) -> String {
    let mut step = prefix.to_vec();
    let _ = capstan_machinery::json::to_writer(&mut step, value);
    String::from_utf8(step).unwrap_or_default()
}

/// The shape a value takes: its schema's, or a map / atomic value without one.
fn shape_of(value: Option<&Value>, schema: Option<&'static Value>) -> Shape<'static> {
    schema.map(shape).unwrap_or(match value {
        Some(Value::Object(_)) => Shape::Map(None),
        _ => Shape::Atomic,
    })
}

/// A child step's schema in a struct or map node.
fn child_schema(shape: &Shape<'static>, key: &str) -> Option<&'static Value> {
    match shape {
        Shape::Struct(properties) => properties.get(key),
        Shape::Map(values) => *values,
        _ => None,
    }
}

/// The fields a value sets (structured-merge-diff's `ToFieldSet`).
fn field_set(value: &Value, schema: Option<&'static Value>) -> Set {
    let mut out = Set::new();
    to_field_set(value, schema, &mut Vec::new(), &mut out);
    out
}

fn to_field_set(value: &Value, schema: Option<&'static Value>, path: &mut Path, out: &mut Set) {
    let node = shape_of(Some(value), schema);
    match (&node, value) {
        (Shape::Struct(_) | Shape::Map(_), Value::Object(map)) => {
            let granular = matches!(node, Shape::Map(_));
            for (key, child) in map {
                let declared = !granular && child_schema(&node, key).is_some();
                path.push(field_step(key));
                to_field_set(child, child_schema(&node, key), path, out);
                let empty = child.is_null() || child.as_object().is_some_and(Map::is_empty);
                if empty || !declared {
                    out.insert(path.clone());
                }
                path.pop();
            }
        }
        (Shape::ListMap(items, keys), Value::Array(list)) => {
            for element in list {
                path.push(entry_step(element, items, keys));
                to_field_set(element, Some(items), path, out);
                out.insert(path.clone());
                path.pop();
            }
        }
        (Shape::Set, Value::Array(list)) => {
            for element in list {
                path.push(set_step(element));
                out.insert(path.clone());
                path.pop();
            }
        }
        _ if !path.is_empty() => {
            out.insert(path.clone());
        }
        _ => {}
    }
}

/// What changed between two objects (structured-merge-diff's `Comparison`).
#[derive(Debug, Default)]
struct Comparison {
    added: Set,
    modified: Set,
    removed: Set,
}

impl Comparison {
    /// Everything the newer object sets anew or differently, and everything it no longer has.
    fn changed_and_removed(mut self) -> (Set, Set) {
        self.added.append(&mut self.modified);
        (self.added, self.removed)
    }
}

/// The step naming a struct field or map key.
fn field_step(key: &str) -> String {
    let mut step = String::with_capacity(key.len() + 2);
    step.push_str("f:");
    step.push_str(key);
    step
}

/// Compares `lhs` (the live object) with `rhs` (the new one).
fn compare(lhs: &Value, rhs: &Value, schema: Option<&'static Value>) -> Comparison {
    let mut out = Comparison::default();
    compare_node(Some(lhs), Some(rhs), schema, &mut Vec::new(), &mut out);
    out
}

/// The entries of a list node by their step (the first of duplicates).
fn entries<'v>(list: Option<&'v Vec<Value>>, node: &Shape<'static>) -> Vec<(String, &'v Value)> {
    let mut seen = HashSet::new();
    list.into_iter()
        .flatten()
        .map(|element| {
            let step = match node {
                Shape::ListMap(items, keys) => entry_step(element, items, keys),
                _ => set_step(element),
            };
            (step, element)
        })
        .filter(|(step, _)| seen.insert(step.clone()))
        .collect()
}

fn compare_node(
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    schema: Option<&'static Value>,
    path: &mut Path,
    out: &mut impl Changes,
) {
    let node = shape_of(rhs.or(lhs), schema);
    // A leaf: added, removed or modified as a whole.
    let leaf = |out: &mut _| {
        if path.is_empty() {
            return;
        }
        match (lhs, rhs) {
            (None, _) => Changes::added(out, path),
            (_, None) => Changes::removed(out, path),
            (Some(l), Some(r)) if l != r => Changes::modified(out, path),
            _ => {}
        };
    };
    match &node {
        Shape::Struct(_) | Shape::Map(_) => {
            let (l, r) = (
                lhs.and_then(Value::as_object),
                rhs.and_then(Value::as_object),
            );
            // Both empty (or null): a leaf, which keeps `{}` apart from absent.
            if l.is_none_or(Map::is_empty) && r.is_none_or(Map::is_empty) {
                return leaf(out);
            }
            // An object's own managedFields are not among its fields.
            let in_metadata = path.len() == 1 && path[0] == "f:metadata";
            let skip = |key: &str| in_metadata && key == "managedFields";
            for (key, value) in l.into_iter().flatten() {
                if skip(key) {
                    continue;
                }
                path.push(field_step(key));
                let other = r.and_then(|r| r.get(key));
                compare_node(Some(value), other, child_schema(&node, key), path, out);
                path.pop();
            }
            for (key, value) in r.into_iter().flatten() {
                if skip(key) || l.is_some_and(|l| l.contains_key(key)) {
                    continue;
                }
                path.push(field_step(key));
                compare_node(None, Some(value), child_schema(&node, key), path, out);
                path.pop();
            }
        }
        Shape::ListMap(..) | Shape::Set => {
            let items = match &node {
                Shape::ListMap(items, _) => Some(*items),
                _ => None,
            };
            let (l, r) = (lhs.and_then(Value::as_array), rhs.and_then(Value::as_array));
            if l.is_none_or(Vec::is_empty) && r.is_none_or(Vec::is_empty) {
                return leaf(out);
            }
            // Each entry's step is made once (a list-map's is its keys as JSON); a list that
            // is all new (a create's) needs no lookups.
            let right = entries(r, &node);
            let left = entries(l, &node);
            let mut in_left = HashSet::new();
            if !left.is_empty() {
                let by_step: HashMap<&str, &Value> = right
                    .iter()
                    .map(|(step, value)| (step.as_str(), *value))
                    .collect();
                for (step, value) in &left {
                    in_left.insert(step.as_str());
                    path.push(step.clone());
                    let other = by_step.get(step.as_str()).copied();
                    compare_node(Some(value), other, items, path, out);
                    path.pop();
                }
            }
            for (step, value) in right {
                if in_left.contains(step.as_str()) {
                    continue;
                }
                path.push(step);
                compare_node(None, Some(value), items, path, out);
                path.pop();
            }
        }
        _ => return leaf(out),
    }
    // A node with members below it: itself added or removed when new or gone.
    if !path.is_empty() {
        if lhs.is_none() {
            out.added(path);
        } else if rhs.is_none() {
            out.removed(path);
        }
    }
}

/// Whether any path of `set` lies under `node` (or is `node`): one ordered lookup, since the
/// paths under a node sort right after it.
fn owns_under(set: &Set, node: &[String]) -> bool {
    set.range(node.to_vec()..)
        .next()
        .is_some_and(|p| p.starts_with(node))
}

/// An entry's set.
fn owned_by(entry: &Value) -> Set {
    entry
        .get("fieldsV1")
        .map(from_fields_v1)
        .unwrap_or_default()
}

/// A managedFields entry; its `fieldsV1` is rendered when it is stored, from the set its
/// [`Owner`] holds (an owner made with [`Owner::new`] is always rendered).
fn entry(manager: &str, operation: &str, tracking: &Tracking, time: &str) -> Value {
    let mut entry = Map::new();
    entry.insert("manager".into(), json!(manager));
    entry.insert("operation".into(), json!(operation));
    entry.insert("apiVersion".into(), json!(tracking.api_version));
    entry.insert("time".into(), json!(time));
    entry.insert("fieldsType".into(), json!("FieldsV1"));
    // Rendered from `fields` when the entry is stored (`store_entries`), in this place.
    entry.insert("fieldsV1".into(), Value::Null);
    if let Some(sub) = tracking.subresource {
        entry.insert("subresource".into(), json!(sub));
    }
    Value::Object(entry)
}

/// Whether `entry` is the one `manager` keeps for `operation` through this write's version
/// and subresource.
fn is_entry_of(entry: &Value, manager: &str, operation: &str, tracking: &Tracking) -> bool {
    let text = |key: &str| entry.get(key).and_then(Value::as_str);
    text("manager") == Some(manager)
        && text("operation") == Some(operation)
        && (operation == "Apply" || text("apiVersion") == Some(tracking.api_version.as_str()))
        && text("subresource") == tracking.subresource
}

/// An object without its managedFields (they are never compared).
fn without_managed_fields(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(metadata) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.shift_remove("managedFields");
    }
    copy
}

/// A managedFields entry and the set it owns, parsed once; re-rendered only when edited.
struct Owner {
    entry: Value,
    owned: Set,
    edited: bool,
}

impl Owner {
    fn new(entry: Value, owned: Set) -> Self {
        Owner {
            entry,
            owned,
            edited: true,
        }
    }

    /// Keeps the fields `keep` accepts.
    fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        let before = self.owned.len();
        self.owned.retain(|p| keep(p));
        self.edited |= self.owned.len() != before;
    }

    /// Owns `set` as well.
    fn extend(&mut self, set: Set) {
        let before = self.owned.len();
        self.owned.extend(set);
        self.edited |= self.owned.len() != before;
    }

    /// Owns `set` instead.
    fn replace(&mut self, set: Set) {
        if self.owned != set {
            self.owned = set;
            self.edited = true;
        }
    }
}

/// The stored entries with their sets.
fn entries_of(object: Option<&Value>) -> Vec<Owner> {
    object
        .and_then(meta::metadata)
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|e| Owner {
                    owned: owned_by(e),
                    entry: e.clone(),
                    edited: false,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes entries back, each edited one re-rendered, those left empty dropped, in upstream's
/// order.
fn store_entries(object: &mut Value, owners: Vec<Owner>) {
    let mut out: Vec<Value> = Vec::with_capacity(owners.len());
    for mut owner in owners {
        if owner.owned.is_empty() {
            continue;
        }
        if owner.edited {
            owner.entry["fieldsV1"] = to_fields_v1(&owner.owned);
        }
        out.push(owner.entry);
    }
    put_entries(object, out);
}

/// Sets the object's managedFields to `out`, capped and ordered as upstream stores them
/// (none: no managedFields).
fn put_entries(object: &mut Value, mut out: Vec<Value>) {
    cap_updates(&mut out);
    sort_entries(&mut out);
    let metadata = meta::metadata_mut(object);
    if out.is_empty() {
        metadata.shift_remove("managedFields");
    } else {
        metadata.insert("managedFields".into(), Value::Array(out));
    }
}

/// Records an `Update` by `manager` on `new`, given the stored `old` object (None on create).
pub fn record_update(new: &mut Value, old: Option<&Value>, manager: &str, tracking: &Tracking) {
    let Some(old) = old else {
        return record_create(new, manager, tracking);
    };
    let comparison = compare(old, new, tracking.schema);
    record(new, comparison, entries_of(Some(old)), manager, tracking);
}

/// Records the write's `comparison` of the stored object with `new` in `entries` (the stored
/// object's), which become `new`'s managedFields.
fn record(
    new: &mut Value,
    comparison: Comparison,
    mut entries: Vec<Owner>,
    manager: &str,
    tracking: &Tracking,
) {
    let (changed, removed) = tracking.filtered(comparison).changed_and_removed();
    // Every other manager loses what this write changed or removed.
    for owner in entries.iter_mut() {
        if !is_entry_of(&owner.entry, manager, "Update", tracking) {
            owner.retain(|p| !changed.contains(p) && !removed.contains(p));
        }
    }
    let taken = tracking.recordable(changed);
    let now = meta::now_rfc3339();
    match entries
        .iter_mut()
        .find(|owner| is_entry_of(&owner.entry, manager, "Update", tracking))
    {
        Some(owner) => {
            owner.retain(|p| !removed.contains(p));
            if !taken.is_empty() {
                owner.extend(taken);
                owner.entry["time"] = json!(now);
            }
        }
        None if !taken.is_empty() => {
            let fresh = entry(manager, "Update", tracking, &now);
            entries.push(Owner::new(fresh, taken));
        }
        None => {}
    }
    store_entries(new, entries);
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
                let mut fields = owned_by(&entries[ancient]);
                fields.extend(owned_by(&entries[oldest]));
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

/// Upstream's order of entries (`sortEncodedManagedFields`): by operation (`Apply` first),
/// then time (to the second), manager, apiVersion and subresource.
fn sort_entries(entries: &mut [Value]) {
    let key = |entry: &Value| {
        let text = |k: &str| meta::text(entry.get(k)).to_string();
        // RFC 3339 times in UTC with whole seconds sort as text; no time sorts first.
        (
            text("operation"),
            text("time").get(..19).unwrap_or_default().to_string(),
            text("manager"),
            text("apiVersion"),
            text("subresource"),
        )
    };
    entries.sort_by_cached_key(key);
}
