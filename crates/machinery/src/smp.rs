//! Strategic merge patch (`application/strategic-merge-patch+json`), driven by the
//! `x-kubernetes-patch-strategy` / `x-kubernetes-patch-merge-key` extensions of the OpenAPI
//! schema. No Rust crate implements it; this follows apimachinery's `strategicpatch` rules:
//! maps merge recursively and `null` deletes; lists with strategy `merge` merge by their merge
//! key (or by value for primitive lists); every other list is replaced; the `$patch`,
//! `$retainKeys`, `$setElementOrder/…` and `$deleteFromPrimitiveList/…` directives are honoured.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::schema::{property, resolve};

/// A value as a hashable key: its JSON with object keys sorted, so equal values (however
/// their keys are ordered) have equal keys. Lists are compared through these in linear time:
/// a client controls their length.
pub fn value_key(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    write(&map[key.as_str()], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// A strategic-merge failure: the message, and whether upstream answers 400 (format) or 422.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmpError {
    /// The text.
    pub message: String,
    /// `true` for a malformed patch (400), `false` for one that cannot apply (422).
    pub bad_request: bool,
}

fn bad(message: impl Into<String>) -> SmpError {
    SmpError {
        message: message.into(),
        bad_request: true,
    }
}

/// Applies `patch` to `original`; `schema` is the object's OpenAPI definition (core/v1).
pub fn apply(
    original: &Value,
    patch: &Value,
    schema: Option<&'static Value>,
) -> Result<Value, SmpError> {
    let (Value::Object(original), Value::Object(patch)) = (original, patch) else {
        return Err(bad("invalid JSON document"));
    };
    Ok(Value::Object(merge_map(original.clone(), patch, schema)?))
}

fn strategy_of(field_schema: Option<&'static Value>) -> (bool, bool, Option<&'static str>) {
    let Some(schema) = field_schema else {
        return (false, false, None);
    };
    let strategy = crate::meta::text(schema.get("x-kubernetes-patch-strategy"));
    let key = schema
        .get("x-kubernetes-patch-merge-key")
        .and_then(Value::as_str);
    (
        strategy.split(',').any(|s| s == "merge"),
        strategy.split(',').any(|s| s == "retainKeys"),
        key,
    )
}

fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    schema: Option<&'static Value>,
) -> Result<Map<String, Value>, SmpError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => return Ok(strip_directives(patch)),
        Some("delete") => return Ok(Map::new()),
        Some(other) => return Err(bad(format!("Unknown patch type: {other}"))),
        None => {}
    }
    if let Some(retain) = patch.get("$retainKeys") {
        let Value::Array(keys) = retain else {
            return Err(bad("invalid patch format of retainKeys"));
        };
        let keep: HashSet<&str> = keys.iter().filter_map(Value::as_str).collect();
        original.retain(|k, _| keep.contains(k.as_str()));
    }
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        let field_schema = schema.and_then(|s| property(s, key));
        if value.is_null() {
            original.shift_remove(key);
            continue;
        }
        let merged = match (original.get_mut(key).map(Value::take), value) {
            (Some(Value::Object(current)), Value::Object(p)) => {
                let item = field_schema.map(resolve);
                Value::Object(merge_map(current, p, item)?)
            }
            (Some(Value::Array(current)), Value::Array(p)) => {
                Value::Array(merge_list(current, p, field_schema)?)
            }
            (None, Value::Object(p)) => {
                let item = field_schema.map(resolve);
                Value::Object(merge_map(Map::new(), p, item)?)
            }
            (None, Value::Array(p)) => Value::Array(merge_list(Vec::new(), p, field_schema)?),
            (_, other) => other.clone(),
        };
        original.insert(key.clone(), merged);
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let Value::Array(remove) = value else {
                return Err(bad("invalid patch format of primitive list"));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                let remove: HashSet<String> = remove.iter().map(value_key).collect();
                list.retain(|v| !remove.contains(&value_key(v)));
            }
        }
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$setElementOrder/") {
            let Value::Array(order) = value else {
                return Err(bad("invalid patch format of setElementOrder list"));
            };
            let field_schema = schema.and_then(|s| property(s, field));
            let (_, _, merge_key) = strategy_of(field_schema);
            if let Some(Value::Array(list)) = original.get_mut(field) {
                reorder(list, order, merge_key);
            }
        }
    }
    Ok(original)
}

