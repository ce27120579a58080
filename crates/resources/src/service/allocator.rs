//! ClusterIP and NodePort allocation. Every allocation is a storage key written in the same
//! transaction as the Service that holds it, so addresses can neither leak nor be handed out
//! twice, even across a crash.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::{ApiError, meta};
use capstan_registry::WriteExtras;
use capstan_storage::{Compare, Op, RangeRequest, Storage};

use super::bitmap::Bitmap;
use serde_json::{Value, json};

const IP_PREFIX: &str = "ranges/serviceips/";
const PORT_PREFIX: &str = "ranges/servicenodeports/";

/// A service CIDR (`--service-cluster-ip-range`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRange {
    base: u128,
    bits: u32,
    prefix: u32,
    text: String,
}

impl IpRange {
    /// Parses `10.96.0.0/12` or `fd00::/108`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = text
            .split_once('/')
            .ok_or_else(|| format!("invalid CIDR address: {text}"))?;
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("invalid CIDR address: {text}"))?;
        let (value, bits) = match address {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        let prefix: u32 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= bits)
            .ok_or_else(|| format!("invalid CIDR address: {text}"))?;
        if bits - prefix > 20 && bits == 32 {
            return Err("specified --service-cluster-ip-range is too large; for 32-bit addresses, the mask must be >= 12".into());
        }
        if bits - prefix > 20 {
            return Err("specified --service-cluster-ip-range is too large; for 128-bit addresses, the mask must be >= 108".into());
        }
        let host_bits = bits - prefix;
        let base = value & !((1u128 << host_bits) - 1);
        Ok(IpRange {
            base,
            bits,
            prefix,
            text: text.to_string(),
        })
    }

    /// `IPv4` or `IPv6`.
    pub fn family(&self) -> &'static str {
        if self.bits == 32 { "IPv4" } else { "IPv6" }
    }

    fn size(&self) -> u128 {
        1u128 << (self.bits - self.prefix)
    }

    /// Usable offsets: 1 ..= last (IPv4 broadcast excluded, IPv6 capped at 65535).
    fn usable(&self) -> u128 {
        if self.bits == 32 {
            self.size().saturating_sub(2)
        } else {
            (self.size() - 1).min(65535)
        }
    }

    fn address(&self, offset: u128) -> String {
        let value = self.base + offset;
        if self.bits == 32 {
            Ipv4Addr::from(value as u32).to_string()
        } else {
            Ipv6Addr::from(value).to_string()
        }
    }

    /// The first host address (held by the `kubernetes` Service).
    pub fn first_host(&self) -> String {
        self.address(1)
    }

    fn offset_of(&self, ip: &str) -> Option<u128> {
        let parsed: IpAddr = ip.parse().ok()?;
        let value = match parsed {
            IpAddr::V4(a) if self.bits == 32 => u128::from(u32::from(a)),
            IpAddr::V6(a) if self.bits == 128 => u128::from(a),
            _ => return None,
        };
        let offset = value.checked_sub(self.base)?;
        (offset >= 1 && offset <= self.usable()).then_some(offset)
    }

    /// Whether `ip` is inside the CIDR at all (usable or not).
    fn contains_network(&self, ip: &str) -> bool {
        let value = match ip.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) if self.bits == 32 => u128::from(u32::from(a)),
            Ok(IpAddr::V6(a)) if self.bits == 128 => u128::from(a),
            _ => return false,
        };
        value >= self.base && value - self.base < self.size()
    }

    fn static_band(&self) -> u128 {
        let size = self.size();
        if size < 16 {
            0
        } else {
            (size / 16).clamp(16, 256)
        }
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The node port range (`--service-node-port-range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub base: u16,
    /// Number of ports.
    pub size: u16,
}

impl PortRange {
    /// Parses `30000-32767` or `30000+2767`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("invalid port range: {text:?}");
        if let Some((a, b)) = text.split_once('-') {
            let a: u16 = a.trim().parse().map_err(|_| bad())?;
            let b: u16 = b.trim().parse().map_err(|_| bad())?;
            if b < a {
                return Err(bad());
            }
            return Ok(PortRange {
                base: a,
                size: b - a + 1,
            });
        }
        if let Some((a, n)) = text.split_once('+') {
            let a: u16 = a.trim().parse().map_err(|_| bad())?;
            let n: u16 = n.trim().parse().map_err(|_| bad())?;
            a.checked_add(n).ok_or_else(bad)?;
            return Ok(PortRange {
                base: a,
                size: n + 1,
            });
        }
        Err(bad())
    }

    /// Whether `port` is in the range.
    pub fn contains(&self, port: i64) -> bool {
        port >= i64::from(self.base) && port < i64::from(self.base) + i64::from(self.size)
    }

    fn last(&self) -> i64 {
        i64::from(self.base) + i64::from(self.size) - 1
    }

    fn static_band(&self) -> u16 {
        if self.size <= 16 {
            0
        } else {
            (self.size / 32).clamp(16, 128)
        }
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.base, self.last())
    }
}

/// What one Service holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Allocations {
    /// Cluster IPs.
    pub ips: Vec<String>,
    /// Node ports and the health check node port.
    pub ports: Vec<i64>,
}

impl Allocations {
    /// What a stored Service holds.
    pub fn of(object: &Value) -> Self {
        let spec = object.get("spec");
        let ips = spec
            .and_then(|s| s.get("clusterIPs"))
            .and_then(Value::as_array)
            .map(|ips| {
                ips.iter()
                    .filter_map(Value::as_str)
                    .filter(|ip| *ip != "None" && !ip.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let mut ports: Vec<i64> = spec
            .and_then(|s| s.get("ports"))
            .and_then(Value::as_array)
            .map(|ports| {
                ports
                    .iter()
                    .filter_map(|p| p.get("nodePort").and_then(Value::as_i64))
                    .filter(|p| *p > 0)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(health) = spec
            .and_then(|s| s.get("healthCheckNodePort"))
            .and_then(Value::as_i64)
            .filter(|p| *p > 0)
        {
            ports.push(health);
        }
        ports.sort_unstable();
        ports.dedup();
        Allocations { ips, ports }
    }

    fn keys(&self) -> Vec<String> {
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

fn spec_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("spec")
        .and_then(|s| s.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn invalid(object: &Value, errors: FieldErrors) -> ApiError {
    ApiError::invalid("", "Service", meta::name(object), &errors)
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
            .and_then(|p| p.parse::<i64>().ok())
            && self.ports.contains(port)
        {
            taken
                .ports
                .set((port - i64::from(self.ports.base)) as usize, on);
        }
    }

    /// Rebuilds the in-memory view from the allocation keys in storage.
    async fn resync(&self, storage: &dyn Storage) -> Result<i64, ApiError> {
        let response = storage
            .range(RangeRequest {
                prefix: "ranges/".into(),
                ..RangeRequest::default()
            })
            .await
            .map_err(ApiError::internal)?;
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
                if let Ok(mut stream) = storage.watch("ranges/", revision).await {
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

    /// The repair check (upstream's repair loops, run once at start-up): every Service's
    /// addresses and ports must be recorded as allocated to it, and nothing else may be.
    /// Writes are transactional, so this finds nothing unless the data was edited by hand;
    /// it reports and fixes what it finds. Returns the number of fixes.
    pub async fn repair(&self, storage: &dyn Storage) -> Result<usize, ApiError> {
        let services = storage
            .range(RangeRequest {
                prefix: super::SERVICE_INFO.list_prefix(""),
                ..RangeRequest::default()
            })
            .await
            .map_err(ApiError::internal)?;
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        for kv in &services.kvs {
            let Ok(object) = serde_json::from_slice::<Value>(&kv.value) else {
                continue;
            };
            let owner = Self::owner(&object);
            for key in Allocations::of(&object).keys() {
                if let Some(other) = wanted.insert(key.clone(), owner.clone())
                    && other != owner
                {
                    tracing::warn!(%key, first = %other, second = %owner, "allocated to several services; please recreate one of them");
                }
            }
        }
        let recorded = storage
            .range(RangeRequest {
                prefix: "ranges/".into(),
                ..RangeRequest::default()
            })
            .await
            .map_err(ApiError::internal)?;
        let mut fixes = 0;
        for kv in &recorded.kvs {
            if !wanted.contains_key(kv.key.as_ref()) {
                tracing::warn!(key = %kv.key, "allocation held by no service; releasing it");
                let txn = capstan_storage::Txn::new()
                    .when(Compare::ModRevision(kv.key.to_string(), kv.mod_revision))
                    .then(Op::Delete(kv.key.to_string()));
                storage.txn(txn).await.map_err(ApiError::internal)?;
                fixes += 1;
            }
        }
        for (key, owner) in &wanted {
            if !recorded
                .kvs
                .iter()
                .any(|kv| kv.key.as_ref() == key.as_str())
            {
                tracing::warn!(%key, %owner, "service address or port not recorded as allocated; repairing");
                let txn = capstan_storage::Txn::new()
                    .when(Compare::Absent(key.clone()))
                    .then(Op::Put(key.clone(), owner.clone().into()));
                storage.txn(txn).await.map_err(ApiError::internal)?;
                fixes += 1;
            }
        }
        Ok(fixes)
    }

    /// The primary service CIDR.
    pub fn primary(&self) -> &IpRange {
        &self.ranges[0]
    }

    /// The configured families, primary first.
    pub fn families(&self) -> Vec<&'static str> {
        self.ranges.iter().map(IpRange::family).collect()
    }

    fn owner(object: &Value) -> String {
        format!("{}/{}", meta::namespace(object), meta::name(object))
    }

    async fn held_by_other(
        storage: &dyn Storage,
        key: &str,
        owner: &str,
    ) -> Result<bool, ApiError> {
        let response = storage.get(key, None).await.map_err(ApiError::internal)?;
        Ok(response
            .kv
            .is_some_and(|kv| kv.value.as_ref() != owner.as_bytes()))
    }

    async fn dynamic_ip(&self, storage: &dyn Storage, index: usize) -> Result<String, ApiError> {
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

    async fn dynamic_port(&self, storage: &dyn Storage, avoid: &[i64]) -> Result<i64, ApiError> {
        let base = i64::from(self.ports.base);
        for attempt in 0..2 {
            {
                let mut taken = self.lock();
                for port in avoid.iter().filter(|p| self.ports.contains(**p)) {
                    taken.ports.set((port - base) as usize, true);
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
                        return Ok(base + offset as i64);
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

    /// Resolves IP families and policy, allocates cluster IPs and node ports for `object`
    /// (`old`: the stored Service on update), and returns the storage work that records them.
    pub async fn allocate(
        &self,
        storage: &dyn Storage,
        object: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
    ) -> Result<WriteExtras, ApiError> {
        let owner = Self::owner(object);
        let kind = spec_str(object, "type").to_string();
        if kind != "ExternalName" {
            self.allocate_ips(storage, object, old, &owner, dry_run)
                .await?;
            self.allocate_ports(storage, object, &kind, &owner, dry_run)
                .await?;
        }
        let before = old.map(Allocations::of).unwrap_or_default();
        let after = Allocations::of(object);
        let mut extras = WriteExtras::default();
        let before_keys = before.keys();
        let after_keys = after.keys();
        for key in &after_keys {
            if !before_keys.contains(key) {
                extras.compares.push(Compare::Absent(key.clone()));
                extras.ops.push(Op::Put(key.clone(), owner.clone().into()));
            }
        }
        for key in before_keys {
            if !after_keys.contains(&key) {
                extras.ops.push(Op::Delete(key));
            }
        }
        Ok(extras)
    }

    async fn allocate_ips(
        &self,
        storage: &dyn Storage,
        object: &mut Value,
        old: Option<&Value>,
        owner: &str,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let snapshot = object.clone();
        let problems = super::validation::validate_cluster_ip_fields(
            snapshot.get("spec").unwrap_or(&Value::Null),
        );
        if !problems.is_empty() {
            return Err(invalid(&snapshot, problems));
        }
        let spec = object
            .get_mut("spec")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| ApiError::bad_request("spec is required"))?;
        let cluster_ip = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut ips: Vec<String> = spec
            .get("clusterIPs")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if !cluster_ip.is_empty() && ips.is_empty() {
            ips.push(cluster_ip.clone());
        }
        let headless = ips.first().map(String::as_str) == Some("None");
        let has_selector = spec
            .get("selector")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty());
        let mut policy = spec
            .get("ipFamilyPolicy")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if policy.is_empty() {
            policy = if headless && !has_selector {
                "RequireDualStack".into()
            } else {
                "SingleStack".into()
            };
        }
        let mut families: Vec<String> = spec
            .get("ipFamilies")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(old) = old {
            let strings = |field: &str| -> Vec<String> {
                old.pointer(&format!("/spec/{field}"))
                    .and_then(Value::as_array)
                    .map(|l| {
                        l.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let (old_ips, old_families) = (strings("clusterIPs"), strings("ipFamilies"));
            if policy == "SingleStack" {
                // Downgrading to single-stack releases the secondary address and family.
                if ips == old_ips && ips.len() == 2 {
                    ips.truncate(1);
                }
                if families == old_families && families.len() == 2 {
                    families.truncate(1);
                }
            } else {
                let mut errors = FieldErrors::new();
                if old_ips.len() == 2 && ips.len() == 1 {
                    errors.push(FieldError::invalid(
                        "spec.ipFamilyPolicy",
                        &json!(policy),
                        "must be 'SingleStack' to release the secondary cluster IP",
                    ));
                }
                if old_families.len() == 2 && families.len() == 1 {
                    errors.push(FieldError::invalid(
                        "spec.ipFamilyPolicy",
                        &json!(policy),
                        "must be 'SingleStack' to release the secondary IP family",
                    ));
                }
                if !errors.is_empty() {
                    return Err(invalid(&snapshot, errors));
                }
            }
        }
        let configured = self.families();
        let primary = configured[0];
        let other = if primary == "IPv4" { "IPv6" } else { "IPv4" };
        let mut errors = FieldErrors::new();
        if headless {
            if families.is_empty() {
                families.push(primary.to_string());
            }
            if !has_selector && policy != "SingleStack" && families.len() == 1 {
                let second = if families[0] == "IPv4" {
                    "IPv6"
                } else {
                    "IPv4"
                };
                families.push(second.to_string());
            }
        } else {
            for (i, ip) in ips.iter().enumerate().skip(families.len()) {
                match ip.parse::<IpAddr>() {
                    Ok(IpAddr::V4(_)) if configured.contains(&"IPv4") => {
                        families.push("IPv4".into())
                    }
                    Ok(IpAddr::V6(_)) if configured.contains(&"IPv6") => {
                        families.push("IPv6".into())
                    }
                    Ok(addr) => {
                        let family = if addr.is_ipv4() { "IPv4" } else { "IPv6" };
                        errors.push(FieldError::invalid(
                            format!("spec.clusterIPs[{i}]"),
                            &json!(ips),
                            format!("{family} is not configured on this cluster"),
                        ));
                    }
                    Err(_) => {}
                }
            }
            if policy == "RequireDualStack" && configured.len() < 2 {
                errors.push(FieldError::invalid(
                    "spec.ipFamilyPolicy",
                    &json!(policy),
                    "this cluster is not configured for dual-stack services",
                ));
            }
            for (i, family) in families.iter().enumerate() {
                if (family == "IPv4" || family == "IPv6") && !configured.contains(&family.as_str())
                {
                    errors.push(FieldError::invalid(
                        format!("spec.ipFamilies[{i}]"),
                        &json!(family),
                        "not configured on this cluster",
                    ));
                }
            }
            if !errors.is_empty() {
                return Err(invalid(&snapshot, errors));
            }
            if families.is_empty() {
                families.push(primary.to_string());
            }
            if policy != "SingleStack" && families.len() == 1 && configured.len() == 2 {
                families.push(other.to_string());
            }
        }
        spec.insert("ipFamilyPolicy".into(), json!(policy));
        spec.insert("ipFamilies".into(), json!(families));
        if headless {
            spec.insert("clusterIP".into(), json!("None"));
            spec.insert("clusterIPs".into(), json!(["None"]));
            return Ok(());
        }
        let old_ips = old.map(Allocations::of).unwrap_or_default().ips;
        let mut allocated = Vec::new();
        for (i, family) in families.iter().enumerate() {
            let Some(range) = self.ranges.iter().find(|r| r.family() == family) else {
                continue;
            };
            match ips.get(i) {
                Some(requested) => {
                    if old_ips.contains(requested) {
                        allocated.push(requested.clone());
                        continue;
                    }
                    if range.offset_of(requested).is_none() {
                        return Err(invalid(
                            &snapshot,
                            FieldErrors(vec![FieldError::invalid(
                                "spec.clusterIPs",
                                &json!(ips),
                                if range.contains_network(requested) {
                                    format!(
                                        "failed to allocate IP {requested}: the provided IP ({requested}) is not in the valid range. The range of valid IPs is {range}"
                                    )
                                } else {
                                    format!(
                                        "failed to allocate IP {requested}: the provided network does not match the current range"
                                    )
                                },
                            )]),
                        ));
                    }
                    // A dry run checks the range only, as upstream's dry-run allocator does.
                    if !dry_run
                        && Self::held_by_other(storage, &format!("{IP_PREFIX}{requested}"), owner)
                            .await?
                    {
                        return Err(invalid(
                            &snapshot,
                            FieldErrors(vec![FieldError::invalid(
                                "spec.clusterIPs",
                                &json!(ips),
                                format!(
                                    "failed to allocate IP {requested}: provided IP is already allocated"
                                ),
                            )]),
                        ));
                    }
                    allocated.push(requested.clone());
                }
                // A dry run reserves nothing: the placeholder is the range's network address.
                None if dry_run => allocated.push(range.address(0)),
                None => {
                    let index = self
                        .ranges
                        .iter()
                        .position(|r| r.family() == range.family())
                        .unwrap_or(0);
                    allocated.push(self.dynamic_ip(storage, index).await?)
                }
            }
        }
        if let Some(first) = allocated.first() {
            spec.insert("clusterIP".into(), json!(first));
        }
        spec.insert("clusterIPs".into(), json!(allocated));
        Ok(())
    }

    async fn allocate_ports(
        &self,
        storage: &dyn Storage,
        object: &mut Value,
        kind: &str,
        owner: &str,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let snapshot = object.clone();
        let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
            return Ok(());
        };
        let wants_node_ports = kind == "NodePort"
            || (kind == "LoadBalancer"
                && spec
                    .get("allocateLoadBalancerNodePorts")
                    .and_then(Value::as_bool)
                    != Some(false));
        let mut used: Vec<i64> = Vec::new();
        let mut by_port: BTreeMap<i64, i64> = BTreeMap::new();
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for (i, port) in ports.iter_mut().enumerate() {
                let Some(port) = port.as_object_mut() else {
                    continue;
                };
                let requested = port.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
                let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
                if requested > 0 {
                    if !used.contains(&requested) {
                        if !dry_run && !self.ports.contains(requested) {
                            return Err(invalid(
                                &snapshot,
                                FieldErrors(vec![FieldError::invalid(
                                    format!("spec.ports[{i}].nodePort"),
                                    &json!(requested),
                                    format!(
                                        "provided port is not in the valid range. The range of valid ports is {}",
                                        self.ports
                                    ),
                                )]),
                            ));
                        }
                        if Self::held_by_other(storage, &format!("{PORT_PREFIX}{requested}"), owner)
                            .await?
                        {
                            return Err(invalid(
                                &snapshot,
                                FieldErrors(vec![FieldError::invalid(
                                    format!("spec.ports[{i}].nodePort"),
                                    &json!(requested),
                                    "provided port is already allocated",
                                )]),
                            ));
                        }
                        used.push(requested);
                    }
                    by_port.entry(number).or_insert(requested);
                    continue;
                }
                if !wants_node_ports {
                    continue;
                }
                let value = match by_port.get(&number) {
                    Some(shared) => *shared,
                    None => {
                        let fresh = if dry_run {
                            dry_run_port(&used)
                        } else {
                            self.dynamic_port(storage, &used).await?
                        };
                        used.push(fresh);
                        by_port.insert(number, fresh);
                        fresh
                    }
                };
                port.insert("nodePort".into(), json!(value));
            }
        }
        if super::spec::needs_health_check(spec) {
            let requested = spec
                .get("healthCheckNodePort")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if requested > 0 {
                if used.contains(&requested)
                    || Self::held_by_other(storage, &format!("{PORT_PREFIX}{requested}"), owner)
                        .await?
                {
                    return Err(ApiError::internal(format!(
                        "failed to allocate requested HealthCheck NodePort {requested}: provided port is already allocated"
                    )));
                }
                if !self.ports.contains(requested) {
                    return Err(ApiError::internal(format!(
                        "failed to allocate requested HealthCheck NodePort {requested}: provided port is not in the valid range. The range of valid ports is {}",
                        self.ports
                    )));
                }
            } else {
                let fresh = if dry_run {
                    dry_run_port(&used)
                } else {
                    self.dynamic_port(storage, &used).await?
                };
                spec.insert("healthCheckNodePort".into(), json!(fresh));
            }
        }
        Ok(())
    }

    /// The storage work that frees what a removed Service held.
    pub fn release(&self, object: &Value) -> WriteExtras {
        WriteExtras {
            compares: Vec::new(),
            ops: Allocations::of(object)
                .keys()
                .into_iter()
                .map(Op::Delete)
                .collect(),
        }
    }
}

/// The dry-run placeholder for a dynamic node port: one more than the highest handed out in
/// this request, or 32769 (upstream's dry-run allocator).
fn dry_run_port(used: &[i64]) -> i64 {
    used.iter().max().map_or(32769, |m| m + 1).max(32769)
}

/// `normalizeClusterIPs`: a `clusterIP` without `clusterIPs` fills them.
pub fn normalize_cluster_ips(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let ip = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let empty = spec
        .get("clusterIPs")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if !ip.is_empty() && empty {
        spec.insert("clusterIPs".into(), json!([ip]));
    }
}

/// `patchAllocatedValues`: a PUT that omits allocated values keeps them.
pub fn keep_allocated_values(new: &mut Value, old: &Value) {
    let old_type = spec_str(old, "type").to_string();
    let new_type = spec_str(new, "type").to_string();
    if old_type == "ExternalName" || new_type == "ExternalName" {
        return;
    }
    let Some(old_spec) = old.get("spec").and_then(Value::as_object) else {
        return;
    };
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let empty = |v: Option<&Value>| match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    };
    if empty(spec.get("clusterIP")) {
        for field in ["clusterIP", "clusterIPs"] {
            if let Some(v) = old_spec.get(field) {
                spec.insert(field.into(), v.clone());
            }
        }
    } else if empty(spec.get("clusterIPs"))
        && spec.get("clusterIP") == old_spec.get("clusterIP")
        && let Some(v) = old_spec.get("clusterIPs")
    {
        spec.insert("clusterIPs".into(), v.clone());
    }
    for field in ["ipFamilies", "ipFamilyPolicy"] {
        if empty(spec.get(field))
            && let Some(v) = old_spec.get(field)
        {
            spec.insert(field.into(), v.clone());
        }
    }
    if matches!(new_type.as_str(), "NodePort" | "LoadBalancer") {
        let old_ports: Vec<(i64, i64)> = old_spec
            .get("ports")
            .and_then(Value::as_array)
            .map(|ports| {
                ports
                    .iter()
                    .map(|p| {
                        (
                            p.get("port").and_then(Value::as_i64).unwrap_or(0),
                            p.get("nodePort").and_then(Value::as_i64).unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                if port.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0 {
                    continue;
                }
                let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
                if let Some((_, node_port)) = old_ports.iter().find(|(p, n)| *p == number && *n > 0)
                {
                    port.insert("nodePort".into(), json!(node_port));
                }
            }
        }
        if empty(spec.get("healthCheckNodePort"))
            && let Some(v) = old_spec.get("healthCheckNodePort")
        {
            spec.insert("healthCheckNodePort".into(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bound_addresses() {
        let range = IpRange::parse("10.96.0.0/16").expect("parses");
        assert_eq!(range.first_host(), "10.96.0.1");
        assert_eq!(range.static_band(), 256);
        assert!(range.offset_of("10.96.255.255").is_none());
        assert!(range.offset_of("10.96.0.0").is_none());
        assert!(range.offset_of("10.96.3.4").is_some());
        assert!(IpRange::parse("10.0.0.0/8").is_err());
    }

    #[test]
    fn port_ranges_parse_both_forms() {
        assert_eq!(
            PortRange::parse("30000-32767"),
            Ok(PortRange {
                base: 30000,
                size: 2768
            })
        );
        assert_eq!(PortRange::parse("30000+10").map(|r| r.size), Ok(11));
        assert_eq!(
            PortRange::parse("30000-32767").map(|r| r.static_band()),
            Ok(86)
        );
    }
}
