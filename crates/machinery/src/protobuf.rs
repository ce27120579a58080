//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`), decoded to JSON.
//!
//! kubectl's typed clients send these (e.g. `kubectl create service`). A kind names its
//! messages ([`Messages`]: its package and its group's field table, which the group's folder
//! holds); the tables are derived from upstream's `generated.proto` files by
//! `scripts/gen-proto-schema.py` (field names there are the JSON names). The apimachinery
//! messages every group uses are the machinery's own.

use std::collections::HashMap;
use std::sync::LazyLock;

use crate::definitions::Definitions;
use crate::go_order;

use base64::Engine;
use serde_json::{Map, Value, json};

type Field = (u32, String, String, bool);

/// The field table of the apimachinery messages (meta/v1, runtime, resource, intstr), which
/// every group's messages use.
static APIMACHINERY: &[u8] = include_bytes!("../data/proto-apimachinery.json");

/// Where a group version's protobuf messages are described.
#[derive(Debug, Clone, Copy)]
pub struct Messages {
    /// The API version whose bodies use these messages (`v1`).
    pub api_version: &'static str,
    /// The protobuf package of the group's messages (`k8s.io.api.core.v1`).
    pub package: &'static str,
    /// The group's field table (JSON, as `scripts/gen-proto-schema.py` writes it), with the
    /// messages of other groups it refers to.
    pub table: &'static [u8],
}

/// Every message known: the apimachinery ones and those of each group a decode was asked
/// for.
static TABLES: LazyLock<Definitions<[Field]>> =
    LazyLock::new(|| Definitions::new(message_table, APIMACHINERY));

/// The messages of a field table.
fn message_table(table: &'static [u8]) -> Vec<(String, &'static [Field])> {
    let parsed: HashMap<String, Vec<Field>> = serde_json::from_slice(table).unwrap_or_default();
    parsed
        .into_iter()
        .map(|(name, fields)| (name, &*Box::leak(fields.into_boxed_slice())))
        .collect()
}

fn lookup(name: &str) -> Option<&'static [Field]> {
    TABLES.get(name)
}

const MAGIC: &[u8] = b"k8s\x00";

/// The OpenAPI name of a protobuf message (`k8s.io.api.core.v1.ServicePort` is
/// `io.k8s.api.core.v1.ServicePort`; `k8s.io.kube_aggregator…` is `io.k8s.kube-aggregator…`).
fn definition_of(message: &str) -> String {
    let rest = message.strip_prefix("k8s.io.").unwrap_or(message);
    format!("io.k8s.{}", rest.replace('_', "-"))
}

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .bytes
                .get(self.position)
                .ok_or("unexpected end of protobuf data")?;
            self.position += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint overflow".into())
    }

    fn take(&mut self, length: usize) -> Result<&'a [u8], String> {
        let end = self
            .position
            .checked_add(length)
            .filter(|e| *e <= self.bytes.len())
            .ok_or("unexpected end of protobuf data")?;
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }

    fn done(&self) -> bool {
        self.position >= self.bytes.len()
    }
}

enum Raw<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

fn fields(bytes: &[u8]) -> Result<Vec<(u32, Raw<'_>)>, String> {
    let mut reader = Reader { bytes, position: 0 };
    let mut out = Vec::new();
    while !reader.done() {
        let tag = reader.varint()?;
        let number = u32::try_from(tag >> 3).map_err(|_| "bad field number")?;
        let raw = match tag & 7 {
            0 => Raw::Varint(reader.varint()?),
            1 => {
                let b = reader.take(8)?;
                Raw::Fixed64(u64::from_le_bytes(b.try_into().map_err(|_| "bad fixed64")?))
            }
            2 => {
                let length = usize::try_from(reader.varint()?).map_err(|_| "bad length")?;
                Raw::Bytes(reader.take(length)?)
            }
            5 => {
                let b = reader.take(4)?;
                Raw::Fixed32(u32::from_le_bytes(b.try_into().map_err(|_| "bad fixed32")?))
            }
            other => return Err(format!("unsupported protobuf wire type {other}")),
        };
        out.push((number, raw));
    }
    Ok(out)
}

