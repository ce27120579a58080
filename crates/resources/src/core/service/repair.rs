//! The repair check of the allocation records (upstream's repair loops for cluster IPs and
//! node ports), run once at start-up.

use std::collections::{BTreeMap, BTreeSet};

use capstan_machinery::ApiError;
use capstan_storage::{Compare, Op, RangeRequest, Storage};
use k8s_openapi::api::core::v1::Service;

use super::allocator::{Allocations, ServiceAllocator};

/// Every allocation key the stored Services hold: the `namespace/name` holding it, and that
/// Service's storage key and revision; with the revision the Services were read at.
async fn wanted(storage: &dyn Storage) -> Result<(Wanted, capstan_storage::Revision), ApiError> {
    let services = storage
        .range(RangeRequest {
            prefix: super::SERVICE_INFO.list_prefix(""),
            ..RangeRequest::default()
        })
        .await
        .map_err(ApiError::internal)?;
    let mut wanted: Wanted = BTreeMap::new();
    for kv in &services.kvs {
        let Ok(service) = serde_json::from_slice::<Service>(&kv.value) else {
            // Only a hand edit gets here; what the record held counts as held by nobody.
            tracing::warn!(key = %kv.key, "stored service does not decode; its allocations are not counted");
            continue;
        };
        let owner = ServiceAllocator::owner(&service);
        for key in Allocations::of(&service).keys() {
            let holder = (owner.clone(), kv.key.to_string(), kv.mod_revision);
            if let Some((other, ..)) = wanted.insert(key.clone(), holder)
                && other != owner
            {
                tracing::warn!(%key, first = %other, second = %owner, "allocated to several services; please recreate one of them");
            }
        }
    }
    Ok((wanted, services.revision))
}

/// Applies one fix: 1 when it held, 0 when what it was judged on changed meanwhile.
async fn fixed(storage: &dyn Storage, txn: capstan_storage::Txn) -> Result<usize, ApiError> {
    let outcome = storage.txn(txn).await.map_err(ApiError::internal)?;
    Ok(usize::from(outcome.succeeded()))
}

/// Allocation keys and who holds them: `namespace/name`, storage key, revision.
type Wanted = BTreeMap<String, (String, String, capstan_storage::Revision)>;

impl ServiceAllocator {
    /// The repair check (upstream's repair loops): every Service's addresses and ports must be
    /// recorded as allocated to it, and nothing else may be. Writes are transactional, so this
    /// finds nothing unless the data was edited by hand; it reports and fixes what it finds.
    /// Returns the number of fixes.
    ///
    /// Other replicas may be writing meanwhile: the records are read at the revision the
    /// Services were read at, and each fix holds only while what it was judged on is
    /// unchanged (the record, or the Service holding it).
    pub async fn repair(&self, storage: &dyn Storage) -> Result<usize, ApiError> {
        let (wanted, revision) = wanted(storage).await?;
        let recorded = super::allocator::records(storage, Some(revision)).await?;
        let mut fixes = 0;
        for kv in &recorded.kvs {
            if !wanted.contains_key(kv.key.as_ref()) {
                tracing::warn!(key = %kv.key, "allocation held by no service; releasing it");
                let txn = capstan_storage::Txn::new()
                    .when(Compare::ModRevision(kv.key.to_string(), kv.mod_revision))
                    .then(Op::Delete(kv.key.to_string()));
                fixes += fixed(storage, txn).await?;
            }
        }
        let present: BTreeSet<&str> = recorded.kvs.iter().map(|kv| &*kv.key).collect();
        for (key, (owner, service, at)) in &wanted {
            if !present.contains(&**key) {
                tracing::warn!(%key, %owner, "service address or port not recorded as allocated; repairing");
                let txn = capstan_storage::Txn::new()
                    .when(Compare::Absent(key.clone()))
                    .when(Compare::ModRevision(service.clone(), *at))
                    .then(Op::Put(key.clone(), owner.clone().into()));
                fixes += fixed(storage, txn).await?;
            }
        }
        Ok(fixes)
    }
}
