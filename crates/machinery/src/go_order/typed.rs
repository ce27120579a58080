//! [`super::write`] straight from a typed value: the JSON a value of a `k8s-openapi` type
//! encodes to, each struct's fields in the order its Go type declares them, without building a
//! `serde_json::Value` first (a controller's 50-endpoint list is most of its write).
//!
//! Each struct's fields are written to a buffer of their own as the type hands them over
//! (alphabetically), then copied out in Go's order; scalars are written by `serde_json`.

use serde::ser::{self, Serialize};
use serde_json::Value;

use super::{Members, Node, node};

type Error = serde_json::Error;

/// The JSON `value` encodes to, as [`super::write`] writes its `Value` with `schema`.
pub fn to_vec<T: Serialize + ?Sized>(
    value: &T,
    schema: Option<&'static Value>,
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(256);
    value.serialize(Ordered {
        out: &mut out,
        schema,
    })?;
    Ok(out)
}

/// Writes one value, as the node `schema` describes says.
struct Ordered<'a> {
    out: &'a mut Vec<u8>,
    schema: Option<&'static Value>,
}

impl Ordered<'_> {
    fn scalar<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        crate::json::to_writer(self.out, value)
    }

    fn node(&self) -> Option<Node> {
        self.schema.map(node)
    }
}

/// The `serde::Serializer` methods for what no Kubernetes type holds (tuples, enum variants with
/// data), each refusing with `$error`; the serializer's associated types for them are
/// `serde::ser::Impossible`.
#[macro_export]
macro_rules! refuse_tuples_and_variants {
    ($error:expr) => {
        fn serialize_newtype_variant<T: ::serde::Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<Self::Ok, Self::Error> {
            Err($error)
        }
        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Self::Error> {
            Err($error)
        }
        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, Self::Error> {
            Err($error)
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, Self::Error> {
            Err($error)
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, Self::Error> {
            Err($error)
        }
    };
}

/// Calls `$callback!` with the `serde::Serializer` methods of one scalar argument, as
/// `method(type)`: for a serializer that treats them all alike.
#[macro_export]
macro_rules! with_scalar_methods {
    ($callback:ident) => {
        $callback!(
            serialize_bool(bool),
            serialize_i8(i8),
            serialize_i16(i16),
            serialize_i32(i32),
            serialize_i64(i64),
            serialize_u8(u8),
            serialize_u16(u16),
            serialize_u32(u32),
            serialize_u64(u64),
            serialize_f32(f32),
            serialize_f64(f64),
            serialize_char(char),
            serialize_str(&str),
            serialize_bytes(&[u8]),
        );
    };
}

macro_rules! scalars {
    ($($method:ident($type:ty)),* $(,)?) => {
        $(fn $method(self, value: $type) -> Result<(), Error> {
            self.scalar(&value)
        })*
    };
}

impl<'a> ser::Serializer for Ordered<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = ser::Impossible<(), Error>;
    type SerializeTupleStruct = ser::Impossible<(), Error>;
    type SerializeTupleVariant = ser::Impossible<(), Error>;
    type SerializeMap = MapWriter<'a>;
    type SerializeStruct = Struct<'a>;
    type SerializeStructVariant = ser::Impossible<(), Error>;

    crate::refuse_tuples_and_variants!(unwritten());

    crate::with_scalar_methods!(scalars);

    fn serialize_none(self) -> Result<(), Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.serialize_none()
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        self.serialize_none()
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        name: &'static str,
    ) -> Result<(), Error> {
        self.scalar(name)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Seq<'a>, Error> {
        let items = match self.node() {
            Some(Node::List(items)) => items,
            _ => None,
        };
        self.out.push(b'[');
        Ok(Seq {
            out: self.out,
            items,
            first: true,
        })
    }

    fn serialize_map(self, _: Option<usize>) -> Result<MapWriter<'a>, Error> {
        // A map of values is written sorted; anything else (FieldsV1, raw JSON) as it comes.
        let values = match self.node() {
            Some(Node::Map(values)) => Some(values),
            _ => None,
        };
        Ok(MapWriter {
            out: self.out,
            values,
            entries: Vec::new(),
            scratch: Vec::new(),
        })
    }

    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Struct<'a>, Error> {
        let members = match self.node() {
            Some(Node::Struct(members)) => members,
            _ => None,
        };
        Ok(Struct {
            out: self.out,
            members: members.unwrap_or(&[]),
            fields: Vec::with_capacity(len),
            scratch: Vec::with_capacity(32 * len),
        })
    }
}