fn scalar(kind: &str, raw: &Raw<'_>) -> Result<Vec<Value>, String> {
    Ok(match (kind, raw) {
        ("string", Raw::Bytes(b)) => vec![json!(String::from_utf8_lossy(b))],
        ("bytes", Raw::Bytes(b)) => {
            vec![json!(base64::engine::general_purpose::STANDARD.encode(b))]
        }
        ("bool", Raw::Varint(v)) => vec![json!(*v != 0)],
        ("int32", Raw::Varint(v)) => vec![json!(*v as i64 as i32)],
        ("int64", Raw::Varint(v)) => vec![json!(*v as i64)],
        ("uint32" | "uint64", Raw::Varint(v)) => vec![json!(*v)],
        ("double", Raw::Fixed64(v)) => vec![json!(f64::from_bits(*v))],
        ("float", Raw::Fixed32(v)) => vec![json!(f32::from_bits(*v))],
        // Packed repeated scalars.
        ("bool" | "int32" | "int64" | "uint32" | "uint64", Raw::Bytes(b)) => {
            let mut reader = Reader {
                bytes: b,
                position: 0,
            };
            let mut values = Vec::new();
            while !reader.done() {
                values.extend(scalar(kind, &Raw::Varint(reader.varint()?))?);
            }
            values
        }
        _ => {
            return Err(format!(
                "protobuf field of type {kind} has the wrong wire type"
            ));
        }
    })
}

fn timestamp(bytes: &[u8], micro: bool) -> Result<Value, String> {
    let mut seconds = 0i64;
    let mut nanos = 0i64;
    for (number, raw) in fields(bytes)? {
        if let Raw::Varint(v) = raw {
            match number {
                1 => seconds = v as i64,
                2 => nanos = i64::from(v as i64 as i32),
                _ => {}
            }
        }
    }
    if seconds == 0 && nanos == 0 {
        return Ok(Value::Null);
    }
    let at = jiff::Timestamp::new(seconds, nanos as i32).map_err(|e| e.to_string())?;
    Ok(json!(if micro {
        at.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
    } else {
        crate::meta::format_timestamp(at)
    }))
}

fn message(name: &str, bytes: &[u8], depth: usize) -> Result<Value, String> {
    if depth > 64 {
        return Err("protobuf nesting too deep".into());
    }
    match name {
        "k8s.io.apimachinery.pkg.apis.meta.v1.Time" => return timestamp(bytes, false),
        "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime" => return timestamp(bytes, true),
        "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => {
            let (mut kind, mut int, mut text) = (0u64, 0i64, String::new());
            for (number, raw) in fields(bytes)? {
                match (number, raw) {
                    (1, Raw::Varint(v)) => kind = v,
                    (2, Raw::Varint(v)) => int = i64::from(v as i64 as i32),
                    (3, Raw::Bytes(b)) => text = String::from_utf8_lossy(b).into_owned(),
                    _ => {}
                }
            }
            return Ok(if kind == 1 { json!(text) } else { json!(int) });
        }
        "k8s.io.apimachinery.pkg.api.resource.Quantity" => {
            for (number, raw) in fields(bytes)? {
                if let (1, Raw::Bytes(b)) = (number, raw) {
                    return Ok(json!(String::from_utf8_lossy(b)));
                }
            }
            return Ok(json!("0"));
        }
        "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1"
        | "k8s.io.apimachinery.pkg.runtime.RawExtension" => {
            for (number, raw) in fields(bytes)? {
                if let (1, Raw::Bytes(b)) = (number, raw) {
                    return serde_json::from_slice(b).map_err(|e| e.to_string());
                }
            }
            return Ok(json!({}));
        }
        _ => {}
    }
    let schema = lookup(name).ok_or_else(|| format!("no protobuf schema for {name}"))?;
    let mut out = Map::new();
    for (number, raw) in fields(bytes)? {
        let Some((_, field, kind, repeated)) = schema.iter().find(|f| f.0 == number) else {
            continue; // unknown fields are dropped, as the typed decoder does
        };
        let values: Vec<Value> = if let Some(value_kind) = kind.strip_prefix("map:") {
            let Raw::Bytes(entry) = raw else {
                return Err(format!("map field {field} has the wrong wire type"));
            };
            let mut key = String::new();
            let mut value = Value::Null;
            for (n, r) in fields(entry)? {
                match (n, r) {
                    (1, Raw::Bytes(b)) => key = String::from_utf8_lossy(b).into_owned(),
                    (2, r) => {
                        value = decode_value(value_kind, &r, depth)?
                            .into_iter()
                            .next()
                            .unwrap_or(Value::Null)
                    }
                    _ => {}
                }
            }
            if value.is_null() && value_kind == "string" {
                value = json!("");
            }
            let map = out
                .entry(field.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(map) = map {
                map.insert(key, value);
            }
            continue;
        } else {
            decode_value(kind, &raw, depth)?
        };
        if *repeated {
            let list = out.entry(field.clone()).or_insert_with(|| json!([]));
            if let Value::Array(list) = list {
                list.extend(values);
            }
        } else if let Some(value) = values.into_iter().next() {
            // Go's protobuf carries every plain field, zero or not; its JSON leaves a zero out
            // (`omitempty`) unless the field is a pointer (set on purpose) or has no
            // `omitempty` (the member order's `*`).
            let zero = value.as_str().is_some_and(str::is_empty)
                || value.as_i64() == Some(0)
                || value.as_bool() == Some(false);
            if !value.is_null()
                && (!zero || go_order::writes_zero(&definition_of(name), field.as_str()))
            {
                out.insert(field.clone(), value);
            }
        }
    }
    Ok(Value::Object(out))
}

