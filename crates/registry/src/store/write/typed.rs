//! Writes of a typed object (the controllers'): the object is encoded once per attempt inside
//! the registry's write, not copied as JSON first, and a patch reads the stored object as its
//! type without a copy that carries `kind` and `apiVersion`. The rules are handed the typed
//! objects (the new one, and a patch's stored one) instead of decoding them from the JSON.
//!
//! An update made from the stored object ([`Registry::update_typed_over`],
//! [`Registry::patch_typed`]) keeps the kind's atomic lists as encoded JSON
//! ([`crate::detached`]): the object it returns after writing is without them (its caller has
//! them; a write that changes nothing returns the stored object whole).

use super::*;
use crate::detached::{Detached, atomic_member, from_typed_detaching};
use crate::object::Object;
use crate::object::from_typed;
use crate::under_write::UnderWrite;

impl Registry {
    /// [`Registry::create`] of a typed object: the rules take it as it is (without what a
    /// create drops of the metadata it is given, in the namespace it is made in) rather than
    /// decoding it again from the JSON made of it. So it must be in the form that JSON
    /// decodes to, as a controller's objects are: where its kind's rules tell an empty list
    /// from an absent one, none empty (the JSON leaves them out), and times in whole seconds.
    pub async fn create_typed<T: Object>(
        &self,
        namespace: &str,
        new: &T,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let object = UnderWrite::typed(new.clone(), from_typed(new));
        let created = self.create_under_write(namespace, object, options);
        Ok(created.await?.object)
    }

    /// [`Registry::update`] of a typed object (pinned to its `resourceVersion` when it has one).
    pub async fn update_typed<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        new: &T,
        options: &WriteOptions,
        subresource: Subresource,
    ) -> Result<(Value, bool), ApiError> {
        self.update_typed_with(namespace, name, (new, None), options, (subresource, false))
            .await
    }

    /// [`Registry::update_typed`] of an object its caller made from the stored one it read,
    /// `read` (as [`crate::current::Current::typed`] decodes it: without managedFields, its
    /// `resourceVersion` the revision it was read at, as the watch cache held it): when the
    /// write finds that revision still stored, the rules take `read` as the stored object
    /// instead of decoding the stored JSON again (the second decode of the same slice in a
    /// controller's sync). `read` must be the object as read, not changed since. The object
    /// returned is without the kind's atomic lists (see the module's doc).
    pub async fn update_typed_over<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        (new, read): (&T, Option<T>),
        options: &WriteOptions,
        subresource: Subresource,
    ) -> Result<(Value, bool), ApiError> {
        self.update_typed_with(namespace, name, (new, read), options, (subresource, true))
            .await
    }

    /// [`Registry::update_typed_over`]; `detach`: with the atomic lists kept as encoded JSON.
    async fn update_typed_with<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        (new, read): (&T, Option<T>),
        options: &WriteOptions,
        (subresource, detach): (Subresource, bool),
    ) -> Result<(Value, bool), ApiError> {
        let pinned = new.metadata().resource_version.clone().unwrap_or_default();
        // Taken by the first attempt; a retry reads a newer object.
        let read = std::sync::Mutex::new(read);
        self.update_with(namespace, name, &pinned, options, subresource, |current| {
            // (Nothing stored: the update creates, from the whole JSON.)
            let (json, detached) = match current {
                Some(_) if detach => self.detaching(new, subresource),
                _ => (from_typed(new), Detached::default()),
            };
            let mut object = UnderWrite::typed(new.clone(), json).with_detached(detached);
            let read = read.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let (Some(read), Some(current)) = (read, current)
                && read.metadata().resource_version.as_deref()
                    == Some(meta::resource_version(current.meta()))
            {
                object = object.with_stored(read);
            }
            Ok(object)
        })
        .await
    }

    /// The JSON of a typed update's object, with the kind's atomic lists kept as encoded JSON
    /// (not for `/status`, whose object is put together from the stored one's JSON).
    fn detaching<T: Object>(&self, new: &T, subresource: Subresource) -> (Value, Detached) {
        let schema = self.strategy.schema();
        match subresource {
            Subresource::Main => {
                from_typed_detaching(new, schema, &|key| atomic_member(schema, key))
            }
            Subresource::Status | Subresource::Finalize => (from_typed(new), Detached::default()),
        }
    }

    /// [`Registry::patch`] whose `apply` makes the new object from the stored one, as its
    /// type (borrowed: the rules keep it, and what `apply` replaces is not copied first); the
    /// object must exist. `apply` is given the object without its managedFields, which the
    /// registry keeps itself (an update's entries come from the stored object, not from the
    /// new one). The object returned is without the kind's atomic lists (see the module's doc).
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
            // The rules' stored object is decoded from the stored JSON into its type.
            Reads::Members,
            |current| {
                let stored: T = current.typed().map_err(ApiError::internal)?;
                let patched = apply(&stored)?;
                let (json, detached) = self.detaching(&patched, subresource);
                let object = UnderWrite::typed(patched, json).with_detached(detached);
                Ok(object.with_stored(stored))
            },
        )
        .await
    }
}
