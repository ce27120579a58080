//! A typed write's large atomic lists, kept as the JSON they encode to instead of as JSON trees.
//!
//! A controller writes a 50-endpoint slice or a 50-address Endpoints as a typed object. Made
//! into a `serde_json::Value` for the registry's generic half of the write, its `endpoints`
//! (or `subsets`) alone were a third of the write's allocations, and nothing generic ever
//! looks inside them: the schema makes them atomic, so managedFields, the no-change check and
//! the encode for storage only ask whether they are what is stored, or write them out. So a
//! typed write encodes each such list once, straight from its type, and leaves a `null` in
//! its place in the JSON ([`from_typed_detaching`]); those three compare or copy the encoded
//! text ([`Detached`]), and anything else that must read the JSON puts the lists back first
//! ([`Detached::restore`]).

use capstan_machinery::schema::{Shape, shape};
use serde::Serialize;
use serde::ser::{Impossible, SerializeStruct, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::decode::holds;
use crate::object::Object;

/// The members of an object kept as encoded JSON; each has a `null` in the object's JSON.
#[derive(Default, Debug, Clone)]
pub struct Detached(Vec<(String, Box<RawValue>)>);

impl Detached {
    /// Whether no member is detached.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A detached member's JSON.
    pub fn get(&self, key: &str) -> Option<&RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, raw)| &**raw)
    }

    /// Puts the members back into `object` as JSON trees: it is whole again.
    pub fn restore(&mut self, object: &mut Value) {
        for (key, raw) in self.0.drain(..) {
            // It was encoded from a typed value: it decodes.
            let value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
            if let Some(slot) = object.get_mut(key.as_str()) {
                *slot = value;
            }
        }
    }

    /// Forgets the members: `object`'s JSON holds them itself now (written back whole).
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Removes the members' places from `object` (what a typed write returns: its caller has
    /// the members, as it wrote them).
    pub fn strip(&self, object: &mut Value) {
        if let Some(map) = object.as_object_mut() {
            for (key, _) in &self.0 {
                map.shift_remove(key.as_str());
            }
        }
    }

    /// Whether a member is what `stored` holds: the same text, else the same JSON (read side
    /// by side as far as that tells, as trees only when it cannot).
    pub fn same(raw: &RawValue, stored: &RawValue) -> Result<bool, serde_json::Error> {
        if raw.get() == stored.get() {
            return Ok(true);
        }
        if let Some(same) = same_text(raw.get(), stored.get()) {
            return Ok(same);
        }
        let value: Value = serde_json::from_str(raw.get())?;
        holds(stored, &value)
    }
}

/// One token of JSON text.
#[derive(Clone, Copy, PartialEq)]
enum Token<'a> {
    /// `{` `}` `[` `]` `:` `,`
    Mark(u8),
    /// A string, number or literal as written.
    Scalar(&'a str),
    End,
}

/// The JSON tokens of a text (whitespace skipped); `None` for what is not JSON.
struct Tokens<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Tokens<'a> {
    fn next(&mut self) -> Option<Token<'a>> {
        let bytes = self.text.as_bytes();
        while bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
        let start = self.at;
        let Some(&first) = bytes.get(start) else {
            return Some(Token::End);
        };
        self.at += 1;
        match first {
            b'{' | b'}' | b'[' | b']' | b':' | b',' => return Some(Token::Mark(first)),
            b'"' => loop {
                match bytes.get(self.at)? {
                    b'\\' => self.at += 2,
                    b'"' => {
                        self.at += 1;
                        break;
                    }
                    _ => self.at += 1,
                }
            },
            _ => {
                while bytes
                    .get(self.at)
                    .is_some_and(|b| !b"{}[]:,\"".contains(b) && !b.is_ascii_whitespace())
                {
                    self.at += 1;
                }
            }
        }
        self.text.get(start..self.at).map(Token::Scalar)
    }
}

/// Whether two JSON texts hold the same JSON, read side by side: `Some` when that tells (the
/// texts agree but for how a string or number is spelled, or they part at a value of the same
/// member or element), `None` when only trees can (they part at a member's name: members in
/// another order, say; or at the end of an object).
fn same_text(a: &str, b: &str) -> Option<bool> {
    let (mut a, mut b) = (Tokens { text: a, at: 0 }, Tokens { text: b, at: 0 });
    // The open containers (`{` or `[`), and whether the next string is a member's name.
    let mut open: Vec<u8> = Vec::new();
    let mut name_next = false;
    loop {
        let (x, y) = (a.next()?, b.next()?);
        if x != y {
            return match (x, y) {
                _ if name_next => None,
                (Token::Scalar(x), Token::Scalar(y)) => match same_scalar(x, y) {
                    Some(true) => {
                        name_next = false;
                        continue;
                    }
                    other => other,
                },
                // An object ending on one side only: another member, or a repeated one. (And
                // what is not JSON, where a `:` or more belongs: the trees tell.)
                (Token::Mark(b'}' | b','), Token::Mark(b'}' | b','))
                | (Token::Mark(b':') | Token::End, _)
                | (_, Token::Mark(b':') | Token::End) => None,
                // Anything else at a value: a value of another kind, or a list of another
                // length.
                _ => Some(false),
            };
        }
        match x {
            Token::End => return open.is_empty().then_some(true),
            Token::Mark(mark @ (b'{' | b'[')) => {
                open.push(mark);
                name_next = mark == b'{';
            }
            Token::Mark(b'}' | b']') => {
                open.pop();
                name_next = false;
            }
            Token::Mark(b',') => name_next = open.last() == Some(&b'{'),
            _ => name_next = false,
        }
    }
}

