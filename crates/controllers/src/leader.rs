//! Leader election over a Lease, as client-go's `leaderelection` package does it with a
//! `LeaseLock` (what kube-controller-manager runs): replicas race to hold one Lease, the holder
//! renews it every retry period, and a replica that cannot renew within the renew deadline
//! stops leading before the lease can expire and another replica take it.
//!
//! Capstan's controllers run while their replica leads ([`Elector::run`]), so they run once
//! however many replicas serve the API.
//!
//! A follower also follows the Lease through the controller runtime's [`Informer`]: when the
//! holder releases it (a clean stop) or it is deleted, a waiting candidate tries at once
//! instead of at its next retry (client-go's candidates only poll, up to a retry period
//! late); expiry is still judged by polling, by this replica's clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_registry::cache::{CachedObject, EventType};
use capstan_registry::{ReadAt, Registry, Subresource, WriteOptions};
use tokio::sync::Notify;

use crate::runtime::{Informer, key_of};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

/// client-go's timings (kube-controller-manager's `--leader-elect-*` flags).
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// How long a lease holds without renewal (`--leader-elect-lease-duration`, 15 s).
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up leading
    /// (`--leader-elect-renew-deadline`, 10 s).
    pub renew_deadline: Duration,
    /// How often candidates try to acquire, and the holder renews
    /// (`--leader-elect-retry-period`, 2 s).
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timings {
    /// client-go's checks: the lease outlasts the renew deadline, which outlasts the retry
    /// period (by its jitter factor, 1.2).
    pub fn check(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err("leaseDuration must be greater than renewDeadline".into());
        }
        if self.renew_deadline.as_secs_f64() <= JITTER * self.retry_period.as_secs_f64() {
            return Err("renewDeadline must be greater than retryPeriod*JitterFactor".into());
        }
        if self.retry_period.is_zero() {
            return Err("retryPeriod must be greater than zero".into());
        }
        Ok(())
    }
}

/// client-go's `JitterFactor`.
const JITTER: f64 = 1.2;

/// The identity kube-controller-manager uses: the host name, `_`, a fresh UUID.
pub fn identity() -> String {
    format!("{}_{}", crate::identity::hostname(), uuid::Uuid::new_v4())
}

/// One replica's candidacy for the controllers' Lease.
pub struct Elector {
    leases: Arc<Registry>,
    namespace: String,
    name: String,
    identity: String,
    timings: Timings,
    /// The Lease as last read or written (client-go's `LeaseLock.lease`).
    lease: Option<Lease>,
    /// Whether no other replica can be alive (the embedded store admits one process): a
    /// holder recorded by an earlier process is taken over at once, not waited out.
    exclusive: bool,
    /// The holder record last observed, and when it was (client-go's `observedRecord` and
    /// `observedTime`: expiry is judged by this replica's clock, never by the times written
    /// in the Lease).
    observed: Option<(LeaseSpec, Instant)>,
}

