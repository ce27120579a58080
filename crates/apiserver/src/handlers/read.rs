//! GET of one object and of a list (streamed from the watch cache, or rendered as a Table).

use super::*;

pub(super) async fn get(
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

pub(super) async fn list(
    request: &ResourceRequest,
    call: &Call,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let options = list_options(request, &call.query)?;
    let result = request.registry.list(&request.namespace, &options).await?;
    Ok(list_response(request, call, encoding, result))
}

pub(super) fn list_response(
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
            let head = json!({"kind": info.list_kind(), "apiVersion": info.api_version(), "metadata": list_meta});
            let body = ListBody::new(&head, result.items);
            response(
                StatusCode::OK,
                "application/json",
                http_body_util::BodyExt::boxed(body),
            )
        }
        output @ (Output::Json | Output::Yaml | Output::Protobuf) => {
            let items: Vec<Value> = result.items.iter().map(|o| o.object()).collect();
            let list = json!({"kind": info.list_kind(), "apiVersion": info.api_version(), "metadata": list_meta, "items": items});
            match output {
                Output::Yaml => {
                    let yaml = yaml::to_string(&list).unwrap_or_default();
                    response(StatusCode::OK, "application/yaml", full(yaml))
                }
                Output::Protobuf => {
                    crate::request::protobuf_response(StatusCode::OK, &list, info.data.messages())
                }
                _ => json_response(StatusCode::OK, &list, encoding.pretty),
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
                &result.items,
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

/// A JSON list sent in pieces of about 64 KiB spliced from the cached items' JSON: the first
/// bytes leave while later items are still being copied, and no buffer the size of the whole
/// list (megabytes for thousands of Services) is allocated and faulted in. The length is known
/// up front, so the response carries a Content-Length.
pub(super) struct ListBody {
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
        let mut open = capstan_machinery::json::to_vec(head);
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
