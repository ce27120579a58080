//! Resource requests: the verb handlers, generic over every registered kind.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capstan_machinery::continue_token::ContinueToken;
use capstan_machinery::fields::FieldSelector;
use capstan_machinery::labels::LabelSelector;
use capstan_machinery::media::{self, BodyFormat, Output};
use capstan_machinery::patch::{self, PatchType};
use capstan_machinery::status::{Details, success_status};
use capstan_machinery::{ApiError, Reason, meta, yaml};
use capstan_registry::watch::{WatchItem, WatchOptions, WatchStart};
use capstan_registry::{DeleteOptions, ListOptions, ReadAt, Registry, WriteOptions};
use http::{HeaderMap, Method, Response, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::request::{
    Body, Encoding, IncludeObject, Query, error_response, full, json_response, object_response,
    read_body, response, to_table,
};

/// A request for a resource, as the router understood it.
pub struct ResourceRequest {
    /// The kind's registry.
    pub registry: Arc<Registry>,
    /// Namespace from the path (empty: none / all namespaces).
    pub namespace: String,
    /// Object name from the path.
    pub name: Option<String>,
    /// `status` for the status subresource.
    pub subresource: Option<String>,
    /// A legacy `/watch/` path.
    pub watch_path: bool,
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
    pub body: Option<hyper::body::Incoming>,
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

/// Routes a resource request to its verb.
pub async fn handle(request: ResourceRequest, call: Call) -> Response<Body> {
    let warnings = request.registry.strategy().request_warnings();
    let response = dispatch(request, call).await;
    with_warnings(response, &warnings)
}

async fn dispatch(request: ResourceRequest, mut call: Call) -> Response<Body> {
    let is_watch = request.watch_path
        || (request.name.is_none()
            && call.method == Method::GET
            && call.query.flag("watch") == Some(true));
    let encoding = match Encoding::negotiate(&call.headers, &call.query, is_watch) {
        Ok(encoding) => encoding,
        Err(error) => return error_response(&error, Encoding::json()),
    };
    let info = request.registry.strategy().info();
    let status_sub = request.subresource.as_deref() == Some("status");
    // A namespaced kind's cluster-wide collection (`/api/v1/services`) serves list and watch
    // only, as upstream routes it: no create, and no deletecollection across namespaces.
    if info.namespaced && request.namespace.is_empty() && call.method != Method::GET {
        return error_response(&ApiError::method_not_allowed(), encoding);
    }
    // The legacy `/watch/` paths are routed for GET only.
    if request.watch_path && call.method != Method::GET {
        return error_response(&ApiError::method_not_allowed(), encoding);
    }
    let result = match (&call.method, request.name.as_deref(), is_watch) {
        (&Method::GET, _, true) => return watch(&request, &call, encoding).await,
        (&Method::GET, None, false) => list(&request, &call, encoding).await,
        (&Method::GET, Some(name), false) => get(&request, name, &call, encoding).await,
        (&Method::POST, None, _) if !status_sub => {
            let body = call.body.take();
            create(&request, &call, body, encoding).await
        }
        (&Method::PUT, Some(name), _) => {
            let body = call.body.take();
            update(&request, name, &call, body, encoding, status_sub).await
        }
        (&Method::PATCH, Some(name), _) => {
            let body = call.body.take();
            patch_object(&request, name, &call, body, encoding, status_sub).await
        }
        (&Method::DELETE, Some(name), _) if !status_sub => {
            let body = call.body.take();
            delete(&request, name, &call, body, encoding).await
        }
        (&Method::DELETE, None, _) if info.verbs.contains(&"deletecollection") => {
            let body = call.body.take();
            delete_collection(&request, &call, body, encoding).await
        }
        _ => Err(ApiError::method_not_allowed()),
    };
    match result {
        Ok(response) => response,
        Err(error) => error_response(&error, encoding),
    }
}

fn parse_revision(text: &str) -> Result<i64, ApiError> {
    text.parse::<u64>()
        .ok()
        .and_then(|r| i64::try_from(r).ok())
        .ok_or_else(|| ApiError::bad_request(format!("invalid resource version: {text}")))
}

fn list_options_invalid(detail: impl std::fmt::Display) -> ApiError {
    options_invalid("ListOptions", &detail.to_string())
}

fn selectors(
    request: &ResourceRequest,
    query: &Query,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    request.registry.check_field_selector(&fields)?;
    if let (Some(path_name), Some(pinned)) = (request.name.as_deref(), fields.pinned_name())
        && path_name != pinned
    {
        return Err(ApiError::bad_request(
            "fieldSelector metadata.name doesn't match requested name",
        ));
    }
    Ok((labels, fields))
}

fn list_options(request: &ResourceRequest, query: &Query) -> Result<ListOptions, ApiError> {
    let (labels, fields) = selectors(request, query)?;
    let limit = query.int("limit")?.unwrap_or(0).max(0) as usize;
    let rv = query.get("resourceVersion").filter(|v| !v.is_empty());
    let rv_match = query.get("resourceVersionMatch").filter(|v| !v.is_empty());
    let continue_token = match query.get("continue").filter(|v| !v.is_empty()) {
        Some(text) => {
            if rv_match.is_some() {
                return Err(list_options_invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if rv.is_some_and(|v| v != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            Some(ContinueToken::decode(text).map_err(ApiError::bad_request)?)
        }
        None => None,
    };
    if query.get("sendInitialEvents").is_some() {
        return Err(list_options_invalid(
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ));
    }
    let read_at = match (rv, rv_match) {
        (None, None) => ReadAt::Latest,
        (None, Some("NotOlderThan" | "Exact")) => {
            return Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        (Some("0"), Some("Exact")) => {
            return Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
        (_, Some(other)) if other != "NotOlderThan" && other != "Exact" => {
            return Err(list_options_invalid(format!(
                "resourceVersionMatch: Unsupported value: {}: supported values: \"Exact\", \"NotOlderThan\", \"\"",
                capstan_machinery::status::quote(other)
            )));
        }
        (Some("0"), _) => ReadAt::Any,
        (Some(v), Some("Exact")) => ReadAt::Exact(parse_revision(v)?),
        (Some(v), _) => ReadAt::NotOlderThan(parse_revision(v)?),
        (None, Some(_)) => ReadAt::Latest,
    };
    Ok(ListOptions {
        labels,
        fields,
        limit,
        continue_token,
        read_at,
    })
}

async fn get(
    request: &ResourceRequest,
    name: &str,
    call: &Call,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let at = match call.query.get("resourceVersion").filter(|v| !v.is_empty()) {
        None => ReadAt::Latest,
        Some("0") => ReadAt::Any,
        Some(v) => ReadAt::NotOlderThan(parse_revision(v)?),
    };
    let object = request.registry.get(&request.namespace, name, at).await?;
    Ok(object_response(
        StatusCode::OK,
        request.registry.strategy().as_ref(),
        &object,
        encoding,
        &call.query,
    ))
}

async fn list(
    request: &ResourceRequest,
    call: &Call,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let options = list_options(request, &call.query)?;
    let result = request.registry.list(&request.namespace, &options).await?;
    Ok(list_response(request, call, encoding, result))
}

fn list_response(
    request: &ResourceRequest,
    call: &Call,
    encoding: Encoding,
    result: capstan_registry::ListResult,
) -> Response<Body> {
    let strategy = request.registry.strategy();
    let info = strategy.info();
    let mut list_meta = Map::new();
    list_meta.insert("resourceVersion".into(), json!(result.revision.to_string()));
    if let Some(token) = &result.continue_token {
        list_meta.insert("continue".into(), json!(token));
    }
    if let Some(remaining) = result.remaining {
        list_meta.insert("remainingItemCount".into(), json!(remaining));
    }
    match encoding.negotiated.output {
        Output::Json if !encoding.pretty => {
            // The hot path: splice the cached item bytes instead of re-serializing them.
            let head = json!({"kind": info.list_kind, "apiVersion": info.api_version(), "metadata": list_meta});
            let body = ListBody::new(&head, result.items);
            response(
                StatusCode::OK,
                "application/json",
                http_body_util::BodyExt::boxed(body),
            )
        }
        Output::Json | Output::Yaml => {
            let items: Vec<Value> = result.items.iter().map(|o| o.object()).collect();
            let list = json!({"kind": info.list_kind, "apiVersion": info.api_version(), "metadata": list_meta, "items": items});
            if encoding.negotiated.output == Output::Yaml {
                let yaml = yaml::to_string(&list).unwrap_or_default();
                response(StatusCode::OK, "application/yaml", full(yaml))
            } else {
                json_response(StatusCode::OK, &list, encoding.pretty)
            }
        }
        Output::Metadata => {
            let items: Vec<Value> = result
                .items
                .iter()
                .map(
                    |o| json!({"metadata": o.object().get("metadata").cloned().unwrap_or(json!({}))}),
                )
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "items": items}),
                encoding.pretty,
            )
        }
        Output::Table(version) => {
            let include = match IncludeObject::parse(&call.query) {
                Ok(include) => include,
                Err(error) => return error_response(&error, encoding),
            };
            let bytes = crate::request::table_bytes(
                strategy.as_ref(),
                version,
                result.items.iter().map(|o| o.object()),
                list_meta,
                include,
            );
            if encoding.pretty {
                let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                return json_response(StatusCode::OK, &value, true);
            }
            response(StatusCode::OK, "application/json", full(bytes))
        }
    }
}

async fn watch(request: &ResourceRequest, call: &Call, encoding: Encoding) -> Response<Body> {
    match start_watch(request, call, encoding).await {
        Ok(response) => response,
        Err(error) => error_response(&error, encoding),
    }
}

async fn start_watch(
    request: &ResourceRequest,
    call: &Call,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let query = &call.query;
    let (labels, mut fields) = selectors(request, query)?;
    if let Some(name) = &request.name {
        fields = FieldSelector::parse(&format!("metadata.name={name}"))
            .map_err(ApiError::bad_request)?;
    }
    let bookmarks = query.flag("allowWatchBookmarks") == Some(true);
    let send_initial = query.flag("sendInitialEvents");
    let rv_match = query.get("resourceVersionMatch").filter(|v| !v.is_empty());
    match (send_initial, rv_match) {
        (Some(_), None) => {
            return Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        (None, Some(_)) => {
            return Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        (Some(_), Some(other)) if other != "NotOlderThan" => {
            return Err(list_options_invalid(format!(
                "resourceVersionMatch: Unsupported value: {}: supported values: \"NotOlderThan\"",
                capstan_machinery::status::quote(other)
            )));
        }
        _ => {}
    }
    if send_initial == Some(true)
        && bookmarks
        && matches!(encoding.negotiated.output, Output::Table(_))
    {
        return Err(ApiError::not_acceptable(media::SERVED_STREAM_TYPES));
    }
    let rv = query.get("resourceVersion").filter(|v| !v.is_empty());
    let registry = &request.registry;
    let start = match (rv, send_initial) {
        (None | Some("0"), None | Some(true)) => WatchStart::Initial {
            end_bookmark: bookmarks,
        },
        (Some(v), Some(true)) => {
            let revision = parse_revision(v)?;
            if !registry
                .cache()
                .wait_for(revision, Duration::from_secs(3))
                .await
            {
                return Err(ApiError::too_large_resource_version(
                    revision,
                    registry.cache().revision(),
                ));
            }
            WatchStart::Initial {
                end_bookmark: bookmarks,
            }
        }
        (None | Some("0"), Some(false)) => WatchStart::After(registry.cache().revision()),
        (Some(v), _) => WatchStart::After(parse_revision(v)?),
    };
    let timeout = match query.int("timeoutSeconds")? {
        Some(seconds) if seconds > 0 => Duration::from_secs(seconds as u64),
        _ => {
            let minimum = call.min_request_timeout.as_secs().max(1);
            Duration::from_secs(minimum + fastrand::u64(..minimum))
        }
    };
    let watcher = registry.watch(
        &request.namespace,
        WatchOptions {
            labels,
            fields,
            start,
        },
    );
    let strategy = registry.strategy().clone();
    let include = IncludeObject::parse(query)?;
    let mut bookmark_timer = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(60),
        Duration::from_secs(60),
    );
    bookmark_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = WatchStream {
        watcher,
        strategy,
        output: encoding.negotiated.output,
        include,
        bookmarks,
        ended: ended(timeout, call.shutdown.clone()),
        bookmark_timer,
        first_table: true,
        last_bookmark: 0,
        finished: false,
    };
    // The response body polls the watch itself: no task or channel between the watch cache
    // and the connection.
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        let line = state.next_line().await?;
        Some((
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(line)),
            state,
        ))
    });
    let body = http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(stream));
    Ok(response(StatusCode::OK, "application/json", body))
}

/// A JSON list sent in pieces of about 64 KiB spliced from the cached items' JSON: the first
/// bytes leave while later items are still being copied, and no buffer the size of the whole
/// list (megabytes for thousands of Services) is allocated and faulted in. The length is known
/// up front, so the response carries a Content-Length.
struct ListBody {
    /// `{"kind":…,"apiVersion":…,"metadata":{…},"items":[`, sent first.
    head: Vec<u8>,
    items: std::vec::IntoIter<Arc<capstan_registry::cache::CachedObject>>,
    started: bool,
    remaining: u64,
    finished: bool,
}

impl ListBody {
    const PIECE: usize = 64 * 1024;

    fn new(head: &Value, items: Vec<Arc<capstan_registry::cache::CachedObject>>) -> Self {
        let mut open = serde_json::to_vec(head).unwrap_or_default();
        open.pop();
        open.extend_from_slice(b",\"items\":[");
        let commas = items.len().saturating_sub(1);
        let length = open.len() + items.iter().map(|i| i.item_len()).sum::<usize>() + commas + 3;
        Self {
            head: open,
            items: items.into_iter(),
            started: false,
            remaining: length as u64,
            finished: false,
        }
    }
}

impl hyper::body::Body for ListBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.finished {
            return std::task::Poll::Ready(None);
        }
        let mut out = std::mem::take(&mut this.head);
        out.reserve(Self::PIECE);
        while out.len() < Self::PIECE {
            let Some(item) = this.items.next() else {
                out.extend_from_slice(b"]}\n");
                this.finished = true;
                break;
            };
            if this.started {
                out.push(b',');
            }
            this.started = true;
            item.write_item(&mut out);
        }
        this.remaining = this.remaining.saturating_sub(out.len() as u64);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(out)))))
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.remaining)
    }
}

