//! The OpenAPI documents kube-apiserver 1.36 serves, and what the machinery reads from them:
//! which fields a kind declares (for `fieldValidation`).

use std::sync::LazyLock;

use serde_json::Value;

/// `/openapi/v3/api/v1`, byte for byte.
pub static CORE_V1_OPENAPI: &[u8] = include_bytes!("../data/openapi/api__v1_openapi.json");
/// `/openapi/v2`, byte for byte.
pub static SWAGGER: &[u8] = include_bytes!("../data/openapi/swagger.json");

static CORE_V1: LazyLock<Value> =
    LazyLock::new(|| serde_json::from_slice(CORE_V1_OPENAPI).unwrap_or(Value::Null));

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

/// The `unknown field "spec.foo"` problems of an object of the core/v1 schema `name`
/// (e.g. `io.k8s.api.core.v1.Service`), in document order.
pub fn unknown_core_fields(name: &str, object: &Value) -> Vec<String> {
    let Some(schema) = CORE_V1.pointer(&format!("/components/schemas/{name}")) else {
        return Vec::new();
    };
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
            unknown_core_fields("io.k8s.api.core.v1.Service", &service),
            [
                "unknown field \"metadata.bogus\"",
                "unknown field \"spec.foo\"",
                "unknown field \"spec.ports[0].nodeport\""
            ]
        );
    }
}
