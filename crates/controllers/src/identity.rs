//! The apiserver identity Lease (upstream 1.26+, `APIServerIdentity`): every replica keeps a
//! Lease `kube-system/apiserver-<hash of its host name>` renewed every 10 s with a one-hour
//! duration and labelled `apiserver.kubernetes.io/identity=kube-apiserver`, and deletes such
//! Leases that have lapsed (upstream's identity lease controller and its garbage collector).

use std::sync::Arc;
use std::time::Duration;

use capstan_registry::{DeleteOptions, ReadAt, Registry, Subresource, WriteOptions};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sha2::Digest;

const NAMESPACE: &str = "kube-system";
/// The identity label and its value for kube-apiserver.
const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
const COMPONENT: &str = "kube-apiserver";
/// `IdentityLeaseDurationSeconds`.
const DURATION_SECONDS: i32 = 3600;
/// `IdentityLeaseRenewIntervalPeriod`.
const RENEW: Duration = Duration::from_secs(10);
/// `IdentityLeaseGCPeriod`.
const GC_PERIOD: Duration = Duration::from_secs(3600);

/// The host name, as Go's `os.Hostname` reads it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The apiserver's ID (`GenericAPIServer.APIServerID`): `apiserver-` and the lower-case
/// base32 (no padding) of the first 16 bytes of the SHA-256 of the host name and
/// `kube-apiserver`, each prefixed by its 16-bit length.
pub fn apiserver_id(hostname: &str) -> String {
    let mut data = Vec::new();
    for part in [hostname, COMPONENT] {
        let length = u16::try_from(part.len()).unwrap_or(u16::MAX);
        data.extend_from_slice(&length.to_be_bytes());
        data.extend_from_slice(&part.as_bytes()[..usize::from(length)]);
    }
    let hash = sha2::Sha256::digest(&data);
    format!("apiserver-{}", base32_lower(&hash[..16]))
}

/// RFC 4648 base32 without padding, in lower case.
fn base32_lower(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in bytes {
        buffer = (buffer << 8) | u32::from(*byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

fn options() -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_manager: COMPONENT.into(),
        applied: false,
    }
}

/// This replica's identity Lease.
pub struct IdentityLease {
    leases: Arc<Registry>,
    hostname: String,
    name: String,
    holder: String,
}

impl IdentityLease {
    /// The identity Lease of this host's apiserver in `leases`.
    pub fn new(leases: Arc<Registry>) -> Self {
        let hostname = hostname();
        let name = apiserver_id(&hostname);
        let holder = format!("{name}_{}", uuid::Uuid::new_v4());
        IdentityLease {
            leases,
            hostname,
            name,
            holder,
        }
    }

    /// `newLease`: a new Lease, or `base` renewed; either way with the duration, the renew
    /// time and the labels asserted (the holder stays whoever created it).
    fn renewed(&self, base: Option<Lease>) -> Lease {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(NAMESPACE.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.holder.clone()),
                ..LeaseSpec::default()
            }),
        });
        let spec = lease.spec.get_or_insert_default();
        spec.lease_duration_seconds = Some(DURATION_SECONDS);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let labels = lease.metadata.labels.get_or_insert_default();
        labels.insert(IDENTITY_LABEL.into(), COMPONENT.into());
        labels.insert("kubernetes.io/hostname".into(), self.hostname.clone());
        lease
    }

    /// One heartbeat: create the Lease, or renew it.
    async fn beat(&self) -> Result<(), capstan_machinery::ApiError> {
        let current = self
            .leases
            .get_typed::<Lease>(NAMESPACE, &self.name, ReadAt::Latest)
            .await;
        match current {
            Err(error) if error.is_not_found() => {
                let lease = capstan_registry::object::from_typed(&self.renewed(None));
                self.leases.create(NAMESPACE, lease, &options()).await?;
            }
            Err(error) => return Err(error),
            Ok(base) => {
                let lease = self.renewed(Some(base));
                self.leases
                    .update_typed(NAMESPACE, &self.name, &lease, &options(), Subresource::Main)
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes identity Leases that have lapsed (`isLeaseExpired`, judged again on a fresh
    /// read before each delete).
    async fn collect(&self) {
        let expired = |lease: &Lease| {
            let spec = lease.spec.as_ref();
            let (Some(renewed), Some(seconds)) = (
                spec.and_then(|s| s.renew_time.as_ref()),
                spec.and_then(|s| s.lease_duration_seconds),
            ) else {
                return true;
            };
            let until = renewed
                .0
                .checked_add(SignedDuration::from_secs(i64::from(seconds)));
            until.is_ok_and(|until| until < Timestamp::now())
        };
        let ours =
            |s: &capstan_registry::cache::Selectable| s.label(IDENTITY_LABEL) == Some(COMPONENT);
        for lease in self.leases.cached_where::<Lease>(NAMESPACE, ours) {
            let Some(name) = lease.metadata.name.clone().filter(|_| expired(&lease)) else {
                continue;
            };
            let fresh = self
                .leases
                .get_typed::<Lease>(NAMESPACE, &name, ReadAt::Latest)
                .await;
            if fresh.is_ok_and(|l| expired(&l)) {
                let _ = self
                    .leases
                    .delete(NAMESPACE, &name, &DeleteOptions::default())
                    .await;
            }
        }
    }

    /// Heartbeats every 10 s (jittered by up to 4 %) and collects lapsed identity Leases
    /// every hour, until `shutdown` turns true.
    pub async fn run(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut collected = tokio::time::Instant::now();
        self.collect().await;
        loop {
            if let Err(error) = self.beat().await {
                tracing::warn!(lease = %self.name, error = %error.message, "renewing the apiserver identity lease");
            }
            if collected.elapsed() >= GC_PERIOD {
                self.collect().await;
                collected = tokio::time::Instant::now();
            }
            let pause = RENEW.mul_f64(1.0 + fastrand::f64() * 0.04);
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_is_rfc_4648_in_lower_case() {
        assert_eq!(base32_lower(b""), "");
        assert_eq!(base32_lower(b"f"), "my");
        assert_eq!(base32_lower(b"foobar"), "mzxw6ytboi");
    }

    #[test]
    fn the_id_hashes_the_host_name_and_the_component() {
        // Python's hashlib and base64.b32encode over the same bytes give the same name.
        assert_eq!(
            apiserver_id("node-1"),
            "apiserver-lgabes5ywnaqeagh5dny4zlzs4"
        );
        assert_ne!(apiserver_id("node-1"), apiserver_id("node-2"));
    }
}
