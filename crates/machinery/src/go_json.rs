//! What Go's JSON decoder says about a request body holding a value of the wrong JSON type
//! for a field: kube-apiserver decodes bodies with `sigs.k8s.io/json` (encoding/json's rules)
//! into the kind's Go type, and reports the first mismatch as
//! `json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32`
//! — the innermost struct, the field's JSON path from the root (no list indexes or map keys),
//! and the Go type, all of which this reconstructs from the OpenAPI schema.

use serde_json::{Map, Value};

use crate::schema::resolve;

/// Fields whose Go type is a named string type (OpenAPI says only `string`), as
/// `<struct>.<field> <type>`; for lists, the element's type.
const NAMED_STRINGS: &str = "\
    ServiceSpec.type v1.ServiceType
    ServiceSpec.sessionAffinity v1.ServiceAffinity
    ServiceSpec.externalTrafficPolicy v1.ServiceExternalTrafficPolicy
    ServiceSpec.internalTrafficPolicy v1.ServiceInternalTrafficPolicy
    ServiceSpec.ipFamilies v1.IPFamily
    ServiceSpec.ipFamilyPolicy v1.IPFamilyPolicy
    ServicePort.protocol v1.Protocol
    EndpointPort.protocol v1.Protocol
    PortStatus.protocol v1.Protocol
    LoadBalancerIngress.ipMode v1.LoadBalancerIPMode
    ObjectMeta.uid types.UID
    OwnerReference.uid types.UID
    ObjectReference.uid types.UID
    ManagedFieldsEntry.operation v1.ManagedFieldsOperationType
    NamespaceSpec.finalizers v1.FinalizerName
    NamespaceStatus.phase v1.NamespacePhase
    NamespaceCondition.type v1.NamespaceConditionType
    NamespaceCondition.status v1.ConditionStatus
    APIServiceCondition.type v1.APIServiceConditionType
    APIServiceCondition.status v1.ConditionStatus
    Condition.status v1.ConditionStatus";

/// The named string type of `owner`'s field `key`, if it has one.
fn named_string(owner: &str, key: &str) -> Option<&'static str> {
    NAMED_STRINGS.lines().find_map(|line| {
        let (field, go) = line.trim().split_once(' ')?;
        (field.split_once('.')? == (owner, key)).then_some(go)
    })
}

/// The first type mismatch of `body` against the kind's definition `schema` (`kind` names
/// its Go struct), in Go's words; `None` when every field has a value of its type.
pub fn type_error(kind: &str, schema: &'static Value, body: &Value) -> Option<String> {
    let mut path = Vec::new();
    fields(kind, schema, body.as_object()?, &mut path)
}

/// The definition a node refers to, by name (`io.k8s.api.core.v1.ServicePort`).
fn reference(node: &'static Value) -> Option<&'static str> {
    node.get("$ref")
        .or_else(|| node.get("allOf").and_then(|all| all.get(0)?.get("$ref")))
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
}

/// A definition's Go type: package and name (`v1.ServicePort`, `intstr.IntOrString`).
fn named_type(reference: &str) -> String {
    let mut parts = reference.rsplit('.');
    let name = parts.next().unwrap_or_default();
    match parts.next() {
        Some(package) => format!("{package}.{name}"),
        None => name.to_string(),
    }
}

/// The Go type of a schema node; `named` is the element's named string type, if any.
fn go_type(node: &'static Value, named: Option<&str>) -> String {
    if let Some(reference) = reference(node) {
        return named_type(reference);
    }
    let node = resolve(node);
    let text = |key: &str| node.get(key).and_then(Value::as_str).unwrap_or_default();
    match text("type") {
        "array" => match node.get("items") {
            Some(items) => format!("[]{}", go_type(items, named)),
            None => "[]interface {}".into(),
        },
        "object" => match node.get("additionalProperties").filter(|v| v.is_object()) {
            Some(values) => format!("map[string]{}", go_type(values, None)),
            None => "map[string]interface {}".into(),
        },
        "integer" => match text("format") {
            "int32" => "int32".into(),
            "int64" => "int64".into(),
            _ => "int".into(),
        },
        "number" => "float64".into(),
        "boolean" => "bool".into(),
        "string" if text("format") == "byte" => "[]uint8".into(),
        _ => named.unwrap_or("string").to_string(),
    }
}

/// How Go names a JSON value that cannot go where it is: its kind, and for a number that
/// does not fit an integer, its text.
fn what(value: &Value, integer: bool) -> String {
    match value {
        Value::String(_) => "string".into(),
        Value::Bool(_) => "bool".into(),
        Value::Array(_) => "array".into(),
        Value::Object(_) => "object".into(),
        Value::Number(n) if integer => format!("number {n}"),
        _ => "number".into(),
    }
}

fn mismatch(value: &Value, integer: bool, owner: &str, path: &[&str], go: &str) -> String {
    format!(
        "json: cannot unmarshal {} into Go struct field {owner}.{} of type {go}",
        what(value, integer),
        path.join(".")
    )
}

/// The fields of a struct value, in the order the body has them.
fn fields<'v>(
    owner: &str,
    schema: &'static Value,
    map: &'v Map<String, Value>,
    path: &mut Vec<&'v str>,
) -> Option<String> {
    let properties = resolve(schema).get("properties")?.as_object()?;
    for (key, value) in map {
        let Some(field) = properties.get(key) else {
            continue;
        };
        path.push(key);
        let found = check(owner, field, Some(key), value, path);
        path.pop();
        if found.is_some() {
            return found;
        }
    }
    None
}