fn strip_directives(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn element_key<'a>(element: &'a Value, merge_key: &str) -> Result<&'a Value, SmpError> {
    element.get(merge_key).ok_or_else(|| SmpError {
        message: format!("map: {element} does not contain declared merge key: {merge_key}"),
        bad_request: false,
    })
}

fn merge_list(
    mut original: Vec<Value>,
    patch: &[Value],
    field_schema: Option<&'static Value>,
) -> Result<Vec<Value>, SmpError> {
    let (merge, _, merge_key) = strategy_of(field_schema);
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .cloned()
            .collect());
    }
    if !merge {
        return Ok(patch.to_vec());
    }
    if patch.iter().any(Value::is_array) {
        return Err(SmpError {
            message: "lists of lists are not supported".into(),
            bad_request: false,
        });
    }
    let item_schema = field_schema.and_then(|s| s.get("items")).map(resolve);
    match merge_key {
        None => {
            // Primitive list with strategy merge: union, original order first.
            let mut present: HashSet<String> = original.iter().map(value_key).collect();
            for value in patch {
                if present.insert(value_key(value)) {
                    original.push(value.clone());
                }
            }
            Ok(original)
        }
        Some(merge_key) => {
            // Entries by merge key; a deleted entry leaves a hole, filled in at the end.
            let mut entries: Vec<Option<Value>> = original.into_iter().map(Some).collect();
            let mut positions: HashMap<String, Vec<usize>> = HashMap::new();
            for (i, entry) in entries.iter().enumerate() {
                if let Some(key) = entry.as_ref().and_then(|e| e.get(merge_key)) {
                    positions.entry(value_key(key)).or_default().push(i);
                }
            }
            for element in patch {
                let key = value_key(element_key(element, merge_key)?);
                match element.get("$patch").and_then(Value::as_str) {
                    Some("delete") => {
                        for i in positions.remove(&key).unwrap_or_default() {
                            entries[i] = None;
                        }
                    }
                    _ => {
                        let Value::Object(patch_map) = element else {
                            return Err(bad("invalid JSON document"));
                        };
                        match positions.get(&key).and_then(|p| p.first()).copied() {
                            Some(i) => {
                                entries[i] = Some(match entries[i].take() {
                                    Some(Value::Object(current)) => {
                                        Value::Object(merge_map(current, patch_map, item_schema)?)
                                    }
                                    _ => element.clone(),
                                });
                            }
                            None => {
                                positions.insert(key, vec![entries.len()]);
                                entries.push(Some(Value::Object(merge_map(
                                    Map::new(),
                                    patch_map,
                                    item_schema,
                                )?)));
                            }
                        }
                    }
                }
            }
            Ok(entries.into_iter().flatten().collect())
        }
    }
}

