//! An HTTP/2 connection's writes, held and written out together.
//!
//! h2 writes each data frame of 256 bytes or more, and flushes, on its own: an event fanned
//! out to many watches on one connection cost one TLS record and one `writev` per watch. So an
//! HTTP/2 connection's stream holds what h2 writes (up to [`HELD_BYTES`]) and the connection's
//! task writes it out after polling the connection ([`write_held`]), as Go's HTTP/2 server
//! writes out its buffer only when no frame is left to write. HTTP/1.1 connections' reads and
//! writes go straight through.

use std::sync::Arc;
use std::task::{Poll, ready};

/// The most bytes an HTTP/2 connection holds back before writing them out.
const HELD_BYTES: usize = 64 * 1024;

/// A connection's TLS stream, shared by hyper's end of it ([`Writes`]) and the connection's
/// task, which writes out what an HTTP/2 connection held back ([`write_held`]).
pub(crate) struct Stream<IO> {
    io: IO,
    /// Bytes an HTTP/2 connection wrote that are not yet handed to `io`.
    held: bytes::BytesMut,
    /// Whether the connection's task has yielded once since bytes were first held.
    yielded: bool,
    /// Whether bytes were handed to `io` since it was last flushed: TLS takes them and
    /// answers that they are written, keeping what the socket would not take until flushed.
    unflushed: bool,
    /// Why writing out held bytes failed: every later write fails the same way.
    failed: Option<(std::io::ErrorKind, String)>,
}

impl<IO: tokio::io::AsyncWrite + Unpin> Stream<IO> {
    /// Hands every held byte to `io` and flushes it (outside tokio's cooperative budget: an
    /// HTTP/2 connection's task writes the frames of every stream on it, and were its writes
    /// budgeted it would queue behind the very stream tasks it serves).
    fn write_out(&mut self, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        use bytes::Buf;
        let Self {
            io,
            held,
            unflushed,
            ..
        } = self;
        let done = ready!(unbudgeted(cx, |cx| {
            while !held.is_empty() {
                match ready!(std::pin::Pin::new(&mut *io).poll_write(cx, held)) {
                    Ok(0) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        held.advance(n);
                        *unflushed = true;
                    }
                    Err(error) => return Poll::Ready(Err(error)),
                }
            }
            if *unflushed {
                ready!(std::pin::Pin::new(&mut *io).poll_flush(cx))?;
                *unflushed = false;
            }
            Poll::Ready(Ok(()))
        }));
        if let Err(error) = &done {
            self.failed = Some((error.kind(), error.to_string()));
            self.held.clear();
        }
        self.yielded = false;
        Poll::Ready(done)
    }

    /// Whether there is anything to write out or flush.
    fn pending(&self) -> bool {
        !self.held.is_empty() || self.unflushed
    }

    fn check(&self) -> std::io::Result<()> {
        match &self.failed {
            Some((kind, why)) => Err(std::io::Error::new(*kind, why.clone())),
            None => Ok(()),
        }
    }
}

/// One poll of `op` outside tokio's cooperative budget.
fn unbudgeted<T>(
    cx: &mut std::task::Context<'_>,
    op: impl FnMut(&mut std::task::Context<'_>) -> Poll<T>,
) -> Poll<T> {
    use std::future::Future;
    let once = std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(op)));
    once.poll(cx)
}

/// Writes out what an HTTP/2 connection held back, after the connection's poll: not on the
/// poll that first held bytes (the task yields once instead, so that the stream tasks woken
/// with it add their frames: one write for an event sent to 1,000 watches on one
/// connection, not 1,000), but on the next. Pending unless writing fails (and always for an
/// HTTP/1.1 connection, which holds nothing).
pub(crate) fn write_held<IO: tokio::io::AsyncWrite + Unpin>(
    stream: &std::sync::Mutex<Stream<IO>>,
    cx: &mut std::task::Context<'_>,
) -> Poll<std::io::Error> {
    let mut stream = stream.lock().unwrap_or_else(|e| e.into_inner());
    if !stream.pending() || stream.failed.is_some() {
        return Poll::Pending;
    }
    // (What TLS still holds is flushed at once: nothing more joins it.)
    if !stream.held.is_empty() && !stream.yielded {
        stream.yielded = true;
        cx.waker().wake_by_ref();
        return Poll::Pending;
    }
    match stream.write_out(cx) {
        Poll::Ready(Err(error)) => Poll::Ready(error),
        _ => Poll::Pending,
    }
}

