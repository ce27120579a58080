//! The stored object an update read, decoded only as far as the write needs it.
//!
//! Most of an update reads the stored object's metadata; managedFields and the no-change check
//! compare it with the new object member by member, and a member whose stored JSON is what
//! the new object's member encodes to is equal without decoding it. The whole object as JSON
//! is decoded only for what works on it generically (patches, apply, a `/status` update, the
//! answer to a write that changes nothing). A controller's write of a 50-endpoint slice so
//! never builds the stored slice's JSON tree, which used to be a third of its cost.

use std::borrow::Cow;
use std::sync::OnceLock;

use capstan_machinery::{ApiError, meta};
use capstan_storage::KeyValue;
use serde::de::Deserializer;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::decode::{Members, for_rules, from_json_without_managed_fields, holds};
use crate::object::Object;

/// The stored object a write read (see the module's doc).
pub struct Current<'a> {
    kv: &'a KeyValue,
    /// The top-level members but `kind`, `apiVersion` and `metadata`, in stored order.
    members: Vec<(Cow<'a, str>, &'a RawValue)>,
    /// What [`Current::meta`] answers: `{"metadata": …}` (the stored metadata with its
    /// `resourceVersion`), or the whole object when it was read whole.
    meta: Value,
    /// Whether `meta` is the whole object ([`Current::read_whole`]).
    meta_is_whole: bool,
    /// Otherwise, the whole object, decoded the first time it is asked for.
    whole: OnceLock<Value>,
}

impl<'a> Current<'a> {
    /// Reads a stored value's members and decodes its metadata (a 500 when it is not a JSON
    /// object).
    pub(crate) fn read(kv: &'a KeyValue) -> Result<Self, ApiError> {
        let (members, metadata) = Self::members_of(kv)?;
        let mut meta = serde_json::json!({});
        if let Some(raw) = metadata {
            let decoded: Value = serde_json::from_str(raw.get()).map_err(|_| undecodable(kv))?;
            meta::metadata_mut(&mut meta).extend(match decoded {
                Value::Object(map) => map,
                _ => serde_json::Map::new(),
            });
        }
        meta::set_meta_str(&mut meta, "resourceVersion", &kv.mod_revision.to_string());
        Ok(Current {
            kv,
            members,
            meta,
            meta_is_whole: false,
            whole: OnceLock::new(),
        })
    }

    /// [`Current::read`] for a write that reads the whole object anyway (a patch, an apply):
    /// it is decoded at once, and its metadata is the one the write reads (not decoded a
    /// second time on its own).
    pub(crate) fn read_whole(kv: &'a KeyValue) -> Result<Self, ApiError> {
        let (members, _) = Self::members_of(kv)?;
        Ok(Current {
            kv,
            members,
            meta: decode(kv)?,
            meta_is_whole: true,
            whole: OnceLock::new(),
        })
    }

    /// The stored object's top-level members but `kind`, `apiVersion` and `metadata`, and its
    /// `metadata` (a 500 when it is not a JSON object).
    #[allow(clippy::type_complexity)]
    fn members_of(
        kv: &'a KeyValue,
    ) -> Result<(Vec<(Cow<'a, str>, &'a RawValue)>, Option<&'a RawValue>), ApiError> {
        let undecodable = || undecodable(kv);
        let mut json = serde_json::Deserializer::from_slice(&kv.value);
        let all = json.deserialize_map(Members).map_err(|_| undecodable())?;
        json.end().map_err(|_| undecodable())?;
        let mut members: Vec<(Cow<'a, str>, &'a RawValue)> = Vec::with_capacity(all.len());
        let mut metadata = None;
        for (key, raw) in all {
            match key.as_ref() {
                "kind" | "apiVersion" => {}
                "metadata" => metadata = Some(raw),
                // A repeated member counts once, with its last value (as a JSON tree has it).
                _ => match members.iter_mut().find(|(k, _)| *k == key) {
                    Some(member) => member.1 = raw,
                    None => members.push((key, raw)),
                },
            }
        }
        Ok((members, metadata))
    }

    /// An object whose `metadata` member is the stored metadata (with its `resourceVersion`):
    /// all of the stored object most of a write reads. Its other members are not to be read
    /// (they are there when the whole object is).
    pub fn meta(&self) -> &Value {
        &self.meta
    }

