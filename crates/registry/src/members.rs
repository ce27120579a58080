//! Members of a write's JSON that the generic half of a write sets, outside the kind's rules:
//! what a `/status` update keeps of the stored object, what it copies from it, and Go's lists
//! that are always written.

use capstan_machinery::ApiError;
use serde_json::Value;

use crate::current::{Current, encodes_to};

/// The generic half of a `/status` update: everything but status and metadata is the stored
/// object's.
pub(crate) fn keep_all_but_status(new: &mut Value, old: &Value) {
    let keys: Vec<String> = old
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    for key in keys {
        if key != "status" && key != "metadata" {
            copy_field(new, old, &key);
        }
    }
    if let Value::Object(map) = new {
        map.retain(|k, _| k == "status" || k == "metadata" || old.get(k.as_str()).is_some());
    }
}

/// Go's lists without `omitempty`: written as `null` when empty or unset.
pub(crate) fn always_present(object: &mut Value, fields: &[&str]) {
    let Value::Object(map) = object else { return };
    for field in fields {
        match map.get_mut(*field) {
            Some(value) if value.as_array().is_some_and(Vec::is_empty) => *value = Value::Null,
            Some(_) => {}
            None => {
                map.insert((*field).to_string(), Value::Null);
            }
        }
    }
}

/// [`copy_field`] from the stored object a write read: a member it holds as the new object's
/// encodes (as `schema`, the kind's, writes it) is not decoded.
pub(crate) fn copy_member(
    to: &mut Value,
    from: &Current<'_>,
    (field, schema): (&str, Option<&'static Value>),
) -> Result<bool, ApiError> {
    let raw = from.member(field);
    let member = schema.and_then(|schema| capstan_machinery::schema::property(schema, field));
    if let (Some(raw), Some(value)) = (raw, to.get(field))
        && encodes_to(value, raw, member)
    {
        return Ok(false);
    }
    let stored = raw.map(|raw| from.decode_member(raw)).transpose()?;
    Ok(set_field(to, field, stored.as_ref()))
}

/// Copies `field` from `from` to `to` (removing it from `to` when `from` lacks it); whether
/// that changed `to`.
fn copy_field(to: &mut Value, from: &Value, field: &str) -> bool {
    set_field(to, field, from.get(field))
}

/// Sets `field` of `to` to `value` (removing it for none); whether that changed `to`.
fn set_field(to: &mut Value, field: &str, value: Option<&Value>) -> bool {
    let Value::Object(map) = to else {
        return false;
    };
    match value {
        Some(value) if map.get(field) != Some(value) => {
            map.insert(field.to_string(), value.clone());
            true
        }
        Some(_) => false,
        None => map.shift_remove(field).is_some(),
    }
}
