//! A create's managedFields (`record_create`), and the `Changes` a comparison reports to.

use std::borrow::Cow;

use capstan_machinery::meta;
use serde_json::Value;

use super::{Comparison, Path, Tracking, compare_node, entry, fields_v1, put_entries};
#[cfg(debug_assertions)]
use super::{compare, record};

/// Where a comparison puts what it finds, as it walks: each path changed (added anew, or
/// modified) or removed.
pub(super) trait Changes {
    fn added(&mut self, path: &Path);
    fn modified(&mut self, path: &Path);
    fn removed(&mut self, path: &Path);
}

impl Changes for Comparison {
    fn added(&mut self, path: &Path) {
        self.added.insert(path.clone());
    }

    fn modified(&mut self, path: &Path) {
        self.modified.insert(path.clone());
    }

    fn removed(&mut self, path: &Path) {
        self.removed.insert(path.clone());
    }
}

/// What a create's manager takes: the paths it changed that the write records, straight into
/// the tree `fieldsV1` is rendered from (no set of paths first; nothing to take away from other
/// managers, as there are none).
struct Taken<'t> {
    tracking: &'t Tracking,
    fields: fields_v1::Tree<'static>,
}

impl Changes for Taken<'_> {
    fn added(&mut self, path: &Path) {
        if self.tracking.records(path) {
            self.fields.insert(path, |step| Cow::Owned(step.clone()));
        }
    }

    fn modified(&mut self, path: &Path) {
        self.added(path);
    }

    fn removed(&mut self, _: &Path) {}
}

/// [`record_update`] of a create: `new` compared with the kind's Go zero value, the manager
/// taking every path that changed and is recorded, and no other manager to take it from.
pub(super) fn record_create(new: &mut Value, manager: &str, tracking: &Tracking) {
    #[cfg(debug_assertions)]
    let by_sets = {
        let mut object = new.clone();
        let comparison = compare(tracking.zero(), &object, tracking.schema);
        record(&mut object, comparison, Vec::new(), manager, tracking);
        object
    };
    let mut taken = Taken {
        tracking,
        fields: fields_v1::Tree::default(),
    };
    compare_node(
        Some(tracking.zero()),
        Some(new),
        tracking.schema,
        &mut Vec::new(),
        &mut taken,
    );
    let mut entries = Vec::new();
    if !taken.fields.is_empty() {
        let mut fresh = entry(manager, "Update", tracking, &meta::now_rfc3339());
        fresh["fieldsV1"] = taken.fields.render();
        entries.push(fresh);
    }
    put_entries(new, entries);
    #[cfg(debug_assertions)]
    {
        // The same entries as the general bookkeeping's, but for the time of day, compared as
        // JSON text (a JSON tree's maps compare without their order, and fieldsV1's matters).
        let entries = |object: &Value| {
            let mut entries = meta::metadata(object)
                .and_then(|m| m.get("managedFields"))
                .cloned();
            for entry in entries.iter_mut().flat_map(|e| e.as_array_mut()).flatten() {
                entry.as_object_mut().map(|e| e.shift_remove("time"));
            }
            entries.map(|entries| entries.to_string())
        };
        debug_assert_eq!(entries(new), entries(&by_sets), "a create's managedFields");
    }
}
