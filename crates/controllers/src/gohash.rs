//! The order upstream lists ports and subsets in: by the FNV-128a hash of each one's
//! `dump.ForHash` text (`k8s.io/utils/dump`: go-spew's `%#v` with types shown, methods and
//! pointer addresses off), compared as bytes. `RepackSubsets` sorts an Endpoints' ports and
//! subsets so (`portsByHash`, `subsetsByHash`), and the EndpointSlice and mirroring
//! controllers sort a slice's ports so (`NewPortMapKey`'s `portsInOrder`).
//!
//! No crate writes Go's spew text, so the few types hashed are written here, as spew's
//! `format.go` writes them: a value of a named type as `(type)value`; a pointer as
//! `(*type)value` or `(*type)<nil>`; a struct as `{Field:value …}`, a slice as `[a b]` or
//! `<nil>` when nil, and an element of a slice without its type (its fields keep theirs).

use std::fmt::Write;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort};
use k8s_openapi::api::discovery::v1::EndpointPort as SlicePort;

/// Go's `hash/fnv` 128-bit FNV-1a of `bytes`; its big-endian bytes are what upstream compares.
pub(crate) fn fnv128a(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u128::from(*byte)).wrapping_mul(PRIME)
    })
}

/// A slice port's place in its slice (`portsInOrder`): the hash of a
/// `discovery/v1.EndpointPort`, whose fields are all pointers.
pub(crate) fn slice_port_order(port: &SlicePort) -> u128 {
    let number = port.port.map(|p| p.to_string());
    let mut out = String::from("(v1.EndpointPort)");
    fields(
        &mut out,
        &[
            ("Name", Go::Pointer("string", port.name.as_deref())),
            (
                "Protocol",
                Go::Pointer("v1.Protocol", port.protocol.as_deref()),
            ),
            ("Port", Go::Pointer("int32", number.as_deref())),
            (
                "AppProtocol",
                Go::Pointer("string", port.app_protocol.as_deref()),
            ),
        ],
    );
    fnv128a(out.as_bytes())
}

/// An Endpoints port's place in its subset (`portsByHash`): the hash of a
/// `core/v1.EndpointPort`.
pub(crate) fn endpoints_port_order(port: &EndpointPort) -> u128 {
    let mut out = String::from("(v1.EndpointPort)");
    endpoints_port(&mut out, port);
    fnv128a(out.as_bytes())
}

/// A subset's place among an Endpoints' subsets (`subsetsByHash`): the hash of the
/// `core/v1.EndpointSubset` with its addresses and ports already in order (an empty list is
/// Go's nil slice, as `RepackSubsets` builds them).
pub(crate) fn subset_order(
    ready: &[EndpointAddress],
    not_ready: &[EndpointAddress],
    ports: &[EndpointPort],
) -> u128 {
    let mut lists = [String::new(), String::new(), String::new()];
    list(&mut lists[0], ready, address);
    list(&mut lists[1], not_ready, address);
    list(&mut lists[2], ports, endpoints_port);
    let [ready, not_ready, ports] = lists;
    let mut out = String::from("(v1.EndpointSubset)");
    fields(
        &mut out,
        &[
            ("Addresses", Go::Typed("[]v1.EndpointAddress", ready)),
            (
                "NotReadyAddresses",
                Go::Typed("[]v1.EndpointAddress", not_ready),
            ),
            ("Ports", Go::Typed("[]v1.EndpointPort", ports)),
        ],
    );
    fnv128a(out.as_bytes())
}

/// One field's value as spew writes it.
enum Go<'a> {
    /// A value of a named type: `(type)value`.
    Value(&'static str, &'a str),
    /// A pointer: `(*type)value`, or `(*type)<nil>`.
    Pointer(&'static str, Option<&'a str>),
    /// A value of a named type written already (a struct or a list): `(type)text`.
    Typed(&'static str, String),
}

/// A struct's fields, `{Name:value …}`, in Go's order.
fn fields(out: &mut String, fields: &[(&str, Go)]) {
    out.push('{');
    for (i, (name, field)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = match field {
            Go::Value(type_name, value) => write!(out, "{name}:({type_name}){value}"),
            Go::Typed(type_name, text) => write!(out, "{name}:({type_name}){text}"),
            Go::Pointer(type_name, value) => {
                write!(out, "{name}:(*{type_name}){}", value.unwrap_or("<nil>"))
            }
        };
    }
    out.push('}');
}

