//! `discovery.k8s.io`: EndpointSlices, and what upstream generates from their Go types.

pub mod endpointslice;

use capstan_machinery::GroupVersionData;

/// discovery.k8s.io/v1's OpenAPI document, protobuf messages and member order.
pub static V1: GroupVersionData = GroupVersionData::new(
    "apis/discovery.k8s.io/v1",
    include_bytes!("openapi.json"),
    include_str!("member_order.txt"),
)
.with_protobuf("k8s.io.api.discovery.v1", include_bytes!("protobuf.json"));
