//! Each registered kind's generated data holds together: its definition is in its group's
//! document, every definition it reaches has its Go member order, and each order names exactly
//! the properties its definition declares.

use std::collections::BTreeSet;

use capstan_machinery::{go_order, schema};
use serde_json::{Value, json};

use crate::test_services;

/// The definitions a schema node refers to, by name, followed to the end.
fn reached(from: &'static Value, names: &mut BTreeSet<String>) {
    match from {
        Value::Object(members) => {
            for (key, value) in members {
                if let (true, Some(target)) = (key == "$ref", value.as_str()) {
                    let name = target.rsplit('/').next().unwrap_or_default().to_string();
                    if let Some(definition) = schema::named(&name)
                        && names.insert(name)
                    {
                        reached(definition, names);
                    }
                } else {
                    reached(value, names);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| reached(item, names)),
        _ => {}
    }
}

#[test]
fn every_definition_a_kind_reaches_has_its_member_order() {
    for kind in crate::registered(std::sync::Arc::new(test_services())) {
        let info = kind.info();
        let definition = info
            .schema()
            .unwrap_or_else(|| panic!("{}", info.definition));
        let mut names = BTreeSet::from([info.definition.to_string()]);
        reached(definition, &mut names);
        for name in names {
            let Some(node) = schema::named(&name) else {
                continue;
            };
            let Some(properties) = node.get("properties").and_then(Value::as_object) else {
                continue;
            };
            let order = go_order::declared(&name)
                .unwrap_or_else(|| panic!("{name}, reached from {}, has no order", info.kind));
            let mut declared: Vec<&str> = properties.keys().map(String::as_str).collect();
            let mut listed = order.to_vec();
            declared.sort_unstable();
            listed.sort_unstable();
            assert_eq!(listed, declared, "{name}");
            // Written without escaping: every member name is a plain identifier.
            assert!(
                order
                    .iter()
                    .all(|m| m.bytes().all(|b| b.is_ascii_alphanumeric()))
            );
        }
    }
}

fn written(
    value: &Value,
    data: &'static capstan_machinery::GroupVersionData,
    name: &str,
) -> String {
    let definition = data.definition(name);
    String::from_utf8(go_order::to_vec(value, definition)).expect("JSON is UTF-8")
}

#[test]
fn structs_in_declaration_order_maps_sorted_the_rest_as_it_is() {
    let spec = json!({"type": "ClusterIP", "clusterIP": "10.0.0.1", "selector": {"b": "2", "a": "1"},
        "ports": [{"targetPort": 8080, "port": 80, "protocol": "TCP", "name": "http"}],
        "sessionAffinity": "None"});
    let core = &crate::core::V1;
    assert_eq!(
        written(&spec, core, "io.k8s.api.core.v1.ServiceSpec"),
        r#"{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}],"selector":{"a":"1","b":"2"},"clusterIP":"10.0.0.1","type":"ClusterIP","sessionAffinity":"None"}"#
    );
    // A member the type does not declare comes last; a value of another shape is written as
    // it is.
    let odd = json!({"zzz": {"y": 1, "x": 2}, "ports": "text", "type": "NodePort"});
    assert_eq!(
        written(&odd, core, "io.k8s.api.core.v1.ServiceSpec"),
        r#"{"ports":"text","type":"NodePort","zzz":{"y":1,"x":2}}"#
    );
    assert_eq!(written(&json!([1, "a"]), core, "nowhere"), r#"[1,"a"]"#);
    // FieldsV1 is raw JSON to Go (structured-merge-diff's order, `i:` after `k:`): as it is.
    let fields = json!({"f:b": {}, "k:{\"x\":1}": {".": {}}, "i:0": {}});
    assert_eq!(
        written(
            &fields,
            core,
            "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1"
        ),
        fields.to_string()
    );
}

#[test]
fn the_same_name_in_two_groups_keeps_each_groups_order() {
    let port = json!({"port": 80, "protocol": "TCP", "name": "p"});
    assert_eq!(
        written(&port, &crate::core::V1, "io.k8s.api.core.v1.EndpointPort"),
        r#"{"name":"p","port":80,"protocol":"TCP"}"#
    );
    assert_eq!(
        written(
            &port,
            &crate::discovery::V1,
            "io.k8s.api.discovery.v1.EndpointPort"
        ),
        r#"{"name":"p","protocol":"TCP","port":80}"#
    );
}

#[test]
fn every_group_takes_protobuf_bodies() {
    for kind in crate::registered(std::sync::Arc::new(test_services())) {
        let info = kind.info();
        let messages = info.data.messages();
        assert!(messages.is_some(), "{}", info.kind);
        if let Some(messages) = messages {
            let version = match info.group {
                "" => info.version.to_string(),
                group => format!("{group}/{}", info.version),
            };
            assert_eq!(messages.api_version, version, "{}", info.kind);
        }
    }
}

/// A length-delimited protobuf field (payloads under 128 bytes).
fn field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![((number << 3) | 2) as u8, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

/// A protobuf body as kubectl's typed clients send it: `k8s\0`, then an `Unknown` holding the
/// type meta and the object's message.
fn protobuf_body(api_version: &str, kind: &str, object: &[u8]) -> Vec<u8> {
    let type_meta = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
    let unknown = [field(1, &type_meta), field(2, object)].concat();
    [b"k8s\x00".to_vec(), unknown].concat()
}

#[test]
fn a_protobuf_body_keeps_the_zero_values_go_writes() {
    let zero = |number: u32| vec![(number << 3) as u8, 0];
    // A Lease whose pointer fields leaseDurationSeconds and leaseTransitions are set to 0.
    let meta = field(1, b"l");
    let spec = [zero(2), zero(5)].concat();
    let lease = [field(1, &meta), field(2, &spec)].concat();
    let body = protobuf_body("coordination.k8s.io/v1", "Lease", &lease);
    let messages = crate::coordination::V1.messages();
    let (_, _, object) = capstan_machinery::protobuf::decode(&body, messages).expect("decodes");
    assert_eq!(
        object["spec"],
        json!({"leaseDurationSeconds": 0, "leaseTransitions": 0})
    );
    // A Service port: `port` (no omitempty) keeps its 0, `nodePort` (omitempty) does not.
    let port = [zero(3), zero(5), field(2, b"TCP")].concat();
    let service = [field(1, &meta), field(2, &field(1, &port))].concat();
    let body = protobuf_body("v1", "Service", &service);
    let messages = crate::core::V1.messages();
    let (_, _, object) = capstan_machinery::protobuf::decode(&body, messages).expect("decodes");
    assert_eq!(
        object["spec"]["ports"],
        json!([{"port": 0, "protocol": "TCP"}])
    );
}
