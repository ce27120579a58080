//! What a Service write allocates and frees: cluster IPs ([`cluster_ips`]) and node ports
//! ([`node_ports`]) picked through the allocator's in-memory view, and the storage work that
//! records them in the Service's own transaction.

use capstan_machinery::ApiError;
use capstan_registry::WriteExtras;
use capstan_storage::{Compare, Op, Storage};
use k8s_openapi::api::core::v1::Service;

use super::allocator::{Allocations, Picker, ServiceAllocator};
use super::{cluster_ips, node_ports, spec};

impl ServiceAllocator {
    /// Resolves IP families and policy, allocates cluster IPs and node ports for `service`
    /// (`old`: the stored Service on update), and returns the storage work that records them.
    pub async fn allocate(
        &self,
        storage: &dyn Storage,
        service: &mut Service,
        old: Option<&Service>,
        dry_run: bool,
    ) -> Result<WriteExtras, ApiError> {
        let owner = Self::owner(service);
        if service.spec.as_ref().map(spec::kind) != Some("ExternalName") {
            let picker = Picker {
                allocator: self,
                storage,
                owner: &owner,
                dry_run,
            };
            cluster_ips::allocate(&picker, service, old).await?;
            node_ports::allocate(&picker, service).await?;
        }
        let before = old.map(Allocations::of).unwrap_or_default().keys();
        let after = Allocations::of(service).keys();
        let mut extras = WriteExtras::default();
        for key in after.iter().filter(|k| !before.contains(k)) {
            extras.compares.push(Compare::Absent(key.clone()));
            extras.ops.push(Op::Put(key.clone(), owner.clone().into()));
        }
        for key in before.into_iter().filter(|k| !after.contains(k)) {
            extras.ops.push(Op::Delete(key));
        }
        Ok(extras)
    }

    /// The storage work that frees what a removed Service held.
    pub fn release(&self, service: &Service) -> WriteExtras {
        WriteExtras {
            compares: Vec::new(),
            ops: Allocations::of(service)
                .keys()
                .into_iter()
                .map(Op::Delete)
                .collect(),
        }
    }
}
