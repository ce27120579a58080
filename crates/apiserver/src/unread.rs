//! A request's body, and what is left of it unread once the request is answered.
//!
//! Many answers come before the body is read: a 405, a 415, a 406, a 404, a body refused as
//! malformed early. Over HTTP/1.1 the next request can only be read once this one's body is
//! off the wire. Go's server (and so kube-apiserver) reads and discards up to 256 KiB of what
//! is left before it writes the answer's header, and when it cannot (more left, a
//! `100-continue` the client still waits for, a read error) it answers `Connection: close`
//! and closes. hyper drains only what it has buffered and otherwise closes without saying so:
//! the client's next request on the connection meets an EOF. [`RequestBody`] hands what is
//! left back to the connection ([`Unread`]), which does as Go does. HTTP/2 needs none of this:
//! an unread stream is reset, and the connection serves on.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// How much of an unread body is read and discarded after the answer (Go's
/// `maxPostHandlerReadBytes`): beyond it, the connection is closed instead.
pub const MAX_POST_HANDLER_READ: u64 = 256 << 10;

/// How long discarding may wait for the rest of the body; a client slower than this has its
/// connection closed (Go waits as long as its read timeout, which kube-apiserver leaves unset;
/// Capstan bounds it).
const DISCARD_TIMEOUT: Duration = Duration::from_secs(5);

/// What a request left of its body.
#[derive(Default)]
struct Left {
    /// The body, when it was dropped before its end.
    body: Option<Incoming>,
    /// Whether anything read it at all (hyper sends a `100 Continue` on the first read).
    polled: bool,
}

/// A request's body: hyper's, which hands itself back to the connection when it is dropped
/// before its end.
pub struct RequestBody {
    inner: Option<Incoming>,
    left: Arc<Mutex<Left>>,
}

/// What the connection does with a request's unread body once it has the answer.
pub struct Unread(Arc<Mutex<Left>>);

/// `body` as the request's, and the connection's hold on what it leaves unread.
pub fn follow(body: Incoming) -> (RequestBody, Unread) {
    let left = Arc::new(Mutex::new(Left::default()));
    let body = RequestBody {
        inner: Some(body),
        left: left.clone(),
    };
    (body, Unread(left))
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Ok(mut left) = self.left.lock() {
            left.polled = true;
        }
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take()
            && !body.is_end_stream()
            && let Ok(mut left) = self.left.lock()
        {
            left.body = Some(body);
        }
    }
}

impl Unread {
    /// Called with the answer in hand, the request's body dropped: discards what is left of
    /// the body as Go does; answers whether the connection must close after the answer
    /// (`Connection: close`). `expects_continue`: the request said `Expect: 100-continue`.
    pub async fn must_close(self, expects_continue: bool) -> bool {
        let (body, polled) = match self.0.lock() {
            Ok(mut left) => (left.body.take(), left.polled),
            Err(_) => return true,
        };
        // Read to its end, never sent, or still held (a proxied request's, being sent on).
        let Some(mut body) = body else {
            return false;
        };
        if expects_continue && !polled {
            // The client waits for a `100 Continue` before it sends the body.
            return true;
        }
        if body.size_hint().lower() >= MAX_POST_HANDLER_READ {
            return true;
        }
        let discard = async {
            let mut read = 0u64;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    return false;
                };
                read += frame.data_ref().map_or(0, |data| data.len() as u64);
                if read > MAX_POST_HANDLER_READ {
                    return false;
                }
            }
            true
        };
        !matches!(
            tokio::time::timeout(DISCARD_TIMEOUT, discard).await,
            Ok(true)
        )
    }
}
