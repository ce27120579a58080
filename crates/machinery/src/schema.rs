//! The OpenAPI documents kube-apiserver 1.36 serves, and what the machinery reads from them:
//! which fields a kind declares (for `fieldValidation`).

use std::sync::LazyLock;

use serde_json::Value;

/// `/openapi/v3/api/v1`, byte for byte.
pub static CORE_V1_OPENAPI: &[u8] = include_bytes!("../data/openapi/api__v1_openapi.json");
/// `/openapi/v2`, byte for byte.
pub static SWAGGER: &[u8] = include_bytes!("../data/openapi/swagger.json");

/// `/openapi/v3/apis/apiregistration.k8s.io/v1`, byte for byte.
pub static APIREGISTRATION_V1_OPENAPI: &[u8] =
    include_bytes!("../data/openapi/apis__apiregistration.k8s.io__v1_openapi.json");

/// The schemas of every served group in one `components/schemas` table (core/v1 plus
/// `apiregistration.k8s.io/v1`; the shared apimachinery definitions are identical in both).
static CORE_V1: LazyLock<Value> = LazyLock::new(|| {
    let mut document: Value = serde_json::from_slice(CORE_V1_OPENAPI).unwrap_or(Value::Null);
    let other: Value = serde_json::from_slice(APIREGISTRATION_V1_OPENAPI).unwrap_or(Value::Null);
    if let (Some(schemas), Some(more)) = (
        document
            .pointer_mut("/components/schemas")
            .and_then(Value::as_object_mut),
        other
            .pointer("/components/schemas")
            .and_then(Value::as_object),
    ) {
        for (name, schema) in more {
            schemas
                .entry(name.clone())
                .or_insert_with(|| schema.clone());
        }
    }
    document
});

fn resolve<'a>(document: &'a Value, schema: &'a Value) -> &'a Value {
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
            return current;
        };
        match document.pointer(&format!("/components/schemas/{}", name.replace('/', "~1"))) {
            Some(next) => current = next,
            None => return current,
        }
    }
    current
}

fn walk(document: &Value, schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    let schema = resolve(document, schema);
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (key, child) in map {
                    let child_path = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    match properties.get(key) {
                        Some(child_schema) => walk(document, child_schema, child, &child_path, out),
                        None => out.push(format!("unknown field {:?}", child_path)),
                    }
                }
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|v| v.is_object())
            {
                for (key, child) in map {
                    walk(document, values, child, &format!("{path}.{key}"), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(document, item_schema, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The `unknown field "spec.foo"` problems of an object against a core/v1 schema
/// definition, in document order.
pub fn unknown_fields(schema: &'static Value, object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(&CORE_V1, schema, object, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_unknown_fields_with_their_paths() {
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "x", "labels": {"any": "thing"}, "bogus": 1},
            "spec": {"foo": 1, "ports": [{"port": 80, "nodeport": 3}], "selector": {"a": "b"}},
        });
        assert_eq!(
            unknown_fields(
                core_schema("io.k8s.api.core.v1.Service").expect("schema"),
                &service
            ),
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

/// The schema of a served definition (`io.k8s.api.core.v1.Service`); `None` for `""`.
pub fn definition(name: &str) -> Option<&'static Value> {
    if name.is_empty() {
        return None;
    }
    core_schema(name)
}

/// The core/v1 schema of a definition (e.g. `io.k8s.api.core.v1.Service`).
pub fn core_schema(name: &str) -> Option<&'static Value> {
    CORE_V1.pointer(&format!("/components/schemas/{name}"))
}

/// A core/v1 schema node with its references resolved.
pub fn core_resolve(schema: &'static Value) -> &'static Value {
    resolve(&CORE_V1, schema)
}

/// The schema of property `key` of a core/v1 struct schema (references resolved on the way in).
pub fn core_property(schema: &'static Value, key: &str) -> Option<&'static Value> {
    core_resolve(schema).get("properties")?.get(key)
}

/// The shape of a core/v1 schema node (references resolved).
pub fn core_shape(schema: &'static Value) -> Shape<'static> {
    let schema = resolve(&CORE_V1, schema);
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
