//! ClusterIP and NodePort allocation. Every allocation is a storage key written in the same
//! transaction as the Service that holds it, so addresses can neither leak nor be handed out
//! twice, even across a crash. This module keeps the in-memory view of what is taken (a
//! bitmap per range, fed by a storage watch) and the write path's bookkeeping; `cluster_ips`
//! and `node_ports` decide what a Service gets, `repair` checks the records at start-up.

use capstan_machinery::ApiError;
use capstan_machinery::field::FieldErrors;
use capstan_storage::{RangeRequest, Storage};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::bitmap::Bitmap;
use super::range::{IpRange, PortRange};

/// The storage prefix of allocated cluster IPs.
pub(super) const IP_PREFIX: &str = "ranges/serviceips/";
/// The storage prefix of allocated node ports.
pub(super) const PORT_PREFIX: &str = "ranges/servicenodeports/";
/// Where every allocation record lives.
const RANGES: &str = "ranges/";

/// Every allocation record in storage (cluster IPs and node ports).
pub(super) async fn records(
    storage: &dyn Storage,
    at_revision: Option<capstan_storage::Revision>,
) -> Result<capstan_storage::RangeResponse, ApiError> {
    let everything = RangeRequest {
        prefix: RANGES.into(),
        at_revision,
        ..RangeRequest::default()
    };
    storage.range(everything).await.map_err(ApiError::internal)
}

/// What one Service holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Allocations {
    /// Cluster IPs.
    pub ips: Vec<String>,
    /// Node ports and the health check node port.
    pub ports: Vec<i32>,
}

impl Allocations {
    /// What a stored Service holds.
    pub fn of(service: &Service) -> Self {
        let spec = super::spec::of(service);
        let ips = spec
            .cluster_ips
            .iter()
            .flatten()
            .filter(|ip| *ip != "None" && !ip.is_empty())
            .cloned()
            .collect();
        let mut ports: Vec<i32> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.node_port)
            .collect();
        ports.extend(spec.health_check_node_port);
        ports.retain(|p| *p > 0);
        ports.sort_unstable();
        ports.dedup();
        Allocations { ips, ports }
    }

    /// The allocation keys that record what the Service holds.
    pub(super) fn keys(&self) -> Vec<String> {
        self.ips
            .iter()
            .map(|ip| format!("{IP_PREFIX}{ip}"))
            .chain(self.ports.iter().map(|p| format!("{PORT_PREFIX}{p}")))
            .collect()
    }
}

/// Hands out cluster IPs and node ports. Clones share one in-memory view of what is taken.
#[derive(Debug, Clone)]
pub struct ServiceAllocator {
    ranges: Vec<IpRange>,
    ports: PortRange,
    taken: std::sync::Arc<std::sync::Mutex<Taken>>,
}

/// A bit per address of each service CIDR and per node port: kept current from the
/// allocation keys by [`ServiceAllocator::start`].
#[derive(Debug)]
struct Taken {
    ips: Vec<Bitmap>,
    ports: Bitmap,
}

/// 422 for a Service whose request cannot be allocated as asked (it takes the metadata, not
/// the Service, so a step can refuse while it holds the spec mutably).
pub(super) fn invalid(metadata: &ObjectMeta, errors: FieldErrors) -> ApiError {
    ApiError::invalid(
        "",
        "Service",
        metadata.name.as_deref().unwrap_or_default(),
        &errors,
    )
}

/// One write's view of the allocator: the store requests are checked against, the owner the
/// records name (`namespace/name`), and whether it is a dry run (which reserves nothing).
pub(super) struct Picker<'a> {
    /// The ranges and the in-memory view of what is taken.
    pub(super) allocator: &'a ServiceAllocator,
    /// Where the allocation records are.
    pub(super) storage: &'a dyn Storage,
    /// The Service being written, as its records name it.
    pub(super) owner: &'a str,
    /// A dry run checks and fills placeholders only.
    pub(super) dry_run: bool,
}

impl Picker<'_> {
    /// Whether `key` is recorded as held by another Service (a Service's own records, kept
    /// over an update, are not in the way).
    pub(super) async fn held_by_other(&self, key: &str) -> Result<bool, ApiError> {
        let response = self
            .storage
            .get(key, None)
            .await
            .map_err(ApiError::internal)?;
        Ok(response
            .kv
            .is_some_and(|kv| kv.value.as_ref() != self.owner.as_bytes()))
    }
}

