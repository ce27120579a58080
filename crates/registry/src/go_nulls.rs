//! Go's reading of `null`, for the objects serde's strict reading refuses.
//!
//! Go's JSON decoder reads `null` into any field as that field's zero value, and a field a
//! struct lacks stays zero; client-go sends a zero `metav1.Time` as `null` (a condition's
//! `lastTransitionTime` it never set), and kube-apiserver stores and echoes it. The kinds'
//! types cannot all take that: a required `Time` (`Condition.lastTransitionTime`) has no
//! default, and a list's item or a map's value of a plain type refuses `null`. [`GoNulls`]
//! wraps a deserializer and reads as Go does: `null` where a value is required becomes the
//! type's zero value (`""`, `0`, `false`, an empty list or map, an empty struct, Go's zero
//! time), and a struct's missing fields are read as `null` (so a required time is zero, and
//! every other field what it would be when missing). The registry reads with it only when the
//! strict reading fails ([`crate::decode::for_rules`] and the others), so objects without
//! such nulls cost nothing more; [`crate::object::from_typed`] writes a zero time back as
//! `null`, as Go's `metav1.Time` marshals it.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Go's zero `time.Time` as the kinds' time types read it (and write it, before it is
/// written as `null`).
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// A deserializer reading `null` as Go does (see the module's doc).
pub struct GoNulls<D>(pub D);

