//! Groups served by other servers: what the API server asks of the aggregation layer
//! (`capstan-aggregation`, which implements [`RemoteGroups`] and stands above this crate, as
//! kube-aggregator stands in front of kube-apiserver). Without one, every group is local.

use crate::unread::RequestBody;
use async_trait::async_trait;
use http::{Request, Response};
use serde_json::Value;

use crate::request::Body;

/// The group versions other servers serve, and the way to them.
#[async_trait]
pub trait RemoteGroups: Send + Sync {
    /// The `APIGroup` entries legacy `/apis` adds for them.
    async fn legacy_groups(&self) -> Vec<Value>;

    /// `/apis/<group>` for a group only they serve.
    async fn legacy_group(&self, group: &str) -> Option<Value>;

    /// Their aggregated discovery: `(priority, group, discovery)`.
    async fn aggregated_groups(&self) -> Vec<(i64, String, Value)>;

    /// Passes on a request under `/apis/<group>/<version>` when another server serves that
    /// group version; hands the request back when none does.
    async fn proxy(
        &self,
        group: &str,
        version: &str,
        request: Request<RequestBody>,
    ) -> Result<Response<Body>, Request<RequestBody>>;
}
