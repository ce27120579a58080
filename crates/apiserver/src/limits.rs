//! What bounds the work one client can make the server do: how many requests run at once, how
//! long one may take, and how requests are classified for those limits — kube-apiserver's
//! `--max-requests-inflight`, `--max-mutating-requests-inflight` and `--request-timeout`, with
//! its rules for which requests they cover.

use std::sync::Arc;
use std::time::Duration;

use capstan_machinery::ApiError;
use http::{HeaderValue, Response, StatusCode, header};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::request::{Body, Query, text_response};
use crate::request_info::RequestInfo;

/// The limits a client can run into, with kube-apiserver's defaults.
#[derive(Debug, Clone)]
pub struct Limits {
    /// `--max-requests-inflight`: read-only requests served at once (0: no limit).
    pub max_requests_inflight: usize,
    /// `--max-mutating-requests-inflight`: mutating requests served at once (0: no limit).
    pub max_mutating_requests_inflight: usize,
    /// `--request-timeout`: how long a request that is not long-running may take.
    pub request_timeout: Duration,
    /// `--min-request-timeout`: a watch without `timeoutSeconds` ends after a random time
    /// between this and twice this.
    pub min_request_timeout: Duration,
    /// `--http2-max-streams-per-connection`.
    pub http2_max_streams_per_connection: u32,
    /// `--max-connections`: open client connections; further ones wait in the listen queue.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            request_timeout: Duration::from_secs(60),
            min_request_timeout: Duration::from_secs(1800),
            http2_max_streams_per_connection: 100,
            max_connections: 10_000,
        }
    }
}

/// How long a client may take to send a request's headers; on HTTP/1.1 also how long a
/// connection may sit idle between requests (upstream's `ReadHeaderTimeout`).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
/// How long a connection with no request in progress stays open (upstream's `IdleTimeout`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head (upstream's `MaxHeaderBytes`, 1 MiB).
pub const MAX_HEADER_BYTES: usize = 1 << 20;
/// The bound on a write inside the request timeout (upstream's `requestTimeoutUpperBound`).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(34);
/// HTTP/2 per-stream receive window and largest frame (upstream: 256 KiB, what 99% of
/// objects fit in); the connection window is this times the stream limit.
pub const HTTP2_STREAM_WINDOW: u32 = 256 * 1024;

/// What admission gave a request that is not long-running: its deadline, and its in-flight
/// slot — shared, so that a write still finishing after its client was answered keeps it.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    /// When the request runs out.
    pub deadline: Option<tokio::time::Instant>,
    /// Its in-flight slot, if its pool is limited.
    pub slot: Option<Arc<OwnedSemaphorePermit>>,
}

/// A response extension: the deadline by which the response must have been sent (the
/// request's deadline); the connection is closed when it has not been.
#[derive(Debug, Clone, Copy)]
pub struct SendBy(pub tokio::time::Instant);

/// The two in-flight pools.
pub struct InFlight {
    read_only: Option<Arc<Semaphore>>,
    mutating: Option<Arc<Semaphore>>,
}

impl InFlight {
    /// Pools of the configured sizes (0: unlimited).
    pub fn new(limits: &Limits) -> Self {
        let pool = |size: usize| (size > 0).then(|| Arc::new(Semaphore::new(size)));
        InFlight {
            read_only: pool(limits.max_requests_inflight),
            mutating: pool(limits.max_mutating_requests_inflight),
        }
    }

    /// A slot for the request, `Ok(None)` when it needs none, or [`Overloaded`] when its
    /// pool is full (answer [`too_many_requests`]). Hold the slot until the response is sent.
    pub fn admit(&self, info: &RequestInfo) -> Result<Option<OwnedSemaphorePermit>, Overloaded> {
        if info.long_running() || info.health_probe() {
            return Ok(None);
        }
        let pool = if info.mutating() {
            &self.mutating
        } else {
            &self.read_only
        };
        let Some(pool) = pool else {
            return Ok(None);
        };
        match pool.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(Overloaded),
        }
    }
}

