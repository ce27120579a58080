//! The schemas of the OpenAPI documents kube-apiserver 1.36 serves, as the machinery reads
//! them: which fields a kind declares (for `fieldValidation`), what shape a member has (for the
//! patch engines and Go's member order). Each group brings its own document
//! ([`crate::GroupVersionData`]); apimachinery's definitions are known from the start.

use std::fmt::Write;
use std::sync::LazyLock;

use crate::definitions::Definitions;

use serde_json::Value;

/// apimachinery's definitions (meta/v1, runtime, resource, intstr), which every group's
/// document shares: known before any group's document is loaded.
static APIMACHINERY: &[u8] = include_bytes!("../data/openapi-apimachinery.json");

/// Every schema definition the machinery knows, by name: apimachinery's, and those of each
/// OpenAPI document a group brings ([`definition`] loads it the first time).
static TABLE: LazyLock<Definitions<Value>> =
    LazyLock::new(|| Definitions::new(openapi_schemas, APIMACHINERY));

/// The `components/schemas` of an OpenAPI v3 document.
fn openapi_schemas(document: &'static [u8]) -> Vec<(String, &'static Value)> {
    let parsed: &'static Value = Box::leak(Box::new(
        serde_json::from_slice(document).unwrap_or(Value::Null),
    ));
    parsed
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .map(|schemas| schemas.iter().map(|(k, v)| (k.clone(), v)).collect())
        .unwrap_or_default()
}

/// A definition by name (`io.k8s.api.core.v1.Service`), from the documents loaded so far.
pub fn named(name: &str) -> Option<&'static Value> {
    TABLE.get(name)
}

/// The schema of a kind's definition in its OpenAPI document (loaded into the table the
/// first time); `None` for `""`.
pub fn definition(document: &'static [u8], name: &str) -> Option<&'static Value> {
    if name.is_empty() {
        return None;
    }
    if let Some(schema) = named(name) {
        return Some(schema);
    }
    TABLE.load(document);
    named(name)
}

/// A hasher for maps keyed by a schema node's address: the address is already unique.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }
    fn write_usize(&mut self, address: usize) {
        // Nodes are at least 8-byte aligned; the multiplication spreads the rest.
        self.0 = (address as u64 >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Memos keyed by schema node. The schemas live as long as the process, so a node's address
/// names it for good.
pub(crate) type ByNode<T> =
    std::collections::HashMap<usize, T, std::hash::BuildHasherDefault<AddressHasher>>;

pub(crate) fn address(schema: &'static Value) -> usize {
    std::ptr::from_ref(schema) as usize
}

/// A schema node with its `$ref` (or single-`allOf` reference) followed. Memoized per node
/// and thread once the chain resolves to the end (a reference into a document not loaded
/// yet is looked up again next time).
pub fn resolve(schema: &'static Value) -> &'static Value {
    thread_local! {
        static RESOLVED: std::cell::RefCell<ByNode<&'static Value>> = std::cell::RefCell::default();
    }
    if let Some(known) = RESOLVED.with_borrow(|memo| memo.get(&address(schema)).copied()) {
        return known;
    }
    let (resolved, complete) = follow_references(schema);
    if complete {
        RESOLVED.with_borrow_mut(|memo| memo.insert(address(schema), resolved));
    }
    resolved
}

/// Follows references from `schema`; whether the last node reached holds none.
fn follow_references(schema: &'static Value) -> (&'static Value, bool) {
    let mut current = schema;
    for _ in 0..8 {
        let reference = current
            .get("$ref")
            .or_else(|| {
                current
                    .get("allOf")
                    .and_then(|a| a.get(0))
                    .and_then(|s| s.get("$ref"))
            })
            .and_then(Value::as_str);
        let Some(name) = reference.and_then(|r| r.strip_prefix("#/components/schemas/")) else {
            return (current, reference.is_none());
        };
        match named(&name.replace("~1", "/").replace("~0", "~")) {
            Some(next) => current = next,
            None => return (current, false),
        }
    }
    (current, false)
}

/// Walks `value` at `path` (one buffer for the whole walk: a child's step is pushed onto it
/// and cut off again, so no path is built unless a field is reported).
fn walk(schema: &'static Value, value: &Value, path: &mut String, out: &mut Vec<String>) {
    let schema = resolve(schema);
    let at = path.len();
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let values = schema.get("additionalProperties").filter(|v| v.is_object());
            if properties.is_none() && values.is_none() {
                return;
            }
            for (key, child) in map {
                if at > 0 || properties.is_none() {
                    path.push('.');
                }
                path.push_str(key);
                match (properties, values) {
                    (Some(properties), _) => match properties.get(key) {
                        Some(child_schema) => walk(child_schema, child, path, out),
                        None => out.push(format!("unknown field {:?}", path)),
                    },
                    (None, Some(values)) => walk(values, child, path, out),
                    (None, None) => {}
                }
                path.truncate(at);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    let _ = write!(path, "[{i}]");
                    walk(item_schema, item, path, out);
                    path.truncate(at);
                }
            }
        }
        _ => {}
    }
}

/// The `unknown field "spec.foo"` problems of an object against a schema definition, in
/// document order.
pub fn unknown_fields(schema: &'static Value, object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, object, &mut String::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_kinds_document_is_loaded_with_its_definition() {
        const SERVICE: &str = "io.k8s.api.core.v1.Service";
        let document = crate::testdata::SERVICE.openapi;
        let schema = definition(document, SERVICE).expect("in its own document");
        // Its references resolve within the table, so its unknown fields are found.
        let service = json!({"metadata": {"name": "x"}, "spec": {"type": "x", "tpye": 1}});
        assert_eq!(
            unknown_fields(schema, &service),
            ["unknown field \"spec.tpye\""]
        );
        assert!(named(SERVICE).is_some());
        assert_eq!(definition(document, ""), None);
    }

    #[test]
    fn finds_unknown_fields_with_their_paths() {
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "x", "labels": {"any": "thing"}, "bogus": 1},
            "spec": {"foo": 1, "ports": [{"port": 80, "nodeport": 3}], "selector": {"a": "b"}},
        });
        assert_eq!(
            unknown_fields(crate::testdata::service().expect("schema"), &service),
            [
                "unknown field \"metadata.bogus\"",
                "unknown field \"spec.foo\"",
                "unknown field \"spec.ports[0].nodeport\""
            ]
        );
    }
}

