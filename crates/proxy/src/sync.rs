//! The sync loop: upstream's `BoundedFrequencyRunner` around `syncProxyRules`. A change runs a
//! sync at once if the last was at least `--min-sync-period` ago, else when it is; a full sync
//! at start, after a failure, when the node's addresses or zone change, and hourly; a failed
//! sync is retried after `--sync-period`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use ipnet::IpNet;
use tokio::sync::Notify;

use crate::conntrack;
use crate::health::{HealthChecks, ProxyHealth};
use crate::metrics::{Metrics, PolicyFamily, TableSize, family_label};
use crate::nft::Nft;
use crate::rules::{self, BaseConfig, Detector};
use crate::ruleset::{ElementRefs, Rules, Transaction};
use crate::state::{ClusterState, Family, Protocol, ServiceName, ServicePort, categorize};

/// How often a full sync runs with nothing else asking for one (upstream's `FullSyncPeriod`).
const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);
/// How long an emptied chain waits before it is deleted.
const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// What the watchers share with the sync loop.
#[derive(Default)]
pub struct Shared {
    /// The cluster as last reported.
    pub state: ClusterState,
    /// Services whose rules may have changed since the last sync.
    pub dirty: BTreeSet<ServiceName>,
    /// Services whose endpoints changed (for conntrack cleanup), since the last sync.
    pub endpoints_changed: BTreeSet<ServiceName>,
    /// When the slices of a Service last changed, by their trigger-time annotation.
    pub trigger_times: BTreeMap<ServiceName, Vec<SystemTime>>,
    /// Whether the next sync must be full.
    pub need_full: bool,
    /// Whether Services and EndpointSlices have each been listed once.
    pub services_synced: bool,
    /// See `services_synced`.
    pub slices_synced: bool,
}

impl Shared {
    /// Every Service, after a (re)list: the next sync is full.
    pub fn services_listed(&mut self, services: Vec<k8s_openapi::api::core::v1::Service>) {
        self.state.replace_services(services);
        self.services_synced = true;
        self.need_full = true;
    }

    /// Every slice, after a (re)list: the next sync is full, and any Service's endpoints may
    /// have changed.
    pub fn slices_listed(&mut self, slices: Vec<k8s_openapi::api::discovery::v1::EndpointSlice>) {
        self.state.replace_slices(slices);
        self.slices_synced = true;
        self.need_full = true;
        let all = self.state.service_names();
        self.endpoints_changed.extend(all);
    }
}

