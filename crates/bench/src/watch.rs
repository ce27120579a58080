//! The `watch` scenario: W watchers on one Service, M updates, and the delay from each write's
//! response to each watcher receiving the event.
//!
//! The watchers are the load tool's own cost on a machine it shares with the server, and that
//! cost is in every figure the scenario prints: it must be small and the same whatever server is
//! measured. So each watcher is one task owning one connection (TLS by rustls, credentials by
//! kube's own layers), which sends one GET and reads the chunked response itself: no pool,
//! connection task, body channel or middleware between the socket and the reader, which reads
//! only the event type and the one label the scenario sets. With `--http2`, the watchers are
//! HTTP/2 streams multiplexed over `--connections` connections (one, as a client-go process's
//! informers share one), each read frame by frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::Empty;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::client::ConfigExt;
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

use crate::process::Ticks;
use crate::{Bench, histogram, latency_json, service};

/// A connection, TLS or plain.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

type Request = http::Request<Empty<Bytes>>;

/// Opens connections to the server of a kubeconfig, with its TLS settings and credentials.
pub struct Dialer {
    address: String,
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    authorize: tower::util::BoxCloneSyncService<Request, http::Response<Request>, tower::BoxError>,
    authority: String,
}

impl Dialer {
    pub fn new(config: &kube::Config) -> anyhow::Result<Self> {
        Self::with_protocol(config, b"http/1.1")
    }

    /// A dialer whose TLS connections negotiate `alpn` (`h2` or `http/1.1`).
    pub fn with_protocol(config: &kube::Config, alpn: &[u8]) -> anyhow::Result<Self> {
        let url = &config.cluster_url;
        let https = url.scheme_str() == Some("https");
        let host = url.host().context("the server URL has no host")?;
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        let tls = if https {
            let name = config.tls_server_name.as_deref().unwrap_or(bare_host);
            let server_name = rustls::pki_types::ServerName::try_from(name.to_string())
                .with_context(|| format!("TLS server name {name}"))?;
            let mut tls = config.rustls_client_config()?;
            tls.alpn_protocols = vec![alpn.to_vec()];
            Some((tokio_rustls::TlsConnector::from(Arc::new(tls)), server_name))
        } else {
            None
        };
        // The kubeconfig's credentials, applied by kube's own layers to each request: the
        // innermost service hands the request it is given back (in a response, as the layers
        // expect of a service).
        let authorize = ServiceBuilder::new()
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .service_fn(|request: Request| async move {
                Ok::<_, tower::BoxError>(http::Response::new(request))
            });
        Ok(Self {
            address: format!("{host}:{port}"),
            tls,
            authorize: tower::util::BoxCloneSyncService::new(authorize),
            authority: url.authority().map(ToString::to_string).unwrap_or_default(),
        })
    }

    /// A connection to the server (TLS when the server URL is https).
    pub async fn connect(&self) -> anyhow::Result<Box<dyn Io>> {
        let tcp = tokio::net::TcpStream::connect(&self.address)
            .await
            .with_context(|| format!("connecting to {}", self.address))?;
        tcp.set_nodelay(true)?;
        Ok(match &self.tls {
            Some((connector, name)) => Box::new(connector.connect(name.clone(), tcp).await?),
            None => Box::new(tcp),
        })
    }

    /// The headers that carry the kubeconfig's credentials (and `Host`).
    pub async fn credentials(&self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let request = self.request("/").await?;
        Ok(request
            .headers()
            .iter()
            .filter(|(name, _)| *name != http::header::ACCEPT && *name != http::header::USER_AGENT)
            .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
            .collect())
    }

    /// A GET of `path` with the kubeconfig's credentials.
    async fn request(&self, path: &str) -> anyhow::Result<Request> {
        crate::REQUESTS.fetch_add(1, Ordering::Relaxed);
        let request = http::Request::get(path)
            .header(http::header::HOST, &self.authority)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "capstan-bench")
            .body(Empty::new())?;
        self.authorize
            .clone()
            .oneshot(request)
            .await
            .map(http::Response::into_body)
            .map_err(|error| anyhow::anyhow!("authorizing a request: {error}"))
    }

    /// Watches `path`; `ready` once the response headers arrived; returns the rounds seen, each
    /// with the time (µs since `origin`) its bytes arrived, until round `rounds - 1`.
    async fn watch(
        &self,
        path: &str,
        rounds: usize,
        origin: Instant,
        ready: &AtomicUsize,
    ) -> anyhow::Result<Vec<(usize, u64)>> {
        let request = head(&self.request(path).await?);
        let tcp = tokio::net::TcpStream::connect(&self.address)
            .await
            .with_context(|| format!("connecting to {}", self.address))?;
        tcp.set_nodelay(true)?;
        match &self.tls {
            Some((connector, name)) => {
                let tls = connector.connect(name.clone(), tcp).await?;
                read_rounds(tls, &request, rounds, origin, ready).await
            }
            None => read_rounds(tcp, &request, rounds, origin, ready).await,
        }
    }
}

