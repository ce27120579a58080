//! The rules' typed view of an object under write, private to [`super::UnderWrite`].
//!
//! A write's object is decoded once for its kind's rules and shared by every rule the write
//! runs (defaulting, preparation, admission), instead of decoded from the JSON by each one.
//! The view holds the object as the rules have left it and as the JSON last had it (both
//! without managedFields, which the rules never see, so the registry's managedFields
//! bookkeeping on the JSON leaves it valid); [`RulesView::sync`] writes the rules' changes
//! into the JSON. A write of a typed object (a controller's) starts from that object, and a
//! patch of one also from the stored object it read: neither is decoded again from the JSON
//! made of it.
//!
//! It also carries the members of a typed write kept as encoded JSON ([`Detached`]), which
//! stay with the JSON when the view is dropped.

use std::any::Any;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::decode::{Level, Skipping, for_rules};
use crate::detached::Detached;
use crate::object::Object;
use crate::typed::{write_back, write_changes};

#[derive(Default)]
pub(super) struct RulesView {
    held: Option<Box<dyn Viewed>>,
    detached: Detached,
}

/// A [`RulesView`]'s object, of whatever kind.
trait Viewed: Send + Sync {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn edit_meta(&mut self, edit: &dyn Fn(&mut ObjectMeta));
    /// The metadata as the rules have left it.
    fn meta(&self) -> &ObjectMeta;
    fn boxed_clone(&self) -> Box<dyn Viewed>;
    /// Writes what the rules changed into `json` ([`write_changes`]); `keep`: the view stays
    /// in step with it (else it is about to be dropped, and is not copied). Whether the
    /// members were written whole.
    fn sync(&mut self, json: &mut Value, keep: bool) -> bool;
    /// Writes the object into `json` whole ([`write_back`]).
    fn write_whole(&self, json: &mut Value);
}

/// The object as the rules have left it, and as the JSON has it; and the stored object as
/// the rules see it, when the write had it typed already.
struct Held<T> {
    current: T,
    synced: T,
    stored: Option<T>,
}

impl<T: Object> Viewed for Held<T> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn edit_meta(&mut self, edit: &dyn Fn(&mut ObjectMeta)) {
        edit(self.current.metadata_mut());
        edit(self.synced.metadata_mut());
    }

    fn meta(&self) -> &ObjectMeta {
        self.current.metadata()
    }

    fn boxed_clone(&self) -> Box<dyn Viewed> {
        Box::new(Held {
            current: self.current.clone(),
            synced: self.synced.clone(),
            stored: self.stored.clone(),
        })
    }

    fn sync(&mut self, json: &mut Value, keep: bool) -> bool {
        if self.current == self.synced {
            return false;
        }
        let whole = write_changes(json, &mut self.current, &mut self.synced);
        if keep {
            self.synced = self.current.clone();
        }
        whole
    }

    fn write_whole(&self, json: &mut Value) {
        write_back(json, &self.current, self.synced.metadata());
    }
}

impl Clone for RulesView {
    fn clone(&self) -> Self {
        RulesView {
            held: self.held.as_ref().map(|held| held.boxed_clone()),
            detached: self.detached.clone(),
        }
    }
}

impl RulesView {
    /// The view of a typed object about to be written as JSON (without its managedFields).
    pub(super) fn of<T: Object>(mut object: T) -> Self {
        object.metadata_mut().managed_fields = None;
        RulesView {
            held: Some(Box::new(Held {
                synced: object.clone(),
                current: object,
                stored: None,
            })),
            detached: Detached::default(),
        }
    }

    pub(super) fn set_detached(&mut self, detached: Detached) {
        self.detached = detached;
    }

    pub(super) fn detached(&self) -> &Detached {
        &self.detached
    }

    /// Puts the detached members back into `json` ([`Detached::restore`]).
    pub(super) fn restore(&mut self, json: &mut Value) {
        self.detached.restore(json);
    }

    pub(super) fn set_stored<T: Object>(&mut self, stored: T) {
        if let Some(held) = self.held::<T>() {
            held.stored = Some(stored);
        }
    }

    pub(super) fn take_stored<T: Object>(&mut self) -> Option<T> {
        self.held::<T>()?.stored.take()
    }

    /// Takes the held object's metadata from `json` (which the registry has edited); drops
    /// the view when it does not decode.
    pub(super) fn refresh_meta(&mut self, json: &Value) {
        let Some(held) = &mut self.held else {
            return;
        };
        let decoded = json.get("metadata").map(|m| {
            <ObjectMeta as serde::Deserialize>::deserialize(Skipping {
                inner: m,
                level: Level::Metadata,
            })
        });
        match decoded {
            Some(Ok(metadata)) => held.edit_meta(&|m| *m = metadata.clone()),
            _ => self.forget(),
        }
    }

    /// Makes the same edit of system metadata the registry makes of the JSON.
    pub(super) fn edit_meta(&mut self, edit: impl Fn(&mut ObjectMeta)) {
        if let Some(held) = &mut self.held {
            held.edit_meta(&edit);
        }
    }

    /// The metadata as the rules have left it, when the view holds an object.
    pub(super) fn meta(&self) -> Option<&ObjectMeta> {
        self.held.as_ref().map(|held| held.meta())
    }

    /// Drops the decoded object: the JSON was changed otherwise.
    pub(super) fn forget(&mut self) {
        self.held = None;
    }

    fn held<T: Object>(&mut self) -> Option<&mut Held<T>> {
        self.held.as_mut()?.as_any_mut().downcast_mut::<Held<T>>()
    }

    /// The object as the rules see it: held, or decoded from `json` ([`for_rules`]; with its
    /// detached members put back first).
    pub(super) fn typed<T: Object>(&mut self, json: &mut Value) -> Result<&mut T, String> {
        if self.held::<T>().is_none() {
            self.detached.restore(json);
            let current: T = for_rules(json)?;
            self.held = Some(Box::new(Held {
                synced: current.clone(),
                current,
                stored: None,
            }));
        }
        self.held::<T>()
            .map(|held| &mut held.current)
            .ok_or_else(|| "the view holds another kind".to_string())
    }

    /// Brings `json` up to date with what the rules changed; `keep`: the view stays (else it
    /// is dropped, and what the JSON now has is not copied again: for a slice, most of a
    /// write's allocations after its decode and encode).
    pub(super) fn sync(&mut self, json: &mut Value, keep: bool) {
        if let Some(held) = &mut self.held
            && held.sync(json, keep)
        {
            self.detached.clear();
        }
        if !keep {
            self.forget();
        }
    }

    /// Writes the object into `json` whole, and drops the view.
    pub(super) fn finish_whole(&mut self, json: &mut Value) {
        if let Some(held) = &self.held {
            held.write_whole(json);
            self.detached.clear();
        }
        self.forget();
    }
}
