//! The syntax error Go's `encoding/json` reports for a document that is not JSON, in its
//! words (`invalid character 'x' looking for beginning of value`, `unexpected end of JSON
//! input`): kube-apiserver reads a body's apiVersion and kind with `json.Unmarshal`, which
//! checks the whole document with its scanner first and answers with the scanner's first
//! error. serde_json finds the same documents invalid but words it differently, and no crate
//! speaks Go's words, so the scanner's states are followed here (`encoding/json/scanner.go`).

/// Go's `maxNestingDepth`.
const MAX_DEPTH: usize = 10_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Within {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    BeginValue,
    BeginValueOrEmpty,
    BeginStringOrEmpty,
    BeginString,
    EndValue,
    EndTop,
    InString,
    InStringEsc,
    /// Inside `\u`, with this many hex digits read.
    InStringEscU(u8),
    Neg,
    One,
    Zero,
    Dot,
    Dot0,
    E,
    ESign,
    E0,
    /// Inside a literal (`true`, `false`, `null`), with this many letters read.
    Literal(&'static [u8], usize),
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// Go's `quoteChar`: the byte in single quotes, escaped as `strconv.Quote` would.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_string(),
        b'"' => "'\"'".to_string(),
        _ => {
            let quoted = capstan_gostd::quote(&char::from(c).to_string());
            format!("'{}'", &quoted[1..quoted.len() - 1])
        }
    }
}

fn invalid(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", quote_char(c))
}

/// The error `json.Unmarshal` gives for `bytes`, or `None` when they are valid JSON.
pub fn syntax_error(bytes: &[u8]) -> Option<String> {
    let mut stack: Vec<Within> = Vec::new();
    let mut state = State::BeginValue;
    for &c in bytes {
        if let Err(error) = step(&mut stack, &mut state, c) {
            return Some(error);
        }
    }
    // Go's `eof`: a space is fed first (which completes a number, or is the error of a value
    // cut short inside a literal, number or escape), then anything unfinished is the end.
    if let Err(error) = step(&mut stack, &mut state, b' ') {
        return Some(error);
    }
    (state != State::EndTop).then(|| "unexpected end of JSON input".into())
}

/// One byte through the scanner.
fn step(stack: &mut Vec<Within>, state: &mut State, c: u8) -> Result<(), String> {
    let current = *state;
    *state = match current {
        State::BeginValueOrEmpty if is_space(c) => State::BeginValueOrEmpty,
        // `]` closes the empty array, as after an element.
        State::BeginValueOrEmpty if c == b']' => end_value(stack, c)?,
        State::BeginValueOrEmpty | State::BeginValue => {
            if is_space(c) {
                current
            } else {
                match c {
                    b'{' => open(stack, Within::ObjectKey, c)?,
                    b'[' => open(stack, Within::ArrayValue, c)?,
                    b'"' => State::InString,
                    b'-' => State::Neg,
                    b'0' => State::Zero,
                    b'1'..=b'9' => State::One,
                    b't' => State::Literal(b"true", 1),
                    b'f' => State::Literal(b"false", 1),
                    b'n' => State::Literal(b"null", 1),
                    _ => return Err(invalid(c, "looking for beginning of value")),
                }
            }
        }
        State::BeginStringOrEmpty if is_space(c) => State::BeginStringOrEmpty,
        State::BeginStringOrEmpty if c == b'}' => {
            if let Some(top) = stack.last_mut() {
                *top = Within::ObjectValue;
            }
            end_value(stack, c)?
        }
        State::BeginStringOrEmpty | State::BeginString => {
            if is_space(c) {
                current
            } else if c == b'"' {
                State::InString
            } else {
                return Err(invalid(c, "looking for beginning of object key string"));
            }
        }
        State::EndValue => end_value(stack, c)?,
        State::EndTop => {
            if is_space(c) {
                State::EndTop
            } else {
                return Err(invalid(c, "after top-level value"));
            }
        }
        State::InString => match c {
            b'"' => State::EndValue,
            b'\\' => State::InStringEsc,
            0..0x20 => return Err(invalid(c, "in string literal")),
            _ => State::InString,
        },
        State::InStringEsc => match c {
            b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => State::InString,
            b'u' => State::InStringEscU(0),
            _ => return Err(invalid(c, "in string escape code")),
        },
        State::InStringEscU(read) => {
            if !c.is_ascii_hexdigit() {
                return Err(invalid(c, "in \\u hexadecimal character escape"));
            }
            if read == 3 {
                State::InString
            } else {
                State::InStringEscU(read + 1)
            }
        }
        State::Neg => match c {
            b'0' => State::Zero,
            b'1'..=b'9' => State::One,
            _ => return Err(invalid(c, "in numeric literal")),
        },
        State::One if c.is_ascii_digit() => State::One,
        State::One | State::Zero => match c {
            b'.' => State::Dot,
            b'e' | b'E' => State::E,
            // The number ends: the byte is what follows it.
            _ => end_value(stack, c)?,
        },
        State::Dot if c.is_ascii_digit() => State::Dot0,
        State::Dot => {
            return Err(invalid(c, "after decimal point in numeric literal"));
        }
        State::Dot0 if c.is_ascii_digit() => State::Dot0,
        State::Dot0 => match c {
            b'e' | b'E' => State::E,
            // The number ends: the byte is what follows it.
            _ => end_value(stack, c)?,
        },
        State::E if matches!(c, b'+' | b'-') => State::ESign,
        State::E | State::ESign => {
            if c.is_ascii_digit() {
                State::E0
            } else {
                return Err(invalid(c, "in exponent of numeric literal"));
            }
        }
        State::E0 if c.is_ascii_digit() => State::E0,
        State::E0 => end_value(stack, c)?,
        State::Literal(word, read) => {
            if c != word[read] {
                let name = std::str::from_utf8(word).unwrap_or_default();
                let expected = char::from(word[read]);
                return Err(invalid(
                    c,
                    &format!("in literal {name} (expecting '{expected}')"),
                ));
            }
            if read + 1 == word.len() {
                State::EndValue
            } else {
                State::Literal(word, read + 1)
            }
        }
    };
    // A value ends the document when nothing holds it.
    if *state == State::EndValue && stack.is_empty() {
        *state = State::EndTop;
    }
    Ok(())
}