/// One HTTP/2 connection to the server; watches are streams on it.
pub struct Http2Connection {
    sender: hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    scheme: &'static str,
}

impl Dialer {
    /// Opens an HTTP/2 connection (TLS with ALPN `h2`, or prior knowledge on plain TCP).
    pub async fn connect_http2(&self) -> anyhow::Result<Http2Connection> {
        let io = self.connect().await?;
        // Go's HTTP/2 transport's flow-control windows (client-go's): 1 GiB for the
        // connection, 4 MiB per stream.
        let (sender, connection) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .initial_connection_window_size(1 << 30)
                .initial_stream_window_size(4 << 20)
                .handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .context("HTTP/2 handshake")?;
        tokio::spawn(connection);
        Ok(Http2Connection {
            sender,
            scheme: if self.tls.is_some() { "https" } else { "http" },
        })
    }

    /// [`Dialer::watch`] as a stream of `connection`.
    async fn watch_http2(
        &self,
        connection: &Http2Connection,
        path: &str,
        rounds: usize,
        origin: Instant,
        ready: &AtomicUsize,
    ) -> anyhow::Result<Vec<(usize, u64)>> {
        use http_body_util::BodyExt;
        let mut request = self.request(path).await?;
        request.headers_mut().remove(http::header::HOST);
        *request.uri_mut() = format!("{}://{}{path}", connection.scheme, self.authority)
            .parse()
            .context("the watch URI")?;
        let mut sender = connection.sender.clone();
        sender.ready().await.context("an HTTP/2 stream")?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        anyhow::ensure!(status.is_success(), "watch: HTTP {status}");
        ready.fetch_add(1, Ordering::Relaxed);
        let mut body = response.into_body();
        let mut reader = Rounds::new(rounds);
        while let Some(frame) = body.frame().await {
            // Delivery time is when the bytes arrive, before this client decodes them.
            let arrived = origin.elapsed().as_micros() as u64;
            if let Ok(data) = frame?.into_data()
                && reader.feed(&data, arrived)?
            {
                return Ok(reader.seen);
            }
        }
        Ok(reader.seen)
    }
}

/// Reads watch lines from body bytes as they arrive: the rounds seen and when.
struct Rounds {
    rounds: usize,
    line: Vec<u8>,
    seen: Vec<(usize, u64)>,
}

impl Rounds {
    fn new(rounds: usize) -> Self {
        Rounds {
            rounds,
            line: Vec::with_capacity(4096),
            seen: Vec::with_capacity(rounds),
        }
    }

    /// Takes body bytes that arrived at `arrived` (µs); `true` once the last round was seen.
    fn feed(&mut self, mut data: &[u8], arrived: u64) -> anyhow::Result<bool> {
        while let Some(end) = memchr::memchr(b'\n', data) {
            let complete = if self.line.is_empty() {
                &data[..end]
            } else {
                self.line.extend_from_slice(&data[..end]);
                &self.line[..]
            };
            anyhow::ensure!(
                !complete.starts_with(b"{\"type\":\"ERROR\""),
                "the watch ended with an error: {}",
                String::from_utf8_lossy(complete)
            );
            // A round counts once per watcher, however many events carry its label.
            if let Some(round) = round_of(complete)?
                && self.seen.last().is_none_or(|(last, _)| round > *last)
            {
                self.seen.push((round, arrived));
                if round + 1 >= self.rounds {
                    return Ok(true);
                }
            }
            self.line.clear();
            data = &data[end + 1..];
        }
        self.line.extend_from_slice(data);
        Ok(false)
    }
}

