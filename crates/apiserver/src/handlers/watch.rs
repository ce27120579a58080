//! Watches: the start (from the cache, a revision or a list), and the event stream with bookmarks and deadlines.

use super::*;

pub(super) async fn watch(
    request: &ResourceRequest,
    call: &Call,
    encoding: Encoding,
) -> Response<Body> {
    match start_watch(request, call, encoding).await {
        Ok(response) => response,
        Err(error) => error_response(&error, encoding),
    }
}

pub(super) async fn start_watch(
    request: &ResourceRequest,
    call: &Call,
    encoding: Encoding,
) -> Result<Response<Body>, ApiError> {
    let query = &call.query;
    let (labels, mut fields) = selectors(request, query)?;
    if let Some(name) = request.name() {
        fields = FieldSelector::parse(&format!("metadata.name={name}"))
            .map_err(ApiError::bad_request)?;
    }
    let bookmarks = query.flag("allowWatchBookmarks") == Some(true);
    let send_initial = query.flag("sendInitialEvents");
    let rv_match = query.get("resourceVersionMatch").filter(|v| !v.is_empty());
    match (send_initial, rv_match) {
        (Some(_), None) => {
            return Err(list_options_invalid(FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )));
        }
        (None, Some(_)) => {
            return Err(list_options_invalid(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            )));
        }
        (Some(_), Some(other)) if other != "NotOlderThan" => {
            return Err(list_options_invalid(FieldError::not_supported(
                "resourceVersionMatch",
                &json!(other),
                &["NotOlderThan"],
            )));
        }
        _ => {}
    }
    if send_initial == Some(true)
        && bookmarks
        && matches!(encoding.negotiated.output, Output::Table(_))
    {
        return Err(ApiError::not_acceptable(media::SERVED_STREAM_TYPES));
    }
    let rv = query.get("resourceVersion").filter(|v| !v.is_empty());
    let registry = &request.registry;
    let start = match (rv, send_initial) {
        (None | Some("0"), None | Some(true)) => WatchStart::Initial {
            end_bookmark: bookmarks,
        },
        (Some(v), Some(true)) => {
            let revision = parse_revision(v)?;
            if !registry
                .cache()
                .wait_for(revision, Duration::from_secs(3))
                .await
            {
                return Err(ApiError::too_large_resource_version(
                    revision,
                    registry.cache().revision(),
                ));
            }
            WatchStart::Initial {
                end_bookmark: bookmarks,
            }
        }
        (None | Some("0"), Some(false)) => WatchStart::After(registry.cache().revision()),
        (Some(v), _) => WatchStart::After(parse_revision(v)?),
    };
    let timeout = match query.int("timeoutSeconds")? {
        Some(seconds) if seconds > 0 => Duration::from_secs(seconds as u64),
        _ => {
            let minimum = call.min_request_timeout.as_secs().max(1);
            Duration::from_secs(minimum + fastrand::u64(..minimum))
        }
    };
    let watcher = registry.watch(
        &request.namespace,
        WatchOptions {
            labels,
            fields,
            start,
        },
    );
    let strategy = registry.strategy().clone();
    let include = IncludeObject::parse(query)?;
    let now = tokio::time::Instant::now();
    // A timeout too long to add is as good as none.
    let deadline = now
        .checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
    let next_bookmark = next_bookmark(now, deadline, false).filter(|_| bookmarks);
    let state = WatchStream {
        watcher,
        strategy,
        output: encoding.negotiated.output,
        include,
        bookmarks,
        ended: ended(deadline, call.shutdown.clone()),
        bookmark_due: next_bookmark.is_some(),
        bookmark: Box::pin(tokio::time::sleep_until(next_bookmark.unwrap_or(deadline))),
        deadline,
        first_table: true,
        finished: false,
    };
    // The response body polls the watch itself: no task or channel between the watch cache
    // and the connection.
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        let line = state.next_line().await?;
        Some((
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(line)),
            state,
        ))
    });
    let body = http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(stream));
    let content_type = match encoding.negotiated.output {
        Output::Protobuf => capstan_machinery::protobuf::STREAM_CONTENT_TYPE,
        _ => "application/json",
    };
    Ok(response(StatusCode::OK, content_type, body))
}

/// How often a watch that allows bookmarks gets one (upstream's cacher: every minute).
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// When a watch's next bookmark is due, as upstream's `nextBookmarkTime` has it: a minute from
/// `now`, or two seconds before the watch's `deadline` if that comes first; none once that
/// has passed (or, `after_one` just went out, is now).
fn next_bookmark(
    now: tokio::time::Instant,
    deadline: tokio::time::Instant,
    after_one: bool,
) -> Option<tokio::time::Instant> {
    let due = (now + BOOKMARK_EVERY).min(deadline.checked_sub(Duration::from_secs(2))?);
    (due > now || (due == now && !after_one)).then_some(due)
}

/// Ready at `deadline`, or when `shutdown` turns true.
pub(super) fn ended(
    deadline: tokio::time::Instant,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>> {
    Box::pin(async move {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.wait_for(|down| *down) => {}
        }
    })
}

/// One watch response: turns watch items into JSON lines.
pub(super) struct WatchStream {
    watcher: capstan_registry::watch::Watcher,
    strategy: std::sync::Arc<dyn capstan_registry::DynStrategy>,
    output: Output,
    include: IncludeObject,
    bookmarks: bool,
    /// Ready when the watch times out or the server shuts down. One future for the life of the
    /// watch: polled after every event, it registers with the timer and the shutdown signal once.
    ended: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>>,
    /// Whether [`Self::bookmark`] is set for the next bookmark.
    bookmark_due: bool,
    bookmark: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// When the watch times out.
    deadline: tokio::time::Instant,
    first_table: bool,
    finished: bool,
}

