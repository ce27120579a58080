//! Strategic merge patch (`application/strategic-merge-patch+json`), driven by the
//! `x-kubernetes-patch-strategy` / `x-kubernetes-patch-merge-key` extensions of the OpenAPI
//! schema. No Rust crate implements it; this follows apimachinery's `strategicpatch` package
//! (`StrategicMergeMapPatch`, which the apiserver calls with `MergeParallelList` and
//! `IgnoreUnmatchedNulls`) rule for rule:
//!
//! - maps merge recursively and `null` deletes; a value the original lacks, or of another
//!   type, is taken as the patch has it;
//! - lists with strategy `merge` merge by their merge key (or by value for primitive lists),
//!   every other list is replaced;
//! - the merged list is put in upstream's order: the patch's items in the patch's order (or
//!   `$setElementOrder/<list>`'s), the server-only items in the live order, interleaved by
//!   `mergeSortedSlice` — so an item the live list lacks goes before the live items unless a
//!   patch item that the live list has comes first;
//! - the `$patch` (`replace`, `delete`), `$retainKeys`, `$setElementOrder/…` and
//!   `$deleteFromPrimitiveList/…` directives, with upstream's errors: the `mergepatch` format
//!   errors are 400s, lists of lists a generic 422, and everything else upstream returns as a
//!   plain Go error, which the apiserver answers as a 500 with no reason.
//!
//! Upstream compares items with Go's `==` in nested loops; here every lookup goes through a
//! hash of the item's identity, so a client-controlled list costs linear time.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::schema::{property, resolve};

/// How [`render`] spells a value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Canonical JSON with sorted object keys.
    Key,
    /// Go's `%v` of the `interface{}` apimachinery decodes JSON into.
    Go,
}

fn render(value: &Value, style: Style, out: &mut String) {
    let (open_map, open_list, close_map, separator) = match style {
        Style::Key => ("{", "[", '}', ','),
        Style::Go => ("map[", "[", ']', ' '),
    };
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push_str(open_map);
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(separator);
                }
                match style {
                    Style::Key => out.push_str(&Value::String(key.clone()).to_string()),
                    Style::Go => out.push_str(key),
                }
                out.push(':');
                render(&map[key.as_str()], style, out);
            }
            out.push(close_map);
        }
        Value::Array(items) => {
            out.push_str(open_list);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(separator);
                }
                render(item, style, out);
            }
            out.push(']');
        }
        Value::Null if style == Style::Go => out.push_str("<nil>"),
        Value::String(s) if style == Style::Go => out.push_str(s),
        Value::Number(n) if style == Style::Go && n.as_i64().is_none() => {
            out.push_str(&go_float(n.as_f64().unwrap_or_default()));
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A value as a hashable key: its JSON with object keys sorted, so equal values (however
/// their keys are ordered) have equal keys. `1` and `1.0` stay apart, as an `int64` and a
/// `float64` do upstream.
pub fn value_key(value: &Value) -> String {
    let mut out = String::new();
    render(value, Style::Key, &mut out);
    out
}

/// A value as Go's `%v` prints the `interface{}` apimachinery decoded it into: `map[k:v …]`
/// with sorted keys, `[a b]`, integers as `int64`, other numbers as `float64` (`%g`,
/// shortest), `<nil>`. Upstream's error texts embed values this way.
pub fn go_format(value: &Value) -> String {
    let mut out = String::new();
    render(value, Style::Go, &mut out);
    out
}

/// Go's `%v` of a `float64`: the shortest digits, in exponent form (`1e+06`) when the
/// exponent is below -4 or at least 6.
fn go_float(f: f64) -> String {
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..6).contains(&exponent) {
        return f.to_string();
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// The Go type apimachinery's JSON decoding gives a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoType {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    List,
    Map,
}

const LIST: &str = "[]interface {}";
const MAP: &str = "map[string]interface {}";

impl GoType {
    fn of(value: &Value) -> Self {
        match value {
            Value::Null => GoType::Nil,
            Value::Bool(_) => GoType::Bool,
            Value::Number(n) if n.is_i64() => GoType::Int,
            Value::Number(_) => GoType::Float,
            Value::String(_) => GoType::Str,
            Value::Array(_) => GoType::List,
            Value::Object(_) => GoType::Map,
        }
    }

    fn name(self) -> &'static str {
        match self {
            GoType::Nil => "%!s(<nil>)",
            GoType::Bool => "bool",
            GoType::Int => "int64",
            GoType::Float => "float64",
            GoType::Str => "string",
            GoType::List => LIST,
            GoType::Map => MAP,
        }
    }
}

/// How upstream answers a strategic-merge failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmpErrorKind {
    /// One of `mergepatch`'s format errors: 400 `BadRequest` with the text.
    BadRequest,
    /// Lists of lists: 422 `Invalid` with the generic text.
    Unprocessable,
    /// Any other error: a plain Go error upstream, which the apiserver answers as a 500
    /// with no reason and the error's text.
    Internal,
}

