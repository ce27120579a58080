//! Upstream's `lease` endpoint reconciler (`--endpoint-reconciler-type=lease`): every replica
//! keeps a record of its address under `masterleases/<ip>` that lapses unless renewed, and
//! the `kubernetes` Service's endpoints list the addresses whose records are live, so a dead
//! replica drops out.
//!
//! Upstream's records are etcd keys with a TTL. Capstan's storage has no TTLs (the embedded
//! store has no leases), so a record carries its expiry and readers judge it; whoever reads
//! an expired record deletes it (only if it is still the record they read).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use capstan_storage::{Compare, Op, RangeRequest, Storage, Txn};

/// Where the records live (upstream: `/registry/masterleases/`).
const PREFIX: &str = "masterleases/";
/// How long a record lives without renewal (upstream's `DefaultEndpointReconcilerTTL`).
pub const TTL: Duration = Duration::from_secs(15);
/// How often a replica renews its record (upstream's `EndpointReconcilerInterval`).
pub const RENEW: Duration = Duration::from_secs(10);

/// One replica's record: its address and when the record lapses (seconds since the epoch).
#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    ip: IpAddr,
    expires: u64,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The replicas' address records.
#[derive(Clone)]
pub struct MasterLeases {
    store: Arc<dyn Storage>,
}

impl MasterLeases {
    /// The records in `store`.
    pub fn new(store: Arc<dyn Storage>) -> Self {
        MasterLeases { store }
    }

    /// Writes (or renews) the record of `ip` for another [`TTL`].
    pub async fn renew(&self, ip: IpAddr) -> Result<(), capstan_storage::StorageError> {
        let record = Record {
            ip,
            expires: now() + TTL.as_secs(),
        };
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let txn = Txn::new().then(Op::Put(format!("{PREFIX}{ip}"), value.into()));
        self.store.txn(txn).await.map(|_| ())
    }

    /// Removes the record of `ip` (a replica shutting down).
    pub async fn remove(&self, ip: IpAddr) -> Result<(), capstan_storage::StorageError> {
        let txn = Txn::new().then(Op::Delete(format!("{PREFIX}{ip}")));
        self.store.txn(txn).await.map(|_| ())
    }

    /// The addresses with live records, sorted; expired records are deleted on the way.
    pub async fn live(&self) -> Result<Vec<IpAddr>, capstan_storage::StorageError> {
        let request = RangeRequest {
            prefix: PREFIX.into(),
            ..RangeRequest::default()
        };
        let records = self.store.range(request).await?;
        let mut live = Vec::new();
        for kv in &records.kvs {
            match serde_json::from_slice::<Record>(&kv.value) {
                Ok(record) if record.expires > now() => live.push(record.ip),
                _ => {
                    let expired = Txn::new()
                        .when(Compare::ModRevision(kv.key.to_string(), kv.mod_revision))
                        .then(Op::Delete(kv.key.to_string()));
                    self.store.txn(expired).await?;
                }
            }
        }
        live.sort();
        live.dedup();
        Ok(live)
    }

    /// Renews the record of `ip` every [`RENEW`] until `shutdown` turns true, then removes it.
    pub async fn keep(&self, ip: IpAddr, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            if let Err(error) = self.renew(ip).await {
                tracing::warn!(%error, %ip, "renewing this replica's endpoint record");
            }
            tokio::select! {
                () = tokio::time::sleep(RENEW) => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
        }
        if let Err(error) = self.remove(ip).await {
            tracing::warn!(%error, %ip, "removing this replica's endpoint record");
        }
    }
}
