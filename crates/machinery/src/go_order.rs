//! The order kube-apiserver writes JSON members in. Go's `encoding/json` writes a struct's
//! fields in the order its type declares them, and a map's keys sorted; Capstan's objects come
//! from `k8s-openapi`'s types (fields in alphabetical order) or from request bodies (in the
//! client's order). [`write`] writes a value as the Go type of its schema would be written,
//! from the member order of each definition: apimachinery's in `data/member_order_apimachinery.txt`,
//! each group's in its folder of `capstan-resources` ([`load`]).

use std::sync::{LazyLock, RwLock};

use serde_json::{Map, Value};

use crate::definitions::Definitions;
use crate::schema;

mod typed;
pub use typed::to_vec as typed_to_vec;

/// The member order of each definition, by its OpenAPI name: apimachinery's, and those of
/// each group loaded so far ([`load`]).
static ORDERS: LazyLock<Definitions<[&'static str]>> = LazyLock::new(|| {
    Definitions::new(
        parse_orders,
        include_bytes!("../data/member_order_apimachinery.txt"),
    )
});

/// The members of each definition whose zero value Go writes in JSON (marked `*` in the
/// member-order texts): pointers (written whenever set, `0` and `false` too) and plain fields
/// without `omitempty` (always written).
static ZERO_WRITTEN: LazyLock<Definitions<[&'static str]>> = LazyLock::new(|| {
    Definitions::new(
        parse_zero_written,
        include_bytes!("../data/member_order_apimachinery.txt"),
    )
});

/// The definitions of a member-order text: a line a definition, its name then its members
/// (a member marked `*` writes its zero value: [`writes_zero`]).
fn parse_orders(text: &'static [u8]) -> Vec<(String, &'static [&'static str])> {
    parse_members(text, |member| Some(member.trim_end_matches('*')))
}

fn parse_zero_written(text: &'static [u8]) -> Vec<(String, &'static [&'static str])> {
    parse_members(text, |member| member.strip_suffix('*'))
}

fn parse_members(
    text: &'static [u8],
    keep: fn(&'static str) -> Option<&'static str>,
) -> Vec<(String, &'static [&'static str])> {
    std::str::from_utf8(text)
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?.to_string();
            let members: &'static [&'static str] =
                Box::leak(words.filter_map(keep).collect::<Box<[_]>>());
            Some((name, members))
        })
        .collect()
}

/// Whether Go writes member `member` of definition `definition` (its OpenAPI name) when its
/// value is zero (`0`, `false`, `""`): a pointer that was set, or a field without
/// `omitempty`. A protobuf body carries every plain field, zero or not; only these keep it.
pub fn writes_zero(definition: &str, member: &str) -> bool {
    ZERO_WRITTEN
        .get(definition)
        .is_some_and(|members| members.contains(&member))
}

/// Go's `omitempty` on plain fields: a struct member that is an empty string, `0` or `false`
/// is left out, as decoding into the Go type and writing it again would leave it out, unless
/// Go writes that member's zero (a pointer, or a field without `omitempty`: [`writes_zero`]).
/// `value` is an object of the definition `definition`; nested structs (through `$ref`, list
/// items and map values) are walked too. A definition with no known member order is left as
/// it is (which of its members are pointers is not known).
pub fn drop_omitted_zeros(value: &mut Value, definition: &str) {
    let Some(properties) = schema::named(definition)
        .map(schema::resolve)
        .and_then(|node| node.get("properties"))
        .and_then(Value::as_object)
    else {
        return;
    };
    let Value::Object(map) = value else {
        return;
    };
    if declared(definition).is_some() {
        map.retain(|member, value| {
            let zero = matches!(value, Value::String(text) if text.is_empty())
                || value.as_f64() == Some(0.0)
                || value == &Value::Bool(false);
            !(zero
                && properties.get(member).is_some_and(plain_scalar)
                && !writes_zero(definition, member))
        });
    }
    for (member, value) in map.iter_mut() {
        if let Some(schema) = properties.get(member) {
            drop_member_zeros(value, schema);
        }
    }
}

