//! Strict decoding's duplicate-field check: a JSON object that names one key twice decodes
//! (the last value wins), but `fieldValidation` reports it, as upstream's strict JSON decoder
//! (`sigs.k8s.io/json`) does: `duplicate field "metadata.name"`.

use std::fmt::{self, Write};

use serde::Deserializer;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// `duplicate field "<path>"` for every key an object of the JSON document repeats, in the
/// order they appear (paths dotted from the root, list items as `[i]`). A document that does
/// not parse reports nothing here (its parse error is reported elsewhere).
pub fn duplicate_fields(json: &[u8]) -> Vec<String> {
    from_slice_with_duplicates(json)
        .map(|(_, found)| found)
        .unwrap_or_default()
}

/// The document decoded as `serde_json::from_slice` decodes it into a `Value` (a repeated
/// key's last value wins, in the first one's place), with its [`duplicate_fields`]: one pass
/// over the body for both. An object's first key is an ordinary key even when it is the one
/// serde_json's own decoder takes for a raw value's marker.
pub fn from_slice_with_duplicates(json: &[u8]) -> Result<(Value, Vec<String>), serde_json::Error> {
    let (mut found, mut path) = (Vec::new(), String::new());
    let mut decoder = serde_json::Deserializer::from_slice(json);
    let value = Build {
        path: &mut path,
        found: &mut found,
    }
    .deserialize(&mut decoder)?;
    decoder.end()?;
    Ok((value, found))
}

/// Decodes one value of the document, at `path` (one buffer for the whole document: a child's
/// step is pushed onto it and cut off again, so no path is built unless a duplicate is
/// reported).
struct Build<'a> {
    path: &'a mut String,
    found: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for Build<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, decoder: D) -> Result<Value, D::Error> {
        decoder.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Build<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, decoder: D) -> Result<Value, D::Error> {
        self.deserialize(decoder)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let (path, found) = (self.path, self.found);
        let at = path.len();
        let mut values = Vec::with_capacity(items.size_hint().unwrap_or(0).min(4096));
        loop {
            let _ = write!(path, "[{}]", values.len());
            let item = items.next_element_seed(Build {
                path: &mut *path,
                found: &mut *found,
            })?;
            path.truncate(at);
            match item {
                Some(value) => values.push(value),
                None => return Ok(Value::Array(values)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<Value, A::Error> {
        let (path, found) = (self.path, self.found);
        let at = path.len();
        let mut members = Map::new();
        while let Some(key) = fields.next_key::<String>()? {
            if at > 0 {
                path.push('.');
            }
            path.push_str(&key);
            if members.contains_key(&key) {
                found.push(format!("duplicate field {path:?}"));
            }
            let value = fields.next_value_seed(Build {
                path: &mut *path,
                found: &mut *found,
            })?;
            path.truncate(at);
            members.insert(key, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::duplicate_fields;

    #[test]
    fn repeated_keys_are_reported_with_their_paths() {
        let body = br#"{"metadata": {"name": "a", "name": "b"},
            "spec": {"ports": [{"port": 1, "port": 2}], "type": "x"}, "spec": {}}"#;
        assert_eq!(
            duplicate_fields(body),
            [
                "duplicate field \"metadata.name\"",
                "duplicate field \"spec.ports[0].port\"",
                "duplicate field \"spec\"",
            ]
        );
        assert!(duplicate_fields(br#"{"a": [1, {"b": null}], "c": true}"#).is_empty());
        assert!(duplicate_fields(b"{not json").is_empty());
    }

    #[test]
    fn the_document_decodes_as_serde_json_decodes_it() {
        for body in [
            &br#"{"a": {"b": 1, "c": [1, 2.5, -3, 18446744073709551615, 1e300, null, true, "x\u00e9"]}, "a": {"d": {}}, "e": []}"#[..],
            br#"[{"k": 1, "k": 2, "j": 3}]"#,
            br#""text""#,
            br#"  {"b": [[], [[]]], "a": 1.0}  "#,
        ] {
            let (value, _) = super::from_slice_with_duplicates(body).expect("valid JSON");
            let expected: serde_json::Value = serde_json::from_slice(body).expect("valid JSON");
            assert_eq!(value, expected);
            assert_eq!(value.to_string(), expected.to_string());
        }
        for body in [&b"{\"a\": 1} x"[..], b"{\"a\": }", b"", b"[1,]", b"[1e400]"] {
            let ours = super::from_slice_with_duplicates(body).map(|(v, _)| v);
            let theirs = serde_json::from_slice::<serde_json::Value>(body);
            assert_eq!(
                ours.map_err(|e| e.to_string()),
                theirs.map_err(|e| e.to_string())
            );
        }
    }
}