impl ServiceAllocator {
    /// An allocator over one or two (dual-stack) service CIDRs and a node port range.
    pub fn new(ranges: Vec<IpRange>, ports: PortRange) -> Self {
        let taken = Taken {
            ips: ranges
                .iter()
                .map(|r| Bitmap::new(r.usable() as usize + 1))
                .collect(),
            ports: Bitmap::new(usize::from(ports.size)),
        };
        ServiceAllocator {
            ranges,
            ports,
            taken: std::sync::Arc::new(std::sync::Mutex::new(taken)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Taken> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark(&self, taken: &mut Taken, key: &str, on: bool) {
        if let Some(ip) = key.strip_prefix(IP_PREFIX) {
            for (i, range) in self.ranges.iter().enumerate() {
                if let Some(offset) = range.offset_of(ip) {
                    taken.ips[i].set(offset as usize, on);
                }
            }
        } else if let Some(port) = key
            .strip_prefix(PORT_PREFIX)
            .and_then(|p| p.parse::<i32>().ok())
            && self.ports.contains(port)
        {
            taken.ports.set(self.ports.offset(port), on);
        }
    }

    /// Rebuilds the in-memory view from the allocation keys in storage.
    async fn resync(&self, storage: &dyn Storage) -> Result<i64, ApiError> {
        let response = records(storage, None).await?;
        let mut taken = self.lock();
        taken.ips.iter_mut().for_each(Bitmap::clear);
        taken.ports.clear();
        for kv in &response.kvs {
            self.mark(&mut taken, &kv.key, true);
        }
        Ok(response.revision)
    }

    /// Loads what is taken and keeps it current from the storage watch (and a periodic
    /// re-read), in a background task. Call once at start-up, after [`Self::repair`].
    pub async fn start(&self, storage: std::sync::Arc<dyn Storage>) -> Result<(), ApiError> {
        let mut revision = self.resync(storage.as_ref()).await?;
        let allocator = self.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(mut stream) = storage.watch(RANGES, revision).await {
                    let mut refresh = tokio::time::interval(std::time::Duration::from_secs(60));
                    refresh.tick().await;
                    loop {
                        tokio::select! {
                            event = stream.next_event() => match event {
                                Some(Ok(event)) => {
                                    revision = event.kv.mod_revision;
                                    let on = event.kind == capstan_storage::EventKind::Put;
                                    let mut taken = allocator.lock();
                                    allocator.mark(&mut taken, &event.kv.key, on);
                                }
                                _ => break,
                            },
                            // Picks are marked before their transaction commits; a pick whose
                            // write failed is cleared by the next full re-read.
                            _ = refresh.tick() => {
                                if let Ok(r) = allocator.resync(storage.as_ref()).await {
                                    revision = r;
                                    break;
                                }
                            }
                        }
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                if let Ok(r) = allocator.resync(storage.as_ref()).await {
                    revision = r;
                }
            }
        });
        Ok(())
    }

    /// The service CIDRs, primary first.
    pub(super) fn ranges(&self) -> &[IpRange] {
        &self.ranges
    }

    /// The node port range.
    pub(super) fn ports(&self) -> PortRange {
        self.ports
    }

    /// The primary service CIDR.
    pub fn primary(&self) -> &IpRange {
        &self.ranges[0]
    }

    /// The configured families, primary first.
    pub fn families(&self) -> Vec<&'static str> {
        self.ranges.iter().map(IpRange::family).collect()
    }

    /// What an allocation key holds: the Service's `namespace/name`.
    pub(super) fn owner(service: &Service) -> String {
        format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or_default(),
            service.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// A free address of range `index` (dynamic picks prefer the addresses above the static
    /// band, which is left to requested addresses), marked taken in the in-memory view.
    pub(super) async fn dynamic_ip(
        &self,
        storage: &dyn Storage,
        index: usize,
    ) -> Result<String, ApiError> {
        let range = &self.ranges[index];
        for attempt in 0..2 {
            {
                let mut taken = self.lock();
                let bitmap = &mut taken.ips[index];
                let usable = range.usable() as usize;
                let band = (range.static_band() as usize).min(usable);
                // Dynamic picks come from above the static band first, then from inside it.
                for (low, high) in [(band + 1, usable), (1, band)] {
                    if low > high {
                        continue;
                    }
                    let start = low + fastrand::usize(..=(high - low));
                    if let Some(offset) = bitmap.find_clear(low, high, start) {
                        bitmap.set(offset, true);
                        return Ok(range.address(offset as u128));
                    }
                }
            }
            if attempt == 0 {
                // The view may hold picks whose writes failed: re-read before giving up.
                self.resync(storage).await?;
            }
        }
        Err(ApiError::internal(
            "failed to allocate a serviceIP: range is full",
        ))
    }

    /// A free node port other than `avoid` (the ones this write already uses), marked taken in
    /// the in-memory view; as for addresses, the static band is used last.
    pub(super) async fn dynamic_port(
        &self,
        storage: &dyn Storage,
        avoid: &[i32],
    ) -> Result<i32, ApiError> {
        for attempt in 0..2 {
            {
                let mut taken = self.lock();
                for port in avoid.iter().filter(|p| self.ports.contains(**p)) {
                    taken.ports.set(self.ports.offset(*port), true);
                }
                let size = usize::from(self.ports.size);
                let band = usize::from(self.ports.static_band()).min(size);
                let mut bands = vec![(band, size.saturating_sub(1))];
                if band > 0 {
                    bands.push((0, band - 1));
                }
                for (low, high) in bands {
                    if low > high {
                        continue;
                    }
                    let start = low + fastrand::usize(..=(high - low));
                    if let Some(offset) = taken.ports.find_clear(low, high, start) {
                        taken.ports.set(offset, true);
                        return Ok(self.ports.port(offset));
                    }
                }
            }
            if attempt == 0 {
                self.resync(storage).await?;
            }
        }
        Err(ApiError::internal(
            "failed to allocate a nodePort: range is full",
        ))
    }
}