/// Walks a member's value for the structs it holds.
fn drop_member_zeros(value: &mut Value, schema: &Value) {
    if let Some(name) = referenced(schema) {
        return drop_omitted_zeros(value, name);
    }
    if let (Some(items), Value::Array(list)) = (schema.get("items"), &mut *value) {
        list.iter_mut()
            .for_each(|item| drop_member_zeros(item, items));
    } else if let (Some(values), Value::Object(map)) = (
        schema.get("additionalProperties").filter(|v| v.is_object()),
        &mut *value,
    ) {
        map.values_mut()
            .for_each(|item| drop_member_zeros(item, values));
    }
}

/// The definition a member's schema names (`$ref`, or the one `allOf` entry OpenAPI v3 wraps
/// it in).
fn referenced(schema: &Value) -> Option<&str> {
    let reference = schema.get("$ref").or_else(|| {
        schema
            .get("allOf")
            .and_then(Value::as_array)
            .and_then(|all| all.first())
            .and_then(|first| first.get("$ref"))
    })?;
    reference.as_str()?.rsplit('/').next()
}

/// A member Go declares as a plain string, number or bool: not a struct written as a string
/// (times, int-or-strings, quantities are `$ref`s or say so in their format).
fn plain_scalar(schema: &Value) -> bool {
    let kind = schema.get("type").and_then(Value::as_str);
    let format = schema.get("format").and_then(Value::as_str);
    matches!(kind, Some("string" | "integer" | "number" | "boolean"))
        && !matches!(format, Some("int-or-string" | "date-time"))
        && schema.get("x-kubernetes-int-or-string").is_none()
}

/// The member order known for the definition `name` (`None`: none is, and the writer leaves
/// its members in the order they come).
pub fn declared(name: &str) -> Option<&'static [&'static str]> {
    ORDERS.get(name)
}

/// Makes a group's member orders known (once per text). A group loads its orders with its
/// OpenAPI document ([`crate::GroupVersionData::definition`]), before any of its definitions
/// can reach the writer: a definition met without an order is remembered as having none.
pub fn load(member_order: &'static str) {
    ORDERS.load(member_order.as_bytes());
    ZERO_WRITTEN.load(member_order.as_bytes());
}

/// `metadata`'s definition, which every kind shares.
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// A struct definition's members in Go's order, each with its schema.
pub type Members = &'static [(&'static str, &'static Value)];

/// The members of each struct definition met so far (by the address of its schema node), or
/// `None` for one without a known order. Filled once per definition for the life of the
/// process: the schemas live as long.
static MEMBERS: LazyLock<RwLock<schema::ByNode<Option<Members>>>> = LazyLock::new(Default::default);