/// A slice: `<nil>` when empty, else its elements (each without its type) between brackets.
fn list<T>(out: &mut String, items: &[T], element: fn(&mut String, &T)) {
    if items.is_empty() {
        out.push_str("<nil>");
        return;
    }
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        element(out, item);
    }
    out.push(']');
}

/// A Go string field's text (`""` when unset).
fn text(field: &Option<String>) -> &str {
    field.as_deref().unwrap_or_default()
}

/// A `core/v1.EndpointPort`'s fields.
fn endpoints_port(out: &mut String, port: &EndpointPort) {
    let number = port.port.to_string();
    fields(
        out,
        &[
            ("Name", Go::Value("string", text(&port.name))),
            ("Port", Go::Value("int32", &number)),
            ("Protocol", Go::Value("v1.Protocol", text(&port.protocol))),
            (
                "AppProtocol",
                Go::Pointer("string", port.app_protocol.as_deref()),
            ),
        ],
    );
}

/// A `core/v1.EndpointAddress`'s fields, its target (an `ObjectReference`) included.
fn address(out: &mut String, address: &EndpointAddress) {
    let target = match &address.target_ref {
        Some(target) => {
            let mut written = String::new();
            fields(
                &mut written,
                &[
                    ("Kind", Go::Value("string", text(&target.kind))),
                    ("Namespace", Go::Value("string", text(&target.namespace))),
                    ("Name", Go::Value("string", text(&target.name))),
                    ("UID", Go::Value("types.UID", text(&target.uid))),
                    ("APIVersion", Go::Value("string", text(&target.api_version))),
                    (
                        "ResourceVersion",
                        Go::Value("string", text(&target.resource_version)),
                    ),
                    ("FieldPath", Go::Value("string", text(&target.field_path))),
                ],
            );
            Go::Typed("*v1.ObjectReference", written)
        }
        None => Go::Pointer("v1.ObjectReference", None),
    };
    fields(
        out,
        &[
            ("IP", Go::Value("string", &address.ip)),
            ("Hostname", Go::Value("string", text(&address.hostname))),
            (
                "NodeName",
                Go::Pointer("string", address.node_name.as_deref()),
            ),
            ("TargetRef", target),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv128a_gives_the_published_vectors() {
        assert_eq!(fnv128a(b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv128a(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
        assert_eq!(fnv128a(b"foobar"), 0x343e1662793c64bf6f0d3597ba446f18);
    }

    #[test]
    fn ports_are_hashed_as_spew_writes_them() {
        let slice_port = SlicePort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            app_protocol: None,
        };
        assert_eq!(
            slice_port_order(&slice_port),
            fnv128a(
                "(v1.EndpointPort){Name:(*string)http Protocol:(*v1.Protocol)TCP \
                 Port:(*int32)8080 AppProtocol:(*string)<nil>}"
                    .as_bytes()
            )
        );
        let port = EndpointPort {
            name: None,
            port: 53,
            protocol: Some("UDP".into()),
            app_protocol: Some("dns".into()),
        };
        assert_eq!(
            endpoints_port_order(&port),
            fnv128a(
                "(v1.EndpointPort){Name:(string) Port:(int32)53 Protocol:(v1.Protocol)UDP \
                 AppProtocol:(*string)dns}"
                    .as_bytes()
            )
        );
    }

    #[test]
    fn a_subset_is_hashed_with_its_elements_untyped_and_empty_lists_nil() {
        let address = EndpointAddress {
            ip: "10.0.0.1".into(),
            node_name: Some("n1".into()),
            target_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some("p".into()),
                uid: Some("u1".into()),
                ..Default::default()
            }),
            ..EndpointAddress::default()
        };
        let port = EndpointPort {
            name: Some("http".into()),
            port: 80,
            protocol: Some("TCP".into()),
            app_protocol: None,
        };
        let text = "(v1.EndpointSubset){Addresses:([]v1.EndpointAddress)[{IP:(string)10.0.0.1 \
            Hostname:(string) NodeName:(*string)n1 TargetRef:(*v1.ObjectReference){Kind:(string)Pod \
            Namespace:(string)ns Name:(string)p UID:(types.UID)u1 APIVersion:(string) \
            ResourceVersion:(string) FieldPath:(string)}}] \
            NotReadyAddresses:([]v1.EndpointAddress)<nil> Ports:([]v1.EndpointPort)[{Name:(string)http \
            Port:(int32)80 Protocol:(v1.Protocol)TCP AppProtocol:(*string)<nil>}]}";
        assert_eq!(
            subset_order(&[address], &[], &[port]),
            fnv128a(text.as_bytes())
        );
    }
}