/// A strategic-merge failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmpError {
    /// The text.
    pub message: String,
    /// How it is answered.
    pub kind: SmpErrorKind,
}

// The directives.
const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder";
const DELETE_FROM: &str = "$deleteFromPrimitiveList";

/// One of mergepatch's format errors (`invalid patch format of …`): a 400 with its text.
fn bad(message: &str) -> SmpError {
    SmpError {
        message: message.into(),
        kind: SmpErrorKind::BadRequest,
    }
}

fn internal(message: String) -> SmpError {
    SmpError {
        message,
        kind: SmpErrorKind::Internal,
    }
}

fn no_merge_key(map: &Value, key: &str) -> SmpError {
    internal(format!(
        "map: {} does not contain declared merge key: {key}",
        go_format(map)
    ))
}

fn bad_arg_type(expected: &str, actual: &Value) -> SmpError {
    internal(format!(
        "expected a {expected}, but received a {}",
        GoType::of(actual).name()
    ))
}

/// `%s` of a value: strings as they are, anything else as Go's `%!s(type=value)`.
fn go_string(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "%!s(<nil>)".into(),
        other => format!("%!s({}={})", GoType::of(other).name(), go_format(other)),
    }
}

fn bad_patch_type(directive: &Value, map: &Map<String, Value>) -> SmpError {
    internal(format!(
        "Unknown patch type: {} in map: {}",
        go_string(directive),
        go_format(&Value::Object(map.clone()))
    ))
}

/// The field name after `<prefix>/` (upstream's `extractKey`).
fn extract_key<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    let (head, rest) = key.split_once('/')?;
    (head == prefix).then_some(rest)
}

/// A place in the object's schema: the (unresolved) node, so its Go type's name is known.
#[derive(Debug, Clone, Copy)]
struct Node(Option<&'static Value>);

/// A field's patch metadata.
#[derive(Debug, Clone, Copy, Default)]
struct PatchMeta {
    merge: bool,
    replace: bool,
    key: Option<&'static str>,
}

impl Node {
    /// The struct's name, as `reflect.Type.Name()` gives it.
    fn name(self) -> &'static str {
        let Some(node) = self.0 else { return "" };
        let reference = node
            .get("$ref")
            .or_else(|| node.get("allOf").and_then(|all| all.get(0)?.get("$ref")))
            .and_then(Value::as_str);
        match reference {
            Some(reference) => reference.rsplit('.').next().unwrap_or(reference),
            None => node
                .get("x-kubernetes-group-version-kind")
                .and_then(|gvk| gvk.get(0)?.get("kind")?.as_str())
                .unwrap_or(""),
        }
    }

    /// The node of field `key` (upstream's `LookupPatchMetadataForStruct`): a struct's
    /// property, or a map's value; a struct without the field is an error.
    fn field(self, key: &str) -> Result<Node, SmpError> {
        let Some(node) = self.0 else {
            return Ok(Node(None));
        };
        let resolved = resolve(node);
        if resolved.get("properties").is_some() {
            return match property(node, key) {
                Some(field) => Ok(Node(Some(field))),
                None => Err(internal(format!(
                    "unable to find api field in struct {} for the json field {key:?}",
                    self.name()
                ))),
            };
        }
        Ok(Node(
            resolved
                .get("additionalProperties")
                .filter(|v| v.is_object()),
        ))
    }

    /// The node of a list's items.
    fn items(self) -> Node {
        Node(self.0.and_then(|node| resolve(node).get("items")))
    }

    fn meta(self) -> PatchMeta {
        let Some(node) = self.0 else {
            return PatchMeta::default();
        };
        let strategies = crate::meta::text(node.get("x-kubernetes-patch-strategy"));
        // `retainKeys` rides along with the strategy proper (`merge,retainKeys`).
        let strategy = strategies
            .split(',')
            .find(|s| *s != "retainKeys")
            .unwrap_or("");
        PatchMeta {
            merge: strategy == "merge",
            replace: strategy == "replace",
            key: node
                .get("x-kubernetes-patch-merge-key")
                .and_then(Value::as_str),
        }
    }
}

