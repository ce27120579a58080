//! Writes of a typed object (the controllers'): the object is encoded once per attempt inside
//! the registry's write, not copied as JSON first, and a patch reads the stored object as its
//! type without a copy that carries `kind` and `apiVersion`. The rules are handed the typed
//! objects (the new one, and a patch's stored one) instead of decoding them from the JSON.

use super::*;
use crate::strategy::Object;
use crate::typed::{RulesView, from_typed};

impl Registry {
    /// [`Registry::update`] of a typed object (pinned to its `resourceVersion` when it has one).
    pub async fn update_typed<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        new: &T,
        options: &WriteOptions,
        subresource: Subresource,
    ) -> Result<(Value, bool), ApiError> {
        let pinned = new.metadata().resource_version.clone().unwrap_or_default();
        self.update_with(namespace, name, &pinned, options, subresource, |_| {
            Ok((from_typed(new), RulesView::of(new.clone())))
        })
        .await
    }

    /// [`Registry::patch`] whose `apply` makes the new object from the stored one, as its
    /// type (borrowed: the rules keep it, and what `apply` replaces is not copied first); the
    /// object must exist. `apply` is given the object without its managedFields, which the
    /// registry keeps itself (an update's entries come from the stored object, not from the
    /// new one).
    pub async fn patch_typed<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        options: &WriteOptions,
        subresource: Subresource,
        apply: impl Fn(&T) -> Result<T, ApiError>,
    ) -> Result<Value, ApiError> {
        self.patch_with(
            (namespace, name),
            options,
            subresource,
            Form::Normal,
            |current| {
                let stored: T = current.typed().map_err(ApiError::internal)?;
                let patched = apply(&stored)?;
                let json = from_typed(&patched);
                Ok((json, RulesView::of(patched).with_stored(stored)))
            },
        )
        .await
    }
}