/// The HTTP/1.1 request head of a GET.
fn head(request: &Request) -> Vec<u8> {
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!("GET {target} HTTP/1.1\r\n").into_bytes();
    for (name, value) in request.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// Sends `request` on `io` and reads watch lines until the last round.
async fn read_rounds<IO>(
    mut io: IO,
    request: &[u8],
    rounds: usize,
    origin: Instant,
    ready: &AtomicUsize,
) -> anyhow::Result<Vec<(usize, u64)>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    io.write_all(request).await?;
    io.flush().await?;
    let mut input = BytesMut::with_capacity(16 * 1024);
    let body_start = loop {
        if io.read_buf(&mut input).await? == 0 {
            anyhow::bail!("the server closed the connection before the response");
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(length) = response.parse(&input)? {
            let code = response.code.unwrap_or_default();
            anyhow::ensure!(
                (200..300).contains(&code),
                "watch: HTTP {code}: {}",
                String::from_utf8_lossy(&input[length..])
            );
            let chunked = response.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("transfer-encoding")
                    && h.value.eq_ignore_ascii_case(b"chunked")
            });
            anyhow::ensure!(chunked, "watch: the response is not chunked");
            break length;
        }
    };
    ready.fetch_add(1, Ordering::Relaxed);
    input.advance(body_start);
    let mut chunks = Chunked::default();
    let mut reader = Rounds::new(rounds);
    let mut arrived = origin.elapsed().as_micros() as u64;
    loop {
        while let Some(data) = chunks.next(&mut input)? {
            if reader.feed(&data, arrived)? {
                return Ok(reader.seen);
            }
        }
        if chunks.done {
            return Ok(reader.seen);
        }
        input.reserve(8 * 1024);
        if io.read_buf(&mut input).await? == 0 {
            anyhow::bail!("the server closed the connection in the middle of the watch");
        }
        // Delivery time is when the bytes arrive, before this client decodes them.
        arrived = origin.elapsed().as_micros() as u64;
    }
}

/// A decoder of HTTP/1.1 chunked transfer coding.
#[derive(Default)]
pub(crate) struct Chunked {
    /// Bytes left in the current chunk's data.
    remaining: usize,
    /// The CRLF after the current chunk's data is still to be read.
    trailer: bool,
    done: bool,
}

impl Chunked {
    /// Whether the last chunk has been read.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// The next piece of body data in `input`, consuming it; `None` when more input is needed
    /// or the body ended (`done`).
    pub(crate) fn next(&mut self, input: &mut BytesMut) -> anyhow::Result<Option<Bytes>> {
        loop {
            if self.done {
                return Ok(None);
            }
            if self.remaining > 0 {
                if input.is_empty() {
                    return Ok(None);
                }
                let take = self.remaining.min(input.len());
                self.remaining -= take;
                return Ok(Some(input.split_to(take).freeze()));
            }
            if self.trailer {
                if input.len() < 2 {
                    return Ok(None);
                }
                anyhow::ensure!(
                    &input[..2] == b"\r\n",
                    "chunked body: no CRLF after a chunk"
                );
                input.advance(2);
                self.trailer = false;
            }
            let Some(end) = memchr::memchr(b'\n', input) else {
                anyhow::ensure!(
                    input.len() < 1024,
                    "chunked body: a chunk size line over 1 KiB"
                );
                return Ok(None);
            };
            let size_line = std::str::from_utf8(&input[..end])?.trim_end_matches('\r');
            let size = size_line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16)
                .with_context(|| format!("chunked body: chunk size {size:?}"))?;
            input.advance(end + 1);
            if size == 0 {
                self.done = true;
            } else {
                self.remaining = size;
                self.trailer = true;
            }
        }
    }
}

/// The round a MODIFIED watch line carries in its `capstan-bench/round` label. A watch line of
/// kube-apiserver and of Capstan alike starts `{"type":"…",` and writes a label `"key":"value"`,
/// so the type and the label are found without decoding the object; a line of another shape is
/// decoded in full.
fn round_of(line: &[u8]) -> anyhow::Result<Option<usize>> {
    const TYPE: &[u8] = b"{\"type\":\"";
    const LABEL: &[u8] = b"\"capstan-bench/round\":\"";
    if let Some(rest) = line.strip_prefix(TYPE) {
        if !rest.starts_with(b"MODIFIED\"") {
            return Ok(None);
        }
        let Some(at) = memchr::memmem::find(rest, LABEL) else {
            return Ok(None);
        };
        let value = &rest[at + LABEL.len()..];
        let end = memchr::memchr(b'"', value).unwrap_or(value.len());
        return Ok(std::str::from_utf8(&value[..end])
            .ok()
            .and_then(|v| v.parse().ok()));
    }
    let event: RoundEvent<'_> = serde_json::from_slice(line).context("a watch line")?;
    if event.kind != "MODIFIED" {
        return Ok(None);
    }
    Ok(event
        .object
        .metadata
        .labels
        .round
        .and_then(|r| r.parse::<usize>().ok()))
}

