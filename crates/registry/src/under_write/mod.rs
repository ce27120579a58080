//! The object under write: the one owner of its forms.
//!
//! A write's object is JSON (what the generic half of a write edits, compares and stores) and,
//! while its kind's rules run, their typed view of it (decoded once and shared by every rule),
//! and for a controller's typed update also the members kept as encoded JSON (the stored
//! bytes of its large atomic lists, [`Detached`]). [`UnderWrite`] holds all three and keeps
//! them in agreement itself: every edit goes through it, and whatever reads the JSON reads it
//! with the rules' changes written in. No caller syncs the forms by hand.
//!
//! The JSON takes the rules' changes only when it is read, and an edit of system metadata
//! goes to both forms as they stand: a create whose rules are followed only by the
//! registry's own metadata edits writes their changes once, after the last rule.

use capstan_machinery::meta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use crate::detached::Detached;
use crate::object::Object;

mod view;
use view::RulesView;

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

/// An object being written: its JSON, the rules' typed view of it, and its detached members.
#[derive(Clone)]
pub struct UnderWrite {
    json: Value,
    view: RulesView,
    /// Whether the JSON is in its type's form (decoded from a body or encoded from the type):
    /// defaulting then writes it back only where it changed something. Other JSON (a JSON
    /// patch's result, an applied configuration) is normalized by defaulting.
    normal: bool,
    /// Whether a rule was lent the typed object since the JSON last took its changes.
    lent: bool,
}

impl UnderWrite {
    /// An object in its type's form (a decoded body), without a view yet.
    pub(crate) fn normal(json: Value) -> Self {
        UnderWrite {
            json,
            view: RulesView::default(),
            normal: true,
            lent: false,
        }
    }

    /// Any JSON (a JSON patch's result, an applied configuration): defaulting normalizes it.
    pub(crate) fn any(json: Value) -> Self {
        UnderWrite {
            normal: false,
            ..Self::normal(json)
        }
    }

    /// A typed object (a controller's, or a body decoded into its type) and its JSON,
    /// `json` encoded from `typed`: the rules take `typed` rather than decode the JSON again.
    pub(crate) fn typed<T: Object>(typed: T, json: Value) -> Self {
        UnderWrite {
            view: RulesView::of(typed),
            ..Self::normal(json)
        }
    }

    /// Also holds the stored object the write started from, as the rules see it.
    pub(crate) fn with_stored<T: Object>(mut self, stored: T) -> Self {
        self.view.set_stored(stored);
        self
    }

    /// The JSON has these members as `null` places, kept encoded ([`Detached`]).
    pub(crate) fn with_detached(mut self, detached: Detached) -> Self {
        self.view.set_detached(detached);
        self
    }

    /// Whether the JSON is in its type's form (see the field's doc).
    pub(crate) fn is_normal(&self) -> bool {
        self.normal
    }

    /// The JSON, with what the rules changed written in.
    pub(crate) fn json(&mut self) -> &Value {
        self.sync();
        &self.json
    }

    /// The JSON and the detached members (an encode, a comparison with the stored object).
    pub(crate) fn parts(&mut self) -> (&Value, &Detached) {
        self.sync();
        (&self.json, self.view.detached())
    }

    /// The members kept encoded.
    pub(crate) fn detached(&self) -> &Detached {
        self.view.detached()
    }

    /// The object's name (or `metadata.generateName`, `generate`) as the rules have left it,
    /// without writing their changes into the JSON first.
    pub(crate) fn name(&self, generate: bool) -> String {
        let from_view = self
            .view
            .meta()
            .filter(|_| self.lent)
            .map(|m| match generate {
                true => m.generate_name.clone().unwrap_or_default(),
                false => m.name.clone().unwrap_or_default(),
            });
        from_view.unwrap_or_else(|| match generate {
            true => meta::meta_str(&self.json, "generateName").to_string(),
            false => meta::name(&self.json).to_string(),
        })
    }

    fn sync(&mut self) {
        if std::mem::take(&mut self.lent) {
            self.view.sync(&mut self.json, true);
        }
    }

    /// The object as the kind's rules see it (held, or decoded now); the JSON takes what they
    /// change when it is next read.
    pub(crate) fn rules<T: Object>(&mut self) -> Result<&mut T, String> {
        self.lent = true;
        self.view.typed::<T>(&mut self.json)
    }

    /// The stored object the write started from, when it came typed ([`Self::with_stored`]).
    pub(crate) fn take_stored<T: Object>(&mut self) -> Option<T> {
        self.view.take_stored::<T>()
    }

    /// The rules are done: the JSON takes their changes and the view is dropped (an edit
    /// after this decodes again, should a rule ask).
    pub(crate) fn finish(&mut self) {
        self.lent = false;
        self.view.sync(&mut self.json, false);
    }

    /// [`Self::finish`], the object written back whole (a `/status` update's, put together
    /// from two objects in no particular order), in its type's order.
    pub(crate) fn finish_whole(&mut self) {
        self.lent = false;
        self.view.finish_whole(&mut self.json);
    }

