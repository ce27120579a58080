//! What selectors read of a cached object.

use std::sync::Arc;

use serde_json::Value;

/// A kind's [`Selectable`] of an object.
pub type Projection = Arc<dyn Fn(&Value) -> Selectable + Send + Sync>;

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
        let mut labels: Vec<(Box<str>, Box<str>)> = capstan_machinery::meta::metadata(object)
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|labels| {
                labels
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                    .collect()
            })
            .unwrap_or_default();
        labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Self {
            name: capstan_machinery::meta::name(object).into(),
            namespace: capstan_machinery::meta::namespace(object).into(),
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