/// Applies `patch` to `original`; `schema` is the object's OpenAPI definition.
pub fn apply(
    original: Value,
    patch: &Value,
    schema: Option<&'static Value>,
) -> Result<Value, SmpError> {
    let (Value::Object(original), Value::Object(patch)) = (original, patch) else {
        return Err(bad("invalid JSON document"));
    };
    Ok(Value::Object(merge_map(
        original,
        patch.clone(),
        Node(schema),
    )?))
}

/// Removes `null`s from a value taken as the patch has it (`IgnoreUnmatchedNulls`).
fn discard_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(discard_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(discard_nulls),
        _ => {}
    }
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    schema: Node,
) -> Result<Map<String, Value>, SmpError> {
    if let Some(directive) = patch.get(PATCH) {
        return match directive.as_str() {
            Some("replace") => {
                patch.shift_remove(PATCH);
                Ok(patch)
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(bad_patch_type(directive, &patch)),
        };
    }
    retain_keys(&mut original, &mut patch)?;
    merge_ordered_lists(&mut original, &mut patch, schema)?;
    for (key, mut value) in patch {
        let (key, delete_list) = if key.starts_with(DELETE_FROM) {
            let field = extract_key(&key, DELETE_FROM)
                .ok_or_else(|| bad("invalid patch format of primitive list"))?;
            (field.to_string(), true)
        } else {
            (key, false)
        };
        if value.is_null() {
            original.shift_remove(&key);
            continue;
        }
        let Some(current) = original.get_mut(&key) else {
            if !delete_list {
                discard_nulls(&mut value);
                original.insert(key, value);
            }
            continue;
        };
        match (current, value) {
            (Value::Object(current), Value::Object(value)) => {
                let field = schema.field(&key)?;
                let merged = if field.meta().replace {
                    value
                } else {
                    merge_map(std::mem::take(current), value, field)?
                };
                *current = merged;
            }
            (Value::Array(current), Value::Array(value)) => {
                let field = schema.field(&key)?;
                let merged =
                    merge_slice_handler(std::mem::take(current), value, field, delete_list)?;
                *current = merged;
            }
            (current, mut value) => {
                if GoType::of(current) == GoType::of(&value) || !delete_list {
                    discard_nulls(&mut value);
                    *current = value;
                }
            }
        }
    }
    Ok(original)
}

/// `$retainKeys`: every key the patch sets must be listed; the original keeps only those.
fn retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), SmpError> {
    let Some(retain) = patch.shift_remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(keys) = retain else {
        return Err(bad("invalid patch format of retainKeys"));
    };
    let keep: HashSet<&str> = keys.iter().filter_map(Value::as_str).collect();
    let unlisted = patch.iter().any(|(k, v)| {
        !v.is_null()
            && !k.starts_with(DELETE_FROM)
            && !k.starts_with(SET_ORDER)
            && !keep.contains(k.as_str())
    });
    if unlisted {
        return Err(bad("invalid patch format of retainKeys"));
    }
    original.retain(|k, _| keep.contains(k.as_str()));
    Ok(())
}

