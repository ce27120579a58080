//! Go's `time.ParseDuration`, for what kube-apiserver reads as Go durations: the `timeout`
//! query parameter and its duration flags (`--request-timeout=1m0s`).

use std::time::Duration;

const NANOS: &[(&str, u64)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000), // U+00B5
    ("μs", 1_000), // U+03BC
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Go's quoting in its duration errors: `"` + text + `"` (the texts here are short and
/// printable in practice; anything else is escaped as `%q` would).
fn quote(text: &str) -> String {
    crate::quote(text)
}

/// Parses a Go duration (`300ms`, `-1.5h`, `2h45m`, `0`) into signed nanoseconds; the error is
/// Go's text (`time: invalid duration "x"`, `time: missing unit in duration "5"`,
/// `time: unknown unit "d" in duration "5d"`).
pub fn parse_go_duration(text: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", quote(text));
    let mut rest = text;
    let mut negative = false;
    if let Some(stripped) = rest.strip_prefix('-') {
        negative = true;
        rest = stripped;
    } else if let Some(stripped) = rest.strip_prefix('+') {
        rest = stripped;
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let limit: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let first = rest.as_bytes()[0];
        if !(first == b'.' || first.is_ascii_digit()) {
            return Err(invalid());
        }
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut whole: u64 = 0;
        for b in rest[..digits].bytes() {
            whole = whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(u64::from(b - b'0')))
                .filter(|w| *w <= limit)
                .ok_or_else(invalid)?;
        }
        rest = &rest[digits..];
        let mut fraction: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut fraction_digits = 0;
        if let Some(after) = rest.strip_prefix('.') {
            fraction_digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflow = false;
            for b in after[..fraction_digits].bytes() {
                if overflow {
                    continue;
                }
                match fraction
                    .checked_mul(10)
                    .and_then(|f| f.checked_add(u64::from(b - b'0')))
                {
                    Some(f) if f <= limit => {
                        fraction = f;
                        scale *= 10.0;
                    }
                    _ => overflow = true,
                }
            }
            rest = &after[fraction_digits..];
        } else if digits == 0 {
            return Err(invalid());
        }
        if digits == 0 && fraction_digits == 0 {
            return Err(invalid());
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        if unit_len == 0 {
            return Err(format!("time: missing unit in duration {}", quote(text)));
        }
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let Some(&(_, nanos)) = NANOS.iter().find(|(name, _)| *name == unit) else {
            return Err(format!(
                "time: unknown unit {} in duration {}",
                quote(unit),
                quote(text)
            ));
        };
        if whole > limit / nanos {
            return Err(invalid());
        }
        let mut value = whole * nanos;
        if fraction > 0 {
            value += (fraction as f64 * (nanos as f64 / scale)) as u64;
            if value > limit {
                return Err(invalid());
            }
        }
        total = total
            .checked_add(value)
            .filter(|t| *t <= limit)
            .ok_or_else(invalid)?;
    }
    if negative {
        return Ok((total as i128).wrapping_neg() as i64);
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// A non-negative Go duration as a [`Duration`] (flags): negative values are refused.
pub fn parse_flag_duration(text: &str) -> Result<Duration, String> {
    let nanos = parse_go_duration(text)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("negative duration {}", quote(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_go_parses() {
        let second = 1_000_000_000;
        assert_eq!(parse_go_duration("0"), Ok(0));
        assert_eq!(parse_go_duration("5s"), Ok(5 * second));
        assert_eq!(parse_go_duration("1m0s"), Ok(60 * second));
        assert_eq!(parse_go_duration("1.5h"), Ok(5400 * second));
        assert_eq!(parse_go_duration("-2m"), Ok(-120 * second));
        assert_eq!(parse_go_duration("300ms"), Ok(300_000_000));
        assert_eq!(parse_go_duration(".5s"), Ok(second / 2));
        assert_eq!(parse_go_duration("1µs"), Ok(1_000));
        assert_eq!(
            parse_go_duration("2h45m30.5s"),
            Ok((2 * 3600 + 45 * 60) * second + 30 * second + second / 2)
        );
    }

    #[test]
    fn errors_are_gos_texts() {
        for (text, error) in [
            ("x", "time: invalid duration \"x\""),
            ("", "time: invalid duration \"\""),
            ("5", "time: missing unit in duration \"5\""),
            ("5d", "time: unknown unit \"d\" in duration \"5d\""),
            (".", "time: invalid duration \".\""),
            (
                "99999999999999999999h",
                "time: invalid duration \"99999999999999999999h\"",
            ),
        ] {
            assert_eq!(parse_go_duration(text), Err(error.into()), "{text}");
        }
        // Never panics on arbitrary text.
        for text in ["é", "5é", "1.é", "-", "+", "1e5s", "\u{0}", "1.5.5s"] {
            let _ = parse_go_duration(text);
        }
    }
}
