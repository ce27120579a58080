//! Values derived from cached objects, kept with the revision each was derived at.

use std::sync::{Arc, Mutex};

use capstan_machinery::hash::HashMap;

use capstan_storage::Revision;

/// Values derived from stored objects (a decoded part, a verdict), each kept by the object's
/// key with the revision it was derived at: it is derived again only once the object changed.
/// At most `capacity` are kept; past that, one goes for each newly kept.
pub struct ByRevision<V> {
    kept: Mutex<HashMap<Arc<str>, (Revision, V)>>,
    capacity: usize,
}

impl<V: Clone> ByRevision<V> {
    /// Keeping at most `capacity` values.
    pub fn new(capacity: usize) -> Self {
        ByRevision {
            kept: Mutex::default(),
            capacity,
        }
    }

    /// The value kept for `key`, if it was derived at `revision`.
    pub fn get(&self, key: &str, revision: Revision) -> Option<V> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(key)
            .filter(|(at, _)| *at == revision)
            .map(|(_, value)| value.clone())
    }

    /// Keeps `value`, derived from `key`'s object at `revision`.
    pub fn put(&self, key: impl Into<Arc<str>>, revision: Revision, value: V) {
        let key = key.into();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= self.capacity
            && !kept.contains_key(&key)
            && let Some(any) = kept.keys().next().cloned()
        {
            kept.remove(&any);
        }
        kept.insert(key, (revision, value));
    }
}

#[cfg(test)]
mod tests {
    use super::ByRevision;

    #[test]
    fn a_value_is_kept_for_its_revision_and_within_the_capacity() {
        let kept = ByRevision::new(2);
        kept.put("a", 1, "one");
        assert_eq!(kept.get("a", 1), Some("one"));
        assert_eq!(kept.get("a", 2), None);
        kept.put("a", 2, "two");
        kept.put("b", 1, "b");
        // Full: a refresh of a kept key evicts nothing; a new key evicts one.
        kept.put("b", 2, "b2");
        assert_eq!(
            (kept.get("a", 2), kept.get("b", 2)),
            (Some("two"), Some("b2"))
        );
        kept.put("c", 1, "c");
        assert_eq!(kept.get("c", 1), Some("c"));
        assert_eq!(
            [kept.get("a", 2), kept.get("b", 2)]
                .iter()
                .flatten()
                .count(),
            1
        );
    }
}