fn as_list(value: Option<&Value>) -> Result<Option<&Vec<Value>>, SmpError> {
    match value {
        None => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(other) => Err(bad_arg_type(LIST, other)),
    }
}

/// `$setElementOrder/<list>` (upstream's `mergePatchIntoOriginal`): the list is merged, then
/// ordered by the directive (for the patch's items) and the live list (for the rest).
fn merge_ordered_lists(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    schema: Node,
) -> Result<(), SmpError> {
    let directives: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ORDER))
        .cloned()
        .collect();
    for directive in directives {
        let Some(order) = patch.shift_remove(&directive) else {
            continue;
        };
        let Value::Array(order) = order else {
            return Err(bad_arg_type(LIST, &order));
        };
        let key = extract_key(&directive, SET_ORDER)
            .ok_or_else(|| bad("invalid patch format of setElementOrder list"))?;
        let live = as_list(original.get(key))?.cloned();
        let patched = as_list(patch.get(key))?.cloned();
        let field = schema.field(key)?;
        let meta = field.meta();
        validate_against_order(patched.as_deref(), &order, meta.key)?;
        let merged = match (&live, &patched) {
            (Some(live), None) => live.clone(),
            (None, Some(patched)) => without_directives(patched),
            (Some(live), Some(patched)) => {
                merge_slice_handler(live.clone(), patched.clone(), field, false)?
            }
            (None, None) => continue,
        };
        let live = live.unwrap_or_default();
        let kind = element_type(&[&live, patched.as_deref().unwrap_or_default()])?;
        let (in_order, server_only) = partition(merged, &order, meta.key)?;
        let both = normalize_element_order(in_order, server_only, &order, &live, meta.key, kind)?;
        original.insert(key.to_string(), Value::Array(both));
        patch.shift_remove(key);
    }
    Ok(())
}

/// A list taken whole from a patch, without its directive elements.
fn without_directives(list: &[Value]) -> Vec<Value> {
    list.iter()
        .filter(|item| item.get(PATCH).is_none())
        .cloned()
        .collect()
}

/// The patch list's items must appear in `$setElementOrder`'s relative order (deletions
/// aside).
fn validate_against_order(
    patched: Option<&[Value]>,
    order: &[Value],
    merge_key: Option<&str>,
) -> Result<(), SmpError> {
    let patched = patched.unwrap_or_default();
    if order.is_empty() || patched.is_empty() {
        return Ok(());
    }
    let mut items = Vec::with_capacity(patched.len());
    for item in patched {
        if merge_key.is_some() && !item.is_object() {
            return Err(bad_arg_type(MAP, item));
        }
        if merge_key.is_none() || item.get(PATCH).and_then(Value::as_str) != Some("delete") {
            items.push(item);
        }
    }
    let (mut p, mut o) = (0, 0);
    while p < items.len() && o < order.len() {
        if items[p].get(PATCH).is_some() {
            p += 1;
            continue;
        }
        if merge_key_equal(items[p], &order[o], merge_key)? {
            p += 1;
        }
        o += 1;
    }
    if p < items.len() && o >= order.len() {
        return Err(internal(format!(
            "The order in patch list:\n{}\n doesn't match {SET_ORDER} list:\n{}\n",
            go_format(&Value::Array(patched.to_vec())),
            go_format(&Value::Array(order.to_vec()))
        )));
    }
    Ok(())
}

fn merge_key_equal(left: &Value, right: &Value, merge_key: Option<&str>) -> Result<bool, SmpError> {
    let Some(key) = merge_key else {
        return Ok(value_key(left) == value_key(right));
    };
    let value_of = |item: &Value| -> Result<String, SmpError> {
        if !item.is_object() {
            return Err(bad_arg_type(MAP, item));
        }
        item.get(key)
            .map(value_key)
            .ok_or_else(|| no_merge_key(item, key))
    };
    Ok(value_of(left)? == value_of(right)?)
}

