//! Reading stored JSON without building what a reader does not need: a kind's object without
//! `metadata.managedFields` ([`for_rules`], [`from_json_without_managed_fields`]), and whether
//! raw JSON holds a value ([`holds`]) without decoding it.

use serde::Deserializer;
use std::borrow::Cow;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::go_nulls::GoNulls;
use crate::object::Object;

/// The object as a rule sees it: everything but `metadata.managedFields`.
pub fn for_rules<T: Object>(object: &Value) -> Result<T, String> {
    T::deserialize(Skipping {
        inner: object,
        level: Level::Object,
    })
    .or_else(|strict| {
        // Go's reading of `null` and of missing fields, only when the strict one fails.
        T::deserialize(Skipping {
            inner: GoNulls(object),
            level: Level::Object,
        })
        .map_err(|_| strict)
    })
    .map_err(|e| e.to_string())
}

/// Decodes stored JSON into a kind's object without `metadata.managedFields` (skipped, not
/// decoded: they are often half of an object, and a reader that is not the registry never
/// needs them).
pub fn from_json_without_managed_fields<T: serde::de::DeserializeOwned>(
    json: &[u8],
) -> Result<T, String> {
    let read = |go: bool| {
        let mut deserializer = serde_json::Deserializer::from_slice(json);
        let object = match go {
            false => T::deserialize(Skipping {
                inner: &mut deserializer,
                level: Level::Object,
            }),
            true => T::deserialize(Skipping {
                inner: GoNulls(&mut deserializer),
                level: Level::Object,
            }),
        }?;
        deserializer.end().map(|()| object)
    };
    // Go's reading of `null` and of missing fields, only when the strict one fails.
    read(false)
        .or_else(|strict| read(true).map_err(|_| strict))
        .map_err(|e| e.to_string())
}

/// A deserializer that hides `metadata.managedFields` from what it decodes, wrapping another
/// (serde_json's over bytes, or over a `&Value`) at the object and metadata levels only.
pub(crate) struct Skipping<D> {
    pub(crate) inner: D,
    pub(crate) level: Level,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skipping<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.inner.deserialize_map(SkippingVisitor {
            inner: visitor,
            level: self.level,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.inner.deserialize_option(SkippingVisitor {
            inner: visitor,
            level: self.level,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct enum identifier ignored_any
    }
}

/// Hands the wrapped visitor a map without `managedFields` (in metadata), or, for an
/// optional object or metadata, `null` or a [`Skipping`] over it.
struct SkippingVisitor<V> {
    inner: V,
    level: Level,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for SkippingVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.inner.expecting(formatter)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_map(SkippingMap {
            inner: map,
            level: self.level,
            metadata_next: false,
        })
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_some(Skipping {
            inner: deserializer,
            level: self.level,
        })
    }
}

struct SkippingMap<A> {
    inner: A,
    level: Level,
    /// Whether the value to come is the object's `metadata`.
    metadata_next: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkippingMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        while let Some(Key(key)) = self.inner.next_key::<Key<'de>>()? {
            if self.level == Level::Metadata && key == "managedFields" {
                self.inner.next_value::<de::IgnoredAny>()?;
                continue;
            }
            self.metadata_next = self.level == Level::Object && key == "metadata";
            return seed
                .deserialize(de::value::CowStrDeserializer::<A::Error>::new(key))
                .map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        if std::mem::take(&mut self.metadata_next) {
            self.inner.next_value_seed(MetadataSeed(seed))
        } else {
            self.inner.next_value_seed(seed)
        }
    }
}

/// A field name, borrowed from the input when it can be (serde's own `Cow` always copies).
pub(crate) struct Key<'de>(pub(crate) std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a field name")
            }

            fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(key.into()))
            }

            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(key.to_owned().into()))
            }

            fn visit_string<E: de::Error>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(key.into()))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The object's `metadata`, decoded through a [`Skipping`] at the metadata level.
struct MetadataSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for MetadataSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Skipping {
            inner: deserializer,
            level: Level::Metadata,
        })
    }
}

