//! Hash maps for the hot paths, on foldhash with a secret seed from the kernel.
//!
//! std's SipHash was about a tenth of a write's instructions; foldhash is several times
//! cheaper. Its own `RandomState` seeds from addresses and the clock, which its authors do not
//! offer as a defence against keys chosen to collide, and these maps hold keys that clients
//! choose (object names, field paths). So the seed every map shares is read from the kernel
//! once per process, and each map mixes in a seed of its own.

use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::SharedSeed;
use foldhash::quality::{FoldHasher, SeedableRandomState};

/// A `HashMap` hashing with [`RandomState`].
pub type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
/// A `HashSet` hashing with [`RandomState`].
pub type HashSet<T> = std::collections::HashSet<T, RandomState>;

/// foldhash (its quality variant) keyed by the process's secret seed and a per-map seed.
#[derive(Clone, Debug)]
pub struct RandomState(SeedableRandomState);

impl Default for RandomState {
    fn default() -> Self {
        static SHARED: OnceLock<SharedSeed> = OnceLock::new();
        static MAPS: AtomicU64 = AtomicU64::new(0);
        let shared = SHARED.get_or_init(|| {
            let mut seed = [0u8; 8];
            // Without a random source the process cannot make UIDs either; foldhash's own
            // seed is the fallback.
            if getrandom::fill(&mut seed).is_err() {
                return SharedSeed::global_random().clone();
            }
            SharedSeed::from_u64(u64::from_le_bytes(seed))
        });
        let per_map = MAPS.fetch_add(1, Ordering::Relaxed);
        RandomState(SeedableRandomState::with_seed(per_map, shared))
    }
}

impl BuildHasher for RandomState {
    type Hasher = FoldHasher<'static>;

    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

/// `new` and `with_capacity` for [`HashMap`], as std has them for its own hasher.
pub trait HashMapExt {
    /// An empty map.
    fn new() -> Self;
    /// An empty map with room for `capacity` entries.
    fn with_capacity(capacity: usize) -> Self;
}

impl<K, V> HashMapExt for HashMap<K, V> {
    fn new() -> Self {
        Self::with_hasher(RandomState::default())
    }

    fn with_capacity(capacity: usize) -> Self {
        Self::with_capacity_and_hasher(capacity, RandomState::default())
    }
}

/// `new` and `with_capacity` for [`HashSet`].
pub trait HashSetExt {
    /// An empty set.
    fn new() -> Self;
    /// An empty set with room for `capacity` members.
    fn with_capacity(capacity: usize) -> Self;
}

impl<T> HashSetExt for HashSet<T> {
    fn new() -> Self {
        Self::with_hasher(RandomState::default())
    }

    fn with_capacity(capacity: usize) -> Self {
        Self::with_capacity_and_hasher(capacity, RandomState::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_work_and_hash_apart_from_one_another() {
        let mut map: HashMap<String, u32> = HashMap::new();
        for i in 0..1000 {
            map.insert(format!("ns/name-{i}"), i);
        }
        assert_eq!(map.get("ns/name-7"), Some(&7));
        let set: HashSet<&str> = ["a", "b"].into_iter().collect();
        assert!(set.contains("a") && !set.contains("c"));
        // Two maps' seeds differ, so the same key hashes differently.
        let (a, b) = (RandomState::default(), RandomState::default());
        assert_ne!(a.hash_one("ns/name"), b.hash_one("ns/name"));
        // One map hashes a key the same way every time.
        assert_eq!(a.hash_one("ns/name"), a.hash_one("ns/name"));
    }
}
