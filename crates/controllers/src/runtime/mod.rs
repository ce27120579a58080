//! The controller runtime every in-process controller stands on, as kube-runtime separates
//! watcher, reflector and controller: an [`Informer`] follows a kind (list, watch, relist
//! after a restart or a revision too old, a synced signal) and feeds handlers that keep an
//! index and queue keys; a [`Store`] reads the kind's objects typed, decoded once per revision; a [`WorkQueue`] coalesces keys and retries failures with client-go's
//! back-off; a [`Controller`] runs workers over the queue once its informers have synced.
//! [`OwnWrites`] holds back a controller whose own last write has not come back through its
//! informer yet. Events (an event recorder) are to hang off this runtime too.

mod controller;
mod informer;
mod own_writes;
mod queue;
mod store;

pub use controller::Controller;
pub use informer::{Informer, Key, Progress, key_of, synced, watch_all};
pub use own_writes::OwnWrites;
pub use queue::{Backoff, WorkQueue};
pub use store::{Decode, Store};