/// Ready after `timeout`, or when `shutdown` turns true.
fn ended(
    timeout: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>> {
    Box::pin(async move {
        tokio::select! {
            _ = tokio::time::sleep(timeout) => {}
            _ = shutdown.wait_for(|down| *down) => {}
        }
    })
}

/// One watch response: turns watch items into JSON lines.
struct WatchStream {
    watcher: capstan_registry::watch::Watcher,
    strategy: std::sync::Arc<dyn capstan_registry::Strategy>,
    output: Output,
    include: IncludeObject,
    bookmarks: bool,
    /// Ready when the watch times out or the server shuts down. One future for the life of the
    /// watch: polled after every event, it registers with the timer and the shutdown signal once.
    ended: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>>,
    bookmark_timer: tokio::time::Interval,
    first_table: bool,
    last_bookmark: i64,
    finished: bool,
}

impl WatchStream {
    async fn next_line(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        loop {
            // `biased`: events first, and no random branch order to pay for on every poll.
            let item = tokio::select! {
                biased;
                item = self.watcher.next() => match item {
                    Some(item) => item,
                    None => return None,
                },
                _ = self.bookmark_timer.tick(), if self.bookmarks => {
                    let revision = self.watcher.progress();
                    if revision <= self.last_bookmark {
                        continue;
                    }
                    WatchItem::Bookmark(revision, false)
                }
                _ = &mut self.ended => return None,
            };
            let info = self.strategy.info();
            match item {
                WatchItem::Event(kind, object) => {
                    return Some(match self.output {
                        Output::Table(version) => {
                            let mut list_meta = Map::new();
                            list_meta.insert("resourceVersion".into(), json!(object.revision.to_string()));
                            let table = to_table(
                                self.strategy.as_ref(),
                                version,
                                &[&object.object()],
                                list_meta,
                                self.include,
                                self.first_table,
                            );
                            self.first_table = false;
                            event_line(kind.as_str(), &serde_json::to_vec(&table).unwrap_or_default())
                        }
                        Output::Metadata => event_line(
                            kind.as_str(),
                            &serde_json::to_vec(&json!({
                                "kind": "PartialObjectMetadata",
                                "apiVersion": "meta.k8s.io/v1",
                                "metadata": object.object().get("metadata").cloned().unwrap_or(json!({})),
                            }))
                            .unwrap_or_default(),
                        ),
                        // Every watcher of this change shares one encoded line.
                        _ => object.watch_line(kind, || {
                            event_line(kind.as_str(), &object.typed_json(info.kind, &info.api_version()))
                        }),
                    });
                }
                WatchItem::Bookmark(revision, initial_end) => {
                    if !self.bookmarks {
                        continue;
                    }
                    self.last_bookmark = revision;
                    let mut metadata = Map::new();
                    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
                    if initial_end {
                        metadata.insert(
                            "annotations".into(),
                            json!({"k8s.io/initial-events-end": "true"}),
                        );
                    }
                    let object = json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": metadata});
                    return Some(event_line(
                        "BOOKMARK",
                        &serde_json::to_vec(&object).unwrap_or_default(),
                    ));
                }
                WatchItem::Error(error) => {
                    self.finished = true;
                    return Some(event_line(
                        "ERROR",
                        &serde_json::to_vec(&error.to_status()).unwrap_or_default(),
                    ));
                }
            }
        }
    }
}

fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn write_options(call: &Call) -> Result<WriteOptions, ApiError> {
    let dry_run = dry_run(&call.query, "CreateOptions")?;
    if let Some(validation) = call.query.get("fieldValidation")
        && !["", "Ignore", "Strict", "Warn"].contains(&validation)
    {
        return Err(options_invalid(
            "CreateOptions",
            &format!(
                "fieldValidation: Unsupported value: {}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
                capstan_machinery::status::quote(validation)
            ),
        ));
    }
    let field_manager = match call.query.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(manager) => {
            if manager.len() > 128 {
                return Err(options_invalid(
                    "CreateOptions",
                    "fieldManager: Too long: may not be more than 128 bytes",
                ));
            }
            manager.to_string()
        }
        None => {
            let agent = call
                .headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let manager: String = agent
                .split('/')
                .next()
                .unwrap_or("")
                .chars()
                .filter(|c| !c.is_control())
                .collect();
            manager.chars().take(128).collect()
        }
    };
    Ok(WriteOptions {
        dry_run,
        field_manager,
        applied: false,
    })
}

