//! A kind's typed object and its JSON: what every kind's object is ([`Object`]), and the
//! conversions between the two forms that need nothing else of the registry.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{Metadata, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use capstan_machinery::meta;

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
    T::deserialize(object).map_err(|e| e.to_string())
}

/// Encodes a kind's object as Capstan keeps it: no `apiVersion`/`kind`, no empty lists (Go's
/// `omitempty`, which every list field of these kinds has).
pub fn from_typed<T: Object>(object: &T) -> Value {
    let mut out = serde_json::to_value(object).unwrap_or(Value::Null);
    meta::strip_type_meta(&mut out);
    drop_empty_lists(&mut out);
    out
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
