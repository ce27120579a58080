//! The work queue controllers share, with client-go's guarantees and back-off.

use capstan_machinery::hash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// The controller's work queue, with client-go's guarantees: a key queued many times before a
/// worker takes it is synced once, and a key is never handed to two workers at once (a key
/// queued while it is being synced is synced again afterwards).
pub struct WorkQueue<K> {
    pub(crate) state: std::sync::Mutex<QueueState<K>>,
    ready: tokio::sync::Notify,
    backoff: Backoff,
    failures: std::sync::Mutex<HashMap<K, u32>>,
}

/// How failed syncs are retried: client-go's per-item exponential failure rate limiter
/// (`base · 2^(failures−1)`, capped at `max`), and how many retries a key gets before it is
/// dropped until its next change (`None`: never dropped).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first delay.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
    /// Retries before the key is dropped.
    pub max_retries: Option<u32>,
}

impl Backoff {
    /// client-go's `DefaultControllerRateLimiter` item limiter (5 ms doubling to 1,000 s), with
    /// the endpoints controller's 15 retries.
    pub const CONTROLLER: Backoff = Backoff::new(ms(5), secs(1000), Some(15));

    /// The EndpointSlice controller's service queue (`defaultSyncBackOff` 1 s doubling to
    /// `maxSyncBackOff` 1,000 s, 15 retries).
    pub const ENDPOINT_SLICES: Backoff = Backoff::new(secs(1), secs(1000), Some(15));

    /// The EndpointSlice mirroring controller's queue (1 s doubling to 100 s, 15 retries).
    pub const MIRRORING: Backoff = Backoff::new(secs(1), secs(100), Some(15));

    /// For a controller whose keys must converge however long it takes (namespace deletion,
    /// APIService availability): 5 ms doubling to 30 s, never dropped.
    pub const NEVER_DROPPED: Backoff = Backoff::new(ms(5), secs(30), None);

    /// Delays from `base` doubling to `max`; a key is dropped after `max_retries` retries.
    pub const fn new(base: Duration, max: Duration, max_retries: Option<u32>) -> Self {
        Backoff {
            base,
            max,
            max_retries,
        }
    }

    /// The delay before retry number `failures` (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(30);
        self.base.saturating_mul(1u32 << exponent).min(self.max)
    }
}

const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

const fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

pub(crate) struct QueueState<K> {
    pub(crate) order: std::collections::VecDeque<K>,
    pub(crate) dirty: HashSet<K>,
    pub(crate) processing: HashSet<K>,
}

impl<K: Clone + Eq + Hash + std::fmt::Debug + Send + Sync + 'static> WorkQueue<K> {
    /// One worker, for the life of the process: takes a key, syncs it, and forgets its
    /// failures on success or queues it again after its back-off on failure; a key that failed
    /// more often than the back-off allows is dropped until it is added again (`what` names the
    /// work in the log).
    pub async fn work<F, Fut, E>(self: Arc<Self>, what: &'static str, sync: F)
    where
        F: Fn(K) -> Fut,
        Fut: std::future::Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        loop {
            let key = self.next().await;
            let result = sync(key.clone()).await;
            self.done(&key);
            match result {
                Ok(()) => self.forget(&key),
                Err(error) => match self.retry_later(key.clone()) {
                    Some(delay) => {
                        tracing::debug!(?key, %error, ?delay, "{what} failed; retrying")
                    }
                    None => tracing::warn!(
                        ?key,
                        %error,
                        "{what} failed too often; dropped until it changes again"
                    ),
                },
            }
        }
    }
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

    /// The key synced: its failures are forgotten.
    pub fn forget(&self, key: &K) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// The key failed to sync: it is queued again after its back-off delay, which grows with
    /// every consecutive failure; past the retry limit it is dropped (and forgotten) until it
    /// is added again. Returns the delay, or `None` when the key was dropped.
    pub fn retry_later(self: &Arc<Self>, key: K) -> Option<Duration>
    where
        K: Send + Sync + 'static,
    {
        let failures = {
            let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let count = failures.entry(key.clone()).or_insert(0);
            *count = count.saturating_add(1);
            let count = *count;
            if self.backoff.max_retries.is_some_and(|max| count > max) {
                failures.remove(&key);
                return None;
            }
            count
        };
        let delay = self.backoff.delay(failures);
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
        Some(delay)
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

impl<K> WorkQueue<K> {
    /// An empty queue whose failed keys are retried with `backoff`.
    pub fn with_backoff(backoff: Backoff) -> Self {
        WorkQueue {
            backoff,
            ..Self::default()
        }
    }
}

impl<K> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            backoff: Backoff::CONTROLLER,
            failures: std::sync::Mutex::new(HashMap::new()),
            state: std::sync::Mutex::new(QueueState {
                order: std::collections::VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
            }),
            ready: tokio::sync::Notify::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_from_five_milliseconds_and_stops_at_the_cap() {
        let backoff = Backoff::CONTROLLER;
        assert_eq!(backoff.delay(1), Duration::from_millis(5));
        assert_eq!(backoff.delay(2), Duration::from_millis(10));
        assert_eq!(backoff.delay(11), Duration::from_millis(5 * 1024));
        assert_eq!(backoff.delay(40), Duration::from_secs(1000));
    }

    #[tokio::test]
    async fn a_failing_key_is_retried_later_each_time_then_dropped() {
        let queue = Arc::new(WorkQueue::<u32>::with_backoff(Backoff {
            base: Duration::from_millis(1),
            max: Duration::from_millis(4),
            max_retries: Some(3),
        }));
        let delays: Vec<Option<Duration>> = (0..4).map(|_| queue.retry_later(7)).collect();
        assert_eq!(
            delays,
            [
                Some(Duration::from_millis(1)),
                Some(Duration::from_millis(2)),
                Some(Duration::from_millis(4)),
                None
            ]
        );
        // Dropped keys start over; a success forgets the count too.
        assert_eq!(queue.retry_later(7), Some(Duration::from_millis(1)));
        queue.forget(&7);
        assert_eq!(queue.retry_later(7), Some(Duration::from_millis(1)));
        assert_eq!(queue.next().await, 7);
    }

    #[tokio::test]
    async fn the_work_queue_coalesces_and_never_hands_out_a_key_twice_at_once() {
        let queue = WorkQueue::<crate::runtime::Key>::default();
        let a: crate::runtime::Key = ("ns".into(), "a".into());
        let b: crate::runtime::Key = ("ns".into(), "b".into());
        queue.add(a.clone());
        queue.add(b.clone());
        queue.add(a.clone());
        assert_eq!(queue.next().await, a);
        // Queued again while being synced: held back until done, then handed out again.
        queue.add(a.clone());
        assert_eq!(queue.next().await, b);
        assert!(
            queue
                .state
                .lock()
                .map(|s| s.order.is_empty())
                .unwrap_or(false)
        );
        queue.done(&a);
        assert_eq!(queue.next().await, a);
        queue.done(&a);
        queue.done(&b);
        assert!(
            queue
                .state
                .lock()
                .map(|s| s.order.is_empty() && s.dirty.is_empty())
                .unwrap_or(false)
        );
    }
}
