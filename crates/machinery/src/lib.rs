//! Kubernetes API machinery for Capstan, independent of any particular resource.
//!
//! Start with [`ApiError`]: every failure a client can cause becomes one, and it renders as the
//! `metav1.Status` kube-apiserver would send. Around it live the pieces every verb handler needs:
//! [`field::FieldError`] lists for `Invalid` errors, [`labels::LabelSelector`] and
//! [`fields::FieldSelector`], [`continue_token::ContinueToken`], content negotiation
//! ([`media`]), the `meta.k8s.io/v1` [`table::Table`], JSON and merge [`patch`]es, YAML
//! ([`yaml`]) and name/label validation ([`validation`]).
//!
//! Objects are handled as `serde_json::Value`: the machinery never needs a resource's types.

pub mod continue_token;
mod definitions;
pub mod field;
pub mod fields;
pub mod go_json;
pub mod go_order;
pub mod go_scanner;
pub mod group;
pub mod hash;
pub mod ip;
pub mod json;
pub mod labels;
pub mod media;
pub mod meta;
pub mod patch;
pub mod protobuf;
pub mod schema;
pub mod smp;
pub mod status;
pub mod strict;
pub mod table;
#[cfg(any(test, feature = "testdata"))]
pub mod testdata;
pub mod uid;
pub mod validation;
pub mod yaml;

pub use group::GroupVersionData;
pub use status::{ApiError, Details, Reason};
