//! Field selectors (`fieldSelector=`): `field=value`, `field==value`, `field!=value`, ANDed.

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field path, e.g. `metadata.name`.
    pub field: String,
    /// `true` for `!=`.
    pub negated: bool,
    /// The value, unescaped.
    pub value: String,
}

/// A parsed field selector. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// The terms.
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `fieldSelector`; the error is the 400 text kube-apiserver sends.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        // Upstream sorts the terms: the first bad one in that order is the one reported.
        let mut terms = split_unescaped(text, ',');
        terms.sort();
        for term in terms {
            if term.is_empty() {
                continue;
            }
            let Some((field, negated, raw)) = split_term(&term) else {
                return Err(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                ));
            };
            let value = unescape(raw).map_err(|e| format!("invalid field selector: {e}"))?;
            requirements.push(FieldRequirement {
                field: field.to_string(),
                negated,
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The value `metadata.name` is pinned to by an `=` term, if any.
    pub fn pinned_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == "metadata.name" && !r.negated)
            .map(|r| r.value.as_str())
    }

    /// Whether an object matches, given how to read a field (`None`: unsupported field).
    pub fn matches<'a>(&self, field: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements
            .iter()
            .all(|r| (field(&r.field).unwrap_or_default() == r.value) != r.negated)
    }
}

fn split_unescaped(text: &str, separator: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            current.push(c);
            escaped = false;
        } else if c == '\\' {
            current.push(c);
            escaped = true;
        } else if c == separator {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
}

/// Splits a term at the first operator, as upstream's `splitTerm`: the field name has no
/// escaping, and the split point is found among character boundaries only.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for (operator, negated) in [("!=", true), ("==", false), ("=", false)] {
            if let Some(value) = rest.strip_prefix(operator) {
                return Some((&term[..i], negated, value));
            }
        }
    }
    None
}

fn unescape(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence: \\{e}")),
                None => return Err("invalid escape sequence: \\".to_string()),
            },
            ',' | '=' => return Err(format!("unescaped character in value: {}", c as u32)),
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_three_operators() {
        let selector =
            FieldSelector::parse("metadata.name=web,spec.type==NodePort,spec.clusterIP!=None")
                .expect("parses");
        assert_eq!(selector.requirements.len(), 3);
        assert_eq!(selector.pinned_name(), Some("web"));
        let cluster_ip = selector
            .requirements
            .iter()
            .find(|r| r.field == "spec.clusterIP")
            .expect("term");
        assert!(cluster_ip.negated);
    }

    #[test]
    fn escapes_and_errors() {
        let selector = FieldSelector::parse(r"metadata.name=a\,b").expect("parses");
        assert_eq!(selector.requirements[0].value, "a,b");
        for (selector, error) in [
            (
                r"metadata.name=a\x",
                r"invalid field selector: invalid escape sequence: \x",
            ),
            (
                "metadata.name=a=b",
                "invalid field selector: unescaped character in value: 61",
            ),
            ("foo", "invalid selector: 'foo'; can't understand 'foo'"),
        ] {
            assert_eq!(FieldSelector::parse(selector).err().as_deref(), Some(error));
        }
    }

    #[test]
    fn multi_byte_characters_never_split() {
        // `é` after a backslash once sliced inside the character and panicked.
        for text in [
            "é",
            "\\é",
            "aé=b",
            "é\\=x",
            "\\",
            "a\\\\é!=é",
            "=é",
            "€=",
            "a=\\é",
        ] {
            let _ = FieldSelector::parse(text);
        }
        assert_eq!(
            FieldSelector::parse("é").expect_err("no operator"),
            "invalid selector: 'é'; can't understand 'é'"
        );
        let selector = FieldSelector::parse("aé=b").expect("parses");
        assert_eq!(selector.requirements[0].field, "aé");
    }

    #[test]
    fn the_first_bad_term_in_sorted_order_is_reported() {
        assert_eq!(
            FieldSelector::parse("z,a").expect_err("must fail"),
            "invalid selector: 'z,a'; can't understand 'a'"
        );
    }

    #[test]
    fn matching_reads_fields() {
        let selector = FieldSelector::parse("spec.type!=NodePort").expect("parses");
        assert!(selector.matches(|_| Some("ClusterIP")));
        assert!(!selector.matches(|_| Some("NodePort")));
    }
}
