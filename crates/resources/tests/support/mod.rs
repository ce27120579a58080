//! The registries of every kind over a fresh embedded store with its watch caches, as
//! `capstan serve` builds them (shared by the tests and the write benchmark).

use std::path::Path;
use std::sync::Arc;

use capstan_registry::cache::{CacheSet, HistoryLimits, Project};
use capstan_registry::{DynStrategy, Registry};
use capstan_resources::core::service::{IpRange, PortRange, ServiceAllocator, ServiceStrategy};
use capstan_storage::{EmbeddedOptions, EmbeddedStore, Storage};

/// Opens the store in `dir` and starts its Service allocator and watch caches; the result
/// gives the registry of a kind (by its `kind`).
pub async fn registries(dir: &Path) -> impl Fn(&str) -> Registry + use<> {
    let store: Arc<dyn Storage> =
        Arc::new(EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("the embedded store"));
    let ranges = vec![IpRange::parse("10.96.0.0/16").expect("a range")];
    let ports = PortRange::parse("30000-32767").expect("a range");
    let services = Arc::new(ServiceStrategy::new(ServiceAllocator::new(ranges, ports)));
    services
        .allocator()
        .start(store.clone())
        .await
        .expect("the allocator");
    let kinds = capstan_resources::registered(services);
    let limits = HistoryLimits {
        events: 102_400,
        bytes: 256 << 20,
    };
    let caches = Arc::new(CacheSet::for_kinds(
        store.clone(),
        kinds.iter().map(|k| k.clone() as Arc<dyn Project>),
        limits,
    ));
    caches.start().await.expect("the watch caches");
    move |kind: &str| {
        let strategy: &Arc<dyn DynStrategy> = kinds
            .iter()
            .find(|k| k.info().kind == kind)
            .expect("a registered kind");
        let cache = caches
            .cache(&strategy.info().list_prefix(""))
            .expect("its cache");
        Registry::new(strategy.clone(), store.clone(), cache, None)
    }
}