/// What no Kubernetes type holds (tuples, enum variants with data): not written here (the
/// caller writes the value another way).
fn unwritten() -> Error {
    ser::Error::custom("a tuple or an enum variant with data: not written in Go's order")
}

/// A list: each item as the list's item schema says.
struct Seq<'a> {
    out: &'a mut Vec<u8>,
    items: Option<&'static Value>,
    first: bool,
}

impl Seq<'_> {
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        value.serialize(Ordered {
            out: self.out,
            schema: self.items,
        })
    }

    fn close(self) -> Result<(), Error> {
        self.out.push(b']');
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.item(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// A struct: its fields written aside as they come, then out in Go's order (those the order
/// does not name after the others, as they came).
struct Struct<'a> {
    out: &'a mut Vec<u8>,
    members: Members,
    /// Each field: its place in `members`, its name, where its value is in `scratch`.
    fields: Vec<(usize, &'static str, std::ops::Range<usize>)>,
    scratch: Vec<u8>,
}

impl ser::SerializeStruct for Struct<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        let rank = self
            .members
            .iter()
            .position(|(name, _)| *name == key)
            .unwrap_or(usize::MAX);
        let start = self.scratch.len();
        value.serialize(Ordered {
            out: &mut self.scratch,
            schema: self.members.get(rank).map(|(_, schema)| *schema),
        })?;
        self.fields.push((rank, key, start..self.scratch.len()));
        Ok(())
    }

    fn end(mut self) -> Result<(), Error> {
        if !self.fields.is_sorted_by_key(|field| field.0) {
            self.fields.sort_by_key(|field| field.0);
        }
        self.out.push(b'{');
        for (i, (_, key, value)) in self.fields.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            // A type's field names are plain identifiers: nothing to escape.
            self.out.push(b'"');
            self.out.extend_from_slice(key.as_bytes());
            self.out.extend_from_slice(b"\":");
            self.out.extend_from_slice(&self.scratch[value.clone()]);
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// A map: its entries in key order (Go sorts a map's keys), each value as the map's value
/// schema says.
struct MapWriter<'a> {
    out: &'a mut Vec<u8>,
    values: Option<&'static Value>,
    /// Each entry: where its key and its value are in `scratch`.
    entries: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
    scratch: Vec<u8>,
}

impl ser::SerializeMap for MapWriter<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        let start = self.scratch.len();
        crate::json::to_writer(&mut self.scratch, key)?;
        self.entries.push((start..self.scratch.len(), 0..0));
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let start = self.scratch.len();
        value.serialize(Ordered {
            out: &mut self.scratch,
            schema: self.values,
        })?;
        let end = self.scratch.len();
        match self.entries.last_mut() {
            Some(entry) => entry.1 = start..end,
            None => return Err(ser::Error::custom("a map value without its key")),
        }
        Ok(())
    }

    fn end(mut self) -> Result<(), Error> {
        let scratch = &self.scratch;
        let sorted = self.values.is_some();
        // Keys compared as written: JSON strings of map keys (names, labels) sort as their
        // text does, but for escapes, which are compared decoded to be sure.
        let key = |range: &std::ops::Range<usize>| -> String {
            serde_json::from_slice(&scratch[range.clone()]).unwrap_or_default()
        };
        if sorted
            && (!self
                .entries
                .is_sorted_by(|a, b| scratch[a.0.clone()] <= scratch[b.0.clone()])
                || scratch.contains(&b'\\'))
        {
            self.entries.sort_by_cached_key(|entry| key(&entry.0));
        }
        self.out.push(b'{');
        for (i, (key, value)) in self.entries.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out.extend_from_slice(&scratch[key.clone()]);
            self.out.push(b':');
            self.out.extend_from_slice(&scratch[value.clone()]);
        }
        self.out.push(b'}');
        Ok(())
    }
}