    /// Edits the JSON alone (an applied configuration defaulted, a member taken from the stored
    /// object); when `edit` says it changed anything, the view is dropped, and the next rule
    /// decodes the object again.
    pub(crate) fn edit_json<R>(&mut self, edit: impl FnOnce(&mut Value) -> (R, bool)) -> R {
        self.sync();
        let (result, changed) = edit(&mut self.json);
        if changed {
            self.view.forget();
        }
        result
    }

    /// Defaulting normalized the JSON: it is in its type's form now.
    pub(crate) fn normalized(&mut self) {
        self.normal = true;
    }

    /// Edits what the rules never see, the JSON's `metadata.managedFields` (recorded,
    /// dropped for size): the view stays valid. `edit` is given the detached members too.
    pub(crate) fn edit_unseen<R>(&mut self, edit: impl FnOnce(&mut Value, &Detached) -> R) -> R {
        self.sync();
        edit(&mut self.json, self.view.detached())
    }

    /// Moves the JSON's `metadata.managedFields` aside or back, reading nothing else of it:
    /// the rules' changes need not be written in first (they keep the JSON's managedFields).
    pub(crate) fn move_managed_fields<R>(&mut self, edit: impl FnOnce(&mut Value) -> R) -> R {
        edit(&mut self.json)
    }

    /// Puts the detached members back: the JSON is whole (for what reads all of it).
    pub(crate) fn restore_detached(&mut self) {
        self.view.restore(&mut self.json);
    }

    // The registry's edits of system metadata below go to the JSON and to both of the view's
    // copies (as the rules left it, as the JSON has it) alike: the rules' changes not yet
    // written stay a difference between those copies, and no write is needed first.

    /// Drops what a create may not set ([`SERVER_SET`]) and puts the object in `namespace`
    /// (`None`: a cluster-scoped kind, which has none).
    pub(crate) fn clear_for_create(&mut self, namespace: Option<&str>) {
        let meta = meta::metadata_mut(&mut self.json);
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
        meta::set_meta_str(&mut self.json, "uid", uid);
        let created_text = meta::format_timestamp(created);
        meta::set_meta_str(&mut self.json, "creationTimestamp", &created_text);
        self.view.edit_meta(|m| {
            m.uid = Some(uid.to_string());
            m.creation_timestamp = Some(Time(created));
        });
    }

    /// Names the object (a generated name).
    pub(crate) fn set_name(&mut self, name: &str) {
        meta::set_meta_str(&mut self.json, "name", name);
        self.view.edit_meta(|m| m.name = Some(name.to_string()));
    }

    /// Sets `metadata.resourceVersion`: the version an update is pinned to, or (`""`) none.
    pub(crate) fn set_resource_version(&mut self, version: &str) {
        if version.is_empty() {
            meta::metadata_mut(&mut self.json).shift_remove("resourceVersion");
        } else {
            meta::set_meta_str(&mut self.json, "resourceVersion", version);
        }
        let version = (!version.is_empty()).then(|| version.to_string());
        self.view
            .edit_meta(|m| m.resource_version.clone_from(&version));
    }

    /// Upstream's `rest.BeforeUpdate` on the metadata: the object is in `namespace` (`None`:
    /// cluster-scoped, left as sent); its creation time is the stored one, and so is its uid
    /// unless it names one (a different one is refused later as immutable); a deletion time and grace period once set stay (setting them by
    /// update is refused later); generation and selfLink are the server's.
    pub(crate) fn before_update(&mut self, namespace: Option<&str>, stored: &Value) {
        self.sync();
        let new = &mut self.json;
        if let Some(namespace) = namespace {
            meta::set_meta_str(new, "namespace", namespace);
        }
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            let kept = meta::metadata(stored).and_then(|m| m.get(field)).cloned();
            let sent = meta::metadata(new).and_then(|m| m.get(field)).is_some();
            match kept {
                Some(_) if field == "uid" && !meta::meta_str(new, "uid").is_empty() => {}
                Some(value) if field != "deletionGracePeriodSeconds" || !sent => {
                    meta::metadata_mut(new).insert(field.into(), value);
                }
                Some(_) => {}
                None if matches!(field, "uid" | "creationTimestamp") => {
                    meta::metadata_mut(new).shift_remove(field);
                }
                None => {}
            }
        }
        meta::metadata_mut(new).shift_remove("generation");
        meta::metadata_mut(new).shift_remove("selfLink");
        // The metadata the rules see is the JSON's, as edited.
        self.view.refresh_meta(&self.json);
    }

    /// The object, with what the rules changed.
    pub(crate) fn into_json(mut self) -> Value {
        self.finish();
        self.json
    }

    /// The object as written at `revision`, without its detached members (a typed write's
    /// caller has them, as it wrote them).
    pub(crate) fn into_written(mut self, revision: capstan_storage::Revision) -> Value {
        self.finish();
        self.view.detached().strip(&mut self.json);
        meta::set_meta_str(&mut self.json, "resourceVersion", &revision.to_string());
        self.json
    }
}

#[cfg(test)]
mod tests;