/// How server-side apply and managedFields see one node of a schema.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    /// A struct: fields tracked one by one.
    Struct(&'a serde_json::Map<String, Value>),
    /// A map tracked key by key (`values` is the value schema).
    Map(Option<&'a Value>),
    /// A list of objects identified by these keys (`x-kubernetes-list-type: map`).
    ListMap(&'a Value, &'a [Value]),
    /// A list of scalars tracked by value (`x-kubernetes-list-type: set`).
    Set,
    /// Owned as a whole: scalars, atomic maps and lists.
    Atomic,
}

/// The schema of property `key` of a struct schema (references resolved on the way in).
pub fn property(schema: &'static Value, key: &str) -> Option<&'static Value> {
    resolve(schema).get("properties")?.get(key)
}

/// The shape of a schema node (references resolved), computed once per node and thread.
pub fn shape(schema: &'static Value) -> Shape<'static> {
    thread_local! {
        static SHAPES: std::cell::RefCell<ByNode<Shape<'static>>> = std::cell::RefCell::default();
    }
    if let Some(known) = SHAPES.with_borrow(|shapes| shapes.get(&address(schema)).copied()) {
        return known;
    }
    let (resolved, complete) = follow_references(schema);
    let computed = shape_of_resolved(resolved);
    if complete {
        SHAPES.with_borrow_mut(|shapes| shapes.insert(address(schema), computed));
    }
    computed
}

fn shape_of_resolved(schema: &'static Value) -> Shape<'static> {
    if schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic") {
        return Shape::Atomic;
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        return Shape::Struct(properties);
    }
    if schema.get("type").and_then(Value::as_str) == Some("object") {
        return Shape::Map(schema.get("additionalProperties").filter(|v| v.is_object()));
    }
    if let Some(items) = schema.get("items") {
        return match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("map") => {
                let keys = schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                Shape::ListMap(items, keys)
            }
            Some("set") => Shape::Set,
            _ => Shape::Atomic,
        };
    }
    Shape::Atomic
}