impl WatchStream {
    /// One event as a protobuf frame. An object its messages cannot carry ends the watch
    /// with an ERROR event (as upstream's watch server does when it cannot encode one): the
    /// client lists again rather than miss a change.
    fn frame(&mut self, event_type: &str, object: &Value) -> Bytes {
        let messages = self.strategy.info().data.messages();
        let (event_type, encoded) = match capstan_machinery::protobuf::encode(object, messages) {
            Ok(encoded) => (event_type, encoded),
            Err(problem) => {
                tracing::warn!(%problem, "a watch event could not be written as protobuf");
                self.finished = true;
                let error = ApiError::internal(format!("unable to encode watch object: {problem}"));
                let status = capstan_machinery::protobuf::encode(&error.to_status(), None);
                ("ERROR", status.unwrap_or_default())
            }
        };
        Bytes::from(capstan_machinery::protobuf::watch_frame(
            event_type, &encoded,
        ))
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        loop {
            // `biased`: events first, and no random branch order to pay for on every poll.
            let item = tokio::select! {
                biased;
                item = self.watcher.next() => match item {
                    Some(item) => item,
                    None => return None,
                },
                _ = &mut self.bookmark, if self.bookmark_due => {
                    match next_bookmark(tokio::time::Instant::now(), self.deadline, true) {
                        Some(at) => self.bookmark.as_mut().reset(at),
                        None => self.bookmark_due = false,
                    }
                    // Upstream's bookmark carries the last change of the kind its cache went
                    // through, and its watcher passes on only one newer than where it began.
                    let revision = self.watcher.last_event();
                    if revision <= self.watcher.start() {
                        continue;
                    }
                    WatchItem::Bookmark(revision, false)
                }
                _ = &mut self.ended => return None,
            };
            let info = self.strategy.info();
            match item {
                WatchItem::Event(kind, object) => {
                    return Some(match self.output {
                        Output::Table(version) => {
                            let mut list_meta = Map::new();
                            list_meta.insert(
                                "resourceVersion".into(),
                                json!(object.revision.to_string()),
                            );
                            let table = to_table(
                                self.strategy.as_ref(),
                                version,
                                &[&object.object()],
                                list_meta,
                                self.include,
                                self.first_table,
                            );
                            self.first_table = false;
                            event_line(kind.as_str(), &capstan_machinery::json::to_vec(&table))
                        }
                        Output::Metadata => event_line(
                            kind.as_str(),
                            &capstan_machinery::json::to_vec(&crate::request::partial_metadata(
                                &object.object(),
                            )),
                        ),
                        Output::Protobuf => {
                            let typed = meta::with_type_meta(
                                &object.object(),
                                &info.api_version(),
                                info.kind,
                            );
                            self.frame(kind.as_str(), &typed)
                        }
                        // Every watcher of this change shares one encoded line.
                        _ => object.watch_line(kind, || {
                            event_line(
                                kind.as_str(),
                                &object.typed_json(info.kind, &info.api_version()),
                            )
                        }),
                    });
                }
                WatchItem::Bookmark(revision, initial_end) => {
                    if !self.bookmarks {
                        continue;
                    }
                    let object = bookmark_object(self.strategy.as_ref(), revision, initial_end);
                    if self.output == Output::Protobuf {
                        return Some(self.frame("BOOKMARK", &object));
                    }
                    let json = match self.output {
                        Output::Metadata => capstan_machinery::json::to_vec(
                            &crate::request::partial_metadata(&object),
                        ),
                        // Upstream transforms a bookmark as any event: a one-row Table.
                        Output::Table(version) => {
                            let mut list_meta = Map::new();
                            list_meta.insert("resourceVersion".into(), json!(revision.to_string()));
                            let table = to_table(
                                self.strategy.as_ref(),
                                version,
                                &[&object],
                                list_meta,
                                self.include,
                                self.first_table,
                            );
                            self.first_table = false;
                            capstan_machinery::json::to_vec(&table)
                        }
                        _ => capstan_machinery::go_order::to_vec(&object, self.strategy.schema()),
                    };
                    return Some(event_line("BOOKMARK", &json));
                }
                WatchItem::Error(error) => {
                    self.finished = true;
                    if self.output == Output::Protobuf {
                        return Some(self.frame("ERROR", &error.to_status()));
                    }
                    return Some(event_line(
                        "ERROR",
                        &capstan_machinery::json::to_vec(&error.to_status()),
                    ));
                }
            }
        }
    }
}

/// A bookmark's object, as upstream's cacher makes it: the kind's Go zero value (the structs
/// Go always writes, `"spec":{}` …) with only the revision in its metadata, and the
/// `k8s.io/initial-events-end` annotation on the one that ends a watch's initial events.
fn bookmark_object(
    strategy: &dyn capstan_registry::DynStrategy,
    revision: i64,
    initial_end: bool,
) -> Value {
    let info = strategy.info();
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
    if initial_end {
        metadata.insert(
            "annotations".into(),
            json!({"k8s.io/initial-events-end": "true"}),
        );
    }
    let mut object = Map::new();
    object.insert("kind".into(), json!(info.kind));
    object.insert("apiVersion".into(), json!(info.api_version()));
    object.insert("metadata".into(), Value::Object(metadata));
    if let Value::Object(zero) = info.zero_value() {
        let members = zero.iter().filter(|(key, _)| *key != "metadata");
        object.extend(members.map(|(key, value)| (key.clone(), value.clone())));
    }
    Value::Object(object)
}

pub(super) fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}
