//! What a controller that keeps several objects per key (the EndpointSlice and mirroring
//! controllers) must know before it reads its own objects back: upstream's
//! `endpointSliceTracker.StaleSlices`.
//!
//! Such a controller finds a Service's slices through an index that its slice watch fills. Its
//! own writes reach that index a little after the write returns, so a sync that ran in between
//! would miss a slice it had just created and create its endpoints a second time. Each key's
//! last write is remembered here, and a sync first waits until the watch has filed it.

use capstan_machinery::hash::{HashMap, HashMapExt};
use std::hash::Hash;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use capstan_machinery::ApiError;
use capstan_storage::Revision;

/// How long a sync waits for its own last write to reach the index before it is retried.
const CATCH_UP: Duration = Duration::from_secs(1);

/// The revision of each key's last write, and how far the index has got.
pub struct OwnWrites<K> {
    written: Mutex<HashMap<K, Revision>>,
    indexed: OnceLock<crate::runtime::Progress>,
}

impl<K: Eq + Hash + Clone> Default for OwnWrites<K> {
    fn default() -> Self {
        OwnWrites {
            written: Mutex::new(HashMap::new()),
            indexed: OnceLock::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> OwnWrites<K> {
    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<K, Revision>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The index's progress, as its [`crate::runtime::Informer`] answers it.
    pub fn follow(&self, indexed: crate::runtime::Progress) {
        let _ = self.indexed.set(indexed);
    }

    /// Remembers a write for `key`: the object it returned.
    pub fn record(&self, key: &K, object: &serde_json::Value) {
        let revision = capstan_machinery::meta::meta_str(object, "resourceVersion").parse();
        if let Ok(revision) = revision {
            let mut written = self.written();
            let last = written.entry(key.clone()).or_insert(revision);
            *last = (*last).max(revision);
        }
    }

    /// Forgets a key that is gone.
    pub fn forget(&self, key: &K) {
        self.written().remove(key);
    }

    /// Refuses a sync (to be retried) while the index does not show the last write for `key`,
    /// after waiting a little for it: upstream's stale-informer error.
    pub async fn ensure_caught_up(&self, key: &K) -> Result<(), ApiError> {
        if self.caught_up(key).await {
            Ok(())
        } else {
            Err(ApiError::internal(
                "EndpointSlice informer cache is out of date",
            ))
        }
    }

    /// Whether the index shows the last write for `key`, waiting a little for it; `false`
    /// when it still does not, or the index was never started.
    async fn caught_up(&self, key: &K) -> bool {
        let Some(revision) = self.written().get(key).copied() else {
            return true;
        };
        let Some(indexed) = self.indexed.get() else {
            return false;
        };
        let mut indexed = indexed.clone();
        let caught_up = |r: &Option<Revision>| r.is_some_and(|r| r >= revision);
        let reached = tokio::time::timeout(CATCH_UP, indexed.wait_for(caught_up)).await;
        matches!(reached, Ok(Ok(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::sync::watch;

    #[tokio::test(start_paused = true)]
    async fn a_sync_waits_until_the_index_shows_its_keys_last_write() {
        let writes = OwnWrites::<&str>::default();
        assert!(
            writes.caught_up(&"a").await,
            "nothing written: nothing to wait for"
        );
        writes.record(&"a", &json!({"metadata": {"resourceVersion": "12"}}));
        writes.record(&"a", &json!({"metadata": {"resourceVersion": "9"}}));
        assert!(!writes.caught_up(&"a").await, "no index yet");
        let (progress, indexed) = watch::channel(Some(11));
        writes.follow(indexed);
        assert!(
            !writes.caught_up(&"a").await,
            "the index is at 11, the write at 12"
        );
        assert!(
            writes.caught_up(&"b").await,
            "another key's writes do not hold it up"
        );
        let waiting = tokio::spawn(async move { writes.caught_up(&"a").await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        progress.send_replace(Some(12));
        assert!(
            waiting.await.expect("joined"),
            "the index reached the write"
        );
    }
}
