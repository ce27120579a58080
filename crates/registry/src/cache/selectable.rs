//! What selectors read of a cached object.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// What label and field selectors read of `metadata` (name, namespace, labels): all the watch
/// cache decodes of a kind without selectable fields, and what a kind's
/// [`crate::Strategy::selectable_object`] reads of the metadata.
#[derive(serde::Deserialize, Default)]
pub struct SelectableMeta {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// `metadata.labels`.
    pub labels: Option<std::collections::BTreeMap<String, String>>,
}

impl SelectableMeta {
    /// The object's metadata with only these fields.
    pub fn into_object_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            labels: self.labels,
            ..ObjectMeta::default()
        }
    }
}

/// What [`crate::Strategy::selectable_object`] reads an object from: its JSON (without
/// managedFields; the watch cache's reading of stored bytes), or the object itself (a write's,
/// which tells the watch cache what it wrote).
#[derive(Clone, Copy)]
pub enum SelectableFrom<'a> {
    /// The object's JSON.
    Json(&'a [u8]),
    /// The object.
    Object(&'a Value),
}

impl SelectableFrom<'_> {
    /// Decodes a partial type from it (members it does not name are skipped).
    pub fn decode<T: serde::de::DeserializeOwned>(self) -> Option<T> {
        match self {
            SelectableFrom::Json(json) => serde_json::from_slice(json).ok(),
            SelectableFrom::Object(object) => T::deserialize(object).ok(),
        }
    }
}

/// What the watch cache reads of a kind: where its objects are stored, what selectors read of
/// each (from the decoded object, or straight from its JSON), and the schema that orders the
/// members of the objects it encodes itself. Every kind's rules are one ([`crate::Strategy`]);
/// the cache knows nothing else of them.
pub trait Project: Send + Sync + 'static {
    /// The storage prefix of the kind's objects (ending in `/`).
    fn storage_prefix(&self) -> String;

    /// What label and field selectors read of `object`.
    fn selectable(&self, object: &Value) -> Selectable;

    /// [`Project::selectable`] of an object's JSON, read from its `metadata` member (and
    /// `whole`, which writes the object without `metadata.managedFields`, when it needs more);
    /// `None` when it cannot (then the object is decoded for [`Project::selectable`]).
    fn selectable_json(&self, metadata: &[u8], whole: &dyn Fn() -> Vec<u8>) -> Option<Selectable>;

    /// The kind's schema, for objects encoded afresh ([`capstan_machinery::go_order`]).
    fn encoding_schema(&self) -> Option<&'static Value>;
}

/// What the cache reads of a kind's objects ([`Project`]).
#[derive(Clone)]
pub struct Projection(Arc<dyn Project>);

/// A [`Project`] made of two functions (tests, benches), without a schema.
struct Functions<O, J> {
    object: O,
    json: J,
}

impl<O, J> Project for Functions<O, J>
where
    O: Fn(&Value) -> Selectable + Send + Sync + 'static,
    J: Fn(&[u8], &dyn Fn() -> Vec<u8>) -> Option<Selectable> + Send + Sync + 'static,
{
    fn storage_prefix(&self) -> String {
        String::new()
    }

    fn selectable(&self, object: &Value) -> Selectable {
        (self.object)(object)
    }

    fn selectable_json(&self, metadata: &[u8], whole: &dyn Fn() -> Vec<u8>) -> Option<Selectable> {
        (self.json)(metadata, whole)
    }

    fn encoding_schema(&self) -> Option<&'static Value> {
        None
    }
}

impl Projection {
    /// `object` projects a decoded object; `json` projects an object's JSON straight from the
    /// bytes ([`Project::selectable_json`]).
    pub fn new(
        object: impl Fn(&Value) -> Selectable + Send + Sync + 'static,
        json: impl Fn(&[u8], &dyn Fn() -> Vec<u8>) -> Option<Selectable> + Send + Sync + 'static,
    ) -> Self {
        Projection(Arc::new(Functions { object, json }))
    }

    /// A kind's projection.
    pub fn of(kind: Arc<dyn Project>) -> Self {
        Projection(kind)
    }

    /// The kind's schema, if it has one.
    pub fn schema(&self) -> Option<&'static Value> {
        self.0.encoding_schema()
    }

    /// A projection of decoded objects only.
    pub fn of_objects(object: impl Fn(&Value) -> Selectable + Send + Sync + 'static) -> Self {
        Self::new(object, |_, _| None)
    }

    /// What selectors read of `object`.
    pub fn project(&self, object: &Value) -> Selectable {
        self.0.selectable(object)
    }

    /// What selectors read of an object's JSON, when it can be read from the bytes: its
    /// `metadata` member, and `whole` for the object without managedFields.
    pub fn project_json(&self, metadata: &[u8], whole: &dyn Fn() -> Vec<u8>) -> Option<Selectable> {
        self.0.selectable_json(metadata, whole)
    }
}

/// What selectors read of an object, kept beside its JSON in the watch cache: its name,
/// namespace and labels, and the values of its kind's other selectable fields. Plain strings,
/// a few hundred bytes per object: as a `serde_json::Value` tree the same took over a kilobyte,
/// and a lookup hashed its way through three maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectable {
    name: Box<str>,
    namespace: Box<str>,
    /// Sorted by key.
    labels: Box<[(Box<str>, Box<str>)]>,
    /// Field selector fields other than `metadata.name` and `metadata.namespace`.
    fields: Box<[(&'static str, Box<str>)]>,
}

impl Selectable {
    /// The name, namespace and labels of `object`, and these field values.
    pub fn new(object: &Value, fields: impl IntoIterator<Item = (&'static str, String)>) -> Self {
        let labels = capstan_machinery::meta::metadata(object)
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())));
        Self::from_parts(
            capstan_machinery::meta::name(object),
            capstan_machinery::meta::namespace(object),
            labels,
            fields,
        )
    }

    /// From the parts themselves (labels in any order).
    pub fn from_parts(
        name: &str,
        namespace: &str,
        labels: impl IntoIterator<Item = (String, String)>,
        fields: impl IntoIterator<Item = (&'static str, String)>,
    ) -> Self {
        let mut labels: Vec<(Box<str>, Box<str>)> = labels
            .into_iter()
            .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
            .collect();
        labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Self {
            name: name.into(),
            namespace: namespace.into(),
            labels: labels.into(),
            fields: fields
                .into_iter()
                .map(|(field, value)| (field, value.into_boxed_str()))
                .collect(),
        }
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.namespace` (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The value of one label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| &*self.labels[i].1)
    }

    /// The value of a field selector field; `None` for a field the kind is not selected by.
    pub fn field(&self, field: &str) -> Option<&str> {
        match field {
            "metadata.name" => Some(&self.name),
            "metadata.namespace" => Some(&self.namespace),
            _ => self
                .fields
                .iter()
                .find(|(f, _)| *f == field)
                .map(|(_, value)| &**value),
        }
    }

    /// Whether both selectors select the object. Empty selectors read nothing of it (in a long
    /// list, each object read is a cache miss).
    pub fn selected_by(
        &self,
        labels: &capstan_machinery::labels::LabelSelector,
        fields: &capstan_machinery::fields::FieldSelector,
    ) -> bool {
        labels.matches_with(|key| self.label(key)) && fields.matches(|f| self.field(f))
    }
}
