//! Request plumbing: query parameters, bodies, and encoding responses as JSON, YAML or Table.

use std::sync::Arc;

use bytes::Bytes;
use capstan_machinery::media::{self, Negotiated, Output};
use capstan_machinery::{ApiError, meta, table, yaml};
use capstan_registry::DynStrategy;
use capstan_registry::cache::CachedObject;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use serde_json::{Map, Value, json};

/// The response body type.
pub type Body = BoxBody<Bytes, std::convert::Infallible>;

/// The largest request body accepted.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// A full body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into()).boxed()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parsed query parameters (first value wins, except where all are needed).
#[derive(Debug, Default, Clone)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Parses a query string.
    pub fn parse(query: Option<&str>) -> Self {
        Query(
            query
                .unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|pair| match pair.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(pair), String::new()),
                })
                .collect(),
        )
    }

    /// The first value of a parameter.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A parameter's value, `""` when it is absent (as Go's `url.Values.Get`).
    pub fn text(&self, name: &str) -> &str {
        self.get(name).unwrap_or_default()
    }

    /// Every value of a parameter.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// Boolean rule: absent/`0`/`false` ⇒ false, anything else (even empty) ⇒ true.
    pub fn flag(&self, name: &str) -> Option<bool> {
        self.get(name)
            .map(|v| !(v == "0" || v.eq_ignore_ascii_case("false")))
    }

    /// Integer parameter; malformed ⇒ 400 with Go's parse error text.
    pub fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "strconv.ParseInt: parsing {}: invalid syntax",
                    capstan_gostd::quote(v)
                ))
            }),
        }
    }
}

/// How to encode a response.
#[derive(Debug, Clone, Copy)]
pub struct Encoding {
    /// Negotiated representation.
    pub negotiated: Negotiated,
    /// Indent the JSON.
    pub pretty: bool,
}

/// A request header's text, `""` when it is absent or not visible ASCII.
pub fn header_text(headers: &HeaderMap, name: header::HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// Whether the request asks for indented JSON, as upstream's `isPrettyPrint` reads it:
/// `?pretty=` when it has a value (`strconv.ParseBool`, anything else false), else whether the
/// client is curl, Wget or a browser.
pub fn pretty_requested(headers: &HeaderMap, query: &Query) -> bool {
    match query.get("pretty").filter(|v| !v.is_empty()) {
        Some(v) => matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True"),
        None => {
            let agent = header_text(headers, header::USER_AGENT);
            agent.starts_with("curl")
                || agent.starts_with("Wget")
                || agent.starts_with("Mozilla/5.0")
        }
    }
}

impl Encoding {
    /// Negotiates from the request; indented when the Accept header's `pretty` parameter or
    /// [`pretty_requested`] says so (never for a watch).
    pub fn negotiate(headers: &HeaderMap, query: &Query, watch: bool) -> Result<Self, ApiError> {
        let accept = header_text(headers, header::ACCEPT);
        let negotiated = media::negotiate(accept, watch)?;
        let pretty = negotiated.pretty || pretty_requested(headers, query);
        Ok(Encoding {
            negotiated,
            pretty: pretty && !watch,
        })
    }

    /// JSON with no negotiation (errors before negotiation, discovery).
    pub fn json() -> Self {
        Encoding {
            negotiated: Negotiated {
                output: Output::Json,
                pretty: false,
            },
            pretty: false,
        }
    }
}

/// Serializes JSON: compact with a trailing newline, or indented without one.
pub fn json_bytes(value: &Value, pretty: bool) -> Bytes {
    if pretty {
        Bytes::from(capstan_machinery::json::to_vec_pretty(value))
    } else {
        let mut out = capstan_machinery::json::to_vec(value);
        out.push(b'\n');
        Bytes::from(out)
    }
}

/// Marks a response written by the API's own writers (objects, lists, Tables, `Status`,
/// discovery): upstream compresses those (`crate::compression`); proxied responses, watches
/// and the OpenAPI documents are not marked.
#[derive(Debug, Clone, Copy)]
pub struct Compressible;

/// A response with the headers every API response carries.
pub fn response(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    response.extensions_mut().insert(Compressible);
    response
}

/// A plain JSON response.
pub fn json_response(status: StatusCode, value: &Value, pretty: bool) -> Response<Body> {
    response(status, "application/json", full(json_bytes(value, pretty)))
}

/// `value` (with its `apiVersion` and `kind`) as Kubernetes protobuf: its message is one of
/// `messages` (its group's) or an apimachinery one. An object the messages cannot carry is a
/// 500, in JSON.
pub fn protobuf_response(
    status: StatusCode,
    value: &Value,
    messages: Option<capstan_machinery::protobuf::Messages>,
) -> Response<Body> {
    match capstan_machinery::protobuf::encode(value, messages) {
        Ok(bytes) => response(
            status,
            capstan_machinery::protobuf::CONTENT_TYPE,
            full(bytes),
        ),
        Err(problem) => {
            tracing::warn!(%problem, "a response could not be written as protobuf");
            let error = ApiError::internal(format!("unable to encode as protobuf: {problem}"));
            let status = error.to_status();
            match capstan_machinery::protobuf::encode(&status, None) {
                Ok(bytes) => response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    capstan_machinery::protobuf::CONTENT_TYPE,
                    full(bytes),
                ),
                Err(_) => json_response(StatusCode::INTERNAL_SERVER_ERROR, &status, false),
            }
        }
    }
}

