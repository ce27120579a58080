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

/// The protobuf content type, as responses carry it.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The content type of a watch written as protobuf frames.
pub const STREAM_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_tag(out: &mut Vec<u8>, number: u32, wire: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire));
}

fn put_bytes(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_tag(out, number, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_int(out: &mut Vec<u8>, number: u32, value: i64) {
    put_tag(out, number, 0);
    // Negative numbers go out as their 64-bit two's complement, as Go's encoder writes them.
    put_varint(out, value as u64);
}

/// Writes one value of a field: a scalar as its kind says, a message (`m:NAME`) as its bytes.
fn encode_value(
    out: &mut Vec<u8>,
    number: u32,
    kind: &str,
    value: &Value,
    depth: usize,
) -> Result<(), String> {
    if let Some(name) = kind.strip_prefix("m:") {
        let mut inner = Vec::new();
        encode_message(&mut inner, name, value, depth + 1)?;
        put_bytes(out, number, &inner);
        return Ok(());
    }
    let wrong = || format!("a value of protobuf type {kind} cannot be {value}");
    match kind {
        "string" => put_bytes(out, number, value.as_str().ok_or_else(wrong)?.as_bytes()),
        "bytes" => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(value.as_str().ok_or_else(wrong)?)
                .map_err(|e| e.to_string())?;
            put_bytes(out, number, &decoded);
        }
        "bool" => {
            put_tag(out, number, 0);
            put_varint(out, u64::from(value.as_bool().ok_or_else(wrong)?));
        }
        "int32" | "int64" => put_int(out, number, value.as_i64().ok_or_else(wrong)?),
        "uint32" | "uint64" => {
            put_tag(out, number, 0);
            put_varint(out, value.as_u64().ok_or_else(wrong)?);
        }
        "double" => {
            put_tag(out, number, 1);
            out.extend_from_slice(&value.as_f64().ok_or_else(wrong)?.to_bits().to_le_bytes());
        }
        "float" => {
            put_tag(out, number, 5);
            out.extend_from_slice(
                &(value.as_f64().ok_or_else(wrong)? as f32)
                    .to_bits()
                    .to_le_bytes(),
            );
        }
        _ => return Err(format!("no protobuf encoding for type {kind}")),
    }
    Ok(())
}

/// Encodes `value` as the message `name` (the inverse of [`message`]): its fields in number
/// order, as Go's generated marshallers write them. A member the JSON leaves out (or sets to
/// `null`) is left out; one it sets, zero or not, is written. (Go also writes the zero of
/// every non-pointer field; a decoder reads both the same, as Go's zero.)
fn encode_message(
    out: &mut Vec<u8>,
    name: &str,
    value: &Value,
    depth: usize,
) -> Result<(), String> {
    if depth > 64 {
        return Err("protobuf nesting too deep".into());
    }
    match name {
        "k8s.io.apimachinery.pkg.apis.meta.v1.Time"
        | "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime" => {
            let Some(text) = value.as_str() else {
                return Ok(());
            };
            let at: jiff::Timestamp = text.parse().map_err(|e: jiff::Error| e.to_string())?;
            put_int(out, 1, at.as_second());
            // `Time.ProtoTime` leaves the nanoseconds out (JSON carries whole seconds);
            // `MicroTime` keeps them.
            let nanos = match name.ends_with(".MicroTime") {
                true => i64::from(at.subsec_nanosecond()),
                false => 0,
            };
            put_int(out, 2, nanos);
            return Ok(());
        }
        "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => {
            // Go writes all three fields: the type, then both values (one of them zero).
            let (kind, int, text) = match value {
                Value::String(text) => (1, 0, text.as_str()),
                other => (0, other.as_i64().unwrap_or(0), ""),
            };
            put_int(out, 1, kind);
            put_int(out, 2, int);
            put_bytes(out, 3, text.as_bytes());
            return Ok(());
        }
        "k8s.io.apimachinery.pkg.api.resource.Quantity" => {
            let text = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            put_bytes(out, 1, text.as_bytes());
            return Ok(());
        }
        "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1"
        | "k8s.io.apimachinery.pkg.runtime.RawExtension" => {
            put_bytes(out, 1, &crate::json::to_vec(value));
            return Ok(());
        }
        "k8s.io.apimachinery.pkg.apis.meta.v1.Verbs" => {
            for verb in value.as_array().into_iter().flatten() {
                put_bytes(out, 1, verb.as_str().unwrap_or_default().as_bytes());
            }
            return Ok(());
        }
        _ => {}
    }
    let schema = lookup(name).ok_or_else(|| format!("no protobuf schema for {name}"))?;
    let Some(members) = value.as_object() else {
        return Err(format!("a {name} must be an object"));
    };
    let mut fields: Vec<&Field> = schema.iter().collect();
    fields.sort_by_key(|field| field.0);
    for (number, field, kind, repeated) in fields {
        let Some(value) = members.get(field.as_str()).filter(|v| !v.is_null()) else {
            continue;
        };
        if let Some(value_kind) = kind.strip_prefix("map:") {
            // Go's marshallers write a map's entries by sorted key.
            let mut entries: Vec<(&String, &Value)> =
                value.as_object().into_iter().flatten().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            for (key, item) in entries {
                let mut entry = Vec::new();
                put_bytes(&mut entry, 1, key.as_bytes());
                if !item.is_null() {
                    encode_value(&mut entry, 2, value_kind, item, depth)?;
                }
                put_bytes(out, *number, &entry);
            }
        } else if *repeated {
            for item in value.as_array().into_iter().flatten() {
                encode_value(out, *number, kind, item, depth)?;
            }
        } else {
            encode_value(out, *number, kind, value, depth)?;
        }
    }
    Ok(())
}