/// hyper's end of a connection's stream: HTTP/2 writes are held (up to [`HELD_BYTES`]) and
/// a flush is left to the connection's task ([`write_held`]).
pub(crate) struct Writes<IO> {
    stream: Shared<IO>,
    http2: bool,
}

/// A connection's stream, shared by hyper's end of it and the connection's task.
pub(crate) type Shared<IO> = Arc<std::sync::Mutex<Stream<IO>>>;

impl<IO> Writes<IO> {
    /// hyper's end of `io`, and the connection task's.
    pub(crate) fn new(io: IO, http2: bool) -> (Self, Shared<IO>) {
        let stream = Arc::new(std::sync::Mutex::new(Stream {
            io,
            held: bytes::BytesMut::new(),
            yielded: false,
            unflushed: false,
            failed: None,
        }));
        let writes = Writes {
            stream: stream.clone(),
            http2,
        };
        (writes, stream)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stream<IO>> {
        self.stream.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Writes<IO> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.lock().io).poll_read(cx, buf)
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> Writes<IO> {
    /// Holds `bufs` (an HTTP/2 connection's), writing out what is held first when they would
    /// not fit; slices as large as the limit go straight to the stream.
    fn hold(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let mut stream = self.lock();
        stream.check()?;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if stream.held.len() + len > HELD_BYTES && !stream.held.is_empty() {
            ready!(stream.write_out(cx))?;
        }
        if len >= HELD_BYTES {
            let io = &mut stream.io;
            let written = ready!(unbudgeted(cx, |cx| {
                std::pin::Pin::new(&mut *io).poll_write_vectored(cx, bufs)
            }))?;
            // Flushed by the connection's task after this poll.
            stream.unflushed = true;
            return Poll::Ready(Ok(written));
        }
        for buf in bufs {
            stream.held.extend_from_slice(buf);
        }
        Poll::Ready(Ok(len))
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Writes<IO> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.http2 {
            return self.hold(cx, &[std::io::IoSlice::new(buf)]);
        }
        std::pin::Pin::new(&mut self.lock().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.http2 {
            return self.hold(cx, bufs);
        }
        std::pin::Pin::new(&mut self.lock().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.http2 || self.lock().io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut stream = self.lock();
        if self.http2 {
            // Written out by the connection's task after this poll of the connection.
            return Poll::Ready(stream.check());
        }
        std::pin::Pin::new(&mut stream.io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut stream = self.lock();
        if stream.pending() {
            ready!(stream.write_out(cx))?;
        }
        std::pin::Pin::new(&mut stream.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Waker};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn writes(
        http2: bool,
    ) -> (
        Writes<tokio::io::DuplexStream>,
        Shared<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
    ) {
        let (ours, peer) = tokio::io::duplex(1 << 20);
        let (writes, stream) = Writes::new(ours, http2);
        (writes, stream, peer)
    }

    async fn available(peer: &mut tokio::io::DuplexStream) -> Vec<u8> {
        let mut out = vec![0; 1 << 20];
        match tokio::time::timeout(Duration::from_millis(50), peer.read(&mut out)).await {
            Ok(Ok(n)) => out[..n].to_vec(),
            _ => Vec::new(),
        }
    }

    /// An HTTP/2 connection's frames and flushes reach the peer only when its task writes
    /// them out, on the poll after the one that first held them, all in one write.
    #[tokio::test]
    async fn http2_writes_are_held_until_the_task_has_yielded_once() {
        let (mut writes, stream, mut peer) = writes(true);
        let mut cx = Context::from_waker(Waker::noop());
        for frame in [&b"first "[..], b"second ", b"third"] {
            writes.write_all(frame).await.expect("held");
            writes.flush().await.expect("flushed");
        }
        assert_eq!(available(&mut peer).await, b"");
        // The poll that finds bytes held yields instead of writing them out.
        assert!(write_held(&stream, &mut cx).is_pending());
        assert_eq!(available(&mut peer).await, b"");
        assert!(write_held(&stream, &mut cx).is_pending());
        assert_eq!(available(&mut peer).await, b"first second third");
        // Nothing held: nothing to do, no yield.
        assert!(write_held(&stream, &mut cx).is_pending());
        assert!(!stream.lock().expect("not poisoned").yielded);
    }

    /// Past the limit, what is held is written out first; a write as large as the limit goes
    /// straight through; a shutdown writes out what is held.
    #[tokio::test]
    async fn http2_holds_at_most_the_limit_and_shutdown_writes_it_out() {
        let (mut writes, _stream, mut peer) = writes(true);
        let small = vec![b'a'; HELD_BYTES - 10];
        writes.write_all(&small).await.expect("held");
        assert_eq!(available(&mut peer).await.len(), 0);
        writes.write_all(&[b'b'; 20]).await.expect("held");
        assert_eq!(available(&mut peer).await, small);
        let large = vec![b'c'; HELD_BYTES];
        writes.write_all(&large).await.expect("written");
        let mut expected = vec![b'b'; 20];
        expected.extend_from_slice(&large);
        let mut got = Vec::new();
        while got.len() < expected.len() {
            let more = available(&mut peer).await;
            assert!(
                !more.is_empty(),
                "{} of {} bytes",
                got.len(),
                expected.len()
            );
            got.extend(more);
        }
        assert_eq!(got, expected);
        writes.write_all(b"last").await.expect("held");
        writes.shutdown().await.expect("shut down");
        let mut rest = Vec::new();
        peer.read_to_end(&mut rest).await.expect("read to the end");
        assert_eq!(rest, b"last");
    }

    /// A TLS stream as tokio-rustls is: it takes every byte, and sends what it holds only
    /// when flushed; its first `refused` flushes find the socket full.
    #[derive(Default)]
    struct Tls {
        buffered: Vec<u8>,
        sent: Vec<u8>,
        refused: usize,
    }

    impl tokio::io::AsyncWrite for Tls {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.buffered.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.refused > 0 {
                self.refused -= 1;
                return Poll::Pending;
            }
            let buffered = std::mem::take(&mut self.buffered);
            self.sent.extend(buffered);
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Bytes TLS took but could not yet send are flushed on the task's next poll, though
    /// nothing is held any more (and hyper's own flushes do not reach TLS); large writes that
    /// went straight through are flushed likewise.
    #[tokio::test]
    async fn what_tls_still_holds_is_flushed_on_the_next_poll() {
        let tls = Tls {
            refused: 1,
            ..Tls::default()
        };
        let (mut writes, stream) = Writes::new(tls, true);
        let mut cx = Context::from_waker(Waker::noop());
        writes.write_all(b"frame").await.expect("held");
        writes.flush().await.expect("flushed");
        assert!(write_held(&stream, &mut cx).is_pending()); // yields
        assert!(write_held(&stream, &mut cx).is_pending()); // the socket is full
        assert_eq!(stream.lock().expect("not poisoned").io.sent, b"");
        assert!(write_held(&stream, &mut cx).is_pending());
        assert_eq!(stream.lock().expect("not poisoned").io.sent, b"frame");
        let large = vec![b'x'; HELD_BYTES];
        writes.write_all(&large).await.expect("written");
        writes.flush().await.expect("flushed");
        assert_eq!(stream.lock().expect("not poisoned").io.sent.len(), 5);
        assert!(write_held(&stream, &mut cx).is_pending());
        assert_eq!(
            stream.lock().expect("not poisoned").io.sent.len(),
            5 + HELD_BYTES
        );
    }

    /// HTTP/1.1 writes go straight through, and the connection's task has nothing to do.
    #[tokio::test]
    async fn http1_writes_go_straight_through() {
        let (mut writes, stream, mut peer) = writes(false);
        writes
            .write_all(b"HTTP/1.1 200 OK\r\n")
            .await
            .expect("written");
        writes.flush().await.expect("flushed");
        assert_eq!(available(&mut peer).await, b"HTTP/1.1 200 OK\r\n");
        let mut cx = Context::from_waker(Waker::noop());
        assert!(write_held(&stream, &mut cx).is_pending());
    }
}