/// The type every element of the lists shares (upstream's `sliceElementType`).
fn element_type(lists: &[&[Value]]) -> Result<GoType, SmpError> {
    let mut kind = None;
    for item in lists.iter().flat_map(|list| list.iter()) {
        let this = GoType::of(item);
        match kind {
            None if this == GoType::List => {
                return Err(SmpError {
                    message: "lists of lists are not supported".into(),
                    kind: SmpErrorKind::Unprocessable,
                });
            }
            None => kind = Some(this),
            Some(kind) if kind != this => {
                let all = lists
                    .iter()
                    .map(|list| Value::Array(list.to_vec()))
                    .collect();
                return Err(internal(format!(
                    "list element types are not identical: {}",
                    go_format(&Value::Array(all))
                )));
            }
            Some(_) => {}
        }
    }
    kind.ok_or_else(|| internal("no elements in any of the given slices".into()))
}

fn merge_slice_handler(
    original: Vec<Value>,
    patch: Vec<Value>,
    field: Node,
    delete_list: bool,
) -> Result<Vec<Value>, SmpError> {
    let meta = field.meta();
    if !meta.merge {
        return Ok(patch);
    }
    merge_slice(original, patch, field.items(), meta.key, delete_list)
}

/// An item's identity in a list: its merge key's value for maps, itself otherwise.
fn identity(item: &Value, kind: GoType, merge_key: Option<&str>) -> String {
    if kind == GoType::Map {
        value_key(
            item.get(merge_key.unwrap_or_default())
                .unwrap_or(&Value::Null),
        )
    } else {
        value_key(item)
    }
}

/// Each identity's first position in `list` (upstream's `index`).
fn positions(list: &[Value], kind: GoType, merge_key: Option<&str>) -> HashMap<String, usize> {
    let mut out = HashMap::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        out.entry(identity(item, kind, merge_key)).or_insert(i);
    }
    out
}

fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    items: Node,
    merge_key: Option<&'static str>,
    delete_list: bool,
) -> Result<Vec<Value>, SmpError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let kind = element_type(&[&original, &patch])?;
    let (live, patch, merged) = if kind != GoType::Map {
        if delete_list {
            let remove: HashSet<String> = patch.iter().map(value_key).collect();
            return Ok(original
                .into_iter()
                .filter(|v| !remove.contains(&value_key(v)))
                .collect());
        }
        let mut seen = HashSet::with_capacity(original.len() + patch.len());
        let merged: Vec<Value> = original
            .iter()
            .chain(patch.iter())
            .filter(|v| seen.insert(value_key(v)))
            .cloned()
            .collect();
        (original, patch, merged)
    } else {
        let Some(key) = merge_key else {
            return Err(internal(format!(
                "cannot merge lists without merge key for {}",
                items.name()
            )));
        };
        let (live, patch) = special_elements(original, patch, key)?;
        let merged = merge_by_key(live.clone(), &patch, key, items)?;
        (live, patch, merged)
    };
    let (in_patch, server_only) = partition(merged, &patch, merge_key)?;
    normalize_element_order(in_patch, server_only, &patch, &live, merge_key, kind)
}

/// `$patch: delete` elements delete from the live list, `$patch: replace` makes the patch's
/// other elements the whole list; returns the live list and the patch without them.
fn special_elements(
    mut live: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
) -> Result<(Vec<Value>, Vec<Value>), SmpError> {
    let mut plain = Vec::with_capacity(patch.len());
    let mut replace = false;
    for element in patch {
        let Some(directive) = element.get(PATCH) else {
            plain.push(element);
            continue;
        };
        match directive.as_str() {
            Some("delete") => {
                let Some(value) = element.get(key) else {
                    return Err(no_merge_key(&element, key));
                };
                let gone = value_key(value);
                live.retain(|item| item.get(key).map(value_key).as_ref() != Some(&gone));
            }
            Some("replace") => replace = true,
            Some("merge") => {
                return Err(internal(
                    "merging lists cannot yet be specified in the patch".into(),
                ));
            }
            _ => {
                let map = element.as_object().cloned().unwrap_or_default();
                return Err(bad_patch_type(directive, &map));
            }
        }
    }
    Ok(if replace {
        (plain, Vec::new())
    } else {
        (live, plain)
    })
}