/// Every slot of the request's in-flight pool is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded;

/// Upstream's overload answer: plain text, not a `Status`, with `Retry-After: 1`.
pub fn too_many_requests() -> Response<Body> {
    let mut response = text_response(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many requests, please try again later.\n",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The request's deadline: `--request-timeout`, shortened by a smaller positive `timeout`
/// query parameter; a malformed one is a 400.
pub fn deadline(limits: &Limits, query: &Query) -> Result<Duration, ApiError> {
    let Some(text) = query.get("timeout").filter(|t| !t.is_empty()) else {
        return Ok(limits.request_timeout);
    };
    let nanos = capstan_gostd::duration::parse_go_duration(text).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid timeout specified in the request URL - {e}"
        ))
    })?;
    let requested = u64::try_from(nanos).map(Duration::from_nanos).ok();
    Ok(match requested {
        Some(requested) if !requested.is_zero() && requested < limits.request_timeout => requested,
        _ => limits.request_timeout,
    })
}

/// What the request timeout answers when a request runs out: upstream's timeout writer
/// encodes the bare Status (no kind or apiVersion) and sets no content type, which Go's
/// server then sniffs as text.
pub fn timed_out() -> Response<Body> {
    let status = ApiError::timeout("request did not complete within the allotted timeout");
    let mut value = status.to_status();
    if let Some(map) = value.as_object_mut() {
        map.shift_remove("kind");
        map.shift_remove("apiVersion");
    }
    let mut body = capstan_machinery::json::to_vec(&value);
    body.push(b'\n');
    let mut response = Response::new(crate::request::full(body));
    *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The deadline of a write's storage work, inside the request's own: what is left of the
/// request deadline, and never more than [`WRITE_TIMEOUT`].
pub fn write_deadline(request_deadline: tokio::time::Instant) -> tokio::time::Instant {
    request_deadline.min(tokio::time::Instant::now() + WRITE_TIMEOUT)
}

/// Request bodies larger than this make a write "heavy": its work (decoding, patching,
/// managedFields over long lists) runs on the blocking pool, not on a runtime worker that
/// other requests wait for.
pub const HEAVY_BODY_BYTES: usize = 64 * 1024;

/// Runs a write's storage work as its own task, so that it completes — or fails — as a whole
/// even when the client goes away or the deadline passes (as upstream's handler goroutine
/// does); the caller gets upstream's 504 when the deadline passes first. `heavy` work runs
/// on the blocking pool.
pub async fn finish<T: Send + 'static>(
    deadline: tokio::time::Instant,
    heavy: bool,
    slot: Option<Arc<OwnedSemaphorePermit>>,
    work: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    // The work keeps the request's in-flight slot until it is done, answered or not: a client
    // cannot pile up writes beyond the limit by giving them short deadlines.
    let work = async move {
        let result = work.await;
        drop(slot);
        result
    };
    let task = if heavy {
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(work))
    } else {
        tokio::spawn(work)
    };
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(ApiError::internal(format!("the request failed: {join}"))),
        Err(_) => Err(ApiError::timeout(
            "request did not complete within requested timeout - context deadline exceeded",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_parameter_only_shortens() {
        let limits = Limits::default();
        let of = |q: &str| deadline(&limits, &Query::parse(Some(q)));
        assert_eq!(of(""), Ok(Duration::from_secs(60)));
        assert_eq!(of("timeout=5s"), Ok(Duration::from_secs(5)));
        assert_eq!(of("timeout=0s"), Ok(Duration::from_secs(60)));
        assert_eq!(of("timeout=-5s"), Ok(Duration::from_secs(60)));
        assert_eq!(of("timeout=10m"), Ok(Duration::from_secs(60)));
        let error = of("timeout=5").expect_err("no unit");
        assert_eq!(
            error.message,
            "invalid timeout specified in the request URL - time: missing unit in duration \"5\""
        );
    }
}