fn reorder(list: &mut [Value], order: &[Value], merge_key: Option<&str>) {
    let identity = |v: &Value| match merge_key {
        Some(k) => v.get(k).map(value_key),
        None => Some(value_key(v)),
    };
    let mut ranks: HashMap<String, usize> = HashMap::with_capacity(order.len());
    for (i, o) in order.iter().enumerate() {
        if let Some(id) = identity(o) {
            ranks.entry(id).or_insert(i);
        }
    }
    let rank = |v: &Value| identity(v).and_then(|id| ranks.get(&id).copied());
    let mut ranked: Vec<(usize, Value)> = list
        .iter_mut()
        .enumerate()
        .map(|(i, v)| (rank(v).unwrap_or(order.len() + i), std::mem::take(v)))
        .collect();
    ranked.sort_by_key(|(r, _)| *r);
    for (slot, (_, value)) in list.iter_mut().zip(ranked) {
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service() -> Option<&'static Value> {
        crate::schema::named("io.k8s.api.core.v1.Service")
    }

    #[test]
    fn ports_merge_by_port_and_labels_merge_by_key() {
        let original = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 80, "targetPort": 8080}], "externalIPs": ["1.1.1.1"]}});
        let patch = json!({"metadata": {"labels": {"b": "2"}}, "spec": {"ports": [{"port": 443}, {"port": 80, "name": "http"}], "externalIPs": ["2.2.2.2"]}});
        let out = apply(&original, &patch, service()).expect("applies");
        assert_eq!(out["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 80, "targetPort": 8080, "name": "http"}, {"port": 443}])
        );
        assert_eq!(
            out["spec"]["externalIPs"],
            json!(["2.2.2.2"]),
            "lists without a strategy are replaced"
        );
    }

    #[test]
    fn directives_delete_replace_and_order() {
        let original = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"ports": [{"port": 80}, {"port": 81}], "selector": {"x": "1", "y": "2"}}});
        let patch = json!({
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["c"]},
            "spec": {"ports": [{"port": 80, "$patch": "delete"}], "selector": {"$patch": "replace", "z": "3"}}
        });
        let out = apply(&original, &patch, service()).expect("applies");
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "c"]));
        assert_eq!(out["spec"]["ports"], json!([{"port": 81}]));
        assert_eq!(out["spec"]["selector"], json!({"z": "3"}));
        let reorder = json!({"spec": {"$setElementOrder/ports": [{"port": 81}, {"port": 80}], "ports": [{"port": 80, "name": "a"}]}});
        let out = apply(&original, &reorder, service()).expect("applies");
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 81}, {"port": 80, "name": "a"}])
        );
    }

    #[test]
    fn long_lists_merge_in_linear_time() {
        // Long lists against long lists (quadratic scans took minutes at 200,000; the time is
        // measured by `capstan-bench abuse`, not asserted here).
        let stored: Vec<Value> = (0..50_000).map(|i| json!(format!("a{i}"))).collect();
        let added: Vec<Value> = (0..50_000).map(|i| json!(format!("b{i}"))).collect();
        let original = json!({"metadata": {"finalizers": stored}});
        let patch = json!({"metadata": {"finalizers": added,
            "$deleteFromPrimitiveList/finalizers": (0..25_000).map(|i| json!(format!("a{i}"))).collect::<Vec<_>>()}});
        let out = apply(&original, &patch, service()).expect("applies");
        assert_eq!(
            out["metadata"]["finalizers"].as_array().map(Vec::len),
            Some(75_000)
        );
        let ports: Vec<Value> = (0..5_000)
            .map(|i| json!({"port": i, "name": format!("p{i}")}))
            .collect();
        let order: Vec<Value> = (0..5_000).rev().map(|i| json!({"port": i})).collect();
        let patch = json!({"spec": {"ports": ports.clone(), "$setElementOrder/ports": order}});
        let out = apply(&json!({"spec": {"ports": ports}}), &patch, service()).expect("applies");
        assert_eq!(out["spec"]["ports"][0]["port"], 4_999);
    }

    #[test]
    fn value_keys_ignore_object_key_order() {
        assert_eq!(
            value_key(&json!({"a": 1, "b": [2, {"d": 1, "c": 2}]})),
            value_key(&json!({"b": [2, {"c": 2, "d": 1}], "a": 1}))
        );
        assert_ne!(value_key(&json!("1")), value_key(&json!(1)));
    }

    #[test]
    fn a_merge_list_element_without_its_key_is_refused() {
        let err = apply(
            &json!({"spec": {"ports": []}}),
            &json!({"spec": {"ports": [{"name": "x"}]}}),
            service(),
        )
        .expect_err("no merge key");
        assert!(
            err.message
                .contains("does not contain declared merge key: port")
        );
        assert!(!err.bad_request);
    }
}
