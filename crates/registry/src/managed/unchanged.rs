//! Whether an update changes anything: the one comparison every update makes, done in place.

use serde_json::Value;

use crate::current::{Current, encodes_to};
use crate::decode::holds;
use crate::detached::Detached;

/// Whether two maps hold the same keys (less `skip`) with values `same` calls equal.
fn same_map(
    new: &serde_json::Map<String, Value>,
    old: &serde_json::Map<String, Value>,
    skip: Option<&str>,
    same: impl Fn(&str, &Value, &Value) -> bool,
) -> bool {
    let skipped = |key: &str| skip == Some(key);
    let counted = |map: &serde_json::Map<String, Value>| map.keys().filter(|k| !skipped(k)).count();
    counted(new) == counted(old)
        && new
            .iter()
            .filter(|(key, _)| !skipped(key))
            .all(|(key, value)| old.get(key).is_some_and(|other| same(key, value, other)))
}

/// Whether an update changes nothing but managedFields timestamps (then it is not written).
/// Compared in place: the objects are not copied.
pub fn same_ignoring_times(new: &Value, old: &Value) -> bool {
    let (Some(new), Some(old)) = (new.as_object(), old.as_object()) else {
        return new == old;
    };
    same_map(new, old, None, |key, new, old| match key {
        "metadata" => same_metadata(new, old),
        _ => new == old,
    })
}

/// [`same_ignoring_times`] with the stored object as [`Current`] holds it: a member the new
/// object's encodes to as stored is equal without decoding it.
/// The new object may keep members as encoded JSON (`detached`: a `null` in their place).
pub fn same_ignoring_times_current(
    (new, detached): (&Value, &Detached),
    old: &Current<'_>,
    schema: Option<&'static Value>,
) -> bool {
    if let Some(whole) = old.decoded()
        && detached.is_empty()
    {
        return same_ignoring_times(new, whole);
    }
    let Some(new) = new.as_object() else {
        return false;
    };
    // Metadata first: a controller's write usually changes it (a trigger time, the generation),
    // and then the other members (a slice's 13 KB of endpoints) need not be compared at all.
    new.len() == old.member_count()
        && new.get("metadata").is_some_and(|value| {
            old.meta()
                .get("metadata")
                .is_some_and(|stored| same_metadata(value, stored))
        })
        && new.iter().all(|(key, value)| {
            key == "metadata"
                || old.member(key).is_some_and(|raw| match detached.get(key) {
                    Some(text) => Detached::same(text, raw).unwrap_or(false),
                    None => {
                        let member =
                            schema.and_then(|s| capstan_machinery::schema::property(s, key));
                        encodes_to(value, raw, member) || holds(raw, value).unwrap_or(false)
                    }
                })
        })
}

/// Whether two `metadata` values are the same but for managedFields timestamps.
fn same_metadata(new: &Value, old: &Value) -> bool {
    let (Value::Object(new), Value::Object(old)) = (new, old) else {
        return new == old;
    };
    same_map(new, old, None, |key, new, old| match (key, new, old) {
        ("managedFields", Value::Array(new), Value::Array(old)) => {
            new.len() == old.len()
                && new.iter().zip(old).all(|pair| match pair {
                    (Value::Object(new), Value::Object(old)) => {
                        same_map(new, old, Some("time"), |_, new, old| new == old)
                    }
                    (new, old) => new == old,
                })
        }
        (_, new, old) => new == old,
    })
}
