//! The DNS server: hickory-server's UDP and TCP listeners with a handler that answers the
//! cluster zone from the index, forwards other names to the upstream resolvers (or refuses
//! them when there are none), and counts what it does under CoreDNS's metric names.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, Metadata, ResponseCode};
use hickory_proto::rr::{Record, RecordType};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::answer::{Outcome, Zone};
use crate::index::Index;
use crate::metrics::{Metrics, RequestLabels};

/// How long an upstream resolver has to answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// The UDP payload this server offers in its EDNS answers (the DNS flag day's size).
const MAX_UDP_PAYLOAD: u16 = 1232;

/// Answers every query.
pub struct Handler {
    /// The cluster zone.
    pub zone: Zone,
    /// What the watches keep.
    pub index: Arc<RwLock<Index>>,
    /// Resolvers for names outside the zone.
    pub upstreams: Vec<SocketAddr>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let started = Instant::now();
        let info = match request.request_info() {
            Ok(info) => info,
            Err(_) => {
                let builder = MessageResponseBuilder::from_message_request(request);
                let reply = builder.error_msg(&request.metadata, ResponseCode::FormErr);
                return send(&mut response, reply, &request.metadata).await;
            }
        };
        let qtype = info.query.query_type();
        let qname = info
            .query
            .name()
            .to_string()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let proto = if matches!(request.protocol(), hickory_server::net::xfer::Protocol::Udp) {
            "udp"
        } else {
            "tcp"
        };
        let family = if request.src().is_ipv4() { "1" } else { "2" };
        let outcome = {
            let index = self.index.read().unwrap_or_else(|p| p.into_inner());
            match self.zone.answer(&index, &qname, qtype) {
                // Not listed yet: an answer now could deny a name that exists.
                Outcome::Answer { .. } if index.synced != (true, true) => None,
                outcome => Some(outcome),
            }
        };
        let Some(outcome) = outcome else {
            let builder = MessageResponseBuilder::from_message_request(request);
            let reply = builder.error_msg(&request.metadata, ResponseCode::ServFail);
            return send(&mut response, reply, &request.metadata).await;
        };
        let mut edns = request.edns.clone().map(|_| {
            let mut e = Edns::new();
            e.set_max_payload(
                MAX_UDP_PAYLOAD.min(
                    request
                        .edns
                        .as_ref()
                        .map_or(512, |r| r.max_payload().max(512)),
                ),
            );
            e
        });
        let (zone_label, info) = match outcome {
            Outcome::Answer {
                code,
                mut answers,
                additionals,
                cname,
            } => {
                if let Some(target) = cname
                    && matches!(qtype, RecordType::A | RecordType::AAAA | RecordType::TXT)
                {
                    answers.extend(self.resolve(&target, qtype).await);
                }
                let mut metadata = Metadata::response_from_request(&request.metadata);
                metadata.authoritative = true;
                metadata.response_code = code;
                let soa: Vec<Record> = if answers.is_empty() {
                    self.zone.soa().into_iter().collect()
                } else {
                    Vec::new()
                };
                let mut builder = MessageResponseBuilder::from_message_request(request);
                if let Some(edns) = edns.as_mut() {
                    builder.edns(edns);
                }
                let reply = builder.build(
                    metadata,
                    answers.iter(),
                    std::iter::empty(),
                    soa.iter(),
                    additionals.iter(),
                );
                (
                    format!("{}.", self.zone.domain),
                    send(&mut response, reply, &request.metadata).await,
                )
            }
            Outcome::Elsewhere => {
                let forwarded = if self.upstreams.is_empty() {
                    None
                } else {
                    forward(request.as_slice(), &self.upstreams).await
                };
                match forwarded {
                    Some(message) => {
                        let mut metadata = Metadata::response_from_request(&request.metadata);
                        metadata.response_code = message.metadata.response_code;
                        metadata.recursion_available = message.metadata.recursion_available;
                        metadata.authentic_data = message.metadata.authentic_data;
                        let mut builder = MessageResponseBuilder::from_message_request(request);
                        if let Some(edns) = edns.as_mut() {
                            builder.edns(edns);
                        }
                        let reply = builder.build(
                            metadata,
                            message.answers.iter(),
                            message.authorities.iter(),
                            std::iter::empty(),
                            message.additionals.iter(),
                        );
                        (
                            ".".to_owned(),
                            send(&mut response, reply, &request.metadata).await,
                        )
                    }
                    None => {
                        let code = if self.upstreams.is_empty() {
                            ResponseCode::Refused
                        } else {
                            ResponseCode::ServFail
                        };
                        let builder = MessageResponseBuilder::from_message_request(request);
                        let reply = builder.error_msg(&request.metadata, code);
                        (
                            ".".to_owned(),
                            send(&mut response, reply, &request.metadata).await,
                        )
                    }
                }
            }
        };
        let labels = RequestLabels {
            server: format!("dns://{}", self.metrics.listen),
            zone: zone_label,
            view: String::new(),
            proto: proto.to_owned(),
            family: family.to_owned(),
            r#type: type_label(qtype),
        };
        self.metrics.observe(
            &labels,
            info.response_code,
            started.elapsed(),
            request.as_slice().len(),
        );
        info
    }
}