/// The full name of the message of `kind` in `api_version`: one of `messages` (the kind's
/// group) when it names one, else an apimachinery message (`Status`, `WatchEvent`, …).
fn message_name(api_version: &str, kind: &str, messages: Option<Messages>) -> String {
    if let Some(group) = messages.filter(|group| group.api_version == api_version) {
        TABLES.load(group.table);
        let name = format!("{}.{kind}", group.package);
        if lookup(&name).is_some() {
            return name;
        }
    }
    format!("{META}.{kind}")
}

/// Encodes an object (its `apiVersion` and `kind` name its message) as upstream's protobuf
/// serializer writes it: the `k8s\0` prefix, then a `runtime.Unknown` holding its type and
/// its bytes.
pub fn encode(object: &Value, messages: Option<Messages>) -> Result<Vec<u8>, String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let mut raw = Vec::new();
    encode_message(
        &mut raw,
        &message_name(api_version, kind, messages),
        object,
        0,
    )?;
    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    put_bytes(&mut out, 1, &type_meta);
    put_bytes(&mut out, 2, &raw);
    // contentEncoding and contentType: empty, and written (Go writes every plain string).
    put_bytes(&mut out, 3, b"");
    put_bytes(&mut out, 4, b"");
    Ok(out)
}

/// One frame of a protobuf watch: the `WatchEvent` message, unwrapped (the stream's raw
/// serializer), whose object is the enveloped object (`encoded`, from [`encode`]), after its
/// length as four big-endian bytes (the length-delimited framer).
pub fn watch_frame(event_type: &str, encoded: &[u8]) -> Vec<u8> {
    let mut raw_extension = Vec::new();
    put_bytes(&mut raw_extension, 1, encoded);
    let mut event = Vec::new();
    put_bytes(&mut event, 1, event_type.as_bytes());
    put_bytes(&mut event, 2, &raw_extension);
    let length = u32::try_from(event.len()).unwrap_or(u32::MAX);
    let mut frame = length.to_be_bytes().to_vec();
    frame.extend_from_slice(&event);
    frame
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
    fn encoding_is_what_decoding_reads() {
        let service = json!({"kind":"Service","apiVersion":"v1",
            "metadata":{"name":"web","namespace":"default","labels":{"b":"2","a":"1"},
                "creationTimestamp":"2026-12-08T00:00:00Z","generation":0,
                "managedFields":[{"manager":"m","operation":"Update","time":"2026-12-08T00:00:01Z",
                    "fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:ports":{}}}}]},
            "spec":{"ports":[{"port":80,"protocol":"TCP","targetPort":"http"},
                             {"port":-1,"targetPort":8080}],
                    "type":"ClusterIP","clusterIPs":["10.0.0.1"],"ipFamilyPolicy":"SingleStack",
                    "sessionAffinityConfig":{"clientIP":{"timeoutSeconds":10800}}},
            "status":{"loadBalancer":{}}});
        let messages = crate::testdata::SERVICE.messages();
        let bytes = encode(&service, messages).expect("encodes");
        assert!(bytes.starts_with(MAGIC));
        let (version, kind, decoded) = decode(&bytes, messages).expect("decodes");
        assert_eq!((version.as_str(), kind.as_str()), ("v1", "Service"));
        // The decoder leaves out the zero generation (JSON's omitempty); all else comes back.
        let mut want = service.clone();
        want["metadata"]
            .as_object_mut()
            .map(|m| m.remove("generation"));
        assert_eq!(decoded, want);
    }

    #[test]
    fn a_watch_frame_is_length_then_event() {
        let status = json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message":"gone","reason":"Expired","code":410});
        let inner = encode(&status, None).expect("encodes");
        let frame = watch_frame("ERROR", &inner);
        let length = u32::from_be_bytes(frame[..4].try_into().expect("four bytes")) as usize;
        assert_eq!(length, frame.len() - 4);
        let event = fields(&frame[4..]).expect("a message");
        assert!(matches!(event[0], (1, Raw::Bytes(b"ERROR"))));
        let Raw::Bytes(extension) = &event[1].1 else {
            panic!("the object is a RawExtension");
        };
        let raw = fields(extension).expect("a RawExtension");
        let Raw::Bytes(object) = raw[0].1 else {
            panic!("its raw bytes");
        };
        let (_, kind, decoded) = decode(object, None).expect("the enveloped Status");
        assert_eq!(kind, "Status");
        assert_eq!(decoded, status);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode(b"k8s\x00\xff\xff\xff", crate::testdata::SERVICE.messages()).is_err());
        assert!(decode(b"nope", None).is_err());
    }
}