/// Patch elements merged into the live element with the same key, or appended.
fn merge_by_key(
    mut live: Vec<Value>,
    patch: &[Value],
    key: &str,
    items: Node,
) -> Result<Vec<Value>, SmpError> {
    let mut at: HashMap<String, usize> = HashMap::with_capacity(live.len() + patch.len());
    for (i, item) in live.iter().enumerate() {
        if let Some(value) = item.get(key) {
            at.entry(value_key(value)).or_insert(i);
        }
    }
    for element in patch {
        let Some(value) = element.get(key) else {
            return Err(no_merge_key(element, key));
        };
        let id = value_key(value);
        match at.get(&id) {
            Some(&i) => {
                let (Value::Object(current), Value::Object(element)) =
                    (std::mem::take(&mut live[i]), element)
                else {
                    return Err(bad_arg_type(MAP, element));
                };
                live[i] = Value::Object(merge_map(current, element.clone(), items)?);
            }
            None => {
                at.insert(id, live.len());
                live.push(element.clone());
            }
        }
    }
    Ok(live)
}

/// Splits `merged` into the items `by` has and the rest (upstream's
/// `partition{Maps,Primitives}ByPresentInList`).
fn partition(
    merged: Vec<Value>,
    by: &[Value],
    merge_key: Option<&str>,
) -> Result<(Vec<Value>, Vec<Value>), SmpError> {
    let present: HashSet<String> = match merge_key {
        None => by.iter().map(value_key).collect(),
        Some(key) => by
            .iter()
            .filter_map(|item| item.get(key).map(value_key))
            .collect(),
    };
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for item in merged {
        let id = match merge_key {
            None => value_key(&item),
            Some(key) => {
                if !item.is_object() {
                    return Err(bad_arg_type(MAP, &item));
                }
                let Some(value) = item.get(key) else {
                    return Err(no_merge_key(&item, key));
                };
                value_key(value)
            }
        };
        if present.contains(&id) {
            inside.push(item);
        } else {
            outside.push(item);
        }
    }
    Ok((inside, outside))
}

/// The patch's items in `patch_order`, the server-only items in `server_order`, then the
/// two interleaved by the live order (upstream's `normalizeElementOrder`).
fn normalize_element_order(
    patch: Vec<Value>,
    server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    merge_key: Option<&str>,
    kind: GoType,
) -> Result<Vec<Value>, SmpError> {
    let patch = normalize_slice_order(patch, patch_order, merge_key, kind)?;
    let server_only = normalize_slice_order(server_only, server_order, merge_key, kind)?;
    Ok(merge_sorted(
        server_only,
        patch,
        server_order,
        merge_key,
        kind,
    ))
}

fn normalize_slice_order(
    to_sort: Vec<Value>,
    order: &[Value],
    merge_key: Option<&str>,
    kind: GoType,
) -> Result<Vec<Value>, SmpError> {
    let mut deletions = Vec::new();
    let mut to_sort = to_sort;
    if kind == GoType::Map {
        let key = merge_key.unwrap_or_default();
        for item in to_sort.iter().chain(order) {
            if !item.is_object() {
                return Err(bad_arg_type(MAP, item));
            }
            if item.get(key).is_none() {
                return Err(no_merge_key(item, key));
            }
        }
        let (keep, delete): (Vec<Value>, Vec<Value>) = to_sort
            .into_iter()
            .partition(|item| item.get(PATCH).and_then(Value::as_str) != Some("delete"));
        to_sort = keep;
        deletions = delete;
    }
    let at = positions(order, kind, merge_key);
    let mut ranked: Vec<(Option<usize>, Value)> = to_sort
        .into_iter()
        .map(|item| (at.get(&identity(&item, kind, merge_key)).copied(), item))
        .collect();
    go_stable_sort(&mut ranked, |a, b| match (a.0, b.0) {
        (Some(a), Some(b)) => a < b,
        _ => true,
    });
    let mut out: Vec<Value> = ranked.into_iter().map(|(_, item)| item).collect();
    out.extend(deletions);
    Ok(out)
}

