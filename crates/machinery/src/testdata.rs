//! Two kinds' generated data, for tests of the engines below the kinds (the machinery's, the
//! registry's): Service's part of core/v1 and EndpointSlice's part of discovery/v1, taken from
//! their groups' folders in `capstan-resources` (`testdata/`), so those tests need no group.

use crate::GroupVersionData;

/// core/v1 Service's part of its group's data.
pub static SERVICE: GroupVersionData = GroupVersionData::new(
    "api/v1",
    include_bytes!("../testdata/service-openapi.json"),
    include_str!("../testdata/service-member-order.txt"),
)
.with_protobuf(
    "k8s.io.api.core.v1",
    include_bytes!("../testdata/service-protobuf.json"),
);

/// discovery/v1 EndpointSlice's part of its group's data (JSON only).
pub static ENDPOINT_SLICE: GroupVersionData = GroupVersionData::new(
    "apis/discovery.k8s.io/v1",
    include_bytes!("../testdata/endpointslice-openapi.json"),
    include_str!("../testdata/endpointslice-member-order.txt"),
);

/// The Service definition.
pub fn service() -> Option<&'static serde_json::Value> {
    SERVICE.definition("io.k8s.api.core.v1.Service")
}

/// The EndpointSlice definition.
pub fn endpoint_slice() -> Option<&'static serde_json::Value> {
    ENDPOINT_SLICE.definition("io.k8s.api.discovery.v1.EndpointSlice")
}
