//! `fieldsV1`, the encoding of a field set in a managedFields entry: a tree of steps in
//! upstream's order, a member with members below it marked by `.`.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Map, Value};

use super::{Path, Set};

/// Upstream's order of path elements: field names, then keys, then values, then indexes;
/// keys and values compared as values (so port 80 precedes port 443).
fn step_order(a: &str, b: &str) -> Ordering {
    fn rank(step: &str) -> u8 {
        match step.get(..2) {
            Some("f:") => 0,
            Some("k:") => 1,
            Some("v:") => 2,
            _ => 3,
        }
    }
    /// After the two-byte prefix (nothing when a step is shorter, or not a prefix at all: a
    /// stored `fieldsV1` can hold any key).
    fn rest(step: &str) -> &str {
        step.get(2..).unwrap_or_default()
    }
    let parsed = |s: &str| serde_json::from_str::<Value>(rest(s)).unwrap_or(Value::Null);
    rank(a).cmp(&rank(b)).then_with(|| match rank(a) {
        1 | 2 => value_order(&parsed(a), &parsed(b)),
        3 => {
            let index = |s: &str| rest(s).parse::<i64>().unwrap_or_default();
            index(a).cmp(&index(b))
        }
        _ => a.cmp(b),
    })
}

/// structured-merge-diff's total order of values: numbers, strings, booleans, lists, maps
/// (as sorted field lists), null.
fn value_order(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or_default(),
                y.as_f64().unwrap_or_default(),
            );
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => x
            .iter()
            .zip(y)
            .map(|(x, y)| value_order(x, y))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Object(x), Value::Object(y)) => {
            fn sorted(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
                let mut fields: Vec<(&String, &Value)> = m.iter().collect();
                fields.sort_by(|a, b| a.0.cmp(b.0));
                fields
            }
            let (x, y) = (sorted(x), sorted(y));
            x.iter()
                .zip(&y)
                .map(|((kx, vx), (ky, vy))| kx.cmp(ky).then_with(|| value_order(vx, vy)))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| x.len().cmp(&y.len()))
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

/// A field set as a tree of steps: what `fieldsV1` renders.
#[derive(Default)]
pub(super) struct Tree<'s> {
    /// Whether the path to this node is itself in the set.
    member: bool,
    children: Vec<(Cow<'s, str>, Tree<'s>)>,
}

impl<'s> Tree<'s> {
    /// Adds a path, each new step as `step` makes it (borrowed from a set that outlives the
    /// tree, or copied).
    pub(super) fn insert<'p>(
        &mut self,
        path: &'p [String],
        step: impl Fn(&'p String) -> Cow<'s, str>,
    ) {
        let mut node = self;
        for name in path {
            // Searched from the last child: a set's paths come in order, so it is that one.
            let index = match node.children.iter().rposition(|(s, _)| s == name) {
                Some(index) => index,
                None => {
                    node.children.push((step(name), Tree::default()));
                    node.children.len() - 1
                }
            };
            node = &mut node.children[index].1;
        }
        node.member = true;
    }

    /// Whether the set is empty.
    pub(super) fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    /// The set as `fieldsV1`: members with nothing below them are `{}`, members with
    /// something below them carry `.`; children in upstream's order (and, where that order
    /// ties, by their text, as a set's paths sort).
    pub(super) fn render(self) -> Value {
        let mut out = Map::with_capacity(self.children.len() + 1);
        if self.member && !self.children.is_empty() {
            out.insert(".".into(), Value::Object(Map::new()));
        }
        let mut children = self.children;
        children.sort_by(|a, b| step_order(&a.0, &b.0).then_with(|| a.0.cmp(&b.0)));
        for (step, child) in children {
            out.insert(step.into_owned(), child.render());
        }
        Value::Object(out)
    }
}

/// A set as `fieldsV1` ([`Tree::render`]).
pub(super) fn to_fields_v1(set: &Set) -> Value {
    let mut root = Tree::default();
    for path in set {
        root.insert(path, |step| Cow::Borrowed(step.as_str()));
    }
    root.render()
}

/// The set a `fieldsV1` value names.
pub(super) fn from_fields_v1(value: &Value) -> Set {
    fn walk(value: &Value, path: &mut Path, out: &mut Set) {
        let Some(map) = value.as_object() else { return };
        if (map.is_empty() || map.contains_key(".")) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (key, child) in map {
            if key == "." {
                continue;
            }
            path.push(key.clone());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = Set::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::set_step;

    /// Steps are written as structured-merge-diff writes them, with Go's escapes.
    #[test]
    fn steps_carry_gos_escapes() {
        assert_eq!(set_step(&json!("a<b>&c")), r#"v:"a\u003cb\u003e\u0026c""#);
        assert_eq!(set_step(&json!(80)), "v:80");
    }
}
