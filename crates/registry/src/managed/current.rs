//! managedFields of an update against the stored object as the write read it ([`Current`]):
//! compared member by member, without decoding what the new object left as it was.

use capstan_machinery::ApiError;
use capstan_machinery::schema::{Shape, shape};
use serde_json::Value;

use super::*;
use crate::current::{Current, encodes_to};
use crate::detached::Detached;

/// [`record_update`] against the stored object a write read, compared member by member
/// without decoding the members the new object left as they were.
/// The new object may keep members as encoded JSON (`detached`: a `null` in their place).
pub fn record_update_current(
    (new, detached): (&mut Value, &Detached),
    old: &Current<'_>,
    manager: &str,
    tracking: &Tracking,
) -> Result<(), ApiError> {
    let entries = entries_of(Some(old.meta()));
    // A top-level member the manager's own entry (the first that is its: the one `record`
    // extends) owns whole, and no other entry owns any of.
    let sole = |key: &str| {
        let step = field_step(key);
        let mine = entries
            .iter()
            .position(|owner| is_entry_of(&owner.entry, manager, "Update", tracking));
        mine.is_some_and(|mine| {
            entries[mine]
                .owned
                .iter()
                .any(|p| p.len() == 1 && p[0] == step)
                && entries.iter().enumerate().all(|(i, owner)| {
                    i == mine || !owner.owned.iter().any(|p| p.first() == Some(&step))
                })
        })
    };
    let comparison = compare_current(old, (new, detached), tracking, &sole)?;
    record(new, comparison, entries, manager, tracking);
    Ok(())
}

/// [`compare`] with the stored object as [`Current`] holds it: its metadata decoded, and each
/// other member decoded only when the new object's does not encode to the same JSON.
///
/// An atomic member `sole` names (one the writing manager alone owns, whole) is compared last,
/// and only when nothing else the write records has changed: otherwise, changed or not, it
/// stays the manager's alone and the manager's entry takes a new time anyway, so the result
/// is the same without reading it (a controller's slice write changes a trigger-time
/// annotation, and its 13 KB of endpoints are then never compared).
fn compare_current(
    old: &Current<'_>,
    (new, detached): (&Value, &Detached),
    tracking: &Tracking,
    sole: &dyn Fn(&str) -> bool,
) -> Result<Comparison, ApiError> {
    let schema = tracking.schema;
    if let Some(whole) = old.decoded()
        && detached.is_empty()
    {
        // Decoded already (for a patch): compared as it is (as the no-change check does, only
        // when the new object is whole too).
        return Ok(compare(whole, new, schema));
    }
    let node = shape_of(Some(new), schema);
    let Some(fields) = new
        .as_object()
        .filter(|_| matches!(node, Shape::Struct(_) | Shape::Map(_)))
    else {
        return Ok(compare(old.whole()?, new, schema));
    };
    let mut out = Comparison::default();
    let mut path = Vec::new();
    let mut member = |key: &str, lhs: Option<&Value>, rhs: Option<&Value>, out: &mut Comparison| {
        path.push(field_step(key));
        compare_node(lhs, rhs, child_schema(&node, key), &mut path, out);
        path.pop();
    };
    member(
        "metadata",
        old.meta().get("metadata"),
        fields.get("metadata"),
        &mut out,
    );
    // An atomic member is a leaf: modified or removed as a whole, known without decoding.
    // (A detached member, kept as encoded JSON, is one of the kind's atomic lists.)
    let atomic_member = |out: &mut Comparison, key: &str, raw, other: Option<&Value>| {
        let same = match (detached.get(key), other) {
            (_, None) => {
                out.removed.insert(vec![field_step(key)]);
                return Ok(());
            }
            (Some(text), Some(_)) => Detached::same(text, raw).map_err(|_| old.undecodable())?,
            (None, Some(other)) => {
                encodes_to(other, raw, child_schema(&node, key)) || old.holds(raw, other)?
            }
        };
        if !same {
            out.modified.insert(vec![field_step(key)]);
        }
        Ok::<_, ApiError>(())
    };
    let mut last = Vec::new();
    for (key, raw) in old.members() {
        let other = fields.get(key);
        // (What `shape_of` makes of a member: its schema's shape, or without one, atomic
        // unless an object.)
        let atomic = detached.get(key).is_some()
            || match child_schema(&node, key) {
                Some(schema) => matches!(shape(schema), Shape::Atomic),
                None => !(raw.get().starts_with('{') || other.is_some_and(Value::is_object)),
            };
        if atomic {
            match other {
                Some(other) if sole(key) => last.push((key, raw, other)),
                _ => atomic_member(&mut out, key, raw, other)?,
            }
            continue;
        }
        if other.is_some_and(|other| encodes_to(other, raw, child_schema(&node, key))) {
            continue;
        }
        member(key, Some(&old.decode_member(raw)?), other, &mut out);
    }
    for (key, value) in fields {
        if key != "metadata" && old.member(key).is_none() {
            match detached.get(key) {
                Some(text) => {
                    let value = serde_json::from_str(text.get())
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                    member(key, None, Some(&value), &mut out);
                }
                None => member(key, None, Some(value), &mut out),
            }
        }
    }
    if !tracking.records_any(&out) {
        for (key, raw, other) in last {
            atomic_member(&mut out, key, raw, Some(other))?;
        }
    }
    Ok(out)
}