/// Where in the object a [`Skipping`] stands.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Level {
    Object,
    Metadata,
}

/// Whether the JSON `raw` holds is `value` (as decoding it would find, whatever the order of
/// its members), compared as it is read: nothing is built, and reading stops at the first
/// difference. [`encodes_to`] first is cheaper when they are usually the same JSON. An error
/// when `raw` does not decode (as decoding it would refuse it).
pub(crate) fn holds(raw: &RawValue, value: &Value) -> Result<bool, serde_json::Error> {
    let mut json = serde_json::Deserializer::from_str(raw.get());
    match Equal(value).deserialize(&mut json) {
        Ok(()) => json.end().map(|()| true),
        // The first difference (`Equal`'s own error), not a fault of the JSON.
        Err(error) if error.is_data() => Ok(false),
        Err(error) => Err(error),
    }
}

/// Reads a JSON value, failing at the first difference from the value it holds.
struct Equal<'v>(&'v Value);

impl<'de> DeserializeSeed<'de> for Equal<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Equal<'_> {
    fn check<E: serde::de::Error>(same: bool) -> Result<(), E> {
        if same {
            Ok(())
        } else {
            Err(E::custom("differs"))
        }
    }
}

impl<'de> Visitor<'de> for Equal<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Self::check(self.0.is_null())
    }

    fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<(), E> {
        Self::check(self.0.as_bool() == Some(value))
    }

    // Numbers as a JSON tree holds them: non-negative integers, negative ones, and floats
    // are told apart.
    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<(), E> {
        Self::check(*self.0 == Value::Number(value.into()))
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<(), E> {
        Self::check(*self.0 == Value::Number(value.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<(), E> {
        Self::check(
            serde_json::Number::from_f64(value).is_some_and(|n| *self.0 == Value::Number(n)),
        )
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<(), E> {
        Self::check(self.0.as_str() == Some(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Value::Array(items) = self.0 else {
            return Self::check(false);
        };
        let mut items = items.iter();
        loop {
            match items.next() {
                Some(item) => {
                    if seq.next_element_seed(Equal(item))?.is_none() {
                        return Self::check(false);
                    }
                }
                None => return Self::check(seq.next_element::<IgnoredAny>()?.is_none()),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Value::Object(members) = self.0 else {
            return Self::check(false);
        };
        // Which of `members` were read: a repeated member is not read twice (a JSON tree
        // keeps its last value; such JSON counts as different, which costs a write at worst).
        let mut seen = Seen::of(members.len());
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let Some((at, value)) = members
                .iter()
                .enumerate()
                .find_map(|(at, (k, v))| (*k == key).then_some((at, v)))
            else {
                return Self::check(false);
            };
            if seen.again(at) {
                return Self::check(false);
            }
            map.next_value_seed(Equal(value))?;
        }
        Self::check(seen.all())
    }
}

/// Which members of an object were read: bits for up to 64 (every object of these kinds),
/// without allocating.
enum Seen {
    Bits(u64, usize),
    Flags(Vec<bool>),
}

impl Seen {
    fn of(len: usize) -> Self {
        if len <= 64 {
            Seen::Bits(0, len)
        } else {
            Seen::Flags(vec![false; len])
        }
    }

    /// Marks member `at` read; whether it was already.
    fn again(&mut self, at: usize) -> bool {
        match self {
            Seen::Bits(bits, _) => {
                let before = *bits & (1 << at) != 0;
                *bits |= 1 << at;
                before
            }
            Seen::Flags(flags) => std::mem::replace(&mut flags[at], true),
        }
    }

    fn all(&self) -> bool {
        match self {
            Seen::Bits(bits, len) => bits.count_ones() as usize == *len,
            Seen::Flags(flags) => flags.iter().all(|read| *read),
        }
    }
}

/// A JSON object's members, borrowed.
pub(crate) struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some((Key(key), raw)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
            members.push((key, raw));
        }
        Ok(members)
    }
}