/// What upstream writes with `WriteRawJSON` (`/version`, and a Status when negotiation
/// fails): `value` indented, without a trailing newline, whatever the request asked for.
pub fn raw_json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let body = capstan_machinery::json::to_vec_pretty(value);
    response(status, "application/json", full(body))
}

/// An error answered outside a resource's handler (401, 404, a bad `timeout`), negotiated as
/// upstream's `ErrorNegotiated` does: in the representation the request accepts, indented as
/// it asks; written raw when it accepts none.
pub fn negotiated_error(error: &ApiError, headers: &HeaderMap, query: &Query) -> Response<Body> {
    match Encoding::negotiate(headers, query, false) {
        Ok(encoding) => error_response(error, encoding),
        Err(_) => unnegotiated_error(error),
    }
}

/// An error whose answer could not be negotiated (406), written as [`raw_json_response`].
pub fn unnegotiated_error(error: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    with_warnings(
        raw_json_response(status, &error.to_status()),
        &error.warnings,
    )
}

/// A discovery document as JSON or YAML, whichever the client accepts, else the 406 Status.
pub fn document_response(accept: &str, value: &Value, pretty: bool) -> Response<Body> {
    match capstan_machinery::media::negotiate_plain(accept) {
        Ok(negotiated) if negotiated.output == Output::Yaml => response(
            StatusCode::OK,
            "application/yaml",
            full(yaml::to_string(value).unwrap_or_default()),
        ),
        Ok(negotiated) if negotiated.output == Output::Protobuf => {
            protobuf_response(StatusCode::OK, value, None)
        }
        Ok(negotiated) => json_response(StatusCode::OK, value, pretty || negotiated.pretty),
        Err(error) => unnegotiated_error(&error),
    }
}

/// A `Status` error response.
pub fn error_response(error: &ApiError, encoding: Encoding) -> Response<Body> {
    let status = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = error.to_status();
    let mut response = match encoding.negotiated.output {
        Output::Yaml => response(
            status,
            "application/yaml",
            full(yaml::to_string(&body).unwrap_or_default()),
        ),
        Output::Protobuf => protobuf_response(status, &body, None),
        _ => json_response(status, &body, encoding.pretty),
    };
    if let Some(seconds) = error.retry_after()
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    with_warnings(response, &error.warnings)
}

/// The most text (in characters) `Warning` headers carry before they are cut short, and what
/// each is cut to from then on (upstream's recorder: `truncateAtTotalRunes`,
/// `truncateItemRunes`).
const WARNINGS_TOTAL_CHARS: usize = 4 * 1024;
const WARNING_CUT_CHARS: usize = 256;

/// The warnings a response carries, as upstream's recorder (`filters/warning.go`) keeps them:
/// empty and repeated ones dropped; once their text would pass [`WARNINGS_TOTAL_CHARS`], every
/// one (those kept so far too) cut to [`WARNING_CUT_CHARS`], and no more added once the cut
/// texts reach the total.
fn recorded_warnings(warnings: &[String]) -> Vec<&str> {
    let cut = |text: &'_ str| -> (usize, usize) {
        match text.char_indices().nth(WARNING_CUT_CHARS) {
            Some((at, _)) => (at, WARNING_CUT_CHARS),
            None => (text.len(), text.chars().count()),
        }
    };
    let mut seen = std::collections::HashSet::new();
    let (mut kept, mut written, mut truncating) = (Vec::new(), 0, false);
    for text in warnings.iter().map(String::as_str) {
        if truncating && written >= WARNINGS_TOTAL_CHARS {
            break;
        }
        if text.is_empty() || !seen.insert(text) {
            continue;
        }
        kept.push(text);
        let chars = text.chars().count();
        if truncating {
            written += cut(text).1;
        } else if written + chars <= WARNINGS_TOTAL_CHARS {
            written += chars;
        } else {
            truncating = true;
            written = kept.iter().map(|t| cut(t).1).sum();
        }
    }
    if truncating {
        kept = kept.into_iter().map(|t| &t[..cut(t).0]).collect();
    }
    kept
}

