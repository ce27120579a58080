//! Go's standard-library text formats that Kubernetes clients see, for the crates that need
//! them and nothing else of the API machinery (the node agents read duration flags too):
//! [`duration`] is `time.ParseDuration`, [`quote`] is `strconv.Quote` (`%q`).

pub mod duration;

/// Go's `%q` for the strings that appear in messages.
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