/// What a schema node is to the writer.
#[derive(Clone, Copy)]
enum Node {
    /// A struct, with its members in order when they are known.
    Struct(Option<Members>),
    /// A map; the schema of its values.
    Map(&'static Value),
    /// A list; the schema of its items.
    List(Option<&'static Value>),
    /// Anything else: written as it is.
    Other,
}

/// What a schema node is to the writer, worked out once per node and thread.
fn node(schema: &'static Value) -> Node {
    thread_local! {
        static NODES: std::cell::RefCell<schema::ByNode<Node>> = std::cell::RefCell::default();
    }
    let address = schema::address(schema);
    if let Some(known) = NODES.with_borrow(|nodes| nodes.get(&address).copied()) {
        return known;
    }
    let found = node_of(schema);
    NODES.with_borrow_mut(|nodes| nodes.insert(address, found));
    found
}

fn node_of(schema: &'static Value) -> Node {
    let resolved = schema::resolve(schema);
    if resolved.get("properties").is_some_and(Value::is_object) {
        return Node::Struct(members(resolved));
    }
    if let Some(items) = resolved.get("items") {
        return Node::List(Some(items).filter(|items| items.is_object()));
    }
    // An object without properties or value schema (FieldsV1, RawExtension) is raw JSON to
    // Go's encoder: written as it is, where a map of values is written sorted.
    match resolved
        .get("additionalProperties")
        .filter(|v| v.is_object())
    {
        Some(values) if resolved.get("type").and_then(Value::as_str) == Some("object") => {
            Node::Map(values)
        }
        _ => Node::Other,
    }
}

/// The members of a struct definition (its resolved schema node) in Go's order.
fn members(definition: &'static Value) -> Option<Members> {
    let address = schema::address(definition);
    if let Some(known) = MEMBERS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&address)
    {
        return *known;
    }
    // The definition's name: every definition its documents hold that has an order is
    // looked up (once per definition the writer meets; its document is loaded, as the
    // node came from it).
    let mut table = MEMBERS.write().unwrap_or_else(|e| e.into_inner());
    // Another thread may have looked it up between the two locks.
    if let Some(known) = table.get(&address) {
        return *known;
    }
    for (name, order) in ORDERS.entries() {
        let Some(node) = schema::named(&name) else {
            continue;
        };
        let at = schema::address(node);
        if table.contains_key(&at) {
            continue;
        }
        let properties = node.get("properties").and_then(Value::as_object);
        let listed: Vec<(&'static str, &'static Value)> = order
            .iter()
            .filter_map(|member| Some((*member, properties?.get(*member)?)))
            .collect();
        let listed: Members = Box::leak(listed.into_boxed_slice());
        table.insert(at, Some(listed));
    }
    *table.entry(address).or_insert(None)
}

/// The members of the definition `name` in Go's order (`None` when it is not loaded, or has
/// no known order).
fn named(name: &str) -> Option<Members> {
    members(schema::named(name)?)
}

/// `ObjectMeta`'s members in Go's order (its document is the first one loaded).
pub fn object_meta() -> Members {
    static MEMBERS: LazyLock<Members> = LazyLock::new(|| named(OBJECT_META).unwrap_or(&[]));
    *MEMBERS
}

/// `ObjectMeta`'s members that come before `resourceVersion` (`name` to `uid`): after them is
/// where it goes in.
pub fn before_resource_version() -> Members {
    let all = object_meta();
    let at = all
        .iter()
        .position(|(name, _)| *name == "resourceVersion")
        .unwrap_or(0);
    &all[..at]
}

/// The members in Go's order of the struct `schema` describes, if it is one with a known
/// order.
pub fn struct_members(schema: &'static Value) -> Option<Members> {
    match node(schema) {
        Node::Struct(members) => members,
        _ => None,
    }
}

/// Writes `value` as JSON, as Go writes the type `schema` describes: a struct's members in
/// the order its type declares them (members it does not declare after them, as they are),
/// a map's keys sorted, each value as its own schema says. Without a schema, as it is.
pub fn write<W: std::io::Write>(
    out: &mut W,
    value: &Value,
    schema: Option<&'static Value>,
) -> std::io::Result<()> {
    let node = match value {
        Value::Object(_) | Value::Array(_) => schema.map(node),
        _ => None,
    };
    match (value, node) {
        (Value::Object(map), Some(Node::Struct(Some(members)))) => {
            out.write_all(b"{")?;
            for (i, member) in in_order(map, members).into_iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_member(out, members, member)?;
            }
            out.write_all(b"}")
        }
        (Value::Object(map), Some(Node::Map(values))) => {
            let values = Some(values);
            out.write_all(b"{")?;
            let mut first = true;
            let mut put = |key: &String, value: &Value| {
                if !std::mem::take(&mut first) {
                    out.write_all(b",")?;
                }
                write_key(out, key)?;
                write(out, value, values)
            };
            if map.keys().is_sorted() {
                for (key, value) in map {
                    put(key, value)?;
                }
            } else {
                let mut sorted: Vec<_> = map.iter().collect();
                sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (key, value) in sorted {
                    put(key, value)?;
                }
            }
            out.write_all(b"}")
        }
        (Value::Array(items), Some(Node::List(schema))) => {
            out.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write(out, item, schema)?;
            }
            out.write_all(b"]")
        }
        _ => crate::json::to_writer(out, value).map_err(std::io::Error::other),
    }
}

/// [`write`] into a buffer (which cannot fail).
pub fn to_vec(value: &Value, schema: Option<&'static Value>) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = write(&mut out, value, schema);
    out
}

/// The members of `map` in the order of `members`, those it does not name after them (in
/// their order), each with its place in `members` (`usize::MAX` for those). Members already
/// in that order (as written by this writer, or read back) are not sorted again.
pub fn in_order(map: &Map<String, Value>, members: Members) -> Vec<(usize, &str, &Value)> {
    let rank = |key: &str| {
        members
            .iter()
            .position(|(name, _)| *name == key)
            .unwrap_or(usize::MAX)
    };
    let mut listed: Vec<_> = map.iter().map(|(k, v)| (rank(k), k.as_str(), v)).collect();
    if !listed.is_sorted_by_key(|member| member.0) {
        // Stable: the members `members` does not name keep their order.
        listed.sort_by_key(|member| member.0);
    }
    listed
}