/// Adds one `Warning: 299 - "<text>"` header per distinct warning, bounded as upstream bounds
/// them ([`recorded_warnings`]).
pub fn with_warnings(mut response: Response<Body>, warnings: &[String]) -> Response<Body> {
    for warning in recorded_warnings(warnings) {
        // Upstream escapes only `"` and `\`; Go's header writer turns line breaks into spaces.
        let escaped = warning
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace(['\n', '\r'], " ");
        // UTF-8 goes out as it is (obs-text), as Go writes it.
        if let Ok(value) = HeaderValue::from_bytes(format!("299 - \"{escaped}\"").as_bytes()) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

/// Plain text (health checks, 404 for unknown paths).
pub fn text_response(status: StatusCode, text: impl Into<Bytes>) -> Response<Body> {
    let mut response = response(status, "text/plain; charset=utf-8", full(text.into()));
    response.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// Reads a request body up to [`MAX_BODY`].
pub async fn read_body(body: crate::unread::RequestBody) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error)
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::too_large(&format!("limit is {MAX_BODY}")))
        }
        Err(error) => Err(ApiError::bad_request(format!(
            "unable to read the request body: {error}"
        ))),
    }
}

/// A response body that holds a guard (an in-flight slot, a connection's activity mark)
/// until the last byte has been handed to the connection or the body is dropped.
struct Holding<G> {
    body: Body,
    _guard: G,
}

impl<G: Unpin> hyper::body::Body for Holding<G> {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The response, its body holding `guard` until it has been sent.
pub fn hold_until_sent<G: Send + Sync + Unpin + 'static>(
    response: Response<Body>,
    guard: G,
) -> Response<Body> {
    response.map(|body| {
        Holding {
            body,
            _guard: guard,
        }
        .boxed()
    })
}

/// The object as a `PartialObjectMetadata`.
pub(crate) fn partial_metadata(object: &Value) -> Value {
    let metadata = json!({"metadata": object.get("metadata").cloned().unwrap_or(json!({}))});
    meta::typed_value(&metadata, ("meta.k8s.io/v1", "PartialObjectMetadata"), None)
}

/// What `includeObject` asks the Table rows to carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The full object.
    Object,
    /// Nothing.
    None,
}

impl IncludeObject {
    /// Parses the query parameter.
    pub fn parse(query: &Query) -> Result<Self, ApiError> {
        match query.text("includeObject") {
            "" | "Metadata" => Ok(IncludeObject::Metadata),
            "Object" => Ok(IncludeObject::Object),
            "None" => Ok(IncludeObject::None),
            other => Err(ApiError::bad_request(format!(
                "Unable to convert to Table as requested: includeObject: Invalid value: {}: must be 'Metadata', 'Object', 'None', or empty",
                capstan_gostd::quote(other)
            ))),
        }
    }
}

/// Builds the Table for objects of one kind.
pub fn to_table(
    strategy: &dyn DynStrategy,
    version: &'static str,
    objects: &[&Value],
    list_meta: Map<String, Value>,
    include: IncludeObject,
    with_columns: bool,
) -> Value {
    let info = strategy.info();
    let columns = strategy.columns();
    let rows = objects
        .iter()
        .map(|object| {
            let row_object = match include {
                IncludeObject::Metadata => partial_metadata(object),
                IncludeObject::Object => {
                    meta::typed_value(object, (&info.api_version(), info.kind), strategy.schema())
                }
                IncludeObject::None => Value::Null,
            };
            (strategy.cells(object), row_object)
        })
        .collect();
    table::table(
        version,
        list_meta,
        with_columns.then_some(columns.as_slice()),
        rows,
    )
}

