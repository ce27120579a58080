//! The core group, `/api/v1`: its kinds, and what upstream generates from their Go types.

pub mod endpoints;
pub mod namespace;
pub mod node;
pub mod pod;
pub mod service;

use capstan_machinery::GroupVersionData;

/// core/v1's OpenAPI document, protobuf messages and member order.
pub static V1: GroupVersionData = GroupVersionData::new(
    "api/v1",
    include_bytes!("openapi.json"),
    include_str!("member_order.txt"),
)
.with_protobuf("k8s.io.api.core.v1", include_bytes!("protobuf.json"));
