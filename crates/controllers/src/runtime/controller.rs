//! The shape every queue-driven controller has: a work queue of keys, the informers whose
//! first list must be in before work starts, and workers that reconcile one key at a time.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use crate::runtime::{Progress, WorkQueue, synced};

/// A controller: its name (in the log), its queue, how many keys it reconciles at once (one
/// key is never reconciled twice at once), and the informers it waits for.
pub struct Controller<K> {
    name: &'static str,
    queue: Arc<WorkQueue<K>>,
    workers: usize,
    informers: Vec<Progress>,
}

impl<K: Clone + Eq + Hash + Debug + Send + Sync + 'static> Controller<K> {
    /// A controller named `name` working off `queue`, one key at a time.
    pub fn new(name: &'static str, queue: Arc<WorkQueue<K>>) -> Self {
        Controller {
            name,
            queue,
            workers: 1,
            informers: Vec::new(),
        }
    }

    /// Reconciles up to `workers` keys at once (at least one).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Starts work only once these informers have listed what exists.
    pub fn after(mut self, informers: impl IntoIterator<Item = Progress>) -> Self {
        self.informers.extend(informers);
        self
    }

    /// Runs the workers on the current runtime's tasks for the life of that runtime: each
    /// takes a key, reconciles it, and on failure queues it again after its back-off.
    pub fn run<F, Fut, E>(self, reconcile: F)
    where
        F: Fn(K) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send,
        E: Display,
    {
        for _ in 0..self.workers {
            let (queue, informers, reconcile) = (
                self.queue.clone(),
                self.informers.clone(),
                reconcile.clone(),
            );
            let name = self.name;
            tokio::spawn(async move {
                synced(&informers).await;
                queue.work(name, reconcile).await
            });
        }
    }
}