/// Encodes one object (from a get or a write) for the client.
pub fn object_response(
    status: StatusCode,
    strategy: &dyn DynStrategy,
    object: &Value,
    encoding: Encoding,
    query: &Query,
) -> Response<Body> {
    let info = strategy.info();
    let type_meta = (info.api_version(), info.kind);
    let type_meta = (type_meta.0.as_str(), type_meta.1);
    match encoding.negotiated.output {
        Output::Json if !encoding.pretty => {
            let mut json = meta::typed_json_bytes(object, type_meta, false, strategy.schema());
            json.push(b'\n');
            response(status, "application/json", full(json))
        }
        Output::Json => json_response(
            status,
            &meta::typed_value(object, type_meta, strategy.schema()),
            true,
        ),
        // YAML's keys are sorted (as upstream's are): no member order to keep.
        Output::Yaml => response(
            status,
            "application/yaml",
            full(
                yaml::to_string(&meta::with_type_meta(object, type_meta.0, type_meta.1))
                    .unwrap_or_default(),
            ),
        ),
        Output::Protobuf => protobuf_response(
            status,
            &meta::with_type_meta(object, type_meta.0, type_meta.1),
            info.data.messages(),
        ),
        Output::Metadata => json_response(status, &partial_metadata(object), encoding.pretty),
        Output::Table(version) => {
            let include = match IncludeObject::parse(query) {
                Ok(include) => include,
                Err(error) => return error_response(&error, encoding),
            };
            let mut list_meta = Map::new();
            list_meta.insert(
                "resourceVersion".into(),
                json!(meta::resource_version(object)),
            );
            json_response(
                status,
                &to_table(strategy, version, &[object], list_meta, include, true),
                encoding.pretty,
            )
        }
    }
}

/// Writes a list's Table row by row from the cached items' JSON: each row's cells come from
/// the item decoded straight into the kind's type, and its `PartialObjectMetadata` is the
/// item's own `metadata` bytes, so no row is built as a `Value` tree.
pub fn table_bytes(
    strategy: &dyn DynStrategy,
    version: &'static str,
    items: &[Arc<CachedObject>],
    list_meta: Map<String, Value>,
    include: IncludeObject,
) -> Bytes {
    let info = strategy.info();
    let head = table::table(
        version,
        list_meta,
        Some(strategy.columns().as_slice()),
        Vec::new(),
    );
    let mut out = capstan_machinery::json::to_vec(&head);
    // `head` ends with `"rows":[]}`: reopen the rows array.
    out.truncate(out.len().saturating_sub(2));
    let api_version = info.api_version();
    let mut item = Vec::new();
    for (i, object) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        item.clear();
        object.write_item_for_rules(&mut item);
        out.extend_from_slice(b"{\"cells\":");
        let _ = capstan_machinery::json::to_writer(&mut out, &strategy.cells_json(&item));
        out.extend_from_slice(b",\"object\":");
        match include {
            IncludeObject::Metadata => {
                out.extend_from_slice(
                    b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":",
                );
                object.write_metadata(&mut out);
                out.push(b'}');
            }
            IncludeObject::Object => {
                out.extend_from_slice(&object.typed_json(info.kind, &api_version));
            }
            // Upstream's `TableRow.object` is a RawExtension: `null` when not included.
            IncludeObject::None => out.extend_from_slice(b"null"),
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_bounded_as_upstreams_recorder_bounds_them() {
        let texts = |list: &[&str]| list.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        // Under the bound: every distinct, non-empty one, whole and in order.
        let few = texts(&["a", "", "b", "a"]);
        assert_eq!(recorded_warnings(&few), ["a", "b"]);
        // Past it: all cut to 256 characters (those kept before too), none added once the
        // cut texts reach 4 Ki. Characters, not bytes: a cut never splits one.
        let long = "é".repeat(3000);
        let many: Vec<String> = [long.clone(), long.clone() + "!"]
            .into_iter()
            .chain((0..100).map(|i| format!("{i:03}{}", "x".repeat(97))))
            .collect();
        let kept = recorded_warnings(&many);
        assert_eq!(kept[0], "é".repeat(256));
        assert_eq!(kept[1], "é".repeat(256), "the second is cut too");
        assert_eq!(kept[2], many[2], "short ones stay whole");
        let total: usize = kept.iter().map(|t| t.chars().count()).sum();
        assert!(
            (WARNINGS_TOTAL_CHARS..WARNINGS_TOTAL_CHARS + WARNING_CUT_CHARS).contains(&total),
            "{total} characters kept"
        );
        assert_eq!(kept.len(), 2 + 36, "100-character warnings until 4 Ki");
    }
}
