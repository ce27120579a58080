//! Random (version 4) UUIDs for object UIDs and `Audit-Id`s, from the operating system's
//! random source read a few kilobytes at a time.
//!
//! `uuid::Uuid::new_v4` asks the kernel for 16 bytes each time: a system call per created
//! object and per request. Here each thread keeps a buffer of the kernel's random bytes and
//! takes 16 from it per UUID, so the bytes are as random as before and the kernel is asked
//! once per 256 UUIDs.

use std::cell::RefCell;

/// Random bytes a thread reads from the kernel at once.
const POOL: usize = 4096;

struct Pool {
    bytes: [u8; POOL],
    /// How many of `bytes` were handed out (all of them when the pool is empty).
    used: usize,
}

thread_local! {
    static RANDOM: RefCell<Pool> = const { RefCell::new(Pool { bytes: [0; POOL], used: POOL }) };
}

/// A random (version 4) UUID in its usual text form (`Display` would cost ten times as much).
pub fn new_v4_string() -> String {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    new_v4().hyphenated().encode_lower(&mut text).to_string()
}

/// A random (version 4) UUID.
pub fn new_v4() -> uuid::Uuid {
    // A thread tearing down its locals has no pool: it asks the kernel directly.
    let bytes = RANDOM.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.used + 16 > POOL {
            if getrandom::fill(&mut pool.bytes).is_err() {
                // No random source: uuid's own call meets (and reports) it as before.
                return None;
            }
            pool.used = 0;
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&pool.bytes[pool.used..pool.used + 16]);
        // Handed out once: the pool keeps no copy of what it gave.
        let used = pool.used;
        pool.bytes[used..used + 16].fill(0);
        pool.used += 16;
        Some(out)
    });
    match bytes.ok().flatten() {
        Some(bytes) => uuid::Builder::from_random_bytes(bytes).into_uuid(),
        None => uuid::Uuid::new_v4(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4_and_distinct_across_pool_refills() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3 * (POOL / 16) {
            let uid = new_v4();
            assert_eq!(uid.get_version_num(), 4);
            assert_eq!(uid.get_variant(), uuid::Variant::RFC4122);
            assert!(seen.insert(uid), "a UUID came twice: {uid}");
        }
        let text = new_v4_string();
        assert_eq!(
            uuid::Uuid::parse_str(&text).map(|u| u.to_string()),
            Ok(text)
        );
    }
}