/// Opens an object or array (`[` or `{`, as `c`), at most [`MAX_DEPTH`] deep.
fn open(stack: &mut Vec<Within>, within: Within, c: u8) -> Result<State, String> {
    if stack.len() >= MAX_DEPTH {
        return Err(invalid(c, "exceeded max depth"));
    }
    stack.push(within);
    Ok(match within {
        Within::ArrayValue => State::BeginValueOrEmpty,
        _ => State::BeginStringOrEmpty,
    })
}

/// Closes the innermost object or array: the document ends with the outermost.
fn close(stack: &mut Vec<Within>) -> State {
    stack.pop();
    if stack.is_empty() {
        State::EndTop
    } else {
        State::EndValue
    }
}

/// Go's `stateEndValue` for byte `c`: what follows a value depends on what holds it.
fn end_value(stack: &mut Vec<Within>, c: u8) -> Result<State, String> {
    let Some(top) = stack.last().copied() else {
        return if is_space(c) {
            Ok(State::EndTop)
        } else {
            Err(invalid(c, "after top-level value"))
        };
    };
    if is_space(c) {
        return Ok(State::EndValue);
    }
    match top {
        Within::ObjectKey if c == b':' => {
            if let Some(last) = stack.last_mut() {
                *last = Within::ObjectValue;
            }
            Ok(State::BeginValue)
        }
        Within::ObjectKey => Err(invalid(c, "after object key")),
        Within::ObjectValue if c == b',' => {
            if let Some(last) = stack.last_mut() {
                *last = Within::ObjectKey;
            }
            Ok(State::BeginString)
        }
        Within::ObjectValue if c == b'}' => Ok(close(stack)),
        Within::ObjectValue => Err(invalid(c, "after object key:value pair")),
        Within::ArrayValue if c == b',' => Ok(State::BeginValue),
        Within::ArrayValue if c == b']' => Ok(close(stack)),
        Within::ArrayValue => Err(invalid(c, "after array element")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_documents_have_no_error() {
        for text in [
            r#"{}"#,
            r#" {"a": [1, -2.5e+3, 0, true, false, null, "x\"\u00e9"], "b": {}} "#,
            "[]",
            "0",
            "12",
            "\"s\"",
            "[[]]",
        ] {
            assert_eq!(syntax_error(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn errors_read_as_go_writes_them() {
        let cases = [
            ("", "unexpected end of JSON input"),
            (r#"{"a":"#, "unexpected end of JSON input"),
            ("x", "invalid character 'x' looking for beginning of value"),
            (r#"{"a" 1}"#, "invalid character '1' after object key"),
            (
                r#"{"a":1 "b":2}"#,
                "invalid character '\"' after object key:value pair",
            ),
            (
                r#"{a:1}"#,
                "invalid character 'a' looking for beginning of object key string",
            ),
            ("[1 2]", "invalid character '2' after array element"),
            ("{} x", "invalid character 'x' after top-level value"),
            ("{}}", "invalid character '}' after top-level value"),
            (
                "[tru]",
                "invalid character ']' in literal true (expecting 'e')",
            ),
            (
                "nul",
                "invalid character ' ' in literal null (expecting 'l')",
            ),
            ("-", "invalid character ' ' in numeric literal"),
            (
                "[1e",
                "invalid character ' ' in exponent of numeric literal",
            ),
            ("[1", "unexpected end of JSON input"),
            ("[-]", "invalid character ']' in numeric literal"),
            (
                "1.x",
                "invalid character 'x' after decimal point in numeric literal",
            ),
            (
                "1e]",
                "invalid character ']' in exponent of numeric literal",
            ),
            ("\"a\u{1}\"", "invalid character '\\x01' in string literal"),
            (r#""\q""#, "invalid character 'q' in string escape code"),
            (
                r#""\u12x4""#,
                "invalid character 'x' in \\u hexadecimal character escape",
            ),
            (
                "{'a':1}",
                r"invalid character '\'' looking for beginning of object key string",
            ),
            (
                "[,]",
                "invalid character ',' looking for beginning of value",
            ),
            ("01", "invalid character '1' after top-level value"),
        ];
        for (text, want) in cases {
            assert_eq!(
                syntax_error(text.as_bytes()).as_deref(),
                Some(want),
                "{text:?}"
            );
        }
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(
            syntax_error(deep.as_bytes()).as_deref(),
            Some("invalid character '[' exceeded max depth")
        );
    }
}
