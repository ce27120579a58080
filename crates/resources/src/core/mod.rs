//! The core group, `/api/v1`: its kinds, and what upstream generates from their Go types.

pub mod endpoints;
pub mod namespace;
pub mod node;
pub mod pod;
pub mod service;

use capstan_machinery::GroupVersionData;
use capstan_machinery::protobuf::Messages;

/// core/v1's OpenAPI document, protobuf messages and member order.
pub static V1: GroupVersionData = GroupVersionData {
    openapi_path: "api/v1",
    openapi: include_bytes!("openapi.json"),
    protobuf: Some(Messages {
        api_version: "v1",
        package: "k8s.io.api.core.v1",
        table: include_bytes!("protobuf.json"),
    }),
    member_order: include_str!("member_order.txt"),
};
