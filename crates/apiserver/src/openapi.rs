//! `/openapi/v2` and `/openapi/v3`: the documents a real kube-apiserver 1.36 serves, verbatim.

use std::sync::LazyLock;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::discovery::sha512_hex;
use crate::request::{Body, Query, full};

use capstan_registry::Registry;

/// `/openapi/v2`: the one document of every kind kube-apiserver 1.36 serves, byte for byte.
static SWAGGER: &[u8] = include_bytes!("../data/swagger.json");

struct Document {
    path: &'static str,
    bytes: Bytes,
    hash: String,
}

/// The `/openapi/v3` documents of the served kinds: each kind names its group version's
/// document, so a new kind's appears with it.
pub struct Documents(Vec<Document>);

impl Documents {
    /// The documents the registered kinds name, each once.
    pub fn of(registries: &[std::sync::Arc<Registry>]) -> Self {
        let mut documents: Vec<Document> = Vec::new();
        for registry in registries {
            let data = registry.strategy().info().data;
            let (path, bytes) = (data.openapi_path, data.openapi);
            if !documents.iter().any(|d| d.path == path) {
                documents.push(Document {
                    path,
                    bytes: Bytes::from_static(bytes),
                    hash: sha512_hex(bytes),
                });
            }
        }
        documents.sort_by_key(|d| d.path);
        Documents(documents)
    }

    /// Whether a document is served at `/openapi/v3/<path>`.
    pub fn serves(&self, path: &str) -> bool {
        self.0.iter().any(|d| d.path == path)
    }
}

static V2_HASH: LazyLock<String> = LazyLock::new(|| sha512_hex(SWAGGER));

fn json(status: StatusCode, bytes: Bytes, etag: &str) -> Response<Body> {
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::VARY, HeaderValue::from_static("Accept"));
    if let Ok(value) = HeaderValue::from_str(&format!("\"{etag}\"")) {
        headers.insert(header::ETAG, value);
    }
    response
}

fn acceptable(accept: &str) -> bool {
    accept.is_empty()
        || capstan_machinery::media::parse_accept(accept)
            .iter()
            .any(|r| {
                (r.kind == "*" || r.kind == "application")
                    && (r.subtype == "*" || r.subtype == "json")
            })
}

fn not_acceptable() -> Response<Body> {
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::NOT_ACCEPTABLE;
    response
}

/// Serves a path under `/openapi/`; `None` when it is not an OpenAPI path.
pub fn serve(
    documents: &Documents,
    path: &str,
    query: &Query,
    accept: &str,
) -> Option<Response<Body>> {
    match path {
        "/openapi/v2" => Some(if acceptable(accept) {
            json(StatusCode::OK, Bytes::from_static(SWAGGER), &V2_HASH)
        } else {
            not_acceptable()
        }),
        "/openapi/v3" | "/openapi/v3/" => {
            let mut paths = serde_json::Map::new();
            for doc in &documents.0 {
                paths.insert(
                    doc.path.to_string(),
                    serde_json::json!({"serverRelativeURL": format!("/openapi/v3/{}?hash={}", doc.path, doc.hash)}),
                );
            }
            let body = capstan_machinery::json::to_vec(&serde_json::json!({"paths": paths}));
            let etag = sha512_hex(&body);
            Some(json(StatusCode::OK, Bytes::from(body), &etag))
        }
        _ => {
            let rest = path.strip_prefix("/openapi/v3/")?;
            let Some(doc) = documents.0.iter().find(|d| d.path == rest) else {
                let mut response = Response::new(full(Bytes::from_static(b"404 page not found\n")));
                *response.status_mut() = StatusCode::NOT_FOUND;
                return Some(response);
            };
            if !acceptable(accept) {
                return Some(not_acceptable());
            }
            match query.get("hash") {
                Some(hash) if hash != doc.hash => {
                    let mut response = Response::new(full(Bytes::new()));
                    *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
                    if let Ok(location) = HeaderValue::from_str(&format!(
                        "/openapi/v3/{}?hash={}",
                        doc.path, doc.hash
                    )) {
                        response.headers_mut().insert(header::LOCATION, location);
                    }
                    Some(response)
                }
                Some(_) => {
                    let mut response = json(StatusCode::OK, doc.bytes.clone(), &doc.hash);
                    response.headers_mut().insert(
                        header::CACHE_CONTROL,
                        HeaderValue::from_static("public, immutable"),
                    );
                    Some(response)
                }
                None => Some(json(StatusCode::OK, doc.bytes.clone(), &doc.hash)),
            }
        }
    }
}
