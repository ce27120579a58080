//! `coordination.k8s.io`: Leases, and what upstream generates from their Go types.

pub mod lease;

use capstan_machinery::GroupVersionData;

/// coordination.k8s.io/v1's OpenAPI document, protobuf messages and member order.
pub static V1: GroupVersionData = GroupVersionData::new(
    "apis/coordination.k8s.io/v1",
    include_bytes!("openapi.json"),
    include_str!("member_order.txt"),
)
.with_protobuf(
    "k8s.io.api.coordination.v1",
    include_bytes!("protobuf.json"),
);