/// The proxy's configuration that rules depend on.
#[derive(Clone, Debug)]
pub struct SyncConfig {
    /// The nftables table's name (in `ip` and `ip6`).
    pub table: String,
    /// The families to program.
    pub families: Vec<Family>,
    /// This node's name.
    pub node_name: String,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--nodeport-addresses`: CIDRs; empty means the node's primary addresses.
    pub nodeport_cidrs: Vec<IpNet>,
    /// `--min-sync-period`.
    pub min_sync_period: Duration,
    /// `--sync-period` (the retry interval after a failed sync).
    pub sync_period: Duration,
}

#[derive(Default)]
struct Applied {
    base: Rules,
    services: HashMap<ServiceName, Rules>,
    refs: ElementRefs,
    stale: BTreeMap<String, Instant>,
}

/// The sync loop's own state.
pub struct Syncer {
    config: SyncConfig,
    shared: Arc<Mutex<Shared>>,
    notify: Arc<Notify>,
    nft: Nft,
    metrics: Arc<Metrics>,
    health: Arc<ProxyHealth>,
    checks: HealthChecks,
    applied: HashMap<Family, Applied>,
    last_attempt: Option<Instant>,
    last_failed: bool,
    last_full: Option<Instant>,
    first_full_done: bool,
    /// Whether the kernel holds what `applied` says (false at start and after a failure).
    trusted: bool,
    last_base: HashMap<Family, BaseConfig>,
    last_zone: Option<String>,
    /// UDP Service ports with their endpoints as of the last sync, for conntrack cleanup.
    udp_ports: HashMap<(Family, ServiceName), Vec<ServicePort>>,
    /// Services with a Local policy and endpoints only elsewhere: (internal, external).
    no_local: HashMap<(Family, ServiceName), (bool, bool)>,
    /// The host's addresses, for `--nodeport-addresses` CIDRs.
    local_addresses: Vec<IpAddr>,
}

/// Locks the shared state, whatever a panicking holder left.
pub fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Syncer {
    /// A sync loop over `shared`, woken by `notify`.
    pub fn new(
        config: SyncConfig,
        shared: Arc<Mutex<Shared>>,
        notify: Arc<Notify>,
        metrics: Arc<Metrics>,
        health: Arc<ProxyHealth>,
        checks: HealthChecks,
    ) -> Syncer {
        Syncer {
            config,
            shared,
            notify,
            nft: Nft::new(),
            metrics,
            health,
            checks,
            applied: HashMap::new(),
            last_attempt: None,
            last_failed: false,
            last_full: None,
            first_full_done: false,
            trusted: false,
            last_base: HashMap::new(),
            last_zone: None,
            udp_ports: HashMap::new(),
            no_local: HashMap::new(),
            local_addresses: Vec::new(),
        }
    }

    /// When the next sync is due, if any is.
    fn deadline(&self, shared: &Shared) -> Option<Instant> {
        if !(shared.services_synced && shared.slices_synced) {
            return None;
        }
        let Some(last) = self.last_attempt else {
            return Some(Instant::now());
        };
        let mut due: Vec<Instant> = Vec::new();
        if self.last_failed {
            due.push(last + self.config.sync_period);
        } else if shared.need_full || !shared.dirty.is_empty() {
            due.push(last + self.config.min_sync_period);
        }
        let oldest_stale = self
            .applied
            .values()
            .filter_map(|a| a.stale.values().min())
            .min();
        if let Some(stale) = oldest_stale {
            due.push((*stale + STALE_CHAIN_DELAY).max(last + self.config.min_sync_period));
        }
        if let Some(full) = self.last_full {
            due.push(full + FULL_SYNC_PERIOD);
        }
        due.into_iter().min()
    }

    /// Runs until the process ends.
    pub async fn run(mut self) {
        loop {
            let deadline = self.deadline(&lock(&self.shared));
            let notify = self.notify.clone();
            let due = match deadline {
                Some(at) if at <= Instant::now() => true,
                Some(at) => {
                    tokio::select! {
                        _ = notify.notified() => false,
                        _ = tokio::time::sleep_until(at.into()) => true,
                    }
                }
                None => {
                    notify.notified().await;
                    false
                }
            };
            if due {
                self.sync().await;
            }
        }
    }

    /// The fixed part's configuration for a family, from the flags and the node.
    fn base_config(&self, family: Family, state: &ClusterState) -> BaseConfig {
        let of_family = |nets: &[IpNet]| -> Vec<IpNet> {
            nets.iter()
                .filter(|n| Family::of(&n.addr()) == family)
                .copied()
                .collect()
        };
        // As upstream: a family with no address to take (no CIDR of it given, no node address
        // of it for "primary") or a zero CIDR takes every local address.
        let (nodeport_ips, match_all) = if self.config.nodeport_cidrs.is_empty() {
            // "primary": the node's own address of this family.
            let ips: Vec<IpAddr> = state
                .node_ips()
                .into_iter()
                .filter(|ip| Family::of(ip) == family && !ip.is_loopback())
                .take(1)
                .collect();
            let all = ips.is_empty();
            (ips, all)
        } else {
            let cidrs = of_family(&self.config.nodeport_cidrs);
            if cidrs.is_empty() || cidrs.iter().any(|c| c.prefix_len() == 0) {
                (Vec::new(), true)
            } else {
                let ips = self
                    .local_addresses
                    .iter()
                    .filter(|ip| cidrs.iter().any(|c| c.contains(*ip)) && !ip.is_loopback())
                    .copied()
                    .collect();
                (ips, false)
            }
        };
        BaseConfig {
            cluster_cidrs: of_family(&self.config.cluster_cidrs),
            masquerade_all: self.config.masquerade_all,
            nodeport_ips,
            nodeport_match_all: match_all,
        }
    }

    /// One sync: the stale chains' deletion, then the rules of what changed (or everything).
    pub async fn sync(&mut self) {
        let start = Instant::now();
        self.last_attempt = Some(start);
        self.delete_stale_chains().await;
        if !self.config.nodeport_cidrs.is_empty() {
            self.local_addresses = crate::local_addresses().await;
        }
        let (full, plan, changed_endpoints, trigger_times) = {
            let mut shared = lock(&self.shared);
            let zone = shared.state.node_zone().map(str::to_owned);
            let mut full = shared.need_full
                || !self.first_full_done
                || self
                    .last_full
                    .is_none_or(|t| t.elapsed() >= FULL_SYNC_PERIOD)
                || zone != self.last_zone;
            self.last_zone = zone;
            let mut bases = HashMap::new();
            for family in self.config.families.clone() {
                let base = self.base_config(family, &shared.state);
                if self.last_base.get(&family) != Some(&base) {
                    full = true;
                }
                bases.insert(family, base);
            }
            let names: BTreeSet<ServiceName> = if full {
                // Every Service known, and every one with rules, so that one deleted during a
                // relist loses its rules too.
                let mut names = shared.state.service_names();
                for applied in self.applied.values() {
                    names.extend(applied.services.keys().cloned());
                }
                names
            } else {
                std::mem::take(&mut shared.dirty)
            };
            shared.dirty.clear();
            shared.need_full = false;
            let zone = shared.state.node_zone().map(str::to_owned);
            let mut plan = Vec::new();
            for family in self.config.families.clone() {
                let base_config = bases.remove(&family).unwrap_or_default();
                let base = rules::base(family, &base_config);
                let detector = Detector {
                    cluster_cidrs: &base_config.cluster_cidrs,
                };
                let mut services = Vec::new();
                for name in &names {
                    let ports = shared.state.ports(name, family, &self.config.node_name);
                    let rules = rules::service(family, &ports, zone.as_deref(), &detector);
                    services.push((name.clone(), ports, rules));
                }
                plan.push((family, base_config, base, services));
            }
            let changed = std::mem::take(&mut shared.endpoints_changed);
            let triggers = std::mem::take(&mut shared.trigger_times);
            self.metrics.endpoint_changes_pending.set(0);
            self.metrics.service_changes_pending.set(0);
            (full, plan, changed, triggers)
        };

        let mut script = String::new();
        let mut new_stale: Vec<(Family, Vec<String>)> = Vec::new();
        for (family, _, base, services) in &plan {
            let mut complete = !self.trusted;
            let existing = if full {
                match self.nft.list(*family, &self.config.table, complete).await {
                    Ok(existing) => {
                        // Rules this process wrote are trusted only while every chain it
                        // wrote is still there (`nft flush ruleset` empties everything).
                        let applied = self.applied.get(family);
                        let lost = applied.is_some_and(|a| {
                            a.base
                                .chains
                                .keys()
                                .chain(a.services.values().flat_map(|r| r.chains.keys()))
                                .any(|c| !existing.chains.contains(c))
                        });
                        if lost && !complete {
                            tracing::warn!(
                                family = family.nft(),
                                "rules were changed behind the proxy; rewriting them all"
                            );
                            complete = true;
                            match self.nft.list(*family, &self.config.table, true).await {
                                Ok(all) => Some(all),
                                Err(_) => Some(existing),
                            }
                        } else {
                            Some(existing)
                        }
                    }
                    Err(err) => {
                        tracing::warn!(%err, "listing the nftables table");
                        None
                    }
                }
            } else {
                None
            };
            let applied = self.applied.entry(*family).or_default();
            let mut tx = Transaction::new(family.nft(), &self.config.table);
            let stale = if full && complete {
                let existing = existing.unwrap_or_default();
                let owners: Vec<&Rules> = std::iter::once(base)
                    .chain(services.iter().map(|(_, _, r)| r))
                    .collect();
                tx.full(
                    owners.iter().copied(),
                    &existing
                        .chains
                        .iter()
                        .filter(|c| c.contains('/'))
                        .cloned()
                        .collect(),
                    &existing
                        .sets
                        .iter()
                        .filter(|s| !base.sets.contains_key(*s) || s.starts_with("affinity-"))
                        .cloned()
                        .collect(),
                    &mut applied.refs,
                    !self.first_full_done,
                )
            } else {
                // A partial sync, or a full one over rules this process wrote itself and
                // still trusts: what changed is written, the fixed part is written again, and
                // whatever is missing from the kernel (someone deleted a chain) is rewritten.
                let mut stale = Vec::new();
                if full {
                    tx.rewrite(base);
                }
                stale.extend(tx.partial(&applied.base, base, &mut applied.refs));
                for (name, _, rules) in services {
                    let old = applied.services.get(name).cloned().unwrap_or_default();
                    stale.extend(tx.partial(&old, rules, &mut applied.refs));
                }
                if let Some(existing) = &existing {
                    let mut wanted = BTreeSet::new();
                    for (_, _, rules) in services {
                        if rules.chains.keys().any(|c| !existing.chains.contains(c)) {
                            tx.rewrite(rules);
                        }
                        wanted.extend(rules.chains.keys());
                    }
                    for chain in existing.chains.iter().filter(|c| c.contains('/')) {
                        if !wanted.contains(chain) && !applied.stale.contains_key(chain) {
                            tx.flush_chain(chain);
                            stale.push(chain.clone());
                        }
                    }
                }
                stale
            };
            new_stale.push((*family, stale));
            script.push_str(&tx.finish());
        }
        let result = self.nft.apply(&script).await;
        let elapsed = start.elapsed().as_secs_f64();
        for (family, ..) in &plan {
            let label = family_label(*family);
            self.metrics
                .sync_duration
                .get_or_create(&label)
                .observe(elapsed);
            let which = if full {
                &self.metrics.full_sync_duration
            } else {
                &self.metrics.partial_sync_duration
            };
            which.get_or_create(&label).observe(elapsed);
        }
        if let Err(err) = result {
            tracing::error!(%err, full, "syncing nftables rules failed; retrying with a full sync");
            for (family, ..) in &plan {
                self.metrics
                    .sync_failures
                    .get_or_create(&family_label(*family))
                    .inc();
                if let Some(applied) = self.applied.get_mut(family) {
                    applied.stale.clear();
                }
            }
            self.last_failed = true;
            self.trusted = false;
            let mut shared = lock(&self.shared);
            shared.need_full = true;
            shared.endpoints_changed.extend(changed_endpoints);
            return;
        }
        self.last_failed = false;
        if full {
            self.last_full = Some(start);
            self.first_full_done = true;
            self.trusted = true;
        }
        let now = Instant::now();
        let mut checks: Vec<(ServiceName, Option<(u16, usize)>)> = Vec::new();
        let mut udp_changed: HashMap<Family, ()> = HashMap::new();
        for (family, base_config, base, services) in plan {
            let applied = self.applied.entry(family).or_default();
            if full {
                applied.services.clear();
                self.no_local.retain(|(f, _), _| *f != family);
            }
            applied.base = base;
            for (name, ports, rules) in services {
                for chain in rules.chains.keys() {
                    applied.stale.remove(chain);
                }
                if rules == Rules::default() {
                    applied.services.remove(&name);
                } else {
                    applied.services.insert(name.clone(), rules);
                }
                let check = health_check(&ports);
                match checks.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, existing)) => *existing = existing.or(check),
                    None => checks.push((name.clone(), check)),
                }
                let zone = self.last_zone.as_deref();
                let mut no_local = (false, false);
                for port in &ports {
                    let c = categorize(port, zone);
                    if c.has_any && c.local.is_empty() {
                        no_local.0 |= port.internal_local;
                        no_local.1 |= port.has_external() && port.external_local;
                    }
                }
                if no_local == (false, false) {
                    self.no_local.remove(&(family, name.clone()));
                } else {
                    self.no_local.insert((family, name.clone()), no_local);
                }
                if changed_endpoints.contains(&name) {
                    let udp: Vec<ServicePort> = ports
                        .into_iter()
                        .filter(|p| p.protocol == Protocol::Udp)
                        .collect();
                    let had = self.udp_ports.remove(&(family, name.clone())).is_some();
                    if had || !udp.is_empty() {
                        udp_changed.entry(family).or_default();
                    }
                    if !udp.is_empty() {
                        self.udp_ports.insert((family, name), udp);
                    }
                }
            }
            for (_, stale) in new_stale.iter().filter(|(f, _)| *f == family) {
                for chain in stale {
                    applied.stale.entry(chain.clone()).or_insert(now);
                }
            }
            self.last_base.insert(family, base_config);
            self.record_sizes(family);
            let label = family_label(family);
            let epoch = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            self.metrics.last_sync.get_or_create(&label).set(epoch);
            self.health.updated(family);
        }
        self.record_no_local_endpoints();
        for times in trigger_times.values() {
            for t in times {
                if let Ok(age) = SystemTime::now().duration_since(*t) {
                    for family in &self.config.families {
                        self.metrics
                            .programming
                            .get_or_create(&family_label(*family))
                            .observe(age.as_secs_f64());
                    }
                }
            }
        }
        self.checks.sync(checks, full).await;
        // One look at the flow table per family whose UDP endpoints changed.
        for family in udp_changed.into_keys() {
            let ports: Vec<ServicePort> = self
                .udp_ports
                .iter()
                .filter(|((f, _), _)| *f == family)
                .flat_map(|(_, p)| p.iter().cloned())
                .collect();
            let started = Instant::now();
            let deleted = conntrack::clean_udp(family, &ports).await;
            let label = family_label(family);
            self.metrics
                .conntrack_duration
                .get_or_create(&label)
                .observe(started.elapsed().as_secs_f64());
            self.metrics
                .conntrack_deleted
                .get_or_create(&label)
                .inc_by(deleted);
        }
        tracing::debug!(full, seconds = elapsed, "synced nftables rules");
    }

    async fn delete_stale_chains(&mut self) {
        let mut script = String::new();
        let mut deleting: Vec<(Family, Vec<String>)> = Vec::new();
        for (family, applied) in &self.applied {
            let due: Vec<String> = applied
                .stale
                .iter()
                .filter(|(_, since)| since.elapsed() >= STALE_CHAIN_DELAY)
                .map(|(name, _)| name.clone())
                .collect();
            if due.is_empty() {
                continue;
            }
            let mut tx = Transaction::new(family.nft(), &self.config.table);
            tx.delete_chains(&due);
            script.push_str(&tx.finish());
            deleting.push((*family, due));
        }
        if deleting.is_empty() {
            return;
        }
        let result = self.nft.apply(&script).await;
        for (family, names) in deleting {
            if let Some(applied) = self.applied.get_mut(&family) {
                for name in names {
                    applied.stale.remove(&name);
                }
            }
            if result.is_err() {
                self.metrics
                    .cleanup_failures
                    .get_or_create(&family_label(family))
                    .inc();
            }
        }
        if let Err(err) = result {
            tracing::warn!(%err, "deleting stale chains failed; the next sync is a full one");
            lock(&self.shared).need_full = true;
        }
    }

    fn record_sizes(&self, family: Family) {
        let Some(applied) = self.applied.get(&family) else {
            return;
        };
        let (mut rules, mut chains, _) = applied.base.counts();
        for r in applied.services.values() {
            let (r2, c2, _) = r.counts();
            rules += r2;
            chains += c2;
        }
        let ip_family = family_label(family).ip_family;
        for (kind, value) in [
            ("rules", rules),
            ("chains", chains),
            ("elements", applied.refs.len()),
        ] {
            let labels = TableSize {
                ip_family: ip_family.clone(),
                kind: kind.to_owned(),
            };
            self.metrics
                .table_size
                .get_or_create(&labels)
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    fn record_no_local_endpoints(&self) {
        for family in &self.config.families {
            let (mut internal, mut external) = (0i64, 0i64);
            for ((f, _), (i, e)) in &self.no_local {
                if f == family {
                    internal += i64::from(*i);
                    external += i64::from(*e);
                }
            }
            let ip_family = family_label(*family).ip_family;
            for (policy, value) in [("internal", internal), ("external", external)] {
                let labels = PolicyFamily {
                    traffic_policy: policy.to_owned(),
                    ip_family: ip_family.clone(),
                };
                self.metrics
                    .no_local_endpoints
                    .get_or_create(&labels)
                    .set(value);
            }
        }
    }
}

/// A Service's health check node port and its count of distinct local ready endpoint IPs
/// (upstream's `LocalReadyEndpoints`), when it has one.
fn health_check(ports: &[ServicePort]) -> Option<(u16, usize)> {
    let port = ports.iter().find_map(|p| p.health_check_node_port)?;
    let ips: BTreeSet<_> = ports
        .iter()
        .flat_map(|p| {
            p.endpoints
                .iter()
                .filter(|e| e.local && e.ready)
                .map(|e| e.ip)
        })
        .collect();
    Some((port, ips.len()))
}