/// Whether two scalars spelled differently are the same value (`None`: not JSON).
fn same_scalar(x: &str, y: &str) -> Option<bool> {
    let (x, y): (Value, Value) = (serde_json::from_str(x).ok()?, serde_json::from_str(y).ok()?);
    Some(x == y)
}

/// Detaches `object`'s non-empty lists that `detach` names as [`from_typed_detaching`] would
/// (for tests that start from JSON).
#[cfg(test)]
pub(crate) fn detach(object: &mut Value, detach: &dyn Fn(&str) -> bool) -> Detached {
    let mut detached = Detached::default();
    if let Some(map) = object.as_object_mut() {
        for (key, value) in map.iter_mut() {
            let text = value.to_string();
            if detach(key)
                && detachable(&text)
                && let Ok(raw) = RawValue::from_string(text)
            {
                detached.0.push((key.clone(), raw));
                *value = Value::Null;
            }
        }
    }
    detached
}

/// Whether `key` names a top-level member the kind's schema makes atomic.
pub fn atomic_member(schema: Option<&'static Value>, key: &str) -> bool {
    match schema.map(shape) {
        Some(Shape::Struct(properties)) => properties
            .get(key)
            .is_some_and(|schema| matches!(shape(schema), Shape::Atomic)),
        _ => false,
    }
}

/// [`crate::typed::from_typed`], with the non-empty lists of `schema` (the kind's) that
/// `detach` names kept as their encoded JSON, written as kube-apiserver writes them
/// ([`capstan_machinery::go_order`]). A list whose JSON holds an empty list anywhere is made
/// a tree as usual, since `from_typed` drops empty lists and the text would then not be what
/// the tree encodes to.
pub fn from_typed_detaching<T: Object>(
    object: &T,
    schema: Option<&'static Value>,
    detach: &dyn Fn(&str) -> bool,
) -> (Value, Detached) {
    let mut detached = Detached::default();
    let Ok(mut value) = object.serialize(Top {
        schema,
        detach,
        detached: &mut detached,
    }) else {
        return (crate::object::from_typed(object), Detached::default());
    };
    capstan_machinery::meta::strip_type_meta(&mut value);
    crate::object::drop_empty_lists(&mut value);
    (value, detached)
}

/// Whether a member's JSON is kept as text: a list, and without an empty list anywhere (which
/// `from_typed` drops, so the text would not be what the tree encodes to).
fn detachable(text: &str) -> bool {
    text.starts_with('[') && text != "[]" && !text.contains("[]")
}

/// Serializes a struct's fields into a JSON map, those `detach` names as encoded text.
struct Top<'a> {
    schema: Option<&'static Value>,
    detach: &'a dyn Fn(&str) -> bool,
    detached: &'a mut Detached,
}

struct Fields<'a> {
    top: Top<'a>,
    map: serde_json::Map<String, Value>,
}

impl SerializeStruct for Fields<'_> {
    type Ok = Value;
    type Error = serde_json::Error;

    fn serialize_field<V: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &V,
    ) -> Result<(), Self::Error> {
        if (self.top.detach)(key) {
            let member = self
                .top
                .schema
                .and_then(|schema| capstan_machinery::schema::property(schema, key));
            let text = String::from_utf8(capstan_machinery::go_order::typed_to_vec(value, member)?)
                .map_err(serde::ser::Error::custom)?;
            if detachable(&text) {
                self.top
                    .detached
                    .0
                    .push((key.to_string(), RawValue::from_string(text)?));
                self.map.insert(key.to_string(), Value::Null);
                return Ok(());
            }
        }
        self.map
            .insert(key.to_string(), serde_json::to_value(value)?);
        Ok(())
    }

    fn end(self) -> Result<Value, Self::Error> {
        Ok(Value::Object(self.map))
    }
}

/// Only a struct is taken apart; anything else is refused (and made a tree whole).
fn refused() -> serde_json::Error {
    serde::ser::Error::custom("not a struct")
}

/// Serializer methods of one argument that refuse it.
macro_rules! refuse {
    ($($method:ident($type:ty) $(-> $out:ty)?),* $(,)?) => {
        $(fn $method(self, _: $type) -> Result<refuse!(@out $($out)?), Self::Error> {
            Err(refused())
        })*
    };
    (@out) => { Value };
    (@out $out:ty) => { $out };
}

