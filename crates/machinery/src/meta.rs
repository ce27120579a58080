//! Reading and writing `metadata` on objects held as JSON.

use serde_json::{Map, Value};

use crate::go_order;

/// `metadata` of an object, if it is a map.
pub fn metadata(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata").and_then(Value::as_object)
}

/// `metadata`, created when missing (and replaced when it is not a map).
pub fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    let Value::Object(map) = object else {
        unreachable!("made an object above")
    };
    let entry = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    match entry {
        Value::Object(meta) => meta,
        _ => unreachable!("made an object above"),
    }
}

/// A JSON value's text: `""` when it is absent or not a string.
pub fn text(value: Option<&Value>) -> &str {
    value.and_then(Value::as_str).unwrap_or("")
}

/// A string field of `metadata` (`""` when absent).
pub fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    text(metadata(object).and_then(|m| m.get(field)))
}

/// `metadata.name`.
pub fn name(object: &Value) -> &str {
    meta_str(object, "name")
}

/// `metadata.namespace`.
pub fn namespace(object: &Value) -> &str {
    meta_str(object, "namespace")
}

/// `metadata.resourceVersion`.
pub fn resource_version(object: &Value) -> &str {
    meta_str(object, "resourceVersion")
}

/// Sets a string field of `metadata`.
pub fn set_meta_str(object: &mut Value, field: &str, value: &str) {
    metadata_mut(object).insert(field.to_string(), Value::String(value.to_string()));
}

/// `metadata.finalizers` as strings.
pub fn finalizers(object: &Value) -> Vec<String> {
    metadata(object)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The current time as Kubernetes writes timestamps: RFC 3339, UTC, whole seconds.
pub fn now_rfc3339() -> String {
    format_timestamp(jiff::Timestamp::now())
}

/// Now, to the second: the time [`now_rfc3339`] writes, as a timestamp.
pub fn now_second() -> jiff::Timestamp {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second()).unwrap_or(now)
}

/// The time `seconds` from now, as [`now_rfc3339`] formats it (deletion deadlines).
pub fn rfc3339_in(seconds: i64) -> String {
    let now = jiff::Timestamp::now();
    format_timestamp(
        now.checked_add(jiff::SignedDuration::from_secs(seconds))
            .unwrap_or(now),
    )
}

/// An RFC 3339 time moved by `seconds` (None when it does not parse).
pub fn shift_rfc3339(time: &str, seconds: i64) -> Option<String> {
    let at: jiff::Timestamp = time.parse().ok()?;
    Some(format_timestamp(
        at.checked_add(jiff::SignedDuration::from_secs(seconds))
            .ok()?,
    ))
}

/// Formats a timestamp as `2006-01-02T15:04:05Z`.
pub fn format_timestamp(at: jiff::Timestamp) -> String {
    let format = |at: jiff::Timestamp| at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    if at.as_second() < 0 || at.subsec_nanosecond() < 0 {
        // Before 1970 a second and its text do not line up as below (jiff's seconds count
        // toward zero); nothing writes such times now.
        return format(at);
    }
    // Every write stamps the second it happens at (creationTimestamp, managedFields' time),
    // so each thread keeps its last second's text rather than format it again.
    thread_local! {
        static LAST: std::cell::RefCell<(i64, String)> =
            const { std::cell::RefCell::new((-1, String::new())) };
    }
    LAST.try_with(|last| {
        let (second, text) = &mut *last.borrow_mut();
        if *second != at.as_second() {
            *text = format(at);
            *second = at.as_second();
        }
        text.clone()
    })
    // A thread tearing down its locals formats afresh.
    .unwrap_or_else(|_| format(at))
}

