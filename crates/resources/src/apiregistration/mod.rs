//! `apiregistration.k8s.io`: APIServices, and what upstream generates from their Go types.
//! (The aggregation layer that gives them meaning is `capstan-aggregation`.)

pub mod apiservice;

use capstan_machinery::GroupVersionData;

/// apiregistration.k8s.io/v1's OpenAPI document, protobuf messages (kube-aggregator's
/// `generated.proto`, through `scripts/gen-proto-schema.py`) and member order.
pub static V1: GroupVersionData = GroupVersionData::new(
    "apis/apiregistration.k8s.io/v1",
    include_bytes!("openapi.json"),
    include_str!("member_order.txt"),
)
.with_protobuf(
    "k8s.io.kube_aggregator.pkg.apis.apiregistration.v1",
    include_bytes!("protobuf.json"),
);
