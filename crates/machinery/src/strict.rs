//! Strict decoding's duplicate-field check: a JSON object that names one key twice decodes
//! (the last value wins), but `fieldValidation` reports it, as upstream's strict JSON decoder
//! (`sigs.k8s.io/json`) does: `duplicate field "metadata.name"`.

use std::collections::HashSet;
use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// `duplicate field "<path>"` for every key an object of the JSON document repeats, in the
/// order they appear (paths dotted from the root, list items as `[i]`). A document that does
/// not parse reports nothing here (its parse error is reported elsewhere).
pub fn duplicate_fields(json: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut decoder = serde_json::Deserializer::from_slice(json);
    let walk = Walk {
        path: String::new(),
        found: &mut found,
    };
    let _ = walk.deserialize(&mut decoder);
    found
}

/// One value of the document, at `path`.
struct Walk<'a> {
    path: String,
    found: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, decoder: D) -> Result<(), D::Error> {
        decoder.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        let found = self.found;
        let mut index = 0;
        loop {
            let item = Walk {
                path: format!("{}[{index}]", self.path),
                found: &mut *found,
            };
            if items.next_element_seed(item)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<(), A::Error> {
        let found = self.found;
        let mut seen = HashSet::new();
        while let Some(key) = fields.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            if !seen.insert(key) {
                found.push(format!("duplicate field {path:?}"));
            }
            fields.next_value_seed(Walk {
                path,
                found: &mut *found,
            })?;
        }
        Ok(())
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
}