/// Writes `"key":value`, the value as the schema of its place in `members` says.
pub fn write_member<W: std::io::Write>(
    out: &mut W,
    members: Members,
    (rank, key, value): (usize, &str, &Value),
) -> std::io::Result<()> {
    match members.get(rank) {
        Some((name, schema)) => {
            // A declared member's name is a plain identifier: nothing to escape.
            out.write_all(b"\"")?;
            out.write_all(name.as_bytes())?;
            out.write_all(b"\":")?;
            write(out, value, Some(schema))
        }
        None => {
            write_key(out, key)?;
            write(out, value, None)
        }
    }
}

/// `"key":`.
pub fn write_key<W: std::io::Write>(out: &mut W, key: &str) -> std::io::Result<()> {
    crate::json::to_writer(&mut *out, key).map_err(std::io::Error::other)?;
    out.write_all(b":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn written(value: &Value, definition: &str) -> String {
        let _ = crate::testdata::SERVICE.definition("io.k8s.api.core.v1.Service");
        String::from_utf8(to_vec(value, schema::named(definition))).expect("JSON is UTF-8")
    }

    #[test]
    fn omitempty_zeros_go_pointers_and_plain_fields_stay() {
        let _ = crate::testdata::SERVICE.definition("io.k8s.api.core.v1.Service");
        let mut service = json!({"metadata": {"name": "web", "namespace": "", "generation": 0,
                "labels": {"empty": ""}},
            "spec": {"clusterIP": "", "clusterIPs": [""], "type": "ExternalName",
                "externalName": "x.example.com", "loadBalancerClass": "",
                "allocateLoadBalancerNodePorts": false, "publishNotReadyAddresses": false,
                "ports": [{"name": "", "port": 0, "targetPort": 0, "nodePort": 0,
                    "appProtocol": ""}]}});
        drop_omitted_zeros(&mut service, "io.k8s.api.core.v1.Service");
        assert_eq!(
            service,
            json!({"metadata": {"name": "web", "labels": {"empty": ""}},
                "spec": {"clusterIPs": [""], "type": "ExternalName",
                    "externalName": "x.example.com", "loadBalancerClass": "",
                    "allocateLoadBalancerNodePorts": false,
                    "ports": [{"port": 0, "targetPort": 0, "appProtocol": ""}]}})
        );
    }

    #[test]
    fn structs_in_declaration_order_maps_sorted_the_rest_as_it_is() {
        let spec = json!({"type": "ClusterIP", "clusterIP": "10.0.0.1", "selector": {"b": "2", "a": "1"},
            "ports": [{"targetPort": 8080, "port": 80, "protocol": "TCP", "name": "http"}],
            "sessionAffinity": "None"});
        assert_eq!(
            written(&spec, "io.k8s.api.core.v1.ServiceSpec"),
            r#"{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}],"selector":{"a":"1","b":"2"},"clusterIP":"10.0.0.1","type":"ClusterIP","sessionAffinity":"None"}"#
        );
        // A member the type does not declare comes last; a value of another shape is
        // written as it is.
        let odd = json!({"zzz": {"y": 1, "x": 2}, "ports": "text", "type": "NodePort"});
        assert_eq!(
            written(&odd, "io.k8s.api.core.v1.ServiceSpec"),
            r#"{"ports":"text","type":"NodePort","zzz":{"y":1,"x":2}}"#
        );
        assert_eq!(written(&json!([1, "a"]), "nowhere"), r#"[1,"a"]"#);
        // FieldsV1 is raw JSON to Go (structured-merge-diff's order, `i:` after `k:`): as it is.
        let fields = json!({"f:b": {}, "k:{\"x\":1}": {".": {}}, "i:0": {}});
        assert_eq!(
            written(&fields, "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1"),
            fields.to_string()
        );
    }

    #[test]
    fn resource_version_goes_after_uid() {
        let before: Vec<&str> = before_resource_version().iter().map(|(n, _)| *n).collect();
        assert_eq!(
            before,
            ["name", "generateName", "namespace", "selfLink", "uid"]
        );
    }
}