/// Sets `kind` and `apiVersion` first in the object, then `metadata`, as kube-apiserver's
/// responses carry them (a Go type's fields in order: `TypeMeta`, `ObjectMeta`, the rest).
pub fn with_type_meta(object: &Value, api_version: &str, kind: &str) -> Value {
    let mut out = Map::new();
    out.insert("kind".into(), Value::String(kind.to_string()));
    out.insert("apiVersion".into(), Value::String(api_version.to_string()));
    if let Value::Object(fields) = object {
        for (k, v) in members_in_order(fields) {
            out.insert(k.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// An object's members but `kind` and `apiVersion`: `metadata` first, the others in order.
fn members_in_order(fields: &Map<String, Value>) -> impl Iterator<Item = (&str, &Value)> {
    let metadata = fields.get("metadata").map(|m| ("metadata", m));
    let rest = fields
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "kind" | "apiVersion" | "metadata"))
        .map(|(k, v)| (k.as_str(), v));
    metadata.into_iter().chain(rest)
}

/// Removes `kind` and `apiVersion`, keeping the other members in order.
pub fn strip_type_meta(object: &mut Value) {
    if let Value::Object(map) = object {
        map.shift_remove("kind");
        map.shift_remove("apiVersion");
    }
}

/// `{"kind":K,"apiVersion":V` — how every typed object's JSON begins.
pub fn type_head(kind: &str, api_version: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(b"{\"kind\":");
    out.extend_from_slice(&crate::json::to_vec(kind));
    out.extend_from_slice(b",\"apiVersion\":");
    out.extend_from_slice(&crate::json::to_vec(api_version));
    out
}

/// [`with_type_meta`] written straight to JSON, without copying the object; with
/// `stored`, `metadata.resourceVersion` is left out (the form kept in storage). The bytes are
/// those of `serde_json::to_vec` of the equivalent value.
pub fn typed_json_bytes(
    object: &Value,
    (api_version, kind): (&str, &str),
    stored: bool,
    schema: Option<&'static Value>,
) -> Vec<u8> {
    typed_json_bytes_laid_out(object, (api_version, kind), stored, &|_| None, schema).0
}

/// [`typed_json_bytes`] made a value again (with `kind` and `apiVersion` first, and each
/// struct's members in their Go type's order): for indented JSON, and for objects embedded in
/// others (a Table's rows, PartialObjectMetadata).
pub fn typed_value(
    object: &Value,
    type_meta: (&str, &str),
    schema: Option<&'static Value>,
) -> Value {
    serde_json::from_slice(&typed_json_bytes(object, type_meta, false, schema))
        .unwrap_or_else(|_| with_type_meta(object, type_meta.0, type_meta.1))
}

/// An object as a list item: [`typed_json_bytes`] without `kind` and `apiVersion`.
pub fn item_json_bytes(object: &Value, schema: Option<&'static Value>) -> Vec<u8> {
    let typed = typed_json_bytes(object, ("", ""), false, schema);
    let rest = &typed[type_head("", "").len()..];
    let mut item = Vec::with_capacity(rest.len());
    item.push(b'{');
    item.extend_from_slice(rest.strip_prefix(b",").unwrap_or(rest));
    item
}

/// Where the parts of an object's stored JSON are, as [`typed_json_bytes_laid_out`] wrote
/// them: what a reader of the bytes would otherwise find by scanning them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredLayout {
    /// Where the members after `kind` and `apiVersion` start (`metadata` first).
    pub members: usize,
    /// Where `metadata`'s opening brace is.
    pub metadata_start: usize,
    /// Where `metadata`'s closing brace is.
    pub metadata_end: usize,
    /// Whether `metadata` has no member.
    pub metadata_empty: bool,
    /// The length of the whole JSON.
    pub len: usize,
    /// The bytes holding `metadata.managedFields` with one comma beside it (the one before
    /// it, or when it comes first the one after it), when it has them: without these bytes
    /// the JSON is the object's without managedFields.
    pub managed_fields: Option<std::ops::Range<usize>>,
    /// Where `metadata.resourceVersion` goes: in `ObjectMeta`'s order, after the members
    /// before it (after `uid`), or at the end of `metadata` when there is none.
    pub resource_version_at: usize,
}

impl StoredLayout {
    /// What [`with_resource_version`] takes: where `resourceVersion` goes, and whether a
    /// member comes before it.
    pub fn mark(&self) -> (usize, bool) {
        (self.resource_version_at, !self.metadata_empty)
    }
}

/// [`typed_json_bytes`] with the top-level members `raw` gives written as that JSON instead
/// of as the object has them (members a typed write kept as encoded text), and, in the stored form of an object with a `metadata` object,
/// where its parts are ([`StoredLayout`]). With the kind's `schema`, each struct's members
/// are in the order kube-apiserver's Go types write them ([`crate::go_order`]); `metadata`'s
/// always are.
pub fn typed_json_bytes_laid_out<'r>(
    object: &Value,
    (api_version, kind): (&str, &str),
    stored: bool,
    raw: &dyn Fn(&str) -> Option<&'r serde_json::value::RawValue>,
    schema: Option<&'static Value>,
) -> (Vec<u8>, Option<StoredLayout>) {
    let mut out = type_head(kind, api_version);
    let mut layout = None;
    if let Value::Object(fields) = object {
        let members = out.len() + 1;
        let ordered = schema.and_then(go_order::struct_members);
        for (key, value, member_schema) in root_members(fields, ordered) {
            out.push(b',');
            let _ = go_order::write_key(&mut out, key);
            match value {
                Value::Object(metadata) if key == "metadata" => {
                    let written = write_metadata(&mut out, metadata, stored);
                    layout = Some(StoredLayout {
                        members,
                        len: 0,
                        ..written
                    });
                }
                _ => match raw(key) {
                    Some(raw) => out.extend_from_slice(raw.get().as_bytes()),
                    None => {
                        let _ = go_order::write(&mut out, value, member_schema);
                    }
                },
            }
        }
    }
    out.push(b'}');
    if let Some(layout) = layout.as_mut() {
        layout.len = out.len();
    }
    (out, layout.filter(|_| stored))
}