fn options_invalid(kind: &str, detail: &str) -> ApiError {
    let mut error = ApiError::new(
        422,
        Reason::Invalid,
        format!("{kind}.meta.k8s.io \"\" is invalid: {detail}"),
    );
    error.details = Some(Box::new(Details {
        group: "meta.k8s.io".into(),
        kind: kind.into(),
        ..Details::default()
    }));
    error
}

fn dry_run(query: &Query, kind: &str) -> Result<bool, ApiError> {
    let values = query.all("dryRun");
    if let Some(bad) = values.iter().find(|v| **v != "All") {
        return Err(options_invalid(
            kind,
            &format!(
                "dryRun: Unsupported value: [{}]: supported values: \"All\"",
                capstan_machinery::status::quote(bad)
            ),
        ));
    }
    Ok(!values.is_empty())
}

/// `fieldValidation`: what to do about unknown fields.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

fn field_validation(query: &Query) -> FieldValidation {
    match query.get("fieldValidation") {
        Some("Ignore") => FieldValidation::Ignore,
        Some("Strict") => FieldValidation::Strict,
        _ => FieldValidation::Warn,
    }
}

/// Adds one `Warning: 299 - "<text>"` header per distinct warning.
fn with_warnings(mut response: Response<Body>, warnings: &[String]) -> Response<Body> {
    let mut seen = std::collections::HashSet::new();
    for warning in warnings {
        if !seen.insert(warning) {
            continue;
        }
        let escaped = warning.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(value) = http::HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

/// Decodes a create/update body and checks its kind and apiVersion; returns the object, the
/// unknown-field warnings and the body's length.
async fn decode_body(
    request: &ResourceRequest,
    call: &Call,
    body: Option<hyper::body::Incoming>,
) -> Result<(Value, Vec<String>, usize), ApiError> {
    let info = request.registry.strategy().info();
    let format = media::body_format(
        call.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    )?;
    let bytes = match body {
        Some(body) => read_body(body).await?,
        None => Bytes::new(),
    };
    let parsed: Result<Value, String> = match format {
        BodyFormat::Json => {
            serde_json::from_slice(&bytes).map_err(|e| format!("json parse error: {e}"))
        }
        BodyFormat::Yaml => yaml::from_slice(&bytes).map_err(|e| format!("yaml: {e}")),
        BodyFormat::Protobuf => {
            capstan_machinery::protobuf::decode(&bytes).map(|(_, _, object)| object)
        }
    };
    let unrecognized = |detail: String| {
        let shown: String = if bytes.is_empty() {
            "<empty>".to_string()
        } else {
            String::from_utf8_lossy(&bytes[..bytes.len().min(30)]).into_owned()
        };
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): couldn't get version/kind; {detail} ({shown})",
            info.kind
        ))
    };
    let mut object = parsed.map_err(unrecognized)?;
    let Some(map) = object.as_object_mut() else {
        return Err(unrecognized(
            "json parse error: the body is not a JSON object".into(),
        ));
    };
    let api_version = info.api_version();
    let body_version = map
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let body_kind = map
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !body_version.is_empty() && body_version != api_version {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({body_version}) does not match the expected API version ({api_version})"
        )));
    }
    if !body_kind.is_empty() && body_kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "{body_kind} in version {} cannot be handled as a {}: the object provided is of kind {body_kind}",
            capstan_machinery::status::quote(if body_version.is_empty() {
                &api_version
            } else {
                &body_version
            }),
            info.kind
        )));
    }
    let problems = request.registry.strategy().unknown_fields(&object);
    let mut warnings = Vec::new();
    match field_validation(&call.query) {
        FieldValidation::Strict if !problems.is_empty() => {
            return Err(ApiError::bad_request(format!(
                "{} in version {} cannot be handled as a {}: strict decoding error: {}",
                info.kind,
                capstan_machinery::status::quote(info.version),
                info.kind,
                problems.join(", ")
            )));
        }
        FieldValidation::Warn => warnings = problems,
        _ => {}
    }
    meta::strip_type_meta(&mut object);
    let decoded = request.registry.strategy().decode(object).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version {} cannot be handled as a {}: {e}",
            info.kind,
            capstan_machinery::status::quote(info.version),
            info.kind
        ))
    })?;
    Ok((decoded, warnings, bytes.len()))
}

