//! Watches served from the watch cache, with selector transitions and bookmarks.

use std::collections::VecDeque;
use std::sync::Arc;

use capstan_machinery::ApiError;
use capstan_machinery::fields::FieldSelector;
use capstan_machinery::labels::LabelSelector;
use capstan_storage::Revision;
use tokio::sync::broadcast;

use crate::cache::{CacheEvent, CacheMessage, CachedObject, EventType};
use crate::store::Registry;

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for the current objects first; `end_bookmark` marks their end.
    Initial {
        /// Send the `k8s.io/initial-events-end` bookmark after them.
        end_bookmark: bool,
    },
    /// Every change after this revision.
    After(Revision),
}

/// Options of a watch.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// Where to start.
    pub start: WatchStart,
}

/// What a watch delivers.
#[derive(Debug)]
pub enum WatchItem {
    /// A change (the object carries the event's revision).
    Event(EventType, Arc<CachedObject>),
    /// Everything up to this revision has been delivered; `true` marks the end of the
    /// initial events.
    Bookmark(Revision, bool),
    /// The watch failed; the stream ends after this.
    Error(ApiError),
}

/// A running watch.
pub struct Watcher {
    registry_prefix: String,
    projection: crate::cache::Projection,
    labels: LabelSelector,
    fields: FieldSelector,
    initial: VecDeque<Arc<CachedObject>>,
    end_bookmark: Option<Revision>,
    replay: VecDeque<Arc<CacheEvent>>,
    receiver: Option<broadcast::Receiver<CacheMessage>>,
    start: Revision,
    safe: Revision,
    /// The revision of the last change of the kind this watcher has been through (matching or
    /// not), where upstream's cacher takes a bookmark's revision from.
    last_event: Revision,
    error: Option<ApiError>,
}

impl Registry {
    /// WATCH a namespace (or everything when `namespace` is empty).
    pub fn watch(&self, namespace: &str, options: WatchOptions) -> Watcher {
        let prefix = self.strategy().info().list_prefix(namespace);
        let (initial, after, end_bookmark) = match options.start {
            WatchStart::Initial { end_bookmark } => (true, 0, end_bookmark),
            WatchStart::After(revision) => (false, revision, false),
        };
        let mut watcher = Watcher {
            registry_prefix: prefix,
            projection: self.cache().projection().clone(),
            labels: options.labels,
            fields: options.fields,
            initial: VecDeque::new(),
            end_bookmark: None,
            replay: VecDeque::new(),
            receiver: None,
            start: after,
            safe: after,
            last_event: after,
            error: None,
        };
        match self.cache().subscribe(initial, after) {
            Ok(subscription) => {
                watcher.initial = subscription
                    .initial
                    .into_iter()
                    .filter(|o| o.key.starts_with(watcher.registry_prefix.as_str()))
                    .collect();
                watcher.start = subscription.start_revision;
                watcher.safe = subscription.start_revision;
                watcher.last_event = subscription.start_revision;
                watcher.end_bookmark = end_bookmark.then_some(subscription.start_revision);
                watcher.replay = subscription.replay.into();
                watcher.receiver = Some(subscription.receiver);
            }
            Err(too_old) => {
                watcher.error = Some(ApiError::expired(format!(
                    "too old resource version: {after} ({})",
                    too_old.oldest
                )));
            }
        }
        watcher
    }
}

impl Watcher {
    /// The revision the watch began at: it delivers only changes after it.
    pub fn start(&self) -> Revision {
        self.start
    }

    /// The revision of the last change of the kind (matching this watch or not) the watcher
    /// has been through: what upstream's bookmarks carry.
    pub fn last_event(&self) -> Revision {
        self.last_event
    }

    /// The revision up to which every matching change has been delivered.
    pub fn progress(&self) -> Revision {
        self.safe
    }

    fn matches(&self, object: &CachedObject) -> bool {
        object.key.starts_with(self.registry_prefix.as_str())
            && object.selectable.selected_by(&self.labels, &self.fields)
    }

    fn translate(&self, event: &CacheEvent) -> Option<WatchItem> {
        let now = self.matches(&event.object);
        let before = event.prev.as_ref().is_some_and(|p| self.matches(p));
        match event.kind {
            EventType::Added => {
                now.then(|| WatchItem::Event(EventType::Added, event.object.clone()))
            }
            EventType::Deleted => {
                let gone = event.prev.as_ref().map_or(now, |_| before || now);
                gone.then(|| WatchItem::Event(EventType::Deleted, event.object.clone()))
            }
            EventType::Modified => match (before, now) {
                (true, true) => Some(WatchItem::Event(EventType::Modified, event.object.clone())),
                (false, true) => Some(WatchItem::Event(EventType::Added, event.object.clone())),
                (true, false) => {
                    let prev = event.prev.as_ref()?;
                    let last = prev.at_revision(event.revision(), &self.projection);
                    Some(WatchItem::Event(EventType::Deleted, Arc::new(last)))
                }
                (false, false) => None,
            },
        }
    }

    /// The next item; `None` when the watch is over (the client should re-watch).
    pub async fn next(&mut self) -> Option<WatchItem> {
        if let Some(error) = self.error.take() {
            self.receiver = None;
            return Some(WatchItem::Error(error));
        }
        while let Some(object) = self.initial.pop_front() {
            if self.matches(&object) {
                return Some(WatchItem::Event(EventType::Added, object));
            }
        }
        if let Some(revision) = self.end_bookmark.take() {
            return Some(WatchItem::Bookmark(revision, true));
        }
        while let Some(event) = self.replay.pop_front() {
            self.safe = self.safe.max(event.revision());
            self.last_event = self.last_event.max(event.revision());
            if let Some(item) = self.translate(&event) {
                return Some(item);
            }
        }
        loop {
            let receiver = self.receiver.as_mut()?;
            match receiver.recv().await {
                Ok(CacheMessage::Event(event)) => {
                    let Some(event) = event.upgrade() else {
                        // The history dropped it before this watcher read it: too far behind.
                        self.receiver = None;
                        return None;
                    };
                    if event.revision() <= self.start {
                        continue;
                    }
                    self.safe = self.safe.max(event.revision());
                    self.last_event = self.last_event.max(event.revision());
                    if let Some(item) = self.translate(&event) {
                        return Some(item);
                    }
                }
                Ok(CacheMessage::Progress(revision)) => {
                    self.safe = self.safe.max(revision.max(self.start));
                }
                Err(_) => {
                    self.receiver = None;
                    return None;
                }
            }
        }
    }
}
