//! `discovery.k8s.io`: EndpointSlices, and what upstream generates from their Go types.

pub mod endpointslice;

use capstan_machinery::GroupVersionData;
use capstan_machinery::protobuf::Messages;

/// discovery.k8s.io/v1's OpenAPI document, protobuf messages and member order.
pub static V1: GroupVersionData = GroupVersionData {
    openapi_path: "apis/discovery.k8s.io/v1",
    openapi: include_bytes!("openapi.json"),
    protobuf: Some(Messages {
        api_version: "discovery.k8s.io/v1",
        package: "k8s.io.api.discovery.v1",
        table: include_bytes!("protobuf.json"),
    }),
    member_order: include_str!("member_order.txt"),
};
