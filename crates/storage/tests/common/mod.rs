//! Shared helpers of the storage tests.
#[cfg(feature = "etcd")]
pub mod etcd_server;
