//! An informer's typed store: a kind's objects as its controller reads them, decoded from the
//! watch cache the informer follows, once per revision. The watch cache holds the objects
//! (as stored bytes); the store keeps only the decoded objects recently read, so a controller
//! that reads a few objects of a large kind pays for those alone.

use std::sync::Arc;

use capstan_machinery::ApiError;
use capstan_registry::Registry;
use capstan_registry::cache::ByRevision;

/// How a store decodes an object: from its stored JSON (without managedFields) and its
/// namespace and name, to what the controller reads of it (all of it, or a part).
pub type Decode<T> = fn(json: &[u8], namespace: &str, name: &str) -> Result<T, String>;

/// A kind's objects, typed.
pub struct Store<T> {
    registry: Arc<Registry>,
    decoded: ByRevision<Arc<T>>,
    decode: Decode<T>,
}

impl<T: Send + Sync + 'static> Store<T> {
    /// The objects of `registry`'s kind, decoded by `decode`, the last `kept` of them kept.
    pub fn new(registry: Arc<Registry>, kept: usize, decode: Decode<T>) -> Self {
        Store {
            registry,
            decoded: ByRevision::new(kept),
            decode,
        }
    }

    /// The object `namespace/name` as the watch cache holds it now, decoded; `None` when
    /// there is none.
    pub fn get(&self, namespace: &str, name: &str) -> Result<Option<Arc<T>>, ApiError> {
        let key = self.registry.strategy().info().key(namespace, name);
        let Some(cached) = self.registry.cache().get(&key) else {
            return Ok(None);
        };
        if let Some(object) = self.decoded.get(&cached.key, cached.revision) {
            return Ok(Some(object));
        }
        let object = (self.decode)(&cached.lean_json(), namespace, name)
            .map_err(|_| ApiError::internal(format!("undecodable object at {key}")))?;
        let object = Arc::new(object);
        self.decoded
            .put(cached.key.clone(), cached.revision, object.clone());
        Ok(Some(object))
    }
}
