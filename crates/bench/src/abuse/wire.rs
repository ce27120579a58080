//! Requests on the wire: raw HTTP/1.1 out, a response (or what became of it) back.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::watch::{Chunked, Io};

use super::generate::Planned;

/// How long one exchange may take before the client gives up on it (watches included).
pub(super) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most of a response body read.
pub(super) const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// What one exchange came to.
pub(super) enum Outcome {
    /// The status, the body, and whether the server said it closes the connection
    /// (`Connection: close`, or a body that runs to the end of the connection).
    Answered(u16, Vec<u8>, bool),
    /// The server closed or reset the connection without an answer.
    Dropped(String),
    /// The client gave up waiting (a watch, a trickling list).
    TimedOut,
}

/// Sends a request and reads its response at the same time: a server may answer (413, 404)
/// and close before it has read a large body, which is an answer, not a dropped connection.
pub(super) async fn exchange(conn: &mut Box<dyn Io>, request: &[u8], head_only: bool) -> Outcome {
    let (mut reader, mut writer) = tokio::io::split(conn);
    let (written, outcome) = tokio::join!(
        async {
            let result = writer.write_all(request).await;
            let _ = writer.flush().await;
            result
        },
        read_response(&mut reader, head_only)
    );
    match (written, outcome) {
        (Err(error), Outcome::Dropped(_)) => Outcome::Dropped(format!("write: {error}")),
        (_, outcome) => outcome,
    }
}

pub(super) async fn read_response(conn: &mut (impl AsyncRead + Unpin), head_only: bool) -> Outcome {
    let mut buffer = BytesMut::with_capacity(16 * 1024);
    let (code, body_start, length, chunked, closing) = loop {
        match conn.read_buf(&mut buffer).await {
            Ok(0) => return Outcome::Dropped("closed before a response".into()),
            Ok(_) => {}
            Err(error) => return Outcome::Dropped(format!("read: {error}")),
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buffer) {
            Ok(httparse::Status::Complete(end)) => {
                let mut length = None;
                let mut chunked = false;
                let mut closing = false;
                for header in response.headers.iter() {
                    if header.name.eq_ignore_ascii_case("connection") {
                        closing |= header
                            .value
                            .split(|b| *b == b',')
                            .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"));
                    }
                    if header.name.eq_ignore_ascii_case("content-length") {
                        length = std::str::from_utf8(header.value)
                            .ok()
                            .and_then(|v| v.trim().parse::<usize>().ok());
                    }
                    if header.name.eq_ignore_ascii_case("transfer-encoding")
                        && header.value.eq_ignore_ascii_case(b"chunked")
                    {
                        chunked = true;
                    }
                }
                break (response.code.unwrap_or(0), end, length, chunked, closing);
            }
            Ok(httparse::Status::Partial) if buffer.len() < 1 << 20 => continue,
            _ => return Outcome::Dropped("an unreadable response head".into()),
        }
    };
    buffer.advance(body_start);
    let mut body = Vec::new();
    if head_only || code == 204 || code == 304 {
        return Outcome::Answered(code, body, closing);
    }
    if chunked {
        let mut decoder = Chunked::default();
        loop {
            match decoder.next(&mut buffer) {
                Ok(Some(piece)) => {
                    if body.len() < BODY_LIMIT {
                        body.extend_from_slice(&piece);
                    }
                    continue;
                }
                Ok(None) if decoder.is_done() => return Outcome::Answered(code, body, closing),
                Ok(None) => {}
                Err(error) => return Outcome::Dropped(format!("chunked body: {error}")),
            }
            match conn.read_buf(&mut buffer).await {
                Ok(0) => return Outcome::Dropped("closed inside a chunked body".into()),
                Ok(_) => {}
                Err(error) => return Outcome::Dropped(format!("read: {error}")),
            }
        }
    }
    let Some(length) = length else {
        // No length: the body runs to the end of the connection.
        let mut rest = Vec::new();
        let _ = (&mut *conn)
            .take(BODY_LIMIT as u64)
            .read_to_end(&mut rest)
            .await;
        body.extend_from_slice(&buffer);
        body.extend_from_slice(&rest);
        return Outcome::Answered(code, body, true);
    };
    while buffer.len() < length {
        match conn.read_buf(&mut buffer).await {
            Ok(0) => return Outcome::Dropped("closed inside a body".into()),
            Ok(_) => {}
            Err(error) => return Outcome::Dropped(format!("read: {error}")),
        }
    }
    body.extend_from_slice(&buffer[..length.min(BODY_LIMIT)]);
    Outcome::Answered(code, body, closing)
}

pub(super) fn serialize(plan: &Planned, credentials: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = format!("{} {} HTTP/1.1\r\n", plan.method, plan.target).into_bytes();
    let replaced = plan.headers.iter().any(|(n, _)| n == "Authorization");
    for (name, value) in credentials {
        if replaced && name.eq_ignore_ascii_case("authorization") {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in &plan.headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", plan.body.len()).as_bytes());
    out.extend_from_slice(&plan.body);
    out
}
