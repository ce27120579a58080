//! Writes of a typed object (the controllers'): the object is encoded once per attempt inside
//! the registry's write, not copied as JSON first, and a patch reads the stored object as its
//! type without a copy that carries `kind` and `apiVersion`.

use super::*;
use crate::strategy::Object;
use crate::typed::{for_rules, from_typed};

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
            Ok(from_typed(new))
        })
        .await
    }

    /// [`Registry::patch`] whose `apply` changes the stored object as its type; the object
    /// must exist. `apply` is given the object without its managedFields, which the registry
    /// keeps itself (an update's entries come from the stored object, not from the new one).
    pub async fn patch_typed<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        options: &WriteOptions,
        subresource: Subresource,
        apply: impl Fn(T) -> Result<T, ApiError>,
    ) -> Result<Value, ApiError> {
        self.patch_with(
            (namespace, name),
            options,
            subresource,
            Form::Normal,
            |current| {
                let typed: T = for_rules(current).map_err(ApiError::internal)?;
                Ok(from_typed(&apply(typed)?))
            },
        )
        .await
    }
}