/// An object's members but `kind` and `apiVersion`, each with its schema: in the order of the
/// kind's Go type when known (`metadata` is first there), else `metadata` first and the
/// others in order.
fn root_members(
    fields: &Map<String, Value>,
    ordered: Option<go_order::Members>,
) -> Vec<(&str, &Value, Option<&'static Value>)> {
    match ordered {
        Some(members) => go_order::in_order(fields, members)
            .into_iter()
            .filter(|(_, key, _)| !matches!(*key, "kind" | "apiVersion"))
            .map(|(rank, key, value)| (key, value, members.get(rank).map(|(_, schema)| *schema)))
            .collect(),
        None => members_in_order(fields)
            .map(|(key, value)| (key, value, None))
            .collect(),
    }
}

/// Writes `metadata` in `ObjectMeta`'s order, and where its parts are (offsets into `out`).
/// `resourceVersion` has its place right after the members that come before it (`name` to
/// `uid`), or at the end when there is none: left out when `stored`, for
/// [`with_resource_version`] to put in there.
fn write_metadata(out: &mut Vec<u8>, metadata: &Map<String, Value>, stored: bool) -> StoredLayout {
    let metadata_start = out.len();
    out.push(b'{');
    let ordered = go_order::object_meta();
    let resource_version_rank = ordered
        .iter()
        .position(|(name, _)| *name == "resourceVersion")
        .unwrap_or(usize::MAX);
    let resource_version = metadata.get("resourceVersion").filter(|_| !stored);
    let mut first = true;
    let mut managed_fields: Option<std::ops::Range<usize>> = None;
    // Whether managedFields came first: its cut then runs to the next member.
    let mut managed_first = false;
    let mut resource_version_at = None;
    // Whether a member that comes before resourceVersion was written.
    let mut before = false;
    for (rank, key, value) in go_order::in_order(metadata, ordered) {
        if key == "resourceVersion" {
            continue;
        }
        before |= rank < resource_version_rank;
        if resource_version_at.is_none() && rank > resource_version_rank && before {
            resource_version_at = Some(out.len());
            write_resource_version(out, resource_version, true);
        }
        // The comma before this member (where it starts, for the first).
        let comma = out.len();
        if !first {
            out.push(b',');
        }
        if std::mem::take(&mut managed_first)
            && let Some(cut) = managed_fields.as_mut()
        {
            cut.end = out.len();
        }
        let _ = go_order::write_member(out, ordered, (rank, key, value));
        if key == "managedFields" {
            managed_fields = Some(comma..out.len());
            managed_first = first;
        }
        first = false;
    }
    let metadata_end = out.len();
    if resource_version_at.is_none() {
        write_resource_version(out, resource_version, !first);
    }
    out.push(b'}');
    StoredLayout {
        members: 0,
        metadata_start,
        metadata_end,
        metadata_empty: first,
        len: 0,
        managed_fields,
        resource_version_at: resource_version_at.unwrap_or(metadata_end),
    }
}