    /// The stored object's members but `kind`, `apiVersion` and `metadata`, as stored.
    pub fn members(&self) -> impl Iterator<Item = (&str, &'a RawValue)> + '_ {
        self.members.iter().map(|(key, raw)| (key.as_ref(), *raw))
    }

    /// One member as stored (not `metadata`).
    pub fn member(&self, key: &str) -> Option<&'a RawValue> {
        self.members
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, raw)| *raw)
    }

    /// How many members the stored object has as a JSON tree (`metadata` always among them).
    pub fn member_count(&self) -> usize {
        self.members.len() + 1
    }

    /// The whole stored object as JSON, without `kind` and `apiVersion` and with its
    /// `resourceVersion`, decoded the first time it is asked for.
    pub fn whole(&self) -> Result<&Value, ApiError> {
        if let Some(whole) = self.decoded() {
            return Ok(whole);
        }
        let decoded = decode(self.kv)?;
        Ok(self.whole.get_or_init(|| decoded))
    }

    /// The whole stored object, if something already decoded it.
    pub fn decoded(&self) -> Option<&Value> {
        if self.meta_is_whole {
            Some(&self.meta)
        } else {
            self.whole.get()
        }
    }

    /// [`Current::whole`], owned.
    pub fn into_whole(mut self) -> Result<Value, ApiError> {
        if self.meta_is_whole {
            return Ok(self.meta);
        }
        match self.whole.take() {
            Some(whole) => Ok(whole),
            None => decode(self.kv),
        }
    }

    /// One member as stored (see [`Current::member`]), decoded.
    pub fn decode_member(&self, raw: &RawValue) -> Result<Value, ApiError> {
        serde_json::from_str(raw.get()).map_err(|_| undecodable(self.kv))
    }

    /// The answer when the stored JSON does not decode (a 500 naming its key).
    pub(crate) fn undecodable(&self) -> ApiError {
        undecodable(self.kv)
    }

    /// [`holds`] of one member as stored: a 500 when it does not decode, as when the whole
    /// object did not.
    pub fn holds(&self, raw: &RawValue, value: &Value) -> Result<bool, ApiError> {
        holds(raw, value).map_err(|_| undecodable(self.kv))
    }

    /// The stored object as its kind's type, as a rule sees it (no managedFields): from the
    /// whole object when something decoded it already, otherwise straight from the stored JSON.
    pub fn typed<T: Object>(&self) -> Result<T, String> {
        if let Some(whole) = self.decoded() {
            return for_rules(whole);
        }
        let mut typed: T = from_json_without_managed_fields(&self.kv.value)?;
        typed.metadata_mut().resource_version = Some(self.kv.mod_revision.to_string());
        Ok(typed)
    }
}

/// A stored value as JSON: without `kind` and `apiVersion`, with its `resourceVersion`.
pub(crate) fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    let mut object: Value = serde_json::from_slice(&kv.value).map_err(|_| undecodable(kv))?;
    meta::strip_type_meta(&mut object);
    meta::set_meta_str(&mut object, "resourceVersion", &kv.mod_revision.to_string());
    Ok(object)
}

/// A stored value that does not decode: a 500 naming its key.
fn undecodable(kv: &KeyValue) -> ApiError {
    ApiError::internal(format!("undecodable object at {}", kv.key))
}

