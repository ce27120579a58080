//! What upstream generates from a group version's Go types and the machinery reads: its OpenAPI
//! document, its protobuf field table and the order its Go types declare their members in. A
//! group brings its own (declared in its folder of `capstan-resources`, registered through each
//! kind's `ResourceInfo`); the machinery holds only apimachinery's.

use serde_json::Value;

use crate::{go_order, protobuf, schema};

/// The generated data of one group version.
#[derive(Debug)]
pub struct GroupVersionData {
    /// The `/openapi/v3` path of its document (`api/v1`, `apis/discovery.k8s.io/v1`).
    pub openapi_path: &'static str,
    /// The OpenAPI v3 document kube-apiserver serves at that path, byte for byte.
    pub openapi: &'static [u8],
    /// The protobuf package of its messages (`k8s.io.api.core.v1`) and their field table, as
    /// `scripts/gen-proto-schema.py` writes it (`None`: its bodies are JSON and YAML only).
    pub protobuf: Option<(&'static str, &'static [u8])>,
    /// The member order of every definition its kinds reach but apimachinery's, one line a
    /// definition: its OpenAPI name, then its members in Go's order (`#` starts a comment).
    pub member_order: &'static str,
}

impl GroupVersionData {
    /// The data of the group version whose `/openapi/v3` document is served at
    /// `openapi_path`, with its Go member order; its bodies are JSON and YAML only.
    pub const fn new(
        openapi_path: &'static str,
        openapi: &'static [u8],
        member_order: &'static str,
    ) -> Self {
        GroupVersionData {
            openapi_path,
            openapi,
            protobuf: None,
            member_order,
        }
    }

    /// With protobuf bodies: the package of its messages and their field table.
    pub const fn with_protobuf(mut self, package: &'static str, table: &'static [u8]) -> Self {
        self.protobuf = Some((package, table));
        self
    }

    /// The protobuf messages its request bodies decode as, if it has them (its member order
    /// loaded first: it says which zero values a decoded body keeps).
    pub fn messages(&self) -> Option<protobuf::Messages> {
        let (package, table) = self.protobuf?;
        go_order::load(self.member_order);
        let path = self.openapi_path;
        let api_version = path.strip_prefix("apis/").or(path.strip_prefix("api/"));
        Some(protobuf::Messages {
            api_version: api_version.unwrap_or(path),
            package,
            table,
        })
    }

    /// A definition of the group's document (`io.k8s.api.core.v1.Service`), its document and
    /// member order loaded first: whatever is written through the schema from then on is
    /// written in Go's order.
    pub fn definition(&'static self, name: &str) -> Option<&'static Value> {
        go_order::load(self.member_order);
        schema::definition(self.openapi, name)
    }
}
