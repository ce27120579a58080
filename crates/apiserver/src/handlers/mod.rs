//! Resource requests: the verb handlers, generic over every registered kind.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capstan_machinery::continue_token::ContinueToken;
use capstan_machinery::field::{FieldError, FieldErrors};
use capstan_machinery::fields::FieldSelector;
use capstan_machinery::labels::LabelSelector;
use capstan_machinery::media::{self, BodyFormat, Output};
use capstan_machinery::patch::PatchType;
use capstan_machinery::status::{Details, success_status};
use capstan_machinery::{ApiError, Reason, meta, yaml};
use capstan_registry::watch::{WatchItem, WatchOptions, WatchStart};
use capstan_registry::{
    DeleteOptions, FieldValidation, ListOptions, Patch, ReadAt, Registry, ResourceInfo,
    Subresource, WriteOptions,
};
use http::{HeaderMap, Method, Response, StatusCode, header};
use serde_json::{Map, Value, json};

mod body;
mod delete;
mod options;
mod read;
mod watch;
mod write;

use body::*;
use delete::*;
use options::*;
use read::*;
use watch::*;
use write::*;

use crate::request::{
    Body, Encoding, IncludeObject, Query, error_response, full, json_response, object_response,
    read_body, response, to_table, with_warnings,
};

/// A request for a resource, as the router understood it.
pub struct ResourceRequest {
    /// The kind's registry.
    pub registry: Arc<Registry>,
    /// Namespace from the path (empty: none / all namespaces).
    pub namespace: String,
    /// What the request is.
    pub info: crate::request_info::RequestInfo,
}

impl ResourceRequest {
    /// The object name the path gives, if any.
    pub fn name(&self) -> Option<&str> {
        Some(self.info.name.as_str()).filter(|name| !name.is_empty())
    }
}

/// Everything a handler reads from the HTTP request.
pub struct Call {
    /// Method.
    pub method: Method,
    /// Headers.
    pub headers: HeaderMap,
    /// Query parameters.
    pub query: Query,
    /// Body (not yet read).
    pub body: Option<crate::unread::RequestBody>,
    /// Ends watches when the server shuts down.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// The request's deadline and in-flight slot (none for watches).
    pub admission: crate::limits::Admission,
    /// `--min-request-timeout`: the default watch lasts between this and twice this.
    pub min_request_timeout: Duration,
}

impl Call {
    /// Runs a write's storage work to completion as its own task, answering upstream's 504
    /// when the write deadline (34 s, or less of the request's) passes first. A write with a
    /// large body (`body_len`) runs off the runtime workers.
    async fn finish<T: Send + 'static>(
        &self,
        body_len: usize,
        work: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    ) -> Result<T, ApiError> {
        let deadline = crate::limits::write_deadline(
            self.admission
                .deadline
                .unwrap_or_else(|| tokio::time::Instant::now() + crate::limits::WRITE_TIMEOUT),
        );
        let heavy = body_len > crate::limits::HEAVY_BODY_BYTES;
        crate::limits::finish(deadline, heavy, self.admission.slot.clone(), work).await
    }
}

/// A request with a body, as its verb's handler takes it.
struct Verb<'a> {
    request: &'a ResourceRequest,
    call: &'a Call,
    /// Taken from the call.
    body: Option<crate::unread::RequestBody>,
    encoding: Encoding,
    subresource: Subresource,
}

fn verb<'a>(
    request: &'a ResourceRequest,
    call: &'a mut Call,
    encoding: Encoding,
    subresource: Subresource,
) -> Verb<'a> {
    Verb {
        body: call.body.take(),
        request,
        call,
        encoding,
        subresource,
    }
}

/// Routes a resource request to its verb.
pub async fn handle(request: ResourceRequest, call: Call) -> Response<Body> {
    let warnings = request.registry.strategy().request_warnings();
    let response = dispatch(request, call).await;
    with_warnings(response, &warnings)
}

async fn dispatch(request: ResourceRequest, mut call: Call) -> Response<Body> {
    let watch_path = request.info.watch_path();
    let is_watch = watch_path || (request.info.verb == "watch" && call.method == Method::GET);
    let encoding = match Encoding::negotiate(&call.headers, &call.query, is_watch) {
        Ok(encoding) => encoding,
        Err(error) => return crate::request::unnegotiated_error(&error),
    };
    let info = request.registry.strategy().info();
    let subresource = match request.info.subresource.as_str() {
        "status" => Subresource::Status,
        "finalize" => Subresource::Finalize,
        _ => Subresource::Main,
    };
    // `/finalize` serves PUT only, as upstream registers it.
    if subresource == Subresource::Finalize && call.method != Method::PUT {
        return error_response(&ApiError::method_not_allowed(), encoding);
    }
    // A namespaced kind's cluster-wide collection (`/api/v1/services`) serves list and watch
    // only, as upstream routes it: no create, and no deletecollection across namespaces.
    if info.namespaced && request.namespace.is_empty() && call.method != Method::GET {
        return error_response(&ApiError::method_not_allowed(), encoding);
    }
    // The legacy `/watch/` paths are routed for GET only.
    if watch_path && call.method != Method::GET {
        return error_response(&ApiError::method_not_allowed(), encoding);
    }
    let result = match (&call.method, request.name(), is_watch) {
        (&Method::GET, _, true) => return watch(&request, &call, encoding).await,
        (&Method::GET, None, false) => list(&request, &call, encoding).await,
        (&Method::GET, Some(name), false) => get(&request, name, &call, encoding).await,
        (&Method::POST, None, _) if subresource == Subresource::Main => {
            create(verb(&request, &mut call, encoding, subresource)).await
        }
        (&Method::PUT, Some(name), _) => {
            update(verb(&request, &mut call, encoding, subresource), name).await
        }
        (&Method::PATCH, Some(name), _) => {
            patch_object(verb(&request, &mut call, encoding, subresource), name).await
        }
        (&Method::DELETE, Some(name), _) if subresource == Subresource::Main => {
            delete(verb(&request, &mut call, encoding, subresource), name).await
        }
        (&Method::DELETE, None, _) if info.verbs.contains(&"deletecollection") => {
            delete_collection(verb(&request, &mut call, encoding, subresource)).await
        }
        _ => Err(ApiError::method_not_allowed()),
    };
    match result {
        Ok(response) => response,
        Err(error) => error_response(&error, encoding),
    }
}
