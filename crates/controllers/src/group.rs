//! Controllers started together and stopped together: what a replica runs while it holds the
//! controllers' Lease ([`crate::leader`]), and stops, completely, when it loses it.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::watch;

/// A set of controller threads. Each runs its work on a single-threaded runtime of its own,
/// so a controller's work never queues behind API requests on the server's workers, its CPU
/// use can be read per thread, and stopping it drops that runtime with every task it spawned.
#[derive(Clone)]
pub struct Group {
    stop: watch::Receiver<bool>,
    inner: Arc<Inner>,
}

struct Inner {
    stopper: watch::Sender<bool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Default for Group {
    fn default() -> Self {
        let (stopper, stop) = watch::channel(false);
        Group {
            stop,
            inner: Arc::new(Inner {
                stopper,
                threads: Mutex::new(Vec::new()),
            }),
        }
    }
}

impl Group {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `work` on a thread of its own named `name` until it ends or the group stops.
    pub fn spawn(
        &self,
        name: &str,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut stop = self.stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = work => {}
                        _ = stop.wait_for(|stopped| *stopped) => {}
                    }
                });
                // Dropping the runtime cancels every task the work spawned on it.
                drop(runtime);
            })?;
        self.threads().push(thread);
        Ok(())
    }

    /// Runs `start` inside a runtime on a thread of its own named `name`: what it spawns runs
    /// there until the group stops.
    pub fn within(&self, name: &str, start: impl FnOnce()) -> std::io::Result<()> {
        let runtime = self.runtime(name)?;
        let _on = runtime.enter();
        start();
        Ok(())
    }

    /// A runtime on a thread of its own named `name`, running until the group stops: what is
    /// spawned on it (`Handle::enter`, then `tokio::spawn`) runs there.
    fn runtime(&self, name: &str) -> std::io::Result<tokio::runtime::Handle> {
        let (sender, receiver) = std::sync::mpsc::channel();
        self.spawn(name, async move {
            let _ = sender.send(tokio::runtime::Handle::current());
            std::future::pending::<()>().await
        })?;
        receiver.recv().map_err(std::io::Error::other)
    }

    /// Whether the group was told to stop.
    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    fn threads(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.inner.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops every thread of the group and returns once all have ended (threads a stopping
    /// thread started are waited for too).
    pub async fn stop(self) {
        self.inner.stopper.send_replace(true);
        loop {
            let Some(thread) = self.threads().pop() else {
                return;
            };
            let name = thread.thread().name().unwrap_or_default().to_string();
            if tokio::task::spawn_blocking(move || thread.join())
                .await
                .is_err()
            {
                tracing::error!(thread = %name, "a controller thread panicked while stopping");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn stopping_ends_every_thread_and_the_tasks_they_spawned() {
        let group = Group::new();
        let ticks = Arc::new(AtomicUsize::new(0));
        for name in ["a", "b"] {
            let (ticks, inner) = (ticks.clone(), group.clone());
            group
                .spawn(name, async move {
                    // A task spawned on the thread's runtime, and a thread started from it.
                    let spawned = ticks.clone();
                    tokio::spawn(async move {
                        loop {
                            spawned.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    });
                    let nested = ticks.clone();
                    inner
                        .spawn("nested", async move {
                            loop {
                                nested.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        })
                        .expect("a thread starts");
                    std::future::pending::<()>().await
                })
                .expect("a thread starts");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ticks.load(Ordering::SeqCst) > 0);
        group.clone().stop().await;
        assert!(group.stopped());
        assert!(group.threads().is_empty());
        let after = ticks.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            ticks.load(Ordering::SeqCst),
            after,
            "nothing runs after the stop"
        );
    }
}
