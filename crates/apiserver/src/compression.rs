//! Response compression as kube-apiserver's (`APIResponseCompression`, on by default): an API
//! response over 128 KiB is sent gzipped (level 1, upstream's `BestSpeed`) when the request's
//! `Accept-Encoding` lists `gzip` — as client-go and kubectl send it.

use std::io::Write;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, header};
use http_body_util::BodyExt;
use hyper::body::Body as _;

use crate::request::{Body, Compressible, full};

/// Responses larger than this are compressed (upstream's `defaultGzipThresholdBytes`).
pub const THRESHOLD: u64 = 128 * 1024;

/// Upstream's `negotiateContentEncoding`: a `gzip` token in the (first) `Accept-Encoding`
/// header, without parameters.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|token| token.trim() == "gzip"))
}

fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 4),
        flate2::Compression::fast(),
    );
    encoder.write_all(bytes)?;
    encoder.finish()
}

/// Gzips `response` if it is marked compressible and its (complete) body is over the
/// threshold; anything else is returned as it is.
pub async fn compress(response: Response<Body>) -> Response<Body> {
    let large = response
        .body()
        .size_hint()
        .exact()
        .is_some_and(|size| size > THRESHOLD);
    if response.extensions().get::<Compressible>().is_none() || !large {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes: Bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    let input = bytes.clone();
    match tokio::task::spawn_blocking(move || gzip(&input)).await {
        Ok(Ok(compressed)) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            parts
                .headers
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            parts
                .headers
                .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
            Response::from_parts(parts, full(compressed))
        }
        _ => Response::from_parts(parts, full(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_gzip_token_counts() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_str(value).expect("header"),
            );
            accepts_gzip(&headers)
        };
        assert!(with("gzip"));
        assert!(with("deflate, gzip"));
        assert!(!with("gzip;q=1.0"));
        assert!(!with("br"));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[tokio::test]
    async fn large_marked_responses_are_gzipped_and_small_ones_are_not() {
        use std::io::Read;
        let marked = |size: usize| {
            let mut response = Response::new(full(vec![b'x'; size]));
            response.extensions_mut().insert(Compressible);
            response
        };
        let small = compress(marked(1024)).await;
        assert!(small.headers().get(header::CONTENT_ENCODING).is_none());
        let large = compress(marked(THRESHOLD as usize + 1)).await;
        assert_eq!(large.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(large.headers()[header::VARY], "Accept-Encoding");
        let body = large.into_body().collect().await.expect("body").to_bytes();
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut plain)
            .expect("gunzips");
        assert_eq!(plain.len(), THRESHOLD as usize + 1);
        let unmarked = compress(Response::new(full(vec![b'x'; 200_000]))).await;
        assert!(unmarked.headers().get(header::CONTENT_ENCODING).is_none());
    }
}