/// `"resourceVersion":…` (after a comma when `comma`), when there is one to write.
fn write_resource_version(out: &mut Vec<u8>, version: Option<&Value>, comma: bool) {
    if let Some(version) = version {
        if comma {
            out.push(b',');
        }
        let _ = go_order::write_key(out, "resourceVersion");
        let _ = go_order::write(out, version, None);
    }
}

/// Stored JSON ([`typed_json_bytes_laid_out`]'s, with its layout's mark) with `resourceVersion` put back
/// in at the end of `metadata`: the bytes [`typed_json_bytes`] writes of the object once its
/// `resourceVersion` is set last in its metadata.
pub fn with_resource_version(
    stored: &[u8],
    (end, members): (usize, bool),
    revision: i64,
) -> Vec<u8> {
    let member = ResourceVersionMember::new(!members, revision);
    let member = member.as_bytes();
    let mut out = Vec::with_capacity(stored.len() + member.len());
    out.extend_from_slice(&stored[..end]);
    out.extend_from_slice(member);
    out.extend_from_slice(&stored[end..]);
    out
}

/// `"resourceVersion":"N"`, after a comma unless it is `metadata`'s only member; written
/// without allocating (list bodies write one per item).
pub struct ResourceVersionMember {
    bytes: [u8; 48],
    len: usize,
}

impl ResourceVersionMember {
    /// The member for `metadata` at `revision` (with no comma before it when `metadata` has
    /// no other member).
    pub fn new(metadata_empty: bool, revision: i64) -> Self {
        use std::io::Write;
        let mut bytes = [0u8; 48];
        let mut cursor = std::io::Cursor::new(&mut bytes[..]);
        let comma = if metadata_empty { "" } else { "," };
        // 48 bytes hold the longest i64: the write cannot fail.
        let _ = write!(cursor, "{comma}\"resourceVersion\":\"{revision}\"");
        let len = cursor.position() as usize;
        Self { bytes, len }
    }