/// Inserts the server-only items (`left`) among the patch's (`right`): a server-only item
/// goes first only when both are in the live list and it comes earlier there (upstream's
/// `mergeSortedSlice`).
fn merge_sorted(
    left: Vec<Value>,
    right: Vec<Value>,
    server_order: &[Value],
    merge_key: Option<&str>,
    kind: GoType,
) -> Vec<Value> {
    let at = positions(server_order, kind, merge_key);
    let rank = |item: &Value| at.get(&identity(item, kind, merge_key)).copied();
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!((rank(l), rank(r)), (Some(l), Some(r)) if l < r),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// Go's `sort.SliceStable` (insertion sort in blocks of 20, then `symMerge`), step for step:
/// upstream sorts with a comparator that is not a strict order when an item is missing from
/// the order list, and the result then depends on the algorithm.
fn go_stable_sort<T>(data: &mut [T], less: impl Fn(&T, &T) -> bool) {
    let n = data.len();
    let less = |data: &[T], i: usize, j: usize| less(&data[i], &data[j]);
    let insertion = |data: &mut [T], a: usize, b: usize| {
        for i in a + 1..b {
            let mut j = i;
            while j > a && less(data, j, j - 1) {
                data.swap(j, j - 1);
                j -= 1;
            }
        }
    };
    let mut block = 20;
    let (mut a, mut b) = (0, block);
    while b <= n {
        insertion(data, a, b);
        a = b;
        b += block;
    }
    insertion(data, a, n);
    while block < n {
        let (mut a, mut b) = (0, 2 * block);
        while b <= n {
            sym_merge(data, a, a + block, b, &less);
            a = b;
            b += 2 * block;
        }
        if a + block < n {
            sym_merge(data, a, a + block, n, &less);
        }
        block *= 2;
    }
}

fn sym_merge<T>(
    data: &mut [T],
    a: usize,
    m: usize,
    b: usize,
    less: &impl Fn(&[T], usize, usize) -> bool,
) {
    if m - a == 1 {
        let (mut i, mut j) = (m, b);
        while i < j {
            let h = (i + j) / 2;
            if less(data, h, a) {
                i = h + 1;
            } else {
                j = h;
            }
        }
        for k in a..i.saturating_sub(1) {
            data.swap(k, k + 1);
        }
        return;
    }
    if b - m == 1 {
        let (mut i, mut j) = (a, m);
        while i < j {
            let h = (i + j) / 2;
            if !less(data, m, h) {
                i = h + 1;
            } else {
                j = h;
            }
        }
        let mut k = m;
        while k > i {
            data.swap(k, k - 1);
            k -= 1;
        }
        return;
    }
    let mid = (a + b) / 2;
    let n = mid + m;
    let (mut start, mut r) = if m > mid { (n - b, mid) } else { (a, m) };
    let p = n - 1;
    while start < r {
        let c = (start + r) / 2;
        if !less(data, p - c, c) {
            start = c + 1;
        } else {
            r = c;
        }
    }
    let end = n - start;
    if start < m && m < end {
        data[start..end].rotate_left(m - start);
    }
    if a < start && start < mid {
        sym_merge(data, a, start, mid, less);
    }
    if mid < end && end < b {
        sym_merge(data, mid, end, b, less);
    }
}

#[cfg(test)]
mod tests;
