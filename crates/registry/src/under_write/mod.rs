//! The registry's own edits of an object under write: its JSON (what is stored) and the rules'
//! typed view of it ([`RulesView`]) edited together, here alone, so that no caller keeps the
//! two forms in step by hand.

use capstan_machinery::meta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use crate::typed::RulesView;

/// The system metadata a create takes from the server, never from the client.
const SERVER_SET: &[&str] = &[
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "resourceVersion",
    "generation",
];

/// An object under write, in both its forms.
pub(crate) struct UnderWrite<'a> {
    json: &'a mut Value,
    view: &'a mut RulesView,
}

impl<'a> UnderWrite<'a> {
    /// The object `json`, with the rules' view of it.
    pub(crate) fn new(json: &'a mut Value, view: &'a mut RulesView) -> Self {
        UnderWrite { json, view }
    }

    /// Drops what a create may not set ([`SERVER_SET`]) and puts the object in `namespace`
    /// (`None`: a cluster-scoped kind, which has none).
    pub(crate) fn clear_for_create(&mut self, namespace: Option<&str>) {
        let meta = meta::metadata_mut(self.json);
        for field in SERVER_SET {
            meta.shift_remove(*field);
        }
        match namespace {
            Some(namespace) => meta.insert("namespace".into(), json!(namespace)),
            None => meta.shift_remove("namespace"),
        };
        self.view.edit_meta(|m| {
            (m.uid, m.creation_timestamp, m.deletion_timestamp) = (None, None, None);
            (m.deletion_grace_period_seconds, m.self_link) = (None, None);
            (m.resource_version, m.generation) = (None, None);
            m.namespace = namespace.map(str::to_string);
        });
    }

    /// Gives the object its identity: `uid` and its creation time.
    pub(crate) fn set_identity(&mut self, uid: &str, created: k8s_openapi::jiff::Timestamp) {
        meta::set_meta_str(self.json, "uid", uid);
        let created_text = meta::format_timestamp(created);
        meta::set_meta_str(self.json, "creationTimestamp", &created_text);
        self.view.edit_meta(|m| {
            m.uid = Some(uid.to_string());
            m.creation_timestamp = Some(Time(created));
        });
    }

    /// Edits the JSON alone (an applied configuration defaulted, a member taken from the stored
    /// object); when `edit` says it changed anything, the view is dropped, and the next rule
    /// decodes the object again.
    pub(crate) fn edit_json<R>(&mut self, edit: impl FnOnce(&mut Value) -> (R, bool)) -> R {
        let (result, changed) = edit(self.json);
        if changed {
            self.view.forget();
        }
        result
    }

    /// Names the object (a generated name).
    pub(crate) fn set_name(&mut self, name: &str) {
        meta::set_meta_str(self.json, "name", name);
        self.view.edit_meta(|m| m.name = Some(name.to_string()));
    }
}