fn decode_value(kind: &str, raw: &Raw<'_>, depth: usize) -> Result<Vec<Value>, String> {
    match kind.strip_prefix("m:") {
        Some(name) => match raw {
            Raw::Bytes(b) => Ok(vec![message(name, b, depth + 1)?]),
            _ => Err(format!("message field {name} has the wrong wire type")),
        },
        None => scalar(kind, raw),
    }
}

/// Decodes an enveloped protobuf body; returns `(apiVersion, kind, object)`. The object is one
/// of `messages` (the kind's group) when the envelope names one of them, else an apimachinery
/// message (`DeleteOptions`…).
pub fn decode(bytes: &[u8], messages: Option<Messages>) -> Result<(String, String, Value), String> {
    let body = bytes.strip_prefix(MAGIC).ok_or(
        "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]",
    )?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (number, value) in fields(body)? {
        match (number, value) {
            (1, Raw::Bytes(type_meta)) => {
                for (n, v) in fields(type_meta)? {
                    match (n, v) {
                        (1, Raw::Bytes(b)) => api_version = String::from_utf8_lossy(b).into_owned(),
                        (2, Raw::Bytes(b)) => kind = String::from_utf8_lossy(b).into_owned(),
                        _ => {}
                    }
                }
            }
            (2, Raw::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let package = match messages {
        Some(group) if group.api_version == api_version => {
            TABLES.load(group.table);
            match lookup(&format!("{}.{kind}", group.package)) {
                Some(_) => group.package,
                None => META,
            }
        }
        _ => META,
    };
    let mut object = message(&format!("{package}.{kind}"), raw, 0)?;
    if let Value::Object(map) = &mut object {
        let mut typed = Map::new();
        typed.insert("kind".into(), json!(kind));
        typed.insert("apiVersion".into(), json!(api_version));
        typed.extend(std::mem::take(map));
        *map = typed;
    }
    Ok((api_version, kind, object))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((number << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    fn varint_field(number: u32, value: u8) -> Vec<u8> {
        vec![(number << 3) as u8, value]
    }

    #[test]
    fn decodes_a_service_envelope() {
        let port = [varint_field(3, 80), field(2, b"TCP")].concat();
        let spec = [field(1, &port), field(4, b"ClusterIP")].concat();
        let meta = [
            field(1, b"web"),
            field(11, &[field(1, b"app"), field(2, b"web")].concat()),
        ]
        .concat();
        let service = [field(1, &meta), field(2, &spec)].concat();
        let type_meta = [field(1, b"v1"), field(2, b"Service")].concat();
        let unknown = [field(1, &type_meta), field(2, &service)].concat();
        let body = [MAGIC.to_vec(), unknown].concat();
        let (version, kind, object) =
            decode(&body, crate::testdata::SERVICE.messages()).expect("decodes");
        assert_eq!((version.as_str(), kind.as_str()), ("v1", "Service"));
        assert_eq!(
            object,
            json!({"kind":"Service","apiVersion":"v1","metadata":{"name":"web","labels":{"app":"web"}},
                   "spec":{"ports":[{"port":80,"protocol":"TCP"}],"type":"ClusterIP"}})
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode(b"k8s\x00\xff\xff\xff", crate::testdata::SERVICE.messages()).is_err());
        assert!(decode(b"nope", None).is_err());
    }
}
