//! Between the JSON the registry keeps and a kind's typed object.
//!
//! A strategy's rule never reads `metadata.managedFields` (the registry owns them), and they
//! are the largest part of most stored objects (a tree of field sets per manager). So the
//! rules' view of an object is decoded without them ([`for_rules`]), and a rule's changes are
//! written back around them ([`write_back`]): a write decodes the object's fields once per
//! rule, not its field-manager history as well.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::decode::for_rules;
use crate::object::{Object, drop_empty_lists, from_typed};

/// Writes a rule's result back into `object`: every top-level field but `metadata` from
/// `typed`, and `metadata` only when the rule changed it (`before` is what the rule was given),
/// keeping the stored managedFields either way (so the stored metadata is kept byte for byte
/// when the rule left it alone).
pub fn write_back<T: Object>(object: &mut Value, typed: &T, before: &ObjectMeta) {
    let metadata_changed = typed.metadata() != before;
    let Value::Object(fields) = from_typed(typed) else {
        return;
    };
    let Value::Object(target) = object else {
        return;
    };
    let mut kept = target.shift_remove("metadata");
    target.clear();
    for (key, value) in fields {
        if key == "metadata" {
            match kept.take() {
                Some(stored) if !metadata_changed => {
                    target.insert(key, stored);
                }
                stored => {
                    target.insert(key, with_managed_fields_of(value, stored));
                }
            }
            continue;
        }
        target.insert(key, value);
    }
}

/// Writes back what a rule changed, `untouched` being what it was given: nothing when it
/// changed nothing, only `metadata` when nothing else changed (a generation bump), else as
/// [`write_back`]. The same result as `write_back`, without encoding what did not change.
/// Returns whether the members were written back whole. `untouched` is left as it was (its
/// metadata is set aside while the rest is compared).
pub(crate) fn write_changes<T: Object>(
    object: &mut Value,
    typed: &mut T,
    untouched: &mut T,
) -> bool {
    if typed == untouched {
        return false;
    }
    // The rest compared with both metadata set aside (not copied).
    let metadata = std::mem::take(typed.metadata_mut());
    let before = std::mem::take(untouched.metadata_mut());
    let only_metadata = typed == untouched;
    *typed.metadata_mut() = metadata;
    *untouched.metadata_mut() = before;
    if !only_metadata {
        // The metadata is kept as the JSON has it (changed there below, member by member): it
        // is not encoded whole only to be dropped.
        let metadata = std::mem::take(typed.metadata_mut());
        write_back(object, typed, &ObjectMeta::default());
        *typed.metadata_mut() = metadata;
    }
    let (new, old) = (typed.metadata(), untouched.metadata());
    if new == old
        || (new.managed_fields == old.managed_fields && write_meta_changes(object, new, old))
    {
        return !only_metadata;
    }
    write_back(object, typed, old);
    true
}

/// Writes into `object`'s `metadata` the members of `typed` that differ from `untouched`
/// (what the JSON holds): what [`write_back`] would write, `metadata` encoded from `typed`
/// around the stored managedFields, without encoding the members that did not change. The
/// members come out in the order encoding gives (their names' order, which is the type's),
/// managedFields last. False, with `object` as it was, when there is no metadata to write
/// into or a member does not encode.
fn write_meta_changes(object: &mut Value, typed: &ObjectMeta, untouched: &ObjectMeta) -> bool {
    // What encoding the metadata whole gives (debug builds check it is what this writes).
    #[cfg(debug_assertions)]
    let whole = object.get("metadata").cloned().map(|stored| {
        let mut encoded = serde_json::to_value(typed).unwrap_or_default();
        drop_empty_lists(&mut encoded);
        with_managed_fields_of(encoded, Some(stored)).to_string()
    });
    let Some(Value::Object(metadata)) = object.as_object_mut().and_then(|o| o.get_mut("metadata"))
    else {
        return false;
    };
    // Every member by name, so that a member the type gains is not missed.
    let ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields: _,
        name,
        namespace,
        owner_references,
        resource_version,
        self_link,
        uid,
    } = typed;
    let mut changes: Vec<(&str, Value)> = Vec::new();
    macro_rules! changed {
        ($($field:ident => $name:literal),* $(,)?) => {$(
            if *$field != untouched.$field {
                match serde_json::to_value($field) {
                    Ok(value) => changes.push(($name, value)),
                    Err(_) => return false,
                }
            }
        )*};
    }
    changed!(
        annotations => "annotations",
        creation_timestamp => "creationTimestamp",
        deletion_grace_period_seconds => "deletionGracePeriodSeconds",
        deletion_timestamp => "deletionTimestamp",
        finalizers => "finalizers",
        generate_name => "generateName",
        generation => "generation",
        labels => "labels",
        name => "name",
        namespace => "namespace",
        owner_references => "ownerReferences",
        resource_version => "resourceVersion",
        self_link => "selfLink",
        uid => "uid",
    );
    for (name, mut value) in changes {
        drop_empty_lists(&mut value);
        if value.is_null() || value.as_array().is_some_and(Vec::is_empty) {
            metadata.shift_remove(name);
        } else {
            metadata.insert(name.to_string(), value);
        }
    }
    // As encoding leaves them: no null or empty list, names in order, managedFields last.
    metadata.retain(|_, v| !v.is_null() && !v.as_array().is_some_and(Vec::is_empty));
    let managed = metadata.shift_remove("managedFields");
    metadata.sort_keys();
    if let Some(managed) = managed {
        metadata.insert("managedFields".to_string(), managed);
    }
    #[cfg(debug_assertions)]
    debug_assert_eq!(
        Some(Value::Object(metadata.clone()).to_string()),
        whole,
        "the metadata's changes written in place"
    );
    true
}

/// `metadata` (as encoded from a typed object) with the managedFields of `stored`, if any.
fn with_managed_fields_of(mut metadata: Value, stored: Option<Value>) -> Value {
    let managed = stored.and_then(|mut m| m.as_object_mut()?.shift_remove("managedFields"));
    if let (Some(managed), Value::Object(fields)) = (managed, &mut metadata) {
        fields.insert("managedFields".into(), managed);
    }
    metadata
}

/// Runs a typed rule that changes `object`, writing back what changed ([`write_back`]);
/// `None` when the object does not decode.
pub fn mutate<T: Object, R>(object: &mut Value, rule: impl FnOnce(&mut T) -> R) -> Option<R> {
    let mut typed: T = for_rules(object).ok()?;
    let before = typed.metadata().clone();
    let result = rule(&mut typed);
    write_back(object, &typed, &before);
    Some(result)
}

/// Runs a typed rule that reads `object`; `None` when the object does not decode.
pub fn read<T: Object, R>(object: &Value, rule: impl FnOnce(&T) -> R) -> Option<R> {
    for_rules(object).ok().map(|typed| rule(&typed))
}

#[cfg(test)]
pub(crate) mod tests;