/// Whether `value` encodes to exactly the JSON `raw` holds, written as its `schema`'s Go type
/// is (as stored members are: [`capstan_machinery::go_order`]); then they are equal. JSON that
/// differs only in member order or spacing is not, and needs decoding to compare.
pub(crate) fn encodes_to(value: &Value, raw: &RawValue, schema: Option<&'static Value>) -> bool {
    /// The JSON not yet matched; a write that differs fails, which stops the encoder.
    struct Against<'b>(&'b [u8]);
    impl std::io::Write for Against<'_> {
        fn write(&mut self, written: &[u8]) -> std::io::Result<usize> {
            let rest = self.0.strip_prefix(written);
            self.0 = rest.ok_or_else(|| std::io::Error::other("differs"))?;
            Ok(written.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut against = Against(raw.get().as_bytes());
    capstan_machinery::go_order::write(&mut against, value, schema).is_ok() && against.0.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde_json::json;

    fn kv(value: &Value) -> KeyValue {
        KeyValue {
            key: "/registry/things/ns/a".into(),
            value: Bytes::from(serde_json::to_vec(value).expect("encodes")),
            create_revision: 3,
            mod_revision: 7,
            version: 2,
        }
    }

    #[test]
    fn the_parts_are_the_decoded_objects_parts() {
        let stored = json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "a", "labels": {"x": "y"}, "managedFields": [{"manager": "m"}]}, "data": {"b": "c"}, "binaryData": {}});
        let kv = kv(&stored);
        let current = Current::read(&kv).expect("reads");
        let whole = decode(&kv).expect("decodes");
        assert_eq!(current.meta()["metadata"], whole["metadata"]);
        assert_eq!(current.meta()["metadata"]["resourceVersion"], json!("7"));
        let members: Vec<(&str, Value)> = current
            .members()
            .map(|(k, raw)| (k, serde_json::from_str(raw.get()).expect("decodes")))
            .collect();
        assert_eq!(
            members,
            vec![("data", json!({"b": "c"})), ("binaryData", json!({}))]
        );
        assert_eq!(
            current.member_count(),
            whole.as_object().map_or(0, |m| m.len())
        );
        let typed = |current: &Current| {
            current
                .typed::<k8s_openapi::api::core::v1::ConfigMap>()
                .expect("a ConfigMap")
        };
        let read = typed(&current);
        assert_eq!(read.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(read.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        assert_eq!(current.whole().expect("decodes"), &whole);
        assert_eq!(typed(&current), read);
        assert_eq!(current.into_whole().expect("decodes"), whole);
        // Read whole at once: the same parts, the metadata the whole object's.
        let at_once = Current::read_whole(&kv).expect("reads");
        assert_eq!(at_once.decoded(), Some(&whole));
        assert_eq!(at_once.meta()["metadata"], whole["metadata"]);
        assert_eq!(
            at_once.members().map(|(k, _)| k).collect::<Vec<_>>(),
            ["data", "binaryData"]
        );
        assert_eq!(typed(&at_once), read);
    }

    #[test]
    fn a_value_encodes_to_its_own_json_only() {
        let raw = |text: &str| RawValue::from_string(text.to_string()).expect("raw");
        assert!(encodes_to(
            &json!({"a": [1, "x"]}),
            &raw(r#"{"a":[1,"x"]}"#),
            None
        ));
        assert!(!encodes_to(
            &json!({"a": [1, "x"]}),
            &raw(r#"{"a":[1,"x"],"b":1}"#),
            None
        ));
        assert!(!encodes_to(
            &json!({"a": [1, "x", 2]}),
            &raw(r#"{"a":[1,"x"]}"#),
            None
        ));
        assert!(!encodes_to(
            &json!({"a": 1, "b": 2}),
            &raw(r#"{"b":2,"a":1}"#),
            None
        ));
        assert!(!encodes_to(&json!({"a": 1}), &raw(r#"{"a": 1}"#), None));
        assert!(encodes_to(&json!("x\"y"), &raw(r#""x\"y""#), None));
    }

    #[test]
    fn raw_json_holds_the_values_a_decoder_finds_in_it() {
        let cases = [
            r#"{"a":[1,"x",null,true,-2,1.5],"b":{"c":{}}}"#,
            r#"{"b":{"c":{}},"a":[1,"x",null,true,-2,1.5]}"#,
            r#"{"a":[1,"x",null,true,-2,1.5]}"#,
            r#"{"a":[1,"x",null,true,-2,1.5,7],"b":{"c":{}}}"#,
            r#"{"a":[1.0,"x",null,true,-2,1.5],"b":{"c":{}}}"#,
            r#"{"a":[1,"x",null,false,-2,1.5],"b":{"c":{"d":1}}}"#,
            r#"{"a":[1,"x\u0041",null,true,-2,1.5],"b":{"c":{}}}"#,
            r#"[1]"#,
            r#""x""#,
            r#"null"#,
        ];
        for text in cases {
            let raw = RawValue::from_string(text.to_string()).expect("raw");
            for other in cases {
                let value: Value = serde_json::from_str(other).expect("decodes");
                let decoded: Value = serde_json::from_str(text).expect("decodes");
                assert_eq!(
                    holds(&raw, &value).expect("decodes"),
                    decoded == value,
                    "{text} against {other}"
                );
            }
        }
    }

    #[test]
    fn repeated_members_and_undecodable_json_are_not_held() {
        let raw = |text: &str| RawValue::from_string(text.to_string()).expect("raw");
        // A repeated member does not stand in for a missing one.
        assert!(!holds(&raw(r#"{"a":1,"a":1}"#), &json!({"a": 1, "b": 2})).expect("decodes"));
        assert!(!holds(&raw(r#"{"a":1,"a":1}"#), &json!({"a": 1})).expect("decodes"));
        // Objects of more members than a word has bits.
        let wide: serde_json::Map<String, Value> =
            (0..70).map(|i| (format!("k{i}"), json!(i))).collect();
        let text = serde_json::to_string(&wide).expect("encodes");
        assert!(holds(&raw(&text), &Value::Object(wide.clone())).expect("decodes"));
        let mut fewer = wide.clone();
        fewer.remove("k69");
        assert!(!holds(&raw(&text), &Value::Object(fewer)).expect("decodes"));
        let repeated = text.replace(r#""k69":69"#, r#""k0":0"#);
        assert!(!holds(&raw(&repeated), &Value::Object(wide)).expect("decodes"));
        // JSON a decoder refuses is an error, not a difference.
        assert!(holds(&raw(r#"[1e400]"#), &json!([1])).is_err());
        assert!(holds(&raw(r#"["\ud800"]"#), &json!(["x"])).is_err());
    }

    #[test]
    fn what_is_not_an_object_is_refused() {
        for value in [json!([1]), json!("x"), json!(null)] {
            assert!(Current::read(&kv(&value)).is_err());
            assert!(Current::read_whole(&kv(&value)).is_err());
        }
    }
}
