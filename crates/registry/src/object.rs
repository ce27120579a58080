//! A kind's typed object and its JSON: what every kind's object is ([`Object`]), and the
//! conversions between the two forms that need nothing else of the registry.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{Metadata, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use capstan_machinery::meta;

use crate::go_nulls::{GoNulls, ZERO_TIME};

use crate::info::Scope;

/// What every kind's typed object is: a `k8s_openapi` resource with standard object metadata,
/// [`Typed`].
pub trait Object: Typed + Resource<Scope: Scope> + Metadata<Ty = ObjectMeta> {}

impl<T: Typed + Resource<Scope: Scope> + Metadata<Ty = ObjectMeta>> Object for T {}

/// A type the registry can hold as an object: encoded and decoded, compared, shared.
pub trait Typed: Serialize + DeserializeOwned + Clone + PartialEq + Send + Sync + 'static {}

impl<T: Serialize + DeserializeOwned + Clone + PartialEq + Send + Sync + 'static> Typed for T {}

/// Decodes stored or request JSON into a kind's object, all of it (managedFields included).
pub fn to_typed<T: Object>(object: &Value) -> Result<T, String> {
    T::deserialize(object)
        .or_else(|strict| T::deserialize(GoNulls(object)).map_err(|_| strict))
        .map_err(|e| e.to_string())
}

/// Encodes a kind's object as Capstan keeps it: no `apiVersion`/`kind`, no empty lists (Go's
/// `omitempty`, which every list field of these kinds has).
pub fn from_typed<T: Object>(object: &T) -> Value {
    let mut out = serde_json::to_value(object).unwrap_or(Value::Null);
    meta::strip_type_meta(&mut out);
    go_marshal(&mut out);
    out
}

/// Go's marshaling of an object, where it differs from the types' serde: `omitempty` on
/// lists (an empty list is never written), and Go's zero time, which `metav1.Time` marshals as
/// `null` ([`crate::go_nulls`]), is `null` (outside `metadata`, whose times are never zero and
/// whose maps hold any text).
fn go_marshal(object: &mut Value) {
    let Value::Object(map) = object else {
        return drop_empty_lists(object);
    };
    map.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
    for (key, member) in map.iter_mut() {
        if key == "metadata" {
            drop_empty_lists(member);
        } else {
            go_values(member);
        }
    }
}

/// [`drop_empty_lists`], and Go's zero time as `null`.
fn go_values(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
            map.values_mut().for_each(go_values);
        }
        Value::Array(items) => items.iter_mut().for_each(go_values),
        Value::String(text) if text == ZERO_TIME => *value = Value::Null,
        _ => {}
    }
}

/// Go's `omitempty` on lists: an empty list is never written.
pub(crate) fn drop_empty_lists(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
            map.values_mut().for_each(drop_empty_lists);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty_lists),
        _ => {}
    }
}