fn settle_namespace(request: &ResourceRequest, object: &mut Value) -> Result<(), ApiError> {
    if !request.registry.strategy().info().namespaced {
        meta::metadata_mut(object).shift_remove("namespace");
        return Ok(());
    }
    let sent = meta::namespace(object).to_string();
    if !sent.is_empty() && sent != request.namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    meta::set_meta_str(object, "namespace", &request.namespace);
    Ok(())
}

async fn create(
    request: &ResourceRequest,
    call: &Call,
    body: Option<hyper::body::Incoming>,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let options = write_options(call)?;
    let (mut object, mut warnings, body_len) = decode_body(request, call, body).await?;
    settle_namespace(request, &mut object)?;
    let (registry, namespace) = (request.registry.clone(), request.namespace.clone());
    let created = call
        .finish(body_len, async move {
            registry.create(&namespace, object, &options).await
        })
        .await?;
    warnings.extend(request.registry.strategy().warnings(&created));
    Ok(with_warnings(
        object_response(
            StatusCode::CREATED,
            request.registry.strategy().as_ref(),
            &created,
            encoding,
            &call.query,
        ),
        &warnings,
    ))
}

async fn update(
    request: &ResourceRequest,
    name: &str,
    call: &Call,
    body: Option<hyper::body::Incoming>,
    encoding: Encoding,
    status: bool,
) -> Result<Response<Body>, ApiError> {
    let options = write_options(call)?;
    let (mut object, mut warnings, body_len) = decode_body(request, call, body).await?;
    let sent_name = meta::name(&object).to_string();
    if sent_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({sent_name}) does not match the name on the URL ({name})"
        )));
    }
    settle_namespace(request, &mut object)?;
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let (stored, created) = call
        .finish(body_len, async move {
            registry
                .update(&namespace, &owned_name, object, &options, status)
                .await
        })
        .await?;
    if !status {
        warnings.extend(request.registry.strategy().warnings(&stored));
    }
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_warnings(
        object_response(
            code,
            request.registry.strategy().as_ref(),
            &stored,
            encoding,
            &call.query,
        ),
        &warnings,
    ))
}