/// One value against its schema node, inside struct `owner` at `path`; `field` is the
/// struct's field it is (or is an element of), for naming a named string type.
fn check<'v>(
    owner: &str,
    node: &'static Value,
    field: Option<&str>,
    value: &'v Value,
    path: &mut Vec<&'v str>,
) -> Option<String> {
    if value.is_null() {
        return None;
    }
    let reference = reference(node);
    let resolved = resolve(node);
    let text = |key: &str| {
        resolved
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let fail = |integer: bool, go: &str| Some(mismatch(value, integer, owner, path, go));
    // Types with their own UnmarshalJSON, as they decode.
    match reference.unwrap_or_default() {
        r if r.ends_with("intstr.IntOrString") => {
            return match value {
                Value::String(_) => None,
                Value::Number(n) if n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()) => None,
                _ => fail(true, "int32"),
            };
        }
        r if r.ends_with("meta.v1.Time") || r.ends_with("meta.v1.MicroTime") => {
            return (!value.is_string()).then(|| mismatch(value, false, owner, path, "string"));
        }
        r if r.ends_with("resource.Quantity")
            || r.ends_with("meta.v1.FieldsV1")
            || r.ends_with("runtime.RawExtension") =>
        {
            return None;
        }
        _ => {}
    }
    if resolved.get("x-kubernetes-int-or-string").is_some()
        || resolved
            .get("x-kubernetes-preserve-unknown-fields")
            .is_some()
    {
        return None;
    }
    // Named only for a mismatch: most values match.
    let go = || go_type(node, field.and_then(|key| named_string(owner, key)));
    if resolved.get("properties").is_some() {
        let Value::Object(map) = value else {
            return fail(false, &go());
        };
        // Inside it, the struct is the innermost one (`ServicePort`).
        let owner = reference
            .and_then(|r| r.rsplit('.').next())
            .unwrap_or(owner);
        return fields(owner, resolved, map, path);
    }
    match text("type") {
        "array" => {
            let Value::Array(items) = value else {
                return fail(false, &go());
            };
            let item = resolved.get("items")?;
            items
                .iter()
                .find_map(|v| check(owner, item, field, v, path))
        }
        "object" => {
            let Value::Object(map) = value else {
                return fail(false, &go());
            };
            let values = resolved
                .get("additionalProperties")
                .filter(|v| v.is_object())?;
            map.values()
                .find_map(|v| check(owner, values, None, v, path))
        }
        "integer" => {
            let fits = match (text("format"), value.as_i64()) {
                ("int32", Some(i)) => i32::try_from(i).is_ok(),
                (_, Some(_)) => true,
                _ => false,
            };
            (!fits).then(|| mismatch(value, true, owner, path, &go()))
        }
        "number" => (!value.is_number()).then(|| mismatch(value, false, owner, path, &go())),
        "boolean" => (!value.is_boolean()).then(|| mismatch(value, false, owner, path, &go())),
        "string" => (!value.is_string()).then(|| mismatch(value, false, owner, path, &go())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(body: Value) -> Option<String> {
        let schema = crate::testdata::service().expect("schema");
        type_error("Service", schema, &body)
    }

    #[test]
    fn mismatches_read_as_gos() {
        let cases = [
            (
                json!({"spec": {"ports": [{"port": "eighty"}]}}),
                "json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32",
            ),
            (
                json!({"spec": {"ports": [{"port": 80.5}]}}),
                "json: cannot unmarshal number 80.5 into Go struct field ServicePort.spec.ports.port of type int32",
            ),
            (
                json!({"spec": {"ports": {"port": 80}}}),
                "json: cannot unmarshal object into Go struct field ServiceSpec.spec.ports of type []v1.ServicePort",
            ),
            (
                json!({"spec": {"ports": [5]}}),
                "json: cannot unmarshal number into Go struct field ServiceSpec.spec.ports of type v1.ServicePort",
            ),
            (
                json!({"metadata": {"labels": "a"}}),
                "json: cannot unmarshal string into Go struct field ObjectMeta.metadata.labels of type map[string]string",
            ),
            (
                json!({"metadata": {"labels": {"a": 5}}}),
                "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string",
            ),
            (
                json!({"metadata": {"name": 5}}),
                "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string",
            ),
            (
                json!({"spec": {"type": 5}}),
                "json: cannot unmarshal number into Go struct field ServiceSpec.spec.type of type v1.ServiceType",
            ),
            (
                json!({"spec": "x"}),
                "json: cannot unmarshal string into Go struct field Service.spec of type v1.ServiceSpec",
            ),
            (
                json!({"spec": {"ports": [{"port": 80, "targetPort": true}]}}),
                "json: cannot unmarshal bool into Go struct field ServicePort.spec.ports.targetPort of type int32",
            ),
            (
                json!({"spec": {"ipFamilies": [4]}}),
                "json: cannot unmarshal number into Go struct field ServiceSpec.spec.ipFamilies of type v1.IPFamily",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(service(body.clone()).as_deref(), Some(want), "{body}");
        }
        assert_eq!(
            service(json!({"spec": {"ports": [{"port": 80, "targetPort": "http"}], "bogus": 1}})),
            None
        );
    }
}
