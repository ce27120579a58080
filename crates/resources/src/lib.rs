//! Capstan's resource kinds: one folder per kind, each a [`capstan_registry::Strategy`].
//!
//! Start with [`service::ServiceStrategy`] (defaults, validation, ClusterIP/NodePort
//! allocation, table printer); [`namespace::NamespaceStrategy`] is the minimal Namespace kind
//! that namespaced objects need.

pub mod apiservice;
pub mod endpoints;
pub mod namespace;
pub mod pod;
pub mod service;

/// The port default every kind shares: an empty or missing `protocol` is `TCP`.
/// Verbs served for a namespaced kind with collection delete (Service, Endpoints, Pod).
pub(crate) const NAMESPACED_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub(crate) fn default_protocol(port: &mut serde_json::Map<String, serde_json::Value>) {
    if port
        .get("protocol")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        port.insert("protocol".into(), "TCP".into());
    }
}

/// Round-trips an object through its typed form: unknown fields are dropped and wrongly typed
/// ones refused, as kube-apiserver's decoder does.
pub(crate) fn typed<T>(mut object: serde_json::Value) -> Result<serde_json::Value, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize + k8s_openapi::Resource,
{
    if let serde_json::Value::Object(map) = &mut object {
        map.insert("apiVersion".into(), T::API_VERSION.into());
        map.insert("kind".into(), T::KIND.into());
    }
    let typed: T = serde_json::from_value(object).map_err(|e| e.to_string())?;
    let mut out = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    capstan_machinery::meta::strip_type_meta(&mut out);
    drop_empty_lists(&mut out);
    Ok(out)
}

/// Go's `omitempty`: an empty list is never written (every list field of these kinds has it).
fn drop_empty_lists(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
            map.values_mut().for_each(drop_empty_lists);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_empty_lists),
        _ => {}
    }
}