async fn patch_object(
    request: &ResourceRequest,
    name: &str,
    call: &Call,
    body: Option<hyper::body::Incoming>,
    encoding: Encoding,
    status: bool,
) -> Result<Response<Body>, ApiError> {
    let patch_type = PatchType::from_content_type(
        call.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    )?;
    let mut options = write_options(call)?;
    if call.query.get("force").is_some() && patch_type != PatchType::Apply {
        return Err(options_invalid(
            "PatchOptions",
            "force: Forbidden: may not be specified for non-apply patch",
        ));
    }
    let bytes = match body {
        Some(body) => read_body(body).await?,
        None => Bytes::new(),
    };
    if patch_type == PatchType::Apply {
        return apply_object(request, name, call, &bytes, options, encoding, status).await;
    }
    let strategic: Option<Value> = if patch_type == PatchType::StrategicMerge {
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        if !value.is_object() {
            return Err(ApiError::bad_request("invalid JSON document"));
        }
        Some(value)
    } else {
        None
    };
    if options.field_manager.is_empty() {
        options.field_manager = "unknown".into();
    }
    let validation = field_validation(&call.query);
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let body_len = bytes.len();
    let (patched, mut warnings) = call
        .finish(body_len, async move {
            let warnings = std::sync::Mutex::new(Vec::<String>::new());
            let input = PatchInput {
                patch_type,
                bytes: &bytes,
                strategic: strategic.as_ref(),
                strategy: registry.strategy().as_ref(),
                name: &owned_name,
                namespace: &namespace,
                validation,
            };
            let patched = registry
                .patch(&namespace, &owned_name, &options, status, |current| {
                    let (result, problems) = patched_object(&input, current)?;
                    *warnings.lock().unwrap_or_else(|e| e.into_inner()) = problems;
                    Ok(result)
                })
                .await?;
            Ok((
                patched,
                warnings.into_inner().unwrap_or_else(|e| e.into_inner()),
            ))
        })
        .await?;
    if !status {
        warnings.extend(request.registry.strategy().warnings(&patched));
    }
    Ok(with_warnings(
        object_response(
            StatusCode::OK,
            request.registry.strategy().as_ref(),
            &patched,
            encoding,
            &call.query,
        ),
        &warnings,
    ))
}

