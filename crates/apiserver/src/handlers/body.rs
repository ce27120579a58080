//! Request bodies: decoding by content type, strict field validation, and the object's identity checks.

use super::*;

/// Decodes a create/update body and checks its kind and apiVersion; returns the object, the
/// unknown-field warnings and the body's length.
pub(super) async fn decode_body(
    request: &ResourceRequest,
    call: &Call,
    body: Option<crate::unread::RequestBody>,
) -> Result<(Value, Vec<String>, usize), ApiError> {
    let info = request.registry.strategy().info();
    let format = media::body_format(
        call.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    )?;
    let bytes = match body {
        Some(body) => read_body(body).await?,
        None => Bytes::new(),
    };
    let validation = field_validation(&call.query);
    // Keys a JSON body repeats are found as it is decoded (reported unless ignored).
    let mut duplicates = Vec::new();
    let parsed: Result<Value, String> = match format {
        BodyFormat::Json => capstan_machinery::strict::from_slice_with_duplicates(&bytes)
            .map(|(object, found)| {
                if validation != FieldValidation::Ignore {
                    duplicates = found;
                }
                object
            })
            .map_err(|e| {
                // Go's decoder words a syntax error its own way; serde's words for the rest.
                let why = capstan_machinery::go_scanner::syntax_error(&bytes)
                    .unwrap_or_else(|| e.to_string());
                format!("couldn't get version/kind; json parse error: {why}")
            }),
        // The YAML serializer converts to JSON first, and answers with that conversion's
        // error as it is.
        BodyFormat::Yaml => yaml::from_slice(&bytes),
        BodyFormat::Protobuf => capstan_machinery::protobuf::decode(&bytes, info.data.messages())
            .map(|(_, _, object)| object),
    };
    let unrecognized = |detail: String| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): {detail} ({})",
            info.kind,
            summarize(&bytes)
        ))
    };
    let mut object = parsed.map_err(unrecognized)?;
    // Go decodes `null` into a struct as nothing at all: an empty object.
    if object.is_null() {
        object = Value::Object(Map::new());
    }
    let Some(map) = object.as_object_mut() else {
        // What Go's JSON decoder says of a document that is not an object, read for its
        // apiVersion and kind.
        let found = match object {
            Value::Array(_) => "array",
            Value::String(_) => "string",
            Value::Number(_) => "number",
            _ => "bool",
        };
        return Err(unrecognized(format!(
            "couldn't get version/kind; json parse error: json: cannot unmarshal {found} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}"
        )));
    };
    let api_version = info.api_version();
    let body_version = meta::text(map.get("apiVersion")).to_string();
    let body_kind = meta::text(map.get("kind")).to_string();
    if info.group.is_empty() {
        if let Some(error) = core_decode_error(info, &body_version, &body_kind) {
            return Err(error);
        }
    } else if !body_version.is_empty() && body_version != api_version {
        let (scheme, versions) = info.scheme;
        if scheme.is_empty() || versions.contains(&body_version.as_str()) {
            return Err(ApiError::version_mismatch(&body_version, &api_version));
        }
        return Err(not_registered(info, &body_version, &body_kind));
    }
    if !body_kind.is_empty() && body_kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "{body_kind} in version {} cannot be handled as a {}: the object provided is of kind {body_kind}",
            capstan_gostd::quote(if body_version.is_empty() {
                &api_version
            } else {
                &body_version
            }),
            info.kind
        )));
    }
    // Strict decoding's problems (keys a JSON or YAML body repeats, then fields the schema lacks),
    // looked for only when they will be reported.
    let mut problems = duplicates;
    if validation != FieldValidation::Ignore {
        if format == BodyFormat::Yaml {
            problems.extend(capstan_machinery::yaml::duplicate_key(&bytes));
        }
        problems.extend(request.registry.strategy().unknown_fields(&object));
    }
    let mut warnings = Vec::new();
    match validation {
        FieldValidation::Strict if !problems.is_empty() => {
            return Err(ApiError::bad_request(format!(
                "{} in version {} cannot be handled as a {}: strict decoding error: {}",
                info.kind,
                capstan_gostd::quote(info.version),
                info.kind,
                problems.join(", ")
            )));
        }
        FieldValidation::Warn => warnings = problems,
        _ => {}
    }
    meta::strip_type_meta(&mut object);
    let strategy = request.registry.strategy();
    let decoded = strategy.decode(object).map_err(|e| {
        // A value of the wrong type is reported in Go's JSON decoder's words, found by the
        // schema in the body (parsed again: this is the rare path).
        let parsed = match format {
            BodyFormat::Json => serde_json::from_slice(&bytes).ok(),
            BodyFormat::Yaml => capstan_machinery::yaml::from_slice(&bytes).ok(),
            BodyFormat::Protobuf => None,
        };
        let why = parsed
            .zip(strategy.schema())
            .and_then(|(body, schema)| {
                capstan_machinery::go_json::type_error(info.kind, schema, &body)
            })
            .unwrap_or(e);
        ApiError::bad_request(format!(
            "{} in version {} cannot be handled as a {}: {why}",
            info.kind,
            capstan_gostd::quote(info.version),
            info.kind
        ))
    })?;
    Ok((decoded, warnings, bytes.len()))
}

