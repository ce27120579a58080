//! The etcd engine: the storage contract on an etcd v3 cluster, so several Capstan replicas can
//! share one cluster state. Every key lives under a configurable prefix (default `/registry/`),
//! so one etcd can host several Capstan clusters. Revisions are etcd's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client as etcd;
use tokio::sync::mpsc;

use crate::watch::CloseReason;
use crate::{
    Compare, Event, EventKind, GetResponse, KeyValue, Op, RangeRequest, RangeResponse, Result,
    Revision, Storage, StorageError, Txn, TxnOutcome, WatchStream, prefix_end,
};

/// The largest gRPC response accepted (kube-apiserver uses `math.MaxInt32` too).
const MAX_MESSAGE: usize = i32::MAX as usize;

/// Settings of the etcd engine.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// etcd client URLs, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Every key is stored under this prefix.
    pub prefix: String,
    /// How many undelivered events one watcher may hold.
    pub watch_buffer: usize,
    /// How long a watcher whose buffer is full gets to make room before it is closed as
    /// lagging. (etcd sends history in bursts, so a reading watcher briefly fills up; one that
    /// does not read is closed, as kube-apiserver's watch cache closes unresponsive watchers.)
    pub lag_grace: Duration,
    /// Timeout for establishing a connection.
    pub connect_timeout: Duration,
    /// Deadline of each request (kube-apiserver bounds storage calls by `--request-timeout`).
    pub request_timeout: Duration,
    /// TLS: the CA that signed etcd's serving certificates (`--etcd-cafile`), and this
    /// client's certificate and key (`--etcd-certfile`, `--etcd-keyfile`), PEM files.
    pub tls: Option<EtcdTls>,
}

/// The files of an etcd TLS connection.
#[derive(Debug, Clone, Default)]
pub struct EtcdTls {
    /// The CA bundle etcd's certificates are checked against.
    pub ca_file: Option<std::path::PathBuf>,
    /// The client certificate, for etcd's `--client-cert-auth`.
    pub cert_file: Option<std::path::PathBuf>,
    /// The client certificate's key.
    pub key_file: Option<std::path::PathBuf>,
}

impl EtcdTls {
    fn options(&self) -> Result<etcd::TlsOptions> {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| StorageError::Etcd(format!("reading {}: {e}", path.display())))
        };
        let mut tls = etcd::TlsOptions::new();
        if let Some(ca) = &self.ca_file {
            tls = tls.ca_certificate(etcd::Certificate::from_pem(read(ca)?));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(etcd::Identity::from_pem(read(cert)?, read(key)?));
            }
            (None, None) => {}
            _ => {
                return Err(StorageError::Etcd(
                    "an etcd client certificate needs both its certificate and key file".into(),
                ));
            }
        }
        Ok(tls)
    }
}

impl EtcdOptions {
    /// Default settings for a list of endpoints.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: "/registry/".into(),
            watch_buffer: 10_000,
            lag_grace: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// The etcd storage engine. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    client: etcd::Client,
    prefix: Arc<str>,
    watch_buffer: usize,
    lag_grace: Duration,
    /// The highest compaction point this process has seen (etcd reports it only on watches).
    known_compacted: Arc<AtomicI64>,
    /// The last health check and when it ran: probes (public, never refused) reuse it for a
    /// second instead of reading etcd each time.
    last_health: Arc<std::sync::Mutex<Option<HealthCheck>>>,
}

/// A health check's result and when it was made.
type HealthCheck = (std::time::Instant, Result<()>);

/// How an etcd error maps onto the contract.
enum Failure {
    Compacted,
    Future,
    Other(String),
}

fn classify(error: &etcd::Error) -> Failure {
    let text = error.to_string();
    if text.contains("required revision has been compacted") {
        Failure::Compacted
    } else if text.contains("required revision is a future revision") {
        Failure::Future
    } else {
        Failure::Other(text)
    }
}

/// How many times a request that may be sent again is retried, and the first pause.
const RETRIES: usize = 3;
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// Whether a failed request may be sent again: one that never reached a member (its
/// connection could not be made), or any read a member could not serve. The client picks a
/// member per request, so a retry goes to another one when a member is down.
fn may_retry(error: &etcd::Error, idempotent: bool) -> bool {
    let text = error.to_string();
    text.contains("tcp connect error")
        || (idempotent && text.contains("The service is currently unavailable"))
}

