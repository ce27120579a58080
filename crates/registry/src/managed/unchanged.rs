//! Whether an update changes anything: the one comparison every update makes, done in place.

use serde_json::Value;

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
    same_map(new, old, None, |key, new, old| match (key, new, old) {
        ("metadata", Value::Object(new), Value::Object(old)) => {
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
        (_, new, old) => new == old,
    })
}