/// What a requested value is when it comes as `null`.
#[derive(Clone, Copy)]
enum Zero {
    Bool,
    Signed,
    Unsigned,
    Float,
    Text,
    Seq,
    Map,
    Struct(&'static str, &'static [&'static str]),
    Time(&'static str),
}

static NULL: Value = Value::Null;

/// What every visitor here shares with the one it wraps: its value, and what it expects.
macro_rules! wrapping {
    ($wrapped:tt) => {
        type Value = V::Value;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            self.$wrapped.expecting(formatter)
        }
    };
}

macro_rules! zero_when_null {
    ($($method:ident => $zero:expr),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.0.deserialize_option(OrZero { visitor, zero: $zero })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for GoNulls<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_any(Wrap(visitor))
    }

    zero_when_null! {
        deserialize_bool => Zero::Bool,
        deserialize_i8 => Zero::Signed,
        deserialize_i16 => Zero::Signed,
        deserialize_i32 => Zero::Signed,
        deserialize_i64 => Zero::Signed,
        deserialize_u8 => Zero::Unsigned,
        deserialize_u16 => Zero::Unsigned,
        deserialize_u32 => Zero::Unsigned,
        deserialize_u64 => Zero::Unsigned,
        deserialize_f32 => Zero::Float,
        deserialize_f64 => Zero::Float,
        deserialize_str => Zero::Text,
        deserialize_string => Zero::Text,
        deserialize_seq => Zero::Seq,
        deserialize_map => Zero::Map,
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_option(Wrap(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        if matches!(name, "Time" | "MicroTime") {
            let zero = Zero::Time(name);
            return self.0.deserialize_option(OrZero { visitor, zero });
        }
        self.0.deserialize_newtype_struct(name, Wrap(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let zero = Zero::Struct(name, fields);
        self.0.deserialize_option(OrZero { visitor, zero })
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char bytes byte_buf unit unit_struct tuple tuple_struct enum identifier
        ignored_any
    }
}

/// The visitor of a value requested as `zero` is: `null` gives the zero value, anything else
/// is read as requested.
struct OrZero<V> {
    visitor: V,
    zero: Zero,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for OrZero<V> {
    wrapping!(visitor);

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        let visitor = self.visitor;
        match self.zero {
            Zero::Bool => visitor.visit_bool(false),
            Zero::Signed => visitor.visit_i64(0),
            Zero::Unsigned => visitor.visit_u64(0),
            Zero::Float => visitor.visit_f64(0.0),
            Zero::Text => visitor.visit_str(""),
            Zero::Seq => visitor
                .visit_seq(de::value::SeqDeserializer::new(std::iter::empty::<Value>()))
                .map_err(E::custom),
            Zero::Map => visitor
                .visit_map(de::value::MapDeserializer::new(std::iter::empty::<(
                    Value,
                    Value,
                )>()))
                .map_err(E::custom),
            // Every field missing: each as it reads from `null`.
            Zero::Struct(_, fields) => {
                visitor
                    .visit_map(Fields::new(
                        de::value::MapDeserializer::<_, serde_json::Error>::new(
                            std::iter::empty::<(Value, Value)>(),
                        ),
                        Some(fields),
                    ))
                    .map_err(E::custom)
            }
            Zero::Time(_) => {
                visitor.visit_newtype_struct(de::value::StrDeserializer::<E>::new(ZERO_TIME))
            }
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        let visitor = self.visitor;
        match self.zero {
            Zero::Bool => deserializer.deserialize_bool(visitor),
            Zero::Signed => deserializer.deserialize_i64(visitor),
            Zero::Unsigned => deserializer.deserialize_u64(visitor),
            Zero::Float => deserializer.deserialize_f64(visitor),
            Zero::Text => deserializer.deserialize_string(visitor),
            Zero::Seq => deserializer.deserialize_seq(Wrap(visitor)),
            Zero::Map => deserializer.deserialize_map(Wrap(visitor)),
            Zero::Struct(name, fields) => {
                deserializer.deserialize_struct(name, fields, Fielded(visitor, fields))
            }
            Zero::Time(name) => deserializer.deserialize_newtype_struct(name, visitor),
        }
    }
}

/// A visitor whose maps, lists and nested values are read through [`GoNulls`] too.
struct Wrap<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    wrapping!(0);

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        self.0.visit_bool(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        self.0.visit_i64(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        self.0.visit_u64(v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        self.0.visit_f64(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.0.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.0.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.0.visit_string(v)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(GoNulls(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        self.0.visit_newtype_struct(GoNulls(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(Items(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(Fields::new(map, None))
    }
}

/// A struct's visitor: its map's missing fields are read as `null`.
struct Fielded<V>(V, &'static [&'static str]);

impl<'de, V: Visitor<'de>> Visitor<'de> for Fielded<V> {
    wrapping!(0);

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(Fields::new(map, Some(self.1)))
    }
}

/// A list whose items are read through [`GoNulls`].
struct Items<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Items<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

/// A map whose values are read through [`GoNulls`]; for a struct's (`fields`), followed by
/// the fields it lacks, each `null`.
struct Fields<A> {
    inner: A,
    fields: Option<&'static [&'static str]>,
    /// The declared fields met so far (at most `fields`: a body's other keys, however many,
    /// are not kept).
    seen: Vec<&'static str>,
    /// The missing field whose `null` is to be read next.
    missing: Option<&'static str>,
}

impl<A> Fields<A> {
    fn new(inner: A, fields: Option<&'static [&'static str]>) -> Self {
        Fields {
            inner,
            fields,
            seen: Vec::new(),
            missing: None,
        }
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Fields<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(fields) = self.fields else {
            return self.inner.next_key_seed(seed);
        };
        if self.missing.is_none()
            && let Some(key) = self.inner.next_key::<String>()?
        {
            if let Some(field) = fields.iter().find(|field| **field == key)
                && !self.seen.contains(field)
            {
                self.seen.push(field);
            }
            return seed
                .deserialize(de::value::StrDeserializer::<A::Error>::new(&key))
                .map(Some);
        }
        let Some(field) = fields.iter().find(|field| !self.seen.contains(field)) else {
            return Ok(None);
        };
        self.seen.push(field);
        self.missing = Some(field);
        seed.deserialize(de::value::StrDeserializer::<A::Error>::new(field))
            .map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if self.missing.is_some() {
            return seed.deserialize(GoNulls(&NULL)).map_err(de::Error::custom);
        }
        self.inner.next_value_seed(Seed(seed))
    }
}

/// A seed whose value is read through [`GoNulls`].
struct Seed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(GoNulls(deserializer))
    }
}

#[cfg(test)]
mod tests;
