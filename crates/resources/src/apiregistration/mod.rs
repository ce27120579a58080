//! `apiregistration.k8s.io`: APIServices, and what upstream generates from their Go types.
//! (The aggregation layer that gives them meaning is `capstan-aggregation`.)

pub mod apiservice;

use capstan_machinery::GroupVersionData;

/// apiregistration.k8s.io/v1's OpenAPI document and member order (its bodies are JSON or
/// YAML: Capstan has no protobuf table for it).
pub static V1: GroupVersionData = GroupVersionData {
    openapi_path: "apis/apiregistration.k8s.io/v1",
    openapi: include_bytes!("openapi.json"),
    protobuf: None,
    member_order: include_str!("member_order.txt"),
};
