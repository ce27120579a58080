//! `/openapi/v2` and `/openapi/v3`: the documents a real kube-apiserver 1.36 serves, verbatim.

use std::sync::LazyLock;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::discovery::sha512_hex;
use crate::request::{Body, Query, full};

use capstan_machinery::schema::{
    APIREGISTRATION_V1_OPENAPI as APIREGISTRATION_V1, CORE_V1_OPENAPI as CORE_V1, SWAGGER,
};

struct Document {
    path: &'static str,
    bytes: Bytes,
    hash: String,
}

static V3: LazyLock<Vec<Document>> = LazyLock::new(|| {
    vec![
        Document {
            path: "api/v1",
            bytes: Bytes::from_static(CORE_V1),
            hash: sha512_hex(CORE_V1),
        },
        Document {
            path: "apis/apiregistration.k8s.io/v1",
            bytes: Bytes::from_static(APIREGISTRATION_V1),
            hash: sha512_hex(APIREGISTRATION_V1),
        },
    ]
});

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
pub fn serve(path: &str, query: &Query, accept: &str) -> Option<Response<Body>> {
    match path {
        "/openapi/v2" => Some(if acceptable(accept) {
            json(StatusCode::OK, Bytes::from_static(SWAGGER), &V2_HASH)
        } else {
            not_acceptable()
        }),
        "/openapi/v3" | "/openapi/v3/" => {
            let mut paths = serde_json::Map::new();
            for doc in V3.iter() {
                paths.insert(
                    doc.path.to_string(),
                    serde_json::json!({"serverRelativeURL": format!("/openapi/v3/{}?hash={}", doc.path, doc.hash)}),
                );
            }
            let body = serde_json::to_vec(&serde_json::json!({"paths": paths})).unwrap_or_default();
            let etag = sha512_hex(&body);
            Some(json(StatusCode::OK, Bytes::from(body), &etag))
        }
        _ => {
            let rest = path.strip_prefix("/openapi/v3/")?;
            let Some(doc) = V3.iter().find(|d| d.path == rest) else {
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
