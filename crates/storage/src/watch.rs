//! Watch delivery: the consumer side ([`WatchStream`]) and the in-process fan-out ([`Hub`]) the
//! embedded engine publishes committed changes to.
//!
//! Every watcher owns a bounded channel. Publishing never waits on a watcher: when a watcher's
//! buffer is full it is closed with [`StorageError::WatcherLagged`], so a slow consumer can
//! stall neither writers nor other watchers.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_util::Stream;
use tokio::sync::mpsc;

use crate::{Event, Revision, StorageError};

/// Why a watch ended, shared between the producer and the [`WatchStream`].
#[derive(Debug, Default)]
pub(crate) struct CloseReason(Mutex<Option<StorageError>>);

impl CloseReason {
    /// Records why the watch ends; the first reason wins.
    pub(crate) fn set(&self, error: StorageError) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    fn take(&self) -> Option<StorageError> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A stream of [`Event`]s from [`crate::Storage::watch`], in revision order.
///
/// It yields `Ok(event)` for each change, then — if the watch ended for a reason other than the
/// store shutting down cleanly — one `Err` saying why (for example
/// [`StorageError::WatcherLagged`] or [`StorageError::Compacted`]), then ends. Dropping it
/// cancels the watch.
pub struct WatchStream {
    events: mpsc::Receiver<Event>,
    reason: Arc<CloseReason>,
    finished: bool,
}

impl WatchStream {
    pub(crate) fn new(events: mpsc::Receiver<Event>, reason: Arc<CloseReason>) -> Self {
        Self {
            events,
            reason,
            finished: false,
        }
    }

    /// A bounded channel for a new watch and the stream reading it.
    pub(crate) fn channel(buffer: usize) -> (mpsc::Sender<Event>, Arc<CloseReason>, Self) {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let reason = Arc::new(CloseReason::default());
        (tx, reason.clone(), Self::new(rx, reason))
    }

    /// The next event, the error that ended the watch, or `None` once it is over.
    pub async fn next_event(&mut self) -> Option<Result<Event, StorageError>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Event, StorageError>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        match self.events.poll_recv(cx) {
            Poll::Ready(Some(event)) => Poll::Ready(Some(Ok(event))),
            Poll::Ready(None) => {
                self.finished = true;
                Poll::Ready(self.reason.take().map(Err))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Stream for WatchStream {
    type Item = Result<Event, StorageError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}

/// One registered, caught-up watcher.
struct Slot {
    prefix: String,
    tx: mpsc::Sender<Event>,
    reason: Arc<CloseReason>,
    /// Events at or below this revision were already delivered from history.
    delivered_through: Revision,
}

#[derive(Default)]
struct HubState {
    /// The highest revision published so far.
    published: Revision,
    slots: Vec<Slot>,
    closed: bool,
}

/// Fans committed changes out to caught-up watchers, in commit order.
#[derive(Default)]
pub(crate) struct Hub {
    state: Mutex<HubState>,
}

/// What [`Hub::register`] did.
pub(crate) enum Registration {
    /// The watcher is live from here on.
    Registered,
    /// Changes up to this revision were published after the watcher's history read: read
    /// history again before registering.
    Behind,
    /// The store is shutting down.
    Closed,
}

impl Hub {
    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_published(&self, revision: Revision) {
        let mut state = self.lock();
        state.published = state.published.max(revision);
    }

    /// Registers a watcher that has delivered every change through `delivered_through` from
    /// history — unless more has been published since, in which case it must catch up first.
    pub(crate) fn register(
        &self,
        prefix: &str,
        delivered_through: Revision,
        tx: mpsc::Sender<Event>,
        reason: Arc<CloseReason>,
    ) -> Registration {
        let mut state = self.lock();
        if state.closed {
            return Registration::Closed;
        }
        if state.published > delivered_through {
            return Registration::Behind;
        }
        state.slots.push(Slot {
            prefix: prefix.to_owned(),
            tx,
            reason,
            delivered_through,
        });
        Registration::Registered
    }

    /// Delivers the changes of one committed revision to every interested watcher.
    pub(crate) fn publish(&self, revision: Revision, events: &[Event]) {
        let mut state = self.lock();
        state.published = state.published.max(revision);
        state.slots.retain_mut(|slot| {
            if slot.tx.is_closed() {
                return false;
            }
            if revision <= slot.delivered_through {
                return true;
            }
            for event in events {
                if !event.kv.key.starts_with(slot.prefix.as_str()) {
                    continue;
                }
                match slot.tx.try_send(event.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        // Everything before this revision reached the watcher.
                        slot.reason.set(StorageError::WatcherLagged {
                            last_delivered: revision - 1,
                        });
                        return false;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return false,
                }
            }
            slot.delivered_through = revision;
            true
        });
    }

    /// Ends every watch; later registrations are refused.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.slots.clear();
    }
}