/// Upstream's `summarizeData`: the first 30 bytes of a body, as text when it starts with `{`,
/// else in hex; ` ...` when there is more.
fn summarize(bytes: &[u8]) -> String {
    const MAX: usize = 30;
    let head = &bytes[..bytes.len().min(MAX)];
    let mut shown = match bytes.first() {
        None => return "<empty>".to_string(),
        Some(b'{') => String::from_utf8_lossy(head).into_owned(),
        Some(_) => head.iter().map(|b| format!("{b:02x}")).collect(),
    };
    if bytes.len() > MAX {
        shown.push_str(" ...");
    }
    shown
}

/// What upstream's decoder (the legacy scheme) makes of a core/v1 body that names another
/// kind or version (`transformDecodeError`): a core/v1 kind decodes but does not convert into
/// the endpoint's; any other is not registered.
fn core_decode_error(info: &ResourceInfo, version: &str, kind: &str) -> Option<ApiError> {
    let version = if version.is_empty() { "v1" } else { version };
    let kind = if kind.is_empty() { info.kind } else { kind };
    if version == "v1" && kind == info.kind {
        return None;
    }
    let registered = version == "v1"
        && capstan_machinery::schema::named(&format!("io.k8s.api.core.v1.{kind}"))
            .is_some_and(|schema| schema.get("x-kubernetes-group-version-kind").is_some());
    if !registered {
        return Some(not_registered(info, version, kind));
    }
    Some(cannot_handle(
        info,
        version,
        kind,
        &format!(
            "converting (v1.{kind}) to (core.{}): unknown conversion",
            info.kind
        ),
    ))
}

/// A body whose version (or kind) the group's scheme does not know.
fn not_registered(info: &ResourceInfo, version: &str, kind: &str) -> ApiError {
    let kind = if kind.is_empty() { info.kind } else { kind };
    let why = format!(
        "no kind {} is registered for version {} in scheme {}",
        capstan_gostd::quote(kind),
        capstan_gostd::quote(version),
        capstan_gostd::quote(info.scheme.0)
    );
    cannot_handle(info, version, kind, &why)
}

/// `transformDecodeError`'s message for a body that names its kind.
fn cannot_handle(info: &ResourceInfo, version: &str, kind: &str, why: &str) -> ApiError {
    let short_version = version.rsplit('/').next().unwrap_or(version);
    ApiError::bad_request(format!(
        "{kind} in version {} cannot be handled as a {}: {why}",
        capstan_gostd::quote(short_version),
        info.kind
    ))
}

/// Puts the URL's namespace on a body (a namespaced kind's; a cluster-scoped object has
/// none), refusing a body that names another.
pub(super) fn settle_namespace(
    request: &ResourceRequest,
    object: &mut Value,
) -> Result<(), ApiError> {
    if !request.registry.strategy().info().namespaced {
        meta::metadata_mut(object).shift_remove("namespace");
        return Ok(());
    }
    let sent = meta::namespace(object);
    if !sent.is_empty() && sent != request.namespace {
        return Err(ApiError::namespace_mismatch());
    }
    meta::set_meta_str(object, "namespace", &request.namespace);
    Ok(())
}
