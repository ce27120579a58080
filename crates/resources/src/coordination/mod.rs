//! `coordination.k8s.io`: Leases, and what upstream generates from their Go types.

pub mod lease;

use capstan_machinery::GroupVersionData;
use capstan_machinery::protobuf::Messages;

/// coordination.k8s.io/v1's OpenAPI document, protobuf messages and member order.
pub static V1: GroupVersionData = GroupVersionData {
    openapi_path: "apis/coordination.k8s.io/v1",
    openapi: include_bytes!("openapi.json"),
    protobuf: Some(Messages {
        api_version: "coordination.k8s.io/v1",
        package: "k8s.io.api.coordination.v1",
        table: include_bytes!("protobuf.json"),
    }),
    member_order: include_str!("member_order.txt"),
};