/// What a (non-apply) patch needs to turn the stored object into the patched one.
struct PatchInput<'a> {
    patch_type: PatchType,
    bytes: &'a [u8],
    strategic: Option<&'a Value>,
    strategy: &'a dyn capstan_registry::Strategy,
    name: &'a str,
    namespace: &'a str,
    validation: FieldValidation,
}

/// Applies a JSON, merge or strategic merge patch to the stored object (with kind and
/// apiVersion) and checks the result as upstream does; returns it with the unknown-field
/// warnings to send.
fn patched_object(
    input: &PatchInput<'_>,
    current: &Value,
) -> Result<(Value, Vec<String>), ApiError> {
    let PatchInput {
        patch_type,
        bytes,
        strategic,
        strategy,
        name,
        namespace,
        validation,
    } = *input;
    let info = strategy.info();
    let mut warnings = Vec::new();
    let mut result = match patch_type {
        PatchType::Json => patch::json_patch(current, bytes)?,
        PatchType::StrategicMerge => {
            let patch_value = strategic.unwrap_or(&Value::Null);
            capstan_machinery::smp::apply(current, patch_value, strategy.schema()).map_err(|e| {
                if e.bad_request {
                    ApiError::bad_request(e.message)
                } else {
                    ApiError::new(422, Reason::Invalid, e.message)
                }
            })?
        }
        _ => patch::merge_patch(current, bytes)?,
    };
    let problems = strategy.unknown_fields(&result);
    match validation {
        FieldValidation::Strict if !problems.is_empty() => {
            let rendered = serde_json::to_string(&result).unwrap_or_default();
            let errors = capstan_machinery::field::FieldErrors(vec![
                capstan_machinery::field::FieldError::invalid(
                    "patch",
                    &Value::String(rendered),
                    format!("strict decoding error: {}", problems.join(", ")),
                ),
            ]);
            return Err(ApiError::invalid("", "", "", &errors));
        }
        FieldValidation::Warn => {
            warnings = problems;
        }
        _ => {}
    }
    if let Some(map) = result.as_object_mut() {
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or(info.kind);
        let version = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or(info.version);
        if kind != info.kind || version != info.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({version}) does not match the expected API version ({})",
                info.api_version()
            )));
        }
    }
    meta::strip_type_meta(&mut result);
    if meta::name(&result) != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta::name(&result)
        )));
    }
    if info.namespaced && meta::namespace(&result) != namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let decoded = strategy.decode(result).map_err(|e| {
        ApiError::new(
            422,
            Reason::Invalid,
            format!(" \"\" is invalid: patch: Invalid value: \"\": {e}"),
        )
    })?;
    Ok((decoded, warnings))
}