impl<'a> Serializer for Top<'a> {
    type Ok = Value;
    type Error = serde_json::Error;
    type SerializeSeq = Impossible<Value, serde_json::Error>;
    type SerializeTuple = Impossible<Value, serde_json::Error>;
    type SerializeTupleStruct = Impossible<Value, serde_json::Error>;
    type SerializeTupleVariant = Impossible<Value, serde_json::Error>;
    type SerializeMap = Impossible<Value, serde_json::Error>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = Impossible<Value, serde_json::Error>;

    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Fields<'a>, Self::Error> {
        Ok(Fields {
            top: self,
            map: serde_json::Map::with_capacity(len),
        })
    }

    capstan_machinery::refuse_tuples_and_variants!(refused());

    capstan_machinery::with_scalar_methods!(refuse);
    refuse!(
        serialize_unit_struct(&'static str),
        serialize_seq(Option<usize>) -> Self::SerializeSeq,
        serialize_map(Option<usize>) -> Self::SerializeMap,
    );

    fn serialize_none(self) -> Result<Value, Self::Error> {
        Err(refused())
    }
    fn serialize_some<V: Serialize + ?Sized>(self, _: &V) -> Result<Value, Self::Error> {
        Err(refused())
    }
    fn serialize_unit(self) -> Result<Value, Self::Error> {
        Err(refused())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<Value, Self::Error> {
        Err(refused())
    }
    fn serialize_newtype_struct<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &V,
    ) -> Result<Value, Self::Error> {
        Err(refused())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::same_text;

    /// A typed value written in Go's order straight from its type is the JSON its `Value`
    /// written in that order is (what a detached list is compared with, and stored as).
    #[test]
    fn typed_values_are_written_as_their_trees_are() {
        use capstan_machinery::go_order;
        let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "s", "labels": {"b": "1", "a": "2"},
                "managedFields": [{"manager": "m", "fieldsV1": {"f:z": {}, "k:{\"x\":1}": {}, "i:0": {}, "f:a": {}}}]},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                "targetRef": {"kind": "Pod", "name": "p", "namespace": "n", "uid": "u"},
                "nodeName": "n1", "zone": "z", "hints": {"forZones": [{"name": "z"}]},
                "deprecatedTopology": {"z": "1", "a": "2"}}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]
        }))
        .expect("a slice");
        let definition = capstan_machinery::testdata::endpoint_slice();
        let typed = go_order::typed_to_vec(&slice, definition).expect("writes");
        let tree = go_order::to_vec(&serde_json::to_value(&slice).expect("a tree"), definition);
        assert_eq!(
            String::from_utf8_lossy(&typed),
            String::from_utf8_lossy(&tree)
        );
        let text = String::from_utf8_lossy(&typed);
        assert!(text.contains(r#""conditions":{"ready":true,"serving":true,"terminating":false},"targetRef":{"kind":"Pod","namespace":"n","name":"p","uid":"u"},"deprecatedTopology":{"a":"2","z":"1"},"nodeName":"n1","zone":"z","hints""#), "{text}");
        // FieldsV1 as it was given.
        assert!(
            text.contains(r#""f:z":{},"k:{\"x\":1}":{},"i:0":{},"f:a":{}"#),
            "{text}"
        );
    }

    #[test]
    fn texts_read_side_by_side() {
        let cases = [
            (
                r#"[{"a":1,"b":true}]"#,
                r#"[{"a":1,"b":false}]"#,
                Some(false),
            ),
            (r#"[{"a":"x\u0041"}]"#, r#"[ {"a" : "xA"} ]"#, Some(true)),
            (r#"[{"a":1.0}]"#, r#"[{"a":1.00}]"#, Some(true)),
            (r#"[1,2]"#, r#"[1,2,3]"#, Some(false)),
            (r#"[{"a":1,"b":2}]"#, r#"[{"b":2,"a":1}]"#, None),
            (r#"[{"a":1}]"#, r#"[{"a":1,"b":2}]"#, None),
            (r#"[{"a":{}}]"#, r#"[{"a":[]}]"#, Some(false)),
            (r#"["a"]"#, r#"["a"#, None),
            (r#"[1]"#, r#"[1"#, None),
        ];
        for (a, b, want) in cases {
            assert_eq!(same_text(a, b), want, "{a} {b}");
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (0u8..3).prop_map(Value::from),
            r#"[ab\\"é]{0,2}"#.prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::vec(("[abc]", inner), 0..3)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever the side-by-side reading decides is what the trees say.
        #[test]
        fn side_by_side_agrees_with_the_trees(a in json(), b in json(), spaced in any::<bool>(), same in any::<bool>()) {
            let b = if same { a.clone() } else { b };
            let text_a = serde_json::to_string(&json!([a])).expect("encodes");
            let text_b = if spaced {
                serde_json::to_string_pretty(&json!([b])).expect("encodes")
            } else {
                serde_json::to_string(&json!([b])).expect("encodes")
            };
            if let Some(verdict) = same_text(&text_a, &text_b) {
                prop_assert_eq!(verdict, a == b, "{} {}", text_a, text_b);
            }
            if same {
                prop_assert_eq!(same_text(&text_a, &text_b), Some(true));
            }
        }
    }
}
