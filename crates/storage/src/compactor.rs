//! Scheduled compaction, the way kube-apiserver compacts etcd.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::{Revision, Storage, StorageError};

/// Compacts a store on a schedule. Every `interval` it notes the current revision and compacts
/// to the revision it noted one interval earlier, so at least one interval of history is always
/// kept — a client that listed and then watched within that interval never sees `Compacted`.
pub struct Compactor {
    task: JoinHandle<()>,
}

impl Compactor {
    /// Starts compacting `store` every `interval` (upstream's default is 5 minutes).
    pub fn start(store: Arc<dyn Storage>, interval: Duration) -> Self {
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // the first tick is immediate
            let mut previous: Option<Revision> = None;
            loop {
                ticks.tick().await;
                let current = match store.current_revision().await {
                    Ok(r) => r,
                    Err(error) => {
                        tracing::warn!(%error, "compaction: cannot read the current revision");
                        continue;
                    }
                };
                if let Some(target) = previous.filter(|r| *r > 0) {
                    match store.compact(target).await {
                        Ok(()) => tracing::info!(revision = target, "compacted storage history"),
                        Err(StorageError::Compacted { .. }) => {} // another replica got there
                        Err(error) => tracing::warn!(%error, "compaction failed"),
                    }
                }
                previous = Some(current);
            }
        });
        Self { task }
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.task.abort();
    }
}
