//! Content negotiation: which representation an `Accept` header asks for.

use crate::status::ApiError;

/// One clause of an `Accept` header.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaRange {
    /// `application`.
    pub kind: String,
    /// `json`.
    pub subtype: String,
    /// Parameters other than `q`, lowercased names.
    pub params: Vec<(String, String)>,
    /// Quality.
    pub q: f32,
}

impl MediaRange {
    /// A parameter's value.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn is_wildcard(&self) -> bool {
        self.kind == "*" || self.subtype == "*"
    }
}

/// Parses one media type (`application/json;as=Table;v=v1`).
pub fn parse_media_type(text: &str) -> Option<MediaRange> {
    let mut parts = text.split(';');
    let essence = parts.next()?.trim().to_ascii_lowercase();
    let (kind, subtype) = essence.split_once('/')?;
    if kind.is_empty() || subtype.is_empty() {
        return None;
    }
    let mut params = Vec::new();
    let mut q = 1.0;
    for param in parts {
        let Some((name, value)) = param.split_once('=') else {
            continue;
        };
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim().trim_matches('"').to_string();
        if name == "q" {
            q = value.parse().unwrap_or(1.0);
        } else {
            params.push((name, value));
        }
    }
    Some(MediaRange {
        kind: kind.to_string(),
        subtype: subtype.to_string(),
        params,
        q,
    })
}

/// Parses an `Accept` header into clauses in preference order: by `q`, then concrete types
/// before wildcards, otherwise in header order. An empty header accepts anything.
pub fn parse_accept(header: &str) -> Vec<MediaRange> {
    let mut ranges: Vec<MediaRange> = header
        .split(',')
        .filter_map(parse_media_type)
        .filter(|r| r.q > 0.0)
        .collect();
    if ranges.is_empty() {
        ranges.push(MediaRange {
            kind: "*".into(),
            subtype: "*".into(),
            params: Vec::new(),
            q: 1.0,
        });
    }
    ranges.sort_by(|a, b| {
        b.q.partial_cmp(&a.q)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.is_wildcard().cmp(&b.is_wildcard()))
    });
    ranges
}

/// The representation of an API response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The object as JSON.
    Json,
    /// The object as YAML.
    Yaml,
    /// A `meta.k8s.io` Table of the given version (`v1` or `v1beta1`).
    Table(&'static str),
    /// `PartialObjectMetadata` / `PartialObjectMetadataList` (`meta.k8s.io/v1`).
    Metadata,
    /// Kubernetes protobuf (`application/vnd.kubernetes.protobuf`): the object in its
    /// envelope; a watch as length-prefixed `WatchEvent` frames.
    Protobuf,
}

/// The chosen representation, and whether the Accept clause asked for pretty output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// What to send.
    pub output: Output,
    /// `pretty=1` in the chosen clause.
    pub pretty: bool,
}

/// Media types listed in a 406 for ordinary requests.
pub const SERVED_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];
/// Media types listed in a 406 for watches.
pub const SERVED_STREAM_TYPES: &[&str] = &[
    "application/json;stream=watch",
    "application/vnd.kubernetes.protobuf;stream=watch",
];

/// What a route of the API produces, as upstream's router declares it: the served types, and
/// for a list route (which also serves `?watch=true`) the stream types after them.
pub fn route_produces(list: bool) -> Vec<&'static str> {
    let mut produces = SERVED_TYPES.to_vec();
    if list {
        produces.extend_from_slice(SERVED_STREAM_TYPES);
    }
    produces
}

/// Upstream's router (go-restful) before any handler runs: some clause of `Accept` (parameters
/// dropped, an empty header meaning `*/*`) must be `*/*` or exactly a type the route produces,
/// else its 406. Wildcards such as `application/*` are not understood there.
pub fn route_accepts(accept: &str, produces: &[&str]) -> Result<(), ApiError> {
    let accept = if accept.is_empty() { "*/*" } else { accept };
    let matches = accept.split(',').any(|clause| {
        let media = clause
            .split(';')
            .next()
            .unwrap_or_default()
            .trim_matches(' ');
        media == "*/*" || produces.contains(&media)
    });
    if matches {
        Ok(())
    } else {
        Err(ApiError::route_not_acceptable(produces))
    }
}

/// Picks the response representation for an API request. `watch` requests cannot have YAML.
pub fn negotiate(accept: &str, watch: bool) -> Result<Negotiated, ApiError> {
    for range in parse_accept(accept) {
        let pretty = range.param("pretty").is_some_and(|v| v == "1");
        let target = range.param("as");
        match target {
            None => {
                if let Some(negotiated) = plain(&range, watch) {
                    return Ok(negotiated);
                }
            }
            Some(kind) if range.kind == "application" && range.subtype == "json" => {
                if range.param("g") != Some("meta.k8s.io") {
                    continue;
                }
                let version = range.param("v");
                match (kind, version) {
                    ("Table", Some("v1")) => {
                        return Ok(Negotiated {
                            output: Output::Table("v1"),
                            pretty,
                        });
                    }
                    ("Table", Some("v1beta1")) => {
                        return Ok(Negotiated {
                            output: Output::Table("v1beta1"),
                            pretty,
                        });
                    }
                    ("PartialObjectMetadata" | "PartialObjectMetadataList", Some("v1")) => {
                        return Ok(Negotiated {
                            output: Output::Metadata,
                            pretty,
                        });
                    }
                    _ => continue,
                }
            }
            Some(_) => continue,
        }
    }
    Err(ApiError::not_acceptable(if watch {
        SERVED_STREAM_TYPES
    } else {
        SERVED_TYPES
    }))
}