    /// Its JSON text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timestamps_format_to_the_second_whichever_came_before() {
        let at = |text: &str| text.parse::<jiff::Timestamp>().expect("a timestamp");
        for (time, text) in [
            ("2026-11-28T19:45:00.250Z", "2026-11-28T19:45:00Z"),
            ("2026-11-28T19:45:00.900Z", "2026-11-28T19:45:00Z"),
            ("2026-11-28T19:45:01Z", "2026-11-28T19:45:01Z"),
            ("2026-11-28T19:45:00Z", "2026-11-28T19:45:00Z"),
            ("1969-12-31T23:59:59.500Z", "1969-12-31T23:59:59Z"),
            ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z"),
        ] {
            assert_eq!(format_timestamp(at(time)), text, "{time}");
        }
    }

    fn service_schema() -> Option<&'static Value> {
        crate::testdata::service()
    }

    #[test]
    fn the_stored_form_with_its_resource_version_put_back_is_the_served_form() {
        for metadata in [
            json!({"name": "a", "labels": {"x": "}"}, "managedFields": [{"f:a": {}}]}),
            json!({"labels": {"x": "y"}, "uid": "u", "name": "a", "creationTimestamp": "t"}),
            json!({"managedFields": [], "labels": {"x": "y"}}),
            json!({}),
            json!({"resourceVersion": "3"}),
        ] {
            for schema in [None, service_schema()] {
                let mut object = json!({"metadata": metadata, "spec": {"a": "{}"}});
                let (stored, layout) =
                    typed_json_bytes_laid_out(&object, ("v1", "Service"), true, &|_| None, schema);
                let mark = layout.expect("metadata was written").mark();
                set_meta_str(&mut object, "resourceVersion", "42");
                assert_eq!(
                    String::from_utf8_lossy(&with_resource_version(&stored, mark, 42)),
                    String::from_utf8_lossy(&typed_json_bytes(
                        &object,
                        ("v1", "Service"),
                        false,
                        schema
                    ))
                );
            }
        }
        // No metadata map: nothing to mark.
        let (_, layout) = typed_json_bytes_laid_out(
            &json!({"spec": {}}),
            ("v1", "Service"),
            true,
            &|_| None,
            None,
        );
        assert_eq!(layout, None);
    }

    #[test]
    fn members_are_written_in_the_order_of_kube_apiservers_go_types() {
        // As k8s-openapi writes a Service: every struct's members alphabetically.
        let object = json!({"apiVersion": "old", "kind": "Old",
            "metadata": {"creationTimestamp": "2026-11-21T16:05:22Z", "labels": {"b": "2", "a": "1"},
                "managedFields": [{"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "m", "operation": "Update"}],
                "name": "web", "namespace": "ref", "resourceVersion": "5", "uid": "u1"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                "selector": {"app": "web"}, "type": "ClusterIP"},
            "status": {"loadBalancer": {}}});
        let served = r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"web","namespace":"ref","uid":"u1","resourceVersion":"5","creationTimestamp":"2026-11-21T16:05:22Z","labels":{"a":"1","b":"2"},"managedFields":[{"manager":"m","operation":"Update","apiVersion":"v1","fieldsType":"FieldsV1"}]},"spec":{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}],"selector":{"app":"web"},"clusterIP":"10.96.0.1","type":"ClusterIP"},"status":{"loadBalancer":{}}}"#;
        let written = typed_json_bytes(&object, ("v1", "Service"), false, service_schema());
        assert_eq!(String::from_utf8_lossy(&written), served);
        // Stored without resourceVersion; served with it where it was.
        let (stored, layout) = typed_json_bytes_laid_out(
            &object,
            ("v1", "Service"),
            true,
            &|_| None,
            service_schema(),
        );
        assert!(!String::from_utf8_lossy(&stored).contains("resourceVersion"));
        let mark = layout.expect("laid out").mark();
        assert_eq!(
            String::from_utf8_lossy(&with_resource_version(&stored, mark, 5)),
            served
        );
        // Without the kind's schema, metadata still is in ObjectMeta's order.
        let bare = typed_json_bytes(&object, ("v1", "Service"), false, None);
        assert!(
            String::from_utf8_lossy(&bare).starts_with(
                r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"web","namespace":"ref","uid":"u1","resourceVersion":"5","#
            ),
            "{}",
            String::from_utf8_lossy(&bare)
        );
        assert_eq!(
            typed_json_bytes(
                &json!({"metadata": {"resourceVersion": "1"}}),
                ("v1", "Pod"),
                true,
                None
            ),
            br#"{"kind":"Pod","apiVersion":"v1","metadata":{}}"#
        );
    }

    #[test]
    fn metadata_comes_right_after_the_type_as_kube_apiserver_writes_it() {
        // k8s-openapi, and many clients, write an EndpointSlice's members alphabetically.
        let slice = json!({"addressType": "IPv4", "apiVersion": "discovery.k8s.io/v1",
            "endpoints": [], "kind": "EndpointSlice", "metadata": {"name": "s"}, "ports": []});
        let type_meta = ("discovery.k8s.io/v1", "EndpointSlice");
        let expected = br#"{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"s"},"addressType":"IPv4","endpoints":[],"ports":[]}"#;
        assert_eq!(typed_json_bytes(&slice, type_meta, true, None), expected);
        assert_eq!(typed_json_bytes(&slice, type_meta, false, None), expected);
        let typed = with_type_meta(&slice, type_meta.0, type_meta.1);
        assert_eq!(serde_json::to_vec(&typed).expect("encodes"), expected);
    }

    #[test]
    fn timestamps_are_whole_seconds_utc() {
        let at: jiff::Timestamp = "2025-01-02T03:04:05.678Z".parse().expect("timestamp");
        assert_eq!(format_timestamp(at), "2025-01-02T03:04:05Z");
    }

    #[test]
    fn type_meta_comes_first() {
        let object = with_type_meta(&json!({"metadata":{"name":"a"}}), "v1", "Service");
        let keys: Vec<&String> = object.as_object().expect("map").keys().collect();
        assert_eq!(keys, ["kind", "apiVersion", "metadata"]);
    }
}