/// PATCH with `application/apply-patch+yaml`: server-side apply (`spec/api-machinery.md` §10.5).
async fn apply_object(
    request: &ResourceRequest,
    name: &str,
    call: &Call,
    bytes: &Bytes,
    options: WriteOptions,
    encoding: Encoding,
    status: bool,
) -> Result<Response<Body>, ApiError> {
    if call.query.get("fieldManager").is_none_or(|m| m.is_empty()) {
        return Err(options_invalid(
            "PatchOptions",
            "fieldManager: Required value: is required for apply patch",
        ));
    }
    let strategy = request.registry.strategy().clone();
    let info = strategy.info();
    let mut config = yaml::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let Some(map) = config.as_object_mut() else {
        return Err(ApiError::bad_request(
            "error decoding YAML: the applied configuration is not an object",
        ));
    };
    let version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
    if version != info.api_version() || kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "Incorrect version specified in apply patch. Specified patch version: {version}, expected: {}",
            info.api_version()
        )));
    }
    if meta::metadata(&config).is_some_and(|m| m.get("managedFields").is_some_and(|f| !f.is_null()))
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    let unknown = strategy.unknown_fields(&config);
    if let Some(first) = unknown.first() {
        let field = first.split('"').nth(1).unwrap_or(first);
        let group_version = if info.group.is_empty() {
            format!("/{}", info.version)
        } else {
            format!("{}/{}", info.group, info.version)
        };
        return Err(ApiError::bad_request(format!(
            "failed to create typed patch object ({}/{name}; {group_version}, Kind={}): .{field}: field not declared in schema",
            request.namespace, info.kind
        )));
    }
    let config_name = meta::name(&config).to_string();
    if !config_name.is_empty() && config_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({config_name}) does not match the name on the URL ({name})"
        )));
    }
    let config_namespace = meta::namespace(&config).to_string();
    if info.namespaced && !config_namespace.is_empty() && config_namespace != request.namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    meta::strip_type_meta(&mut config);
    meta::set_meta_str(&mut config, "name", name);
    if info.namespaced {
        meta::set_meta_str(&mut config, "namespace", &request.namespace);
    }
    // The typed decode only checks types: it would add defaults for required fields the
    // applier never sent, which would then count as applied.
    strategy.decode(config.clone()).map_err(|e| {
        ApiError::new(
            422,
            Reason::Invalid,
            format!(" \"\" is invalid: patch: Invalid value: \"\": {e}"),
        )
    })?;
    let force = call
        .query
        .get("force")
        .is_some_and(|f| f == "true" || f == "1" || f.is_empty());
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let (stored, created) = call
        .finish(bytes.len(), async move {
            registry
                .apply(&namespace, &owned_name, config, &options, status, force)
                .await
        })
        .await?;
    let warnings = if status {
        Vec::new()
    } else {
        strategy.warnings(&stored)
    };
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_warnings(
        object_response(code, strategy.as_ref(), &stored, encoding, &call.query),
        &warnings,
    ))
}

