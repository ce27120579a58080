//! `apiregistration.k8s.io`: APIServices, and what upstream generates from their Go types.
//! (The aggregation layer that gives them meaning is `capstan-aggregation`.)

pub mod apiservice;

use capstan_machinery::GroupVersionData;

/// apiregistration.k8s.io/v1's OpenAPI document and member order (its bodies are JSON or
/// YAML: Capstan has no protobuf table for it).
pub static V1: GroupVersionData = GroupVersionData::new(
    "apis/apiregistration.k8s.io/v1",
    include_bytes!("openapi.json"),
    include_str!("member_order.txt"),
);