impl Bench {
    pub async fn watch(&self) -> anyhow::Result<Value> {
        let args = &self.args;
        let api = self.services();
        api.create(&PostParams::default(), &service("watched"))
            .await?;
        let rv = api
            .list(&ListParams::default().limit(1))
            .await?
            .metadata
            .resource_version
            .unwrap_or_default();
        let dialer = Arc::new(if args.http2 {
            Dialer::with_protocol(&self.config, b"h2")?
        } else {
            Dialer::new(&self.config)?
        });
        let mut connections = Vec::new();
        if args.http2 {
            for _ in 0..args.connections.max(1) {
                connections.push(Arc::new(dialer.connect_http2().await?));
            }
        }
        let path = format!(
            "/api/v1/namespaces/{}/services?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3Dwatched&timeoutSeconds=290",
            self.namespace
        );
        let origin = Instant::now();
        let ready = Arc::new(AtomicUsize::new(0));
        let mut watchers = Vec::new();
        for i in 0..args.watchers {
            let (dialer, path, ready) = (dialer.clone(), path.clone(), ready.clone());
            let updates = args.updates;
            let connection =
                (!connections.is_empty()).then(|| connections[i % connections.len()].clone());
            watchers.push(tokio::spawn(async move {
                match connection {
                    Some(connection) => {
                        dialer
                            .watch_http2(&connection, &path, updates, origin, &ready)
                            .await
                    }
                    None => dialer.watch(&path, updates, origin, &ready).await,
                }
            }));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while ready.load(Ordering::Relaxed) < args.watchers && Instant::now() < deadline {
            eprint!(
                "\rwatch: {}/{} watchers open        ",
                ready.load(Ordering::Relaxed),
                args.watchers
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let answered: Arc<Vec<AtomicU64>> =
            Arc::new((0..args.updates).map(|_| AtomicU64::new(0)).collect());
        // The server's CPU from the first update until every watcher has its last event:
        // the writes and their deliveries, without opening the watches (TLS handshakes).
        let cpu_before =
            (!args.server_pids.is_empty()).then(|| crate::process::split_ticks(&args.server_pids));
        let started = Instant::now();
        for round in 0..args.updates {
            let patch = json!({"metadata": {"labels": {"capstan-bench/round": round.to_string()}}});
            api.patch("watched", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            answered[round].store(origin.elapsed().as_micros() as u64, Ordering::Relaxed);
            eprint!("\rwatch: update {}/{}        ", round + 1, args.updates);
        }
        let writes = started.elapsed();
        let mut delivery = histogram();
        let mut received = 0usize;
        let mut failures = Vec::new();
        for watcher in watchers {
            match tokio::time::timeout(Duration::from_secs(30), watcher).await {
                Ok(Ok(Ok(seen))) => {
                    for (round, at) in seen {
                        received += 1;
                        let sent = answered.get(round).map_or(0, |a| a.load(Ordering::Relaxed));
                        let _ = delivery.record(at.saturating_sub(sent).max(1));
                    }
                }
                Ok(Ok(Err(error))) => failures.push(format!("{error:#}")),
                Ok(Err(error)) => failures.push(error.to_string()),
                Err(_) => failures.push("no last event within 30 s".into()),
            }
        }
        let delivering =
            cpu_before.map(|before| crate::process::split_ticks(&args.server_pids).since(before));
        eprint!("\r{:80}\r", "");
        let expected = args.watchers * args.updates;
        let missed = expected.saturating_sub(received);
        let over = if args.http2 {
            format!(" (HTTP/2, {} connections)", connections.len())
        } else {
            String::new()
        };
        println!(
            "watch{over}                  {} watchers x {} updates: delivered {received}/{expected}, missed {missed}   p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
            args.watchers,
            args.updates,
            delivery.value_at_quantile(0.5) as f64 / 1000.0,
            delivery.value_at_quantile(0.99) as f64 / 1000.0,
            delivery.max() as f64 / 1000.0,
        );
        if let Some(first) = failures.first() {
            println!("  {} watchers failed; the first: {first}", failures.len());
        }
        let seconds = delivering.map(|used| Ticks::seconds(used.total()));
        let system_seconds = delivering.map(|used| Ticks::seconds(used.system));
        if let Some(used) = delivering {
            // Per delivered event: all of it, then the part in user space and in the kernel.
            let per_event = |ticks: u64| Ticks::seconds(ticks) * 1e6 / received.max(1) as f64;
            println!(
                "server CPU from the first update to the last event: {:.2} s ({:.2} µs per delivered event, the updates included; user {:.2} µs, system {:.2} µs)",
                Ticks::seconds(used.total()),
                per_event(used.total()),
                per_event(used.user),
                per_event(used.system),
            );
        }
        Ok(json!({
            "watchers": args.watchers,
            "updates": args.updates,
            "expected": expected,
            "received": received,
            "missed": missed,
            "failed_watchers": failures.len(),
            "http2_connections": connections.len(),
            "update_seconds": writes.as_secs_f64(),
            "server_cpu_seconds_delivering": seconds,
            "server_system_seconds_delivering": system_seconds,
            "delivery_latency_ms": latency_json(&delivery),
        }))
    }
}

/// A watch line: its event type and the parts of its object that `O` reads (borrowed from
/// the line: the bench shares the server's CPUs, so it builds as little as it can).
#[derive(serde::Deserialize)]
pub(crate) struct Event<'a, O> {
    #[serde(rename = "type", borrow)]
    pub(crate) kind: std::borrow::Cow<'a, str>,
    pub(crate) object: O,
}

/// The parts of a watch line the watch scenario reads.
type RoundEvent<'a> = Event<'a, RoundObject<'a>>;

#[derive(serde::Deserialize)]
struct RoundObject<'a> {
    #[serde(borrow)]
    metadata: RoundMeta<'a>,
}

#[derive(serde::Deserialize)]
struct RoundMeta<'a> {
    #[serde(default, borrow)]
    labels: RoundLabels<'a>,
}

/// The one label a watch round is read from; every other label is skipped unread.
#[derive(serde::Deserialize, Default)]
struct RoundLabels<'a> {
    #[serde(rename = "capstan-bench/round", borrow)]
    round: Option<std::borrow::Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::{Chunked, round_of};

