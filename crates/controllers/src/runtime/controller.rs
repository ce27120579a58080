//! The shape every queue-driven controller has: a work queue of keys, the informers whose
//! first list must be in before work starts, and workers that reconcile one key at a time.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use std::time::Duration;

use capstan_registry::Registry;

use crate::runtime::{Backoff, Informer, Progress, WorkQueue, synced};

/// What a periodic recheck queues.
type Due<K> = Box<dyn FnMut() -> Vec<K> + Send>;

/// A controller: its name (in the log), its queue, how many keys it reconciles at once (one
/// key is never reconciled twice at once), the informers it waits for, and its rechecks.
pub struct Controller<K> {
    name: &'static str,
    queue: Arc<WorkQueue<K>>,
    workers: usize,
    informers: Vec<Progress>,
    rechecks: Vec<(Duration, Due<K>)>,
}

impl Controller<String> {
    /// A controller of one cluster-scoped kind's objects, by name: its informer (started now,
    /// on the current runtime) queues every object added or changed, and work starts once it
    /// has listed them; failures are retried with `backoff`.
    pub fn of_kind(name: &'static str, registry: Arc<Registry>, backoff: Backoff) -> Self {
        let queue = Arc::new(WorkQueue::with_backoff(backoff));
        let informer = Informer::new(registry)
            .enqueue_changes(queue.clone())
            .start();
        Controller::new(name, queue).after([informer])
    }
}

impl<K: Clone + Eq + Hash + Debug + Send + Sync + 'static> Controller<K> {
    /// A controller named `name` working off `queue`, one key at a time.
    pub fn new(name: &'static str, queue: Arc<WorkQueue<K>>) -> Self {
        Controller {
            name,
            queue,
            workers: 1,
            informers: Vec::new(),
            rechecks: Vec::new(),
        }
    }

    /// Its queue, for informers of other kinds that wake its keys.
    pub fn queue(&self) -> &Arc<WorkQueue<K>> {
        &self.queue
    }

    /// Also queues, every `period`, the keys `due` names: what time alone changes (a grace
    /// period running out, a backend that stopped answering), as an informer's resync.
    pub fn every(mut self, period: Duration, due: impl FnMut() -> Vec<K> + Send + 'static) -> Self {
        self.rechecks.push((period, Box::new(due)));
        self
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
        for (period, mut due) in self.rechecks {
            let queue = self.queue.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    for key in due() {
                        queue.add(key);
                    }
                }
            });
        }
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
