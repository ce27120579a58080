//! The listener and its connections: TLS, HTTP/1.1 and HTTP/2 with kube-apiserver's
//! connection limits (header read, idle and handshake deadlines, header size, HTTP/2 streams
//! and windows), a cap on open connections, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::ApiServer;
use crate::held::{Writes, write_held};
use crate::limits::{
    HEADER_READ_TIMEOUT, HTTP2_STREAM_WINDOW, IDLE_TIMEOUT, MAX_HEADER_BYTES, TLS_HANDSHAKE_TIMEOUT,
};

/// Serves HTTPS on `listener` until `shutdown` resolves, then drains in-flight requests
/// (up to `drain`) and returns.
pub async fn serve(
    server: Arc<ApiServer>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let limits = server.limits().clone();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let open = Arc::new(OpenConnections::default());
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_streams_per_connection)
        .max_frame_size(HTTP2_STREAM_WINDOW)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(
            HTTP2_STREAM_WINDOW.saturating_mul(limits.http2_max_streams_per_connection.max(1)),
        )
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        // At the connection cap, further clients wait in the kernel's listen queue until an
        // open connection ends (deadlines end the idle and the slow ones).
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // Dead peers (a watcher whose machine vanished) are noticed, as Go's listener does.
        let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(15));
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        let acceptor = acceptor.clone();
        let server = server.clone();
        let builder = builder.clone();
        let counted = open.enter();
        tokio::spawn(async move {
            let _slot = slot;
            let _counted = counted;
            let tls =
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            // An HTTP/2 connection's writes are held and written out together, outside tokio's
            // cooperative budget (`crate::held`); its reads stay budgeted, so a client flooding
            // it cannot hold a worker.
            let http2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let (tls, stream) = Writes::new(tls, http2);
            let activity = Arc::new(Activity::new());
            let service = {
                let (server, activity) = (server.clone(), activity.clone());
                hyper::service::service_fn(move |request: http::Request<Incoming>| {
                    let (server, busy) = (server.clone(), activity.begin());
                    async move {
                        let http1 = request.version() < http::Version::HTTP_2;
                        let expects_continue = request
                            .headers()
                            .get(http::header::EXPECT)
                            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
                        let (parts, body) = request.into_parts();
                        let (body, unread) = crate::unread::follow(body);
                        let request = http::Request::from_parts(parts, body);
                        let mut response = server.handle(request).await;
                        // What the request left unread is discarded as Go's server does, or
                        // the connection closes after the answer, saying so.
                        if http1 && unread.must_close(expects_continue).await {
                            response.headers_mut().insert(
                                http::header::CONNECTION,
                                http::HeaderValue::from_static("close"),
                            );
                        }
                        if let Some(crate::limits::SendBy(deadline)) =
                            response.extensions().get::<crate::limits::SendBy>()
                        {
                            busy.send_by(*deadline);
                        }
                        Ok::<_, std::convert::Infallible>(crate::request::hold_until_sent(
                            response, busy,
                        ))
                    }
                })
            };
            let connection = builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            tokio::pin!(connection);
            let mut shutting_down = server.shutdown_signal();
            let idle = tokio::time::sleep(IDLE_TIMEOUT);
            tokio::pin!(idle);
            // Armed for the earliest response deadline; far off while there is none.
            let far = || Instant::now() + Duration::from_secs(86_400);
            let overdue = tokio::time::sleep_until(far());
            tokio::pin!(overdue);
            let mut closing = false;
            let mut forcing = false;
            loop {
                tokio::select! {
                    // The connection first, then what it held back (HTTP/2).
                    biased;
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            tracing::debug!(%peer, %error, "connection ended with an error");
                        }
                        break;
                    }
                    error = std::future::poll_fn(|cx| write_held(&stream, cx)) => {
                        tracing::debug!(%peer, %error, "writing to the connection failed");
                        break;
                    }
                    _ = shutting_down.wait_for(|down| *down), if !closing => {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    _ = activity.deadline_added.notified() => {
                        overdue.as_mut().reset(activity.send_deadline().unwrap_or_else(far));
                    }
                    _ = &mut overdue => match activity.send_deadline() {
                        Some(deadline) if deadline <= Instant::now() => {
                            tracing::debug!(%peer, "a response was not taken within its request deadline; closing");
                            break;
                        }
                        Some(deadline) => overdue.as_mut().reset(deadline),
                        None => overdue.as_mut().reset(far()),
                    },
                    _ = &mut idle, if !closing || forcing => {
                        if forcing {
                            // Still not closed: a peer that does not read what was sent.
                            tracing::debug!(%peer, "an idle connection did not close; dropping it");
                            break;
                        }
                        match activity.idle_until(IDLE_TIMEOUT) {
                            Some(deadline) if deadline <= Instant::now() => {
                                tracing::debug!(%peer, "closing an idle connection");
                                closing = true;
                                forcing = true;
                                connection.as_mut().graceful_shutdown();
                                idle.as_mut().reset(Instant::now() + CLOSE_GRACE);
                            }
                            Some(deadline) => idle.as_mut().reset(deadline),
                            None => idle.as_mut().reset(Instant::now() + IDLE_TIMEOUT),
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    server.begin_shutdown();
    if tokio::time::timeout(drain, open.drained()).await.is_err() {
        tracing::warn!("some connections did not finish within the drain period");
    }
}

/// How long an idle connection told to close may take to finish (a response still in its
/// buffers) before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// Time past a request's deadline for its response to be sent.
const SEND_GRACE: Duration = Duration::from_secs(5);

/// Counts open connections, so shutdown can wait for them to finish.
#[derive(Default)]
struct OpenConnections {
    count: AtomicUsize,
    changed: tokio::sync::Notify,
}

struct Counted(Arc<OpenConnections>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

impl OpenConnections {
    fn enter(self: &Arc<Self>) -> Counted {
        self.count.fetch_add(1, Ordering::SeqCst);
        Counted(self.clone())
    }

    async fn drained(&self) {
        loop {
            let changed = self.changed.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            changed.await;
        }
    }
}

/// Which requests of one connection are in progress, since when none is, and by when the
/// responses still being sent must be done.
struct Activity {
    state: std::sync::Mutex<ActivityState>,
    /// Signalled when a send deadline is registered.
    deadline_added: tokio::sync::Notify,
}

struct ActivityState {
    active: usize,
    idle_since: Instant,
    next_id: u64,
    /// Responses of requests that are not long-running, by id: their request deadline.
    deadlines: Vec<(u64, Instant)>,
}

/// Marks a request in progress until dropped (with its response body).
struct Busy {
    activity: Arc<Activity>,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.activity.lock();
        state.active = state.active.saturating_sub(1);
        if state.active == 0 {
            state.idle_since = Instant::now();
        }
        let id = self.id;
        state.deadlines.retain(|(other, _)| *other != id);
    }
}

impl Busy {
    /// The response must be sent by `deadline` (the request's), or the connection is closed:
    /// a client that stops reading a response cannot hold its in-flight slot, or the
    /// connection, past the request timeout (upstream's timeout handler aborts it too).
    fn send_by(&self, deadline: Instant) {
        self.activity.lock().deadlines.push((self.id, deadline));
        self.activity.deadline_added.notify_one();
    }
}

impl Activity {
    fn new() -> Self {
        Activity {
            state: std::sync::Mutex::new(ActivityState {
                active: 0,
                idle_since: Instant::now(),
                next_id: 0,
                deadlines: Vec::new(),
            }),
            deadline_added: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn begin(self: &Arc<Self>) -> Busy {
        let mut state = self.lock();
        state.active += 1;
        state.next_id += 1;
        Busy {
            activity: self.clone(),
            id: state.next_id,
        }
    }

    /// When the connection will have been idle for `limit`, or `None` while a request is
    /// in progress.
    fn idle_until(&self, limit: Duration) -> Option<Instant> {
        let state = self.lock();
        (state.active == 0).then(|| state.idle_since + limit)
    }

    /// The earliest deadline of a response still being sent, with [`SEND_GRACE`] to send the
    /// answer made at the deadline itself (a 504).
    fn send_deadline(&self) -> Option<Instant> {
        self.lock()
            .deadlines
            .iter()
            .map(|(_, d)| *d + SEND_GRACE)
            .min()
    }
}