fn options() -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_manager: "capstan-controllers".into(),
        applied: false,
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    /// A candidate named `identity` for the Lease `namespace/name`.
    pub fn new(
        leases: Arc<Registry>,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: Timings,
    ) -> Self {
        Elector {
            leases,
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            timings,
            lease: None,
            observed: None,
            exclusive: false,
        }
    }

    /// [`Elector`] for a store only this process can open: any earlier holder is gone.
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }

    fn is_leader(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|(spec, _)| spec.holder_identity.as_deref() == Some(&self.identity))
    }

    /// client-go's `isLeaseValid`: the observed record holds for the duration it names,
    /// counted from when this replica observed it (a record without one has lapsed).
    fn lease_valid(&self) -> bool {
        self.observed.as_ref().is_some_and(|(spec, at)| {
            let seconds = spec.lease_duration_seconds.unwrap_or(0).max(0);
            at.elapsed() < Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
        })
    }

    /// The record this candidate writes: itself as holder, renewed now.
    fn record(&self, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = now();
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: i32::try_from(self.timings.lease_duration.as_secs()).ok(),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Writes `spec` over the Lease last seen (pinned to its resourceVersion).
    async fn update(&mut self, spec: LeaseSpec) -> bool {
        let Some(mut lease) = self.lease.clone() else {
            return false;
        };
        lease.spec = Some(spec.clone());
        let written = self
            .leases
            .update_typed(
                &self.namespace,
                &self.name,
                &lease,
                &options(),
                Subresource::Main,
            )
            .await;
        match written.map(|(object, _)| serde_json::from_value::<Lease>(object)) {
            Ok(Ok(stored)) => {
                self.lease = Some(stored);
                self.observed = Some((spec, Instant::now()));
                true
            }
            Ok(Err(error)) => {
                tracing::error!(%error, "the updated lease does not decode");
                false
            }
            Err(error) => {
                tracing::info!(lease = %self.name, error = %error.message, "failed to update lease");
                false
            }
        }
    }

    /// client-go's `tryAcquireOrRenew`: whether this candidate holds the Lease now.
    async fn try_acquire_or_renew(&mut self) -> bool {
        // The leader first renews what it saw last, without reading.
        if self.is_leader() && self.lease_valid() {
            let (acquired, transitions) = self.observed_times();
            if self.update(self.record(acquired, transitions)).await {
                return true;
            }
        }
        let current = self
            .leases
            .get_typed::<Lease>(&self.namespace, &self.name, ReadAt::Latest)
            .await;
        let current = match current {
            Ok(lease) => lease,
            Err(error) if error.is_not_found() => {
                let spec = self.record(None, 0);
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec.clone()),
                };
                let object = capstan_registry::object::from_typed(&lease);
                return match self
                    .leases
                    .create(&self.namespace, object, &options())
                    .await
                {
                    Ok(created) => {
                        self.lease = serde_json::from_value(created).ok();
                        self.observed = Some((spec, Instant::now()));
                        true
                    }
                    Err(error) => {
                        tracing::info!(error = %error.message, "failed to create the lease");
                        false
                    }
                };
            }
            Err(error) => {
                tracing::info!(error = %error.message, "failed to read the lease");
                return false;
            }
        };
        let record = current.spec.clone().unwrap_or_default();
        if self.observed.as_ref().map(|(spec, _)| spec) != Some(&record) {
            self.observed = Some((record.clone(), Instant::now()));
        }
        self.lease = Some(current);
        let held = record
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty());
        if held && self.lease_valid() && !self.is_leader() && !self.exclusive {
            return false;
        }
        let transitions = record.lease_transitions.unwrap_or(0);
        let spec = if self.is_leader() {
            self.record(record.acquire_time.clone(), transitions)
        } else {
            self.record(None, transitions + 1)
        };
        self.update(spec).await
    }

    fn observed_times(&self) -> (Option<MicroTime>, i32) {
        let spec = self.observed.as_ref().map(|(spec, _)| spec);
        (
            spec.and_then(|s| s.acquire_time.clone()),
            spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        )
    }

    /// A retry period with client-go's jitter (up to 1.2 times longer).
    fn jittered(&self) -> Duration {
        self.timings
            .retry_period
            .mul_f64(1.0 + fastrand::f64() * JITTER)
    }

    /// Campaigns for the Lease until `shutdown` turns true: while this replica holds it,
    /// `lead`'s work runs (`lead` starts it and returns its [`crate::Group`]); when a renewal
    /// does not succeed within the renew deadline, that work is stopped, completely, before
    /// the replica campaigns again. At shutdown the work is stopped and the Lease released.
    pub async fn run(
        mut self,
        mut lead: impl FnMut() -> crate::Group + Send,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let released = self.follow();
        loop {
            tracing::info!(lease = %self.lease_path(), identity = %self.identity, "attempting to acquire leader lease");
            while !self.try_acquire_or_renew().await {
                tokio::select! {
                    () = tokio::time::sleep(self.jittered()) => {}
                    () = released.notified() => {
                        tracing::debug!(lease = %self.lease_path(), "the lease was released");
                    }
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
            }
            tracing::info!(lease = %self.lease_path(), identity = %self.identity, "successfully acquired lease");
            let group = lead();
            let lost = tokio::select! {
                () = self.renew() => true,
                _ = shutdown.wait_for(|stop| *stop) => false,
            };
            if lost {
                tracing::warn!(lease = %self.lease_path(), identity = %self.identity, "leaderelection lost; stopping the controllers");
                let started = Instant::now();
                group.stop().await;
                // Another replica may take the lease once it has seen no renewal for the
                // lease duration; the renew deadline and a retry of it have passed already.
                let margin = self
                    .timings
                    .lease_duration
                    .saturating_sub(self.timings.renew_deadline);
                if started.elapsed() > margin.saturating_sub(self.timings.retry_period) {
                    tracing::error!(took = ?started.elapsed(), "the controllers stopped late; another replica may have started them meanwhile");
                }
            } else {
                // Shutting down: the lease is renewed while the controllers stop, then released.
                let stopping = group.stop();
                tokio::pin!(stopping);
                loop {
                    tokio::select! {
                        () = &mut stopping => break,
                        () = tokio::time::sleep(self.timings.retry_period) => {
                            self.try_acquire_or_renew().await;
                        }
                    }
                }
                self.release().await;
                return;
            }
            self.observed = None;
        }
    }

    /// Renews every retry period; returns once a renewal has not succeeded within the renew
    /// deadline.
    async fn renew(&mut self) {
        loop {
            tokio::time::sleep(self.timings.retry_period).await;
            let deadline = Instant::now() + self.timings.renew_deadline;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return;
                }
                match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(_) => return,
                }
                if !self.is_leader() {
                    // Another replica holds it now.
                    return;
                }
                tokio::time::sleep(self.timings.retry_period.min(left)).await;
            }
        }
    }

    /// Follows the Lease on the current runtime (for its life): the answer is notified each
    /// time the Lease is seen without a holder, or deleted.
    fn follow(&self) -> Arc<Notify> {
        let released = Arc::new(Notify::new());
        let notify = released.clone();
        let key = (self.namespace.clone(), self.name.clone());
        Informer::new(self.leases.clone())
            .on_change(move |kind, object, _| {
                if key_of(&object.selectable) == key && (kind == EventType::Deleted || free(object))
                {
                    notify.notify_one();
                }
            })
            .start();
        released
    }

    fn lease_path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// client-go's `ReleaseOnCancel`: the holder gives the Lease up (no holder, a one-second
    /// duration) so another replica need not wait for it to expire.
    async fn release(&mut self) {
        // The Lease is read again first, for its latest resourceVersion.
        let current = self
            .leases
            .get_typed::<Lease>(&self.namespace, &self.name, ReadAt::Latest)
            .await;
        let Ok(current) = current else {
            return;
        };
        let transitions = current.spec.as_ref().and_then(|s| s.lease_transitions);
        self.lease = Some(current);
        if !self.is_leader() {
            return;
        }
        let now = now();
        let spec = LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions.unwrap_or(0)),
            ..LeaseSpec::default()
        };
        if self.update(spec).await {
            tracing::info!(lease = %self.lease_path(), "released the lease");
        }
    }
}

/// Whether a Lease names no holder (released, or never held).
fn free(lease: &CachedObject) -> bool {
    lease
        .member(&["spec", "holderIdentity"])
        .is_none_or(|holder| {
            serde_json::from_slice::<Option<String>>(holder)
                .is_ok_and(|h| h.is_none_or(|h| h.is_empty()))
        })
}