/// Picks JSON or YAML for a document no conversion applies to (discovery): upstream's
/// `DefaultEndpointRestrictions` skip every clause asking for one (`as=Table`, …).
pub fn negotiate_plain(accept: &str) -> Result<Negotiated, ApiError> {
    parse_accept(accept)
        .iter()
        .filter(|range| range.param("as").is_none())
        .find_map(|range| plain(range, false))
        .ok_or_else(|| ApiError::not_acceptable(SERVED_TYPES))
}

/// JSON, YAML (not for watches) or protobuf, if the clause accepts one.
fn plain(range: &MediaRange, watch: bool) -> Option<Negotiated> {
    let pretty = range.param("pretty").is_some_and(|v| v == "1");
    let json_like = range.kind == "*"
        || (range.kind == "application" && (range.subtype == "*" || range.subtype == "json"));
    if json_like {
        return Some(Negotiated {
            output: Output::Json,
            pretty,
        });
    }
    if range.kind == "application" && range.subtype == "vnd.kubernetes.protobuf" {
        return Some(Negotiated {
            output: Output::Protobuf,
            pretty: false,
        });
    }
    (!watch && range.kind == "application" && range.subtype == "yaml").then_some(Negotiated {
        output: Output::Yaml,
        pretty,
    })
}

/// The format of a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// JSON (also when no Content-Type was sent).
    Json,
    /// YAML.
    Yaml,
    /// Kubernetes protobuf (`application/vnd.kubernetes.protobuf`).
    Protobuf,
}

/// Reads a create/update `Content-Type`; unknown types are a 415.
pub fn body_format(content_type: Option<&str>) -> Result<BodyFormat, ApiError> {
    let Some(text) = content_type.filter(|t| !t.trim().is_empty()) else {
        return Ok(BodyFormat::Json);
    };
    match parse_media_type(text) {
        Some(m) if m.kind == "application" && m.subtype == "json" => Ok(BodyFormat::Json),
        Some(m) if m.kind == "application" && m.subtype == "yaml" => Ok(BodyFormat::Yaml),
        Some(m) if m.kind == "application" && m.subtype == "vnd.kubernetes.protobuf" => {
            Ok(BodyFormat::Protobuf)
        }
        _ => Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
            "application/vnd.kubernetes.protobuf",
        ])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_wants_an_exact_type_or_any() {
        let produces = route_produces(false);
        assert!(route_accepts("", &produces).is_ok());
        assert!(route_accepts("text/html, */*;q=0.1", &produces).is_ok());
        assert!(route_accepts("application/json;as=Table;v=v1;g=meta.k8s.io", &produces).is_ok());
        let refused = route_accepts("application/*", &produces).expect_err("406");
        assert_eq!(refused.code, 406);
        assert_eq!(
            refused.message,
            "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        );
        let list = route_accepts("text/plain", &route_produces(true)).expect_err("406");
        assert!(list.message.ends_with(
            "application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch"
        ));
    }

    #[test]
    fn kubectl_get_asks_for_a_table() {
        let n = negotiate(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            false,
        )
        .expect("acceptable");
        assert_eq!(n.output, Output::Table("v1"));
    }

    #[test]
    fn empty_and_wildcards_mean_json() {
        assert_eq!(negotiate("", false).map(|n| n.output), Ok(Output::Json));
        assert_eq!(negotiate("*/*", false).map(|n| n.output), Ok(Output::Json));
        assert_eq!(
            negotiate("application/yaml", false).map(|n| n.output),
            Ok(Output::Yaml)
        );
    }

    #[test]
    fn unservable_is_406() {
        let err = negotiate("text/html", false).expect_err("must fail");
        assert_eq!(err.code, 406);
        assert_eq!(
            err.message,
            "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        );
        // Tables and metadata are served as JSON only.
        assert!(
            negotiate(
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
                false
            )
            .is_err()
        );
        assert_eq!(
            negotiate("application/vnd.kubernetes.protobuf, */*", true).map(|n| n.output),
            Ok(Output::Protobuf)
        );
        assert_eq!(
            negotiate("application/yaml", true)
                .expect_err("must fail")
                .code,
            406
        );
    }

    #[test]
    fn quality_orders_clauses() {
        let n = negotiate("application/json;q=0.5,application/yaml", false).expect("ok");
        assert_eq!(n.output, Output::Yaml);
    }
}