    #[test]
    fn a_round_is_read_from_modified_lines_only() {
        let managed = br#"{"type":"MODIFIED","object":{"metadata":{"managedFields":[{"fieldsV1":{"f:metadata":{"f:labels":{"f:capstan-bench/round":{}}}}}],"labels":{"capstan-bench/round":"12"}}}}"#;
        assert_eq!(round_of(managed).ok().flatten(), Some(12));
        let spaced = br#"{ "type": "MODIFIED", "object": {"metadata": {"labels": {"capstan-bench/round": "3"}}}}"#;
        assert_eq!(round_of(spaced).ok().flatten(), Some(3));
        let modified = br#"{"type":"MODIFIED","object":{"kind":"Service","metadata":{"name":"watched","labels":{"app":"x","capstan-bench/round":"7"}},"spec":{}}}"#;
        assert_eq!(round_of(modified).ok().flatten(), Some(7));
        let added =
            br#"{"type":"ADDED","object":{"metadata":{"labels":{"capstan-bench/round":"7"}}}}"#;
        assert_eq!(round_of(added).ok().flatten(), None);
        let unlabelled = br#"{"type":"MODIFIED","object":{"metadata":{"name":"watched"}}}"#;
        assert_eq!(round_of(unlabelled).ok().flatten(), None);
        assert!(round_of(b"{not json").is_err());
    }

    #[test]
    fn chunked_bodies_are_decoded_across_reads() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        for split in 0..body.len() {
            let mut chunks = Chunked::default();
            let mut input = BytesMut::from(&body[..split]);
            let mut out = Vec::new();
            while let Some(data) = chunks.next(&mut input).unwrap_or_default() {
                out.extend_from_slice(&data);
            }
            input.extend_from_slice(&body[split..]);
            while let Some(data) = chunks.next(&mut input).unwrap_or_default() {
                out.extend_from_slice(&data);
            }
            assert_eq!(out, b"hello, world", "split at {split}");
            assert!(chunks.done, "split at {split}");
        }
        let mut bad = BytesMut::from(&b"zz\r\n"[..]);
        assert!(Chunked::default().next(&mut bad).is_err());
    }
}