async fn delete_options(
    call: &Call,
    body: Option<hyper::body::Incoming>,
) -> Result<DeleteOptions, ApiError> {
    let bytes = match body {
        Some(body) => read_body(body).await?,
        None => Bytes::new(),
    };
    let mut options = DeleteOptions {
        dry_run: dry_run(&call.query, "DeleteOptions")?,
        ..DeleteOptions::default()
    };
    let mut propagation = call.query.get("propagationPolicy").map(str::to_string);
    if let Some(grace) = call.query.get("gracePeriodSeconds") {
        options.grace_period_seconds = Some(grace.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "gracePeriodSeconds: invalid value {}",
                capstan_machinery::status::quote(grace)
            ))
        })?);
    }
    let mut orphan = call.query.flag("orphanDependents");
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        let body: Value = capstan_machinery::protobuf::decode(&bytes)
            .map(|(_, _, object)| object)
            .or_else(|_| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
            .or_else(|_| yaml::from_slice(&bytes).map_err(|e| e.to_string()))
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        propagation = body
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .map(str::to_string);
        orphan = body.get("orphanDependents").and_then(Value::as_bool);
        if let Some(grace) = body.get("gracePeriodSeconds").and_then(Value::as_i64) {
            options.grace_period_seconds = Some(grace);
        }
        if let Some(pre) = body.get("preconditions") {
            options.uid = pre.get("uid").and_then(Value::as_str).map(str::to_string);
            options.resource_version = pre
                .get("resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        if let Some(values) = body.get("dryRun").and_then(Value::as_array) {
            if values.iter().any(|v| v.as_str() != Some("All")) {
                return Err(options_invalid(
                    "DeleteOptions",
                    "dryRun: Unsupported value: [\"x\"]: supported values: \"All\"",
                ));
            }
            options.dry_run |= !values.is_empty();
        }
    }
    if let Some(policy) = &propagation {
        if !["Orphan", "Background", "Foreground"].contains(&policy.as_str()) {
            return Err(options_invalid(
                "DeleteOptions",
                &format!(
                    "propagationPolicy: Unsupported value: {}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"",
                    capstan_machinery::status::quote(policy)
                ),
            ));
        }
        if orphan.is_some() {
            return Err(options_invalid(
                "DeleteOptions",
                &format!(
                    "propagationPolicy: Invalid value: {}: orphanDependents and deletionPropagation cannot be both set",
                    capstan_machinery::status::quote(policy)
                ),
            ));
        }
    }
    options.propagation = propagation;
    Ok(options)
}

async fn delete(
    request: &ResourceRequest,
    name: &str,
    call: &Call,
    body: Option<hyper::body::Incoming>,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let options = delete_options(call, body).await?;
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let result = call
        .finish(0, async move {
            registry.delete(&namespace, &owned_name, &options).await
        })
        .await?;
    let strategy = request.registry.strategy();
    let info = strategy.info();
    if info.delete_returns_object || !result.removed {
        return Ok(object_response(
            StatusCode::OK,
            strategy.as_ref(),
            &result.object,
            encoding,
            &call.query,
        ));
    }
    let details = Details {
        name: name.to_string(),
        group: info.group.to_string(),
        kind: info.plural.to_string(),
        uid: meta::meta_str(&result.object, "uid").to_string(),
        ..Details::default()
    };
    Ok(json_response(
        StatusCode::OK,
        &success_status(&details),
        encoding.pretty,
    ))
}

async fn delete_collection(
    request: &ResourceRequest,
    call: &Call,
    body: Option<hyper::body::Incoming>,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let options = delete_options(call, body).await?;
    let list = list_options(request, &call.query)?;
    // Not bound by the write timeout (as upstream), only by the request's own deadline.
    let (registry, namespace) = (request.registry.clone(), request.namespace.clone());
    let deadline = call
        .admission
        .deadline
        .unwrap_or_else(|| tokio::time::Instant::now() + crate::limits::WRITE_TIMEOUT);
    let result = crate::limits::finish(deadline, false, call.admission.slot.clone(), async move {
        registry
            .delete_collection(&namespace, &list, &options)
            .await
    })
    .await?;
    Ok(list_response(request, call, encoding, result))
}
