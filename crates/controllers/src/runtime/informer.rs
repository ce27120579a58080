//! The informer: every object of a kind followed for the life of its runtime, as client-go's
//! reflector and shared informer follow it. It lists, then watches; when a watch ends it lists
//! and watches again (the registry answers a revision too old to resume from with a fresh
//! list, as a 410 makes a reflector relist), and what was known before and is missing from
//! the new list is reported gone (an informer's Replace). The kind's watch cache is its store:
//! handlers keep only what their controller indexes.

use std::sync::Arc;
use std::time::Duration;

use capstan_machinery::hash::{HashSet, HashSetExt};
use capstan_registry::Registry;
use capstan_registry::cache::{CachedObject, EventType, Selectable};
use capstan_registry::watch::{WatchItem, WatchOptions, WatchStart, Watcher};
use capstan_storage::Revision;

/// An object's key: its namespace (`""` for a cluster-scoped kind) and name.
pub type Key = (String, String);

/// An object's key as its watch event shows it.
pub fn key_of(selectable: &Selectable) -> Key {
    (selectable.namespace().into(), selectable.name().into())
}

/// How far an informer has got: `None` until its first list is in its handlers (an
/// informer's `HasSynced`), then the revision up to which its handlers have seen every
/// change. A controller whose writes must come back through its own informer before it reads
/// again waits on it ([`crate::runtime::OwnWrites`]).
pub type Progress = tokio::sync::watch::Receiver<Option<Revision>>;

/// Waits until every one of these informers has listed what exists, as a controller waits for
/// its informers' caches to sync before its workers start (a sync before would read an index
/// still filling: Endpoints without their pods, slices created again).
pub async fn synced(informers: &[Progress]) {
    for progress in informers {
        let _ = progress.clone().wait_for(Option::is_some).await;
    }
}

/// A watch over every object of a kind, from its current state (the listed objects as
/// events, then a bookmark marking their end when `end_bookmark`).
pub fn watch_all(registry: &Registry, end_bookmark: bool) -> Watcher {
    registry.watch(
        "",
        WatchOptions {
            labels: capstan_machinery::labels::LabelSelector::default(),
            fields: capstan_machinery::fields::FieldSelector::default(),
            start: WatchStart::Initial { end_bookmark },
        },
    )
}

/// How long an informer waits before it lists and watches again after a watch ended.
const REWATCH_DELAY: Duration = Duration::from_millis(200);

type OnChange = Box<dyn Fn(EventType, &CachedObject, bool) + Send>;
type OnReplayed = Box<dyn Fn(&HashSet<Key>) + Send>;

/// An informer over one kind, with its handlers.
pub struct Informer {
    registry: Arc<Registry>,
    on_change: Vec<OnChange>,
    on_replayed: Vec<OnReplayed>,
}

impl Informer {
    /// An informer over `registry`'s kind, with no handlers yet.
    pub fn new(registry: Arc<Registry>) -> Self {
        Informer {
            registry,
            on_change: Vec::new(),
            on_replayed: Vec::new(),
        }
    }

    /// Adds a handler of every change: the event, the object as the watch cache holds it, and
    /// whether it comes from a list (`true` while a start or restart lists what exists).
    pub fn on_change(
        mut self,
        handler: impl Fn(EventType, &CachedObject, bool) + Send + 'static,
    ) -> Self {
        self.on_change.push(Box::new(handler));
        self
    }

    /// Adds a handler of each completed list: the keys it held, so that what is missing from
    /// it (deleted while no watch was open) can be forgotten.
    pub fn on_replayed(mut self, handler: impl Fn(&HashSet<Key>) + Send + 'static) -> Self {
        self.on_replayed.push(Box::new(handler));
        self
    }

    /// Adds every key that is added or changes (not deletions) to `queue`.
    pub fn enqueue_changes(self, queue: Arc<crate::runtime::WorkQueue<String>>) -> Self {
        self.on_change(move |kind, object, _| {
            if kind != EventType::Deleted {
                queue.add(object.selectable.name().to_string());
            }
        })
    }

    /// Runs on the current runtime's tasks for the life of that runtime; answers how far its
    /// handlers have got.
    pub fn start(self) -> Progress {
        let (progress, seen) = tokio::sync::watch::channel(None);
        self.start_reporting(progress);
        seen
    }

    /// Runs on the current runtime's tasks for the life of that runtime, telling `progress`
    /// how far its handlers have got (for a caller that hands out the [`Progress`] before the
    /// informer starts).
    pub fn start_reporting(self, progress: tokio::sync::watch::Sender<Option<Revision>>) {
        let advance = move |revision| {
            progress.send_if_modified(|r: &mut Option<Revision>| {
                let later = r.is_none_or(|r| revision > r);
                *r = Some(r.map_or(revision, |r| r.max(revision)));
                later
            });
        };
        let Informer {
            registry,
            on_change,
            on_replayed,
        } = self;
        tokio::spawn(async move {
            loop {
                let mut watcher = watch_all(&registry, true);
                let mut listing: Option<HashSet<Key>> = Some(HashSet::new());
                while let Some(item) = watcher.next().await {
                    match item {
                        WatchItem::Event(kind, object) => {
                            if let Some(seen) = listing.as_mut() {
                                seen.insert(key_of(&object.selectable));
                            }
                            for handler in &on_change {
                                handler(kind, &object, listing.is_some());
                            }
                            if listing.is_none() {
                                advance(watcher.progress());
                            }
                        }
                        WatchItem::Bookmark(revision, true) => {
                            if let Some(seen) = listing.take() {
                                for handler in &on_replayed {
                                    handler(&seen);
                                }
                            }
                            advance(revision);
                        }
                        _ => {}
                    }
                }
                tokio::time::sleep(REWATCH_DELAY).await;
            }
        });
    }
}