async fn send<'a, R: ResponseHandler>(
    response: &mut R,
    reply: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    request: &Metadata,
) -> ResponseInfo {
    match response.send_response(reply).await {
        Ok(info) => info,
        Err(err) => {
            tracing::debug!(%err, "sending a DNS response");
            let mut metadata = Metadata::response_from_request(request);
            metadata.response_code = ResponseCode::ServFail;
            ResponseInfo::from(hickory_proto::op::Header {
                metadata,
                counts: Default::default(),
            })
        }
    }
}

impl Handler {
    /// An ExternalName's target's records, as CoreDNS adds them after the CNAME: from the
    /// zone itself when the target is in it, else from the upstream resolvers.
    async fn resolve(&self, target: &hickory_proto::rr::Name, qtype: RecordType) -> Vec<Record> {
        let text = target
            .to_string()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let outcome = {
            let index = self.index.read().unwrap_or_else(|p| p.into_inner());
            self.zone.answer(&index, &text, qtype)
        };
        if let Outcome::Answer { answers, .. } = outcome {
            return answers;
        }
        if self.upstreams.is_empty() {
            return Vec::new();
        }
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        query.add_query(hickory_proto::op::Query::query(target.clone(), qtype));
        let Ok(bytes) = query.to_vec() else {
            return Vec::new();
        };
        forward(&bytes, &self.upstreams)
            .await
            .map(|m| m.answers)
            .unwrap_or_default()
    }
}

/// CoreDNS's `type` label: the common types by name, the rest as "other".
fn type_label(qtype: RecordType) -> String {
    match qtype {
        RecordType::A
        | RecordType::AAAA
        | RecordType::CNAME
        | RecordType::MX
        | RecordType::NS
        | RecordType::PTR
        | RecordType::SOA
        | RecordType::SRV
        | RecordType::TXT
        | RecordType::HTTPS
        | RecordType::ANY => qtype.to_string(),
        _ => "other".to_owned(),
    }
}

/// At most this many queries are forwarded at once; more get SERVFAIL at once.
const MAX_FORWARDS: usize = 1024;
static FORWARDS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_FORWARDS);

/// Sends the query as it came to each upstream in turn (UDP, then TCP when the answer was
/// truncated); the first answer wins.
async fn forward(query: &[u8], upstreams: &[SocketAddr]) -> Option<Message> {
    let Ok(_permit) = FORWARDS.try_acquire() else {
        tracing::debug!("too many queries being forwarded");
        return None;
    };
    for upstream in upstreams {
        match tokio::time::timeout(UPSTREAM_TIMEOUT, forward_one(query, *upstream)).await {
            Ok(Ok(message)) => return Some(message),
            Ok(Err(err)) => tracing::debug!(%err, %upstream, "forwarding a query"),
            Err(_) => tracing::debug!(%upstream, "forwarding a query timed out"),
        }
    }
    None
}

async fn forward_one(query: &[u8], upstream: SocketAddr) -> anyhow::Result<Message> {
    let local: SocketAddr = if upstream.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()?;
    let socket = UdpSocket::bind(local).await?;
    socket.send_to(query, upstream).await?;
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = socket.recv_from(&mut buf).await?;
        if from != upstream || n < 2 || query.len() < 2 || buf[..2] != query[..2] {
            continue;
        }
        if n == buf.len() {
            break; // did not fit: ask over TCP
        }
        let Ok(message) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if !message.metadata.truncation {
            return Ok(message);
        }
        break;
    }
    let mut stream = TcpStream::connect(upstream).await?;
    let length = u16::try_from(query.len())?;
    stream.write_all(&length.to_be_bytes()).await?;
    stream.write_all(query).await?;
    let mut prefix = [0u8; 2];
    stream.read_exact(&mut prefix).await?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
    stream.read_exact(&mut body).await?;
    Ok(Message::from_vec(&body)?)
}
