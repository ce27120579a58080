//! The work queue controllers share, with client-go's guarantees.

use std::collections::HashSet;
use std::hash::Hash;

/// The controller's work queue, with client-go's guarantees: a key queued many times before a
/// worker takes it is synced once, and a key is never handed to two workers at once (a key
/// queued while it is being synced is synced again afterwards).
pub struct WorkQueue<K> {
    pub(crate) state: std::sync::Mutex<QueueState<K>>,
    ready: tokio::sync::Notify,
}

pub(crate) struct QueueState<K> {
    pub(crate) order: std::collections::VecDeque<K>,
    pub(crate) dirty: HashSet<K>,
    pub(crate) processing: HashSet<K>,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    /// Queues a key (once, however often it is added before a worker takes it).
    pub fn add(&self, key: K) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.dirty.insert(key.clone()) && !state.processing.contains(&key) {
            state.order.push_back(key);
            self.ready.notify_one();
        }
    }

    /// The next key to sync; waits for one.
    pub async fn next(&self) -> K {
        loop {
            {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(key) = state.order.pop_front() {
                    state.dirty.remove(&key);
                    state.processing.insert(key.clone());
                    if !state.order.is_empty() {
                        self.ready.notify_one();
                    }
                    return key;
                }
            }
            self.ready.notified().await;
        }
    }

    /// A worker finished a key; queues it again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.processing.remove(key);
        if state.dirty.contains(key) {
            state.order.push_back(key.clone());
            self.ready.notify_one();
        }
    }
}

impl<K> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            state: std::sync::Mutex::new(QueueState {
                order: std::collections::VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
            }),
            ready: tokio::sync::Notify::new(),
        }
    }
}
