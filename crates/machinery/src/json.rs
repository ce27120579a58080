//! JSON text as Go's `encoding/json` writes it, which is what kube-apiserver answers with:
//! `serde_json`'s output but for the escapes. Go escapes `<`, `>` and `&` (`\u003c`,
//! `\u003e`, `\u0026`: its encoder's default `SetEscapeHTML(true)`, which the apiserver's
//! serializers keep) and the line and paragraph separators U+2028 and U+2029 (always); the
//! control characters it escapes as `serde_json` does (`\b`, `\f`, `\n`, `\r`, `\t`, else
//! `\u00xx`, lowercase). So a Table's `<none>` cell goes out as `"\u003cnone\u003e"`.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

/// A `serde_json` formatter (compact or indented) writing Go's escapes.
pub struct GoEscapes<F>(F);

/// `serde_json`'s compact formatter with Go's escapes.
pub fn compact() -> GoEscapes<CompactFormatter> {
    GoEscapes(CompactFormatter)
}

/// `serde_json`'s indented formatter (two spaces, as `json.MarshalIndent(v, "", "  ")`) with
/// Go's escapes.
pub fn indented() -> GoEscapes<PrettyFormatter<'static>> {
    GoEscapes(PrettyFormatter::with_indent(b"  "))
}

/// `Formatter` methods that the wrapped formatter answers.
macro_rules! delegate {
    ($($method:ident($($arg:ident: $type:ty)?)),* $(,)?) => {
        $(fn $method<W: ?Sized + Write>(&mut self, writer: &mut W $(, $arg: $type)?) -> io::Result<()> {
            self.0.$method(writer $(, $arg)?)
        })*
    };
}

impl<F: Formatter> Formatter for GoEscapes<F> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        write_fragment(writer, fragment)
    }
    delegate!(
        begin_array(),
        end_array(),
        begin_array_value(first: bool),
        end_array_value(),
        begin_object(),
        end_object(),
        begin_object_key(first: bool),
        begin_object_value(),
        end_object_value(),
    );
}

/// The bytes that may start what Go escapes and `serde_json` does not: `<`, `>`, `&`, and
/// the first byte of U+2028 and U+2029.
static GO_ONLY: [bool; 256] = {
    let mut table = [false; 256];
    table[b'<' as usize] = true;
    table[b'>' as usize] = true;
    table[b'&' as usize] = true;
    table[0xE2] = true;
    table
};

/// Writes a run of a string that `serde_json` leaves unescaped, escaping what Go escapes
/// besides.
fn write_fragment<W: ?Sized + Write>(writer: &mut W, fragment: &str) -> io::Result<()> {
    let bytes = fragment.as_bytes();
    let (mut start, mut at) = (0, 0);
    loop {
        // One table look-up a byte: most strings hold none of these.
        while at < bytes.len() && !GO_ONLY[bytes[at] as usize] {
            at += 1;
        }
        let Some(&byte) = bytes.get(at) else {
            break;
        };
        let (escape, length): (&[u8], usize) = match (byte, bytes.get(at + 1..at + 3)) {
            (b'<', _) => (b"\\u003c", 1),
            (b'>', _) => (b"\\u003e", 1),
            (b'&', _) => (b"\\u0026", 1),
            // U+2028 and U+2029 are E2 80 A8 and E2 80 A9.
            (_, Some([0x80, 0xA8])) => (b"\\u2028", 3),
            (_, Some([0x80, 0xA9])) => (b"\\u2029", 3),
            _ => {
                at += 1;
                continue;
            }
        };
        writer.write_all(&bytes[start..at])?;
        writer.write_all(escape)?;
        at += length;
        start = at;
    }
    writer.write_all(&bytes[start..])
}

/// Writes `value` as compact JSON with Go's escapes.
pub fn to_writer<W: Write, T: Serialize + ?Sized>(writer: W, value: &T) -> serde_json::Result<()> {
    value.serialize(&mut serde_json::Serializer::with_formatter(
        writer,
        compact(),
    ))
}

/// `value` as compact JSON with Go's escapes (empty if it does not serialize: no map with
/// non-string keys or failing `Serialize` impl is written here).
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    if to_writer(&mut out, value).is_err() {
        out.clear();
    }
    out
}

/// `value` as indented JSON (`json.MarshalIndent(v, "", "  ")`) with Go's escapes.
pub fn to_vec_pretty<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, indented());
    if value.serialize(&mut serializer).is_err() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn escapes_as_go_does() {
        let value = json!({"a<b": "<none> & <pending>", "s": "x\u{2028}y\u{2029}z\u{2027}é\n\t\u{1}\u{8}\u{c}\u{7f}\"\\"});
        assert_eq!(
            String::from_utf8(to_vec(&value)).expect("UTF-8"),
            "{\"a\\u003cb\":\"\\u003cnone\\u003e \\u0026 \\u003cpending\\u003e\",\"s\":\"x\\u2028y\\u2029z\u{2027}é\\n\\t\\u0001\\b\\f\u{7f}\\\"\\\\\"}"
        );
        assert_eq!(
            String::from_utf8(to_vec_pretty(&json!({"a": ["<"], "b": {}, "c": []})))
                .expect("UTF-8"),
            "{\n  \"a\": [\n    \"\\u003c\"\n  ],\n  \"b\": {},\n  \"c\": []\n}"
        );
    }

    proptest! {
        /// Whatever the string, the text is JSON that reads back as the same value, and holds
        /// none of the characters Go escapes.
        #[test]
        fn reads_back_and_leaves_nothing_go_escapes(text in any::<String>(), key in "\\PC{0,8}") {
            let value = json!({key: [text, {"k": 1}]});
            for bytes in [to_vec(&value), to_vec_pretty(&value)] {
                let written = String::from_utf8(bytes).expect("UTF-8");
                prop_assert_eq!(serde_json::from_str::<Value>(&written).expect("JSON"), value.clone());
                let escaped = ['<', '>', '&', '\u{2028}', '\u{2029}'];
                prop_assert!(!written.contains(escaped), "{}", written);
            }
        }
    }
}
