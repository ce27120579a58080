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

/// What a resource path and method route to, as upstream's installer registers the routes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Watch,
    List,
    Get,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

/// The route a request takes, or upstream's router's 405 when its path has none for the method.
fn route(request: &ResourceRequest, method: &Method, subresource: Subresource) -> Option<Route> {
    let info = request.registry.strategy().info();
    let watch_path = request.info.watch_path();
    let is_watch = watch_path || (request.info.verb == "watch" && method == Method::GET);
    // `/finalize` serves PUT only, as upstream registers it.
    if subresource == Subresource::Finalize && method != Method::PUT {
        return None;
    }
    // A namespaced kind's cluster-wide collection (`/api/v1/services`) serves list and watch
    // only, as upstream routes it: no create, and no deletecollection across namespaces.
    if info.namespaced && request.namespace.is_empty() && method != Method::GET {
        return None;
    }
    // The legacy `/watch/` paths are routed for GET only.
    if watch_path && method != Method::GET {
        return None;
    }
    Some(match (method, request.name(), is_watch) {
        (&Method::GET, _, true) => Route::Watch,
        (&Method::GET, None, false) => Route::List,
        (&Method::GET, Some(_), false) => Route::Get,
        (&Method::POST, None, _) if subresource == Subresource::Main => Route::Create,
        (&Method::PUT, Some(_), _) => Route::Update,
        (&Method::PATCH, Some(_), _) => Route::Patch,
        (&Method::DELETE, Some(_), _) if subresource == Subresource::Main => Route::Delete,
        (&Method::DELETE, None, _) if info.verbs.contains(&"deletecollection") => {
            Route::DeleteCollection
        }
        _ => return None,
    })
}

async fn dispatch(request: ResourceRequest, mut call: Call) -> Response<Body> {
    let subresource = match request.info.subresource.as_str() {
        "status" => Subresource::Status,
        "finalize" => Subresource::Finalize,
        _ => Subresource::Main,
    };
    // Upstream's router first: the method (405), a PATCH's Content-Type (415), then `Accept`
    // against what the route produces (406); only then the handler's own negotiation.
    let refused =
        |error: ApiError| crate::request::negotiated_error(&error, &call.headers, &call.query);
    let Some(route) = route(&request, &call.method, subresource) else {
        return refused(ApiError::method_not_allowed());
    };
    if route == Route::Patch
        && let Err(error) = PatchType::from_content_type(
            call.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
        )
    {
        return refused(error);
    }
    // A watch at a list's path is the list route (`?watch=true`), which produces streams.
    let list_route = matches!(route, Route::List | Route::Watch);
    let accept = crate::request::header_text(&call.headers, header::ACCEPT);
    if let Err(error) = media::route_accepts(accept, &media::route_produces(list_route)) {
        return refused(error);
    }
    let encoding = match Encoding::negotiate(&call.headers, &call.query, route == Route::Watch) {
        Ok(encoding) => encoding,
        Err(error) => return crate::request::unnegotiated_error(&error),
    };
    let name = request.name().unwrap_or_default();
    let result = match route {
        Route::Watch => return watch(&request, &call, encoding).await,
        Route::List => list(&request, &call, encoding).await,
        Route::Get => get(&request, name, &call, encoding).await,
        Route::Create => create(verb(&request, &mut call, encoding, subresource)).await,
        Route::Update => update(verb(&request, &mut call, encoding, subresource), name).await,
        Route::Patch => patch_object(verb(&request, &mut call, encoding, subresource), name).await,
        Route::Delete => delete(verb(&request, &mut call, encoding, subresource), name).await,
        Route::DeleteCollection => {
            delete_collection(verb(&request, &mut call, encoding, subresource)).await
        }
    };
    match result {
        Ok(response) => response,
        Err(error) => error_response(&error, encoding),
    }
}