/// Runs `call` until it succeeds, fails in a way that must not be retried, or has been
/// retried [`RETRIES`] times (pausing 50 ms, then twice as long each time).
async fn retried<T, F, Fut>(idempotent: bool, mut call: F) -> std::result::Result<T, etcd::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd::Error>>,
{
    let mut pause = FIRST_PAUSE;
    for _ in 0..RETRIES {
        match call().await {
            Err(error) if may_retry(&error, idempotent) => {
                tracing::debug!(%error, "etcd request failed; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            done => return done,
        }
    }
    call().await
}

fn other(error: etcd::Error) -> StorageError {
    StorageError::Etcd(error.to_string())
}

impl EtcdStore {
    /// Connects to etcd. Fails when no endpoint answers within the connect timeout.
    pub async fn connect(options: EtcdOptions) -> Result<Self> {
        let mut connect = etcd::ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A watch on a member cut off from the others fails instead of going quiet (as
            // kube-apiserver watches with clientv3.WithRequireLeader).
            .with_require_leader(true);
        if let Some(tls) = &options.tls {
            connect = connect.with_tls(tls.options()?);
        }
        let client = etcd::Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(other)?;
        let store = Self {
            client,
            prefix: Arc::from(options.prefix.as_str()),
            watch_buffer: options.watch_buffer,
            lag_grace: options.lag_grace,
            known_compacted: Arc::new(AtomicI64::new(0)),
            last_health: Arc::default(),
        };
        // Fail now, not on the first request, when etcd is not there.
        store.current_revision().await?;
        Ok(store)
    }

    /// A KV client that accepts responses as large as kube-apiserver does (a whole large list).
    fn kv(&self) -> etcd::KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE)
    }

    fn full_key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(self.prefix.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    fn to_kv(&self, kv: &etcd::KeyValue) -> Result<KeyValue> {
        let key = kv
            .key()
            .strip_prefix(self.prefix.as_bytes())
            .ok_or_else(|| StorageError::Corrupt("etcd key outside the prefix".into()))?;
        let key = std::str::from_utf8(key)
            .map_err(|_| StorageError::Corrupt("etcd key is not UTF-8".into()))?;
        Ok(KeyValue {
            key: Arc::from(key),
            value: Bytes::copy_from_slice(kv.value()),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
        })
    }

    fn compacted_error(&self, requested: Revision) -> StorageError {
        let known = self.known_compacted.load(Ordering::Relaxed);
        StorageError::Compacted {
            requested,
            compacted: known.max(requested + 1),
        }
    }

    async fn read_failure(&self, error: etcd::Error, requested: Revision) -> StorageError {
        match classify(&error) {
            Failure::Compacted => self.compacted_error(requested),
            Failure::Future => match self.current_revision().await {
                Ok(current) => StorageError::FutureRevision { requested, current },
                Err(e) => e,
            },
            Failure::Other(text) => StorageError::Etcd(text),
        }
    }

    fn revision_of(header: Option<&etcd::ResponseHeader>) -> Result<Revision> {
        header
            .map(|h| h.revision())
            .ok_or_else(|| StorageError::Etcd("response without a header".into()))
    }
}

impl EtcdStore {
    /// One etcd read (at revision `at`, else the latest), with the revision it answers for.
    async fn read(
        &self,
        key: Vec<u8>,
        mut options: etcd::GetOptions,
        at: Option<Revision>,
    ) -> Result<(etcd::GetResponse, Revision)> {
        if let Some(r) = at {
            options = options.with_revision(r);
        }
        let get = || {
            let (mut kv, key, options) = (self.kv(), key.clone(), options.clone());
            async move { kv.get(key, Some(options)).await }
        };
        let response = match retried(true, get).await {
            Ok(response) => response,
            Err(e) => return Err(self.read_failure(e, at.unwrap_or(0)).await),
        };
        let current = Self::revision_of(response.header())?;
        Ok((response, at.unwrap_or(current)))
    }
}

#[async_trait]
impl Storage for EtcdStore {
    async fn get(&self, key: &str, at_revision: Option<Revision>) -> Result<GetResponse> {
        let at = at_revision.filter(|r| *r > 0);
        let key = self.full_key(key);
        let (response, revision) = self.read(key, etcd::GetOptions::new(), at).await?;
        let found = response
            .kvs()
            .first()
            .map(|kv| self.to_kv(kv))
            .transpose()?;
        Ok(GetResponse {
            kv: found,
            revision,
        })
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse> {
        let at = request.at_revision.filter(|r| *r > 0);
        let full_prefix = self.full_key(&request.prefix);
        let end = prefix_end(&full_prefix).unwrap_or_else(|| vec![0]);
        let start = match &request.start_after {
            Some(after) if after.as_bytes() >= request.prefix.as_bytes() => {
                let mut start = self.full_key(after);
                start.push(0);
                start
            }
            _ => full_prefix,
        };
        if start >= end {
            let revision = match at {
                Some(r) => r,
                None => self.current_revision().await?,
            };
            return Ok(RangeResponse {
                kvs: Vec::new(),
                more: false,
                remaining: 0,
                revision,
            });
        }
        let mut options = etcd::GetOptions::new().with_range(end);
        if request.limit > 0 {
            options = options.with_limit(i64::try_from(request.limit).unwrap_or(i64::MAX));
        }
        let (response, revision) = self.read(start, options, at).await?;
        let kvs = response
            .kvs()
            .iter()
            .map(|kv| self.to_kv(kv))
            .collect::<Result<Vec<_>>>()?;
        let count = u64::try_from(response.count()).unwrap_or(0);
        let remaining = count.saturating_sub(kvs.len() as u64);
        Ok(RangeResponse {
            kvs,
            more: remaining > 0,
            remaining,
            revision,
        })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        txn.validate()?;
        let compares: Vec<etcd::Compare> = txn
            .compares
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => {
                    etcd::Compare::mod_revision(self.full_key(k), etcd::CompareOp::Equal, 0)
                }
                Compare::ModRevision(k, r) => {
                    etcd::Compare::mod_revision(self.full_key(k), etcd::CompareOp::Equal, *r)
                }
            })
            .collect();
        let ops: Vec<etcd::TxnOp> = txn
            .ops
            .iter()
            .map(|op| match op {
                Op::Put(k, v) => etcd::TxnOp::put(
                    self.full_key(k),
                    v.to_vec(),
                    Some(etcd::PutOptions::new().with_prev_key()),
                ),
                Op::Delete(k) => etcd::TxnOp::delete(
                    self.full_key(k),
                    Some(etcd::DeleteOptions::new().with_prev_key()),
                ),
            })
            .collect();
        let reads: Vec<etcd::TxnOp> = txn
            .compares
            .iter()
            .map(|c| etcd::TxnOp::get(self.full_key(c.key()), None))
            .collect();
        let request = etcd::Txn::new().when(compares).and_then(ops).or_else(reads);
        let send = || {
            let (mut kv, request) = (self.kv(), request.clone());
            async move { kv.txn(request).await }
        };
        // A transaction is sent again only when it never reached a member.
        let response = retried(false, send).await.map_err(other)?;
        let revision = Self::revision_of(response.header())?;
        let responses = response.op_responses();
        if response.succeeded() {
            let previous = responses
                .iter()
                .map(|r| match r {
                    etcd::TxnOpResponse::Put(p) => {
                        p.prev_key().map(|kv| self.to_kv(kv)).transpose()
                    }
                    etcd::TxnOpResponse::Delete(d) => {
                        d.prev_kvs().first().map(|kv| self.to_kv(kv)).transpose()
                    }
                    _ => Err(StorageError::Etcd("unexpected txn response".into())),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(TxnOutcome::Committed { revision, previous })
        } else {
            let current = responses
                .iter()
                .map(|r| match r {
                    etcd::TxnOpResponse::Get(g) => {
                        g.kvs().first().map(|kv| self.to_kv(kv)).transpose()
                    }
                    _ => Err(StorageError::Etcd("unexpected txn response".into())),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(TxnOutcome::Failed { revision, current })
        }
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        let after = after_revision.max(0);
        // etcd reports a compacted start only after the watch was created; check first so the
        // contract's synchronous `Compacted` holds (a compaction racing this still surfaces as
        // the stream's error).
        let probe = etcd::GetOptions::new()
            .with_count_only()
            .with_revision(after.max(1));
        let mut kv = self.kv();
        if let Err(e) = kv.get(self.full_key(prefix), Some(probe)).await {
            match classify(&e) {
                Failure::Compacted => return Err(self.compacted_error(after)),
                Failure::Future => {}
                Failure::Other(text) => return Err(StorageError::Etcd(text)),
            }
        }

        let full_prefix = self.full_key(prefix);
        let end = prefix_end(&full_prefix).unwrap_or_else(|| vec![0]);
        let options = etcd::WatchOptions::new()
            .with_range(end)
            .with_start_revision(after + 1)
            .with_prev_key();
        let mut watch_client = self
            .client
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE);
        let stream = watch_client
            .watch(full_prefix, Some(options))
            .await
            .map_err(other)?;
        let (tx, reason, watch_stream) = WatchStream::channel(self.watch_buffer);
        tokio::spawn(forward(self.clone(), stream, tx, reason, after));
        Ok(watch_stream)
    }

    async fn current_revision(&self) -> Result<Revision> {
        let count = || {
            let (mut kv, prefix) = (self.kv(), self.prefix.as_bytes().to_vec());
            async move {
                let options = etcd::GetOptions::new().with_count_only();
                kv.get(prefix, Some(options)).await
            }
        };
        let response = retried(true, count).await.map_err(other)?;
        Self::revision_of(response.header())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut kv = self.kv();
        match kv.compact(revision, None).await {
            Ok(_) => {
                self.known_compacted.fetch_max(revision, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => match classify(&e) {
                Failure::Compacted => Ok(()),
                Failure::Future => Err(StorageError::FutureRevision {
                    requested: revision,
                    current: self.current_revision().await?,
                }),
                Failure::Other(text) => Err(StorageError::Etcd(text)),
            },
        }
    }

    /// kube-apiserver's etcd check: a read of `<prefix>health` answered within 2 s
    /// (`--etcd-healthcheck-timeout`).
    async fn health(&self) -> Result<()> {
        if let Some((at, result)) = &*self.last_health.lock().unwrap_or_else(|e| e.into_inner())
            && at.elapsed() < Duration::from_secs(1)
        {
            return result.clone();
        }
        let mut kv = self.kv();
        let read = kv.get(self.full_key("health"), None);
        let result = match tokio::time::timeout(Duration::from_secs(2), read).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(other(error)),
            Err(_) => Err(StorageError::Unavailable(
                "etcd did not answer the health check within 2s".into(),
            )),
        };
        *self.last_health.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((std::time::Instant::now(), result.clone()));
        result
    }
}

/// Moves one etcd watch's events into the watcher's bounded channel.
async fn forward(
    store: EtcdStore,
    mut stream: etcd::WatchStream,
    tx: mpsc::Sender<Event>,
    reason: Arc<CloseReason>,
    after: Revision,
) {
    let mut delivered_through = after;
    loop {
        let message = tokio::select! {
            _ = tx.closed() => return,
            message = stream.message() => message,
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => {
                reason.set(StorageError::Etcd("watch stream ended".into()));
                return;
            }
            Err(e) => {
                reason.set(other(e));
                return;
            }
        };
        if response.canceled() {
            let compacted = response.compact_revision();
            if compacted > 0 {
                store
                    .known_compacted
                    .fetch_max(compacted, Ordering::Relaxed);
                reason.set(StorageError::Compacted {
                    requested: delivered_through,
                    compacted,
                });
            } else {
                reason.set(StorageError::Etcd(format!(
                    "watch canceled: {}",
                    response.cancel_reason()
                )));
            }
            return;
        }
        for event in response.events() {
            let converted = match convert(&store, event) {
                Ok(e) => e,
                Err(e) => {
                    reason.set(e);
                    return;
                }
            };
            let revision = converted.revision();
            match tx.send_timeout(converted, store.lag_grace).await {
                Ok(()) => {}
                Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                    reason.set(StorageError::WatcherLagged {
                        last_delivered: (revision - 1).max(delivered_through),
                    });
                    return;
                }
                Err(mpsc::error::SendTimeoutError::Closed(_)) => return,
            }
        }
        if let Some(last) = response.events().last().and_then(|e| e.kv()) {
            delivered_through = last.mod_revision();
        }
    }
}

fn convert(store: &EtcdStore, event: &etcd::Event) -> Result<Event> {
    let kv = event
        .kv()
        .ok_or_else(|| StorageError::Etcd("watch event without a key".into()))?;
    let prev = event.prev_kv().map(|kv| store.to_kv(kv)).transpose()?;
    Ok(match event.event_type() {
        etcd::EventType::Put => Event {
            kind: EventKind::Put,
            kv: store.to_kv(kv)?,
            prev,
            hint: None,
        },
        etcd::EventType::Delete => {
            let mut deleted = store.to_kv(kv)?;
            deleted.value = Bytes::new();
            deleted.create_revision = 0;
            deleted.version = 0;
            Event {
                kind: EventKind::Delete,
                kv: deleted,
                prev,
                hint: None,
            }
        }
    })
}
