//! Query parameters and option bodies: list, write and delete options, dry run, field validation.

use super::*;

/// A `resourceVersion` query parameter. Upstream's storage parses it as a uint64 and refuses
/// it as a field error wrapped in a 400 (the strconv error's text after the quoted value).
pub(super) fn parse_revision(text: &str) -> Result<i64, ApiError> {
    let why = match text.parse::<u64>() {
        Ok(revision) => match i64::try_from(revision) {
            Ok(revision) => return Ok(revision),
            Err(_) => "value out of range",
        },
        Err(_) => "invalid syntax",
    };
    let quoted = capstan_gostd::quote(text);
    Err(ApiError::bad_request(format!(
        "invalid resource version: resourceVersion: Invalid value: {quoted}: parsing {quoted}: {why}"
    )))
}

pub(super) fn list_options_invalid(error: FieldError) -> ApiError {
    options_invalid("ListOptions", error)
}

pub(super) fn selectors(
    request: &ResourceRequest,
    query: &Query,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels =
        LabelSelector::parse(query.text("labelSelector")).map_err(ApiError::bad_request)?;
    let fields =
        FieldSelector::parse(query.text("fieldSelector")).map_err(ApiError::bad_request)?;
    request.registry.check_field_selector(&fields)?;
    if let (Some(path_name), Some(pinned)) = (request.name(), fields.pinned_name())
        && path_name != pinned
    {
        return Err(ApiError::bad_request(
            "fieldSelector metadata.name doesn't match requested name",
        ));
    }
    Ok((labels, fields))
}

pub(super) fn list_options(
    request: &ResourceRequest,
    query: &Query,
) -> Result<ListOptions, ApiError> {
    let (labels, fields) = selectors(request, query)?;
    let limit = query.int("limit")?.unwrap_or(0).max(0) as usize;
    let rv = query.get("resourceVersion").filter(|v| !v.is_empty());
    let rv_match = query.get("resourceVersionMatch").filter(|v| !v.is_empty());
    let continue_token = match query.get("continue").filter(|v| !v.is_empty()) {
        Some(text) => {
            if rv_match.is_some() {
                return Err(list_options_invalid(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                )));
            }
            if rv.is_some_and(|v| v != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            Some(ContinueToken::decode(text).map_err(ApiError::bad_request)?)
        }
        None => None,
    };
    if query.get("sendInitialEvents").is_some() {
        return Err(list_options_invalid(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        )));
    }
    let read_at = match (rv, rv_match) {
        (None, None) => ReadAt::Latest,
        (None, Some("NotOlderThan" | "Exact")) => {
            return Err(list_options_invalid(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            )));
        }
        (Some("0"), Some("Exact")) => {
            return Err(list_options_invalid(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            )));
        }
        (_, Some(other)) if other != "NotOlderThan" && other != "Exact" => {
            return Err(list_options_invalid(FieldError::not_supported(
                "resourceVersionMatch",
                &json!(other),
                &["Exact", "NotOlderThan", ""],
            )));
        }
        (Some("0"), _) => ReadAt::Any,
        (Some(v), Some("Exact")) => ReadAt::Exact(parse_revision(v)?),
        (Some(v), _) => ReadAt::NotOlderThan(parse_revision(v)?),
        (None, Some(_)) => ReadAt::Latest,
    };
    Ok(ListOptions {
        labels,
        fields,
        limit,
        continue_token,
        read_at,
    })
}

pub(super) fn write_options(call: &Call) -> Result<WriteOptions, ApiError> {
    let dry_run = dry_run(&call.query, "CreateOptions")?;
    if let Some(validation) = call.query.get("fieldValidation") {
        let directives = ["", "Ignore", "Strict", "Warn"];
        one_of(
            "CreateOptions",
            "fieldValidation",
            validation,
            &directives,
            &directives,
        )?;
    }
    let field_manager = match call.query.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(manager) => {
            if manager.len() > 128 {
                return Err(options_invalid(
                    "CreateOptions",
                    FieldError::too_long("fieldManager", 128),
                ));
            }
            manager.to_string()
        }
        None => {
            let agent = crate::request::header_text(&call.headers, header::USER_AGENT);
            let manager: String = agent
                .split('/')
                .next()
                .unwrap_or_default()
                .chars()
                .filter(|c| !c.is_control())
                .collect();
            manager.chars().take(128).collect()
        }
    };
    Ok(WriteOptions {
        dry_run,
        field_manager,
        applied: false,
    })
}

/// An option that takes one of `accepted` values only (`listed` in the error, which may name
/// more, as upstream's `nil` propagation policy).
fn one_of(
    kind: &str,
    field: &str,
    value: &str,
    accepted: &[&str],
    listed: &[&str],
) -> Result<(), ApiError> {
    if accepted.contains(&value) {
        return Ok(());
    }
    let error = FieldError::not_supported(field, &json!(value), listed);
    Err(options_invalid(kind, error))
}

/// Upstream's answer to invalid request options (`CreateOptions`, `ListOptions`…): 422
/// `<Kind>.meta.k8s.io "" is invalid: <field error>`, with the error as its cause.
pub(super) fn options_invalid(kind: &str, error: FieldError) -> ApiError {
    let mut errors = FieldErrors::new();
    errors.push(error);
    ApiError::invalid("meta.k8s.io", &format!("{kind}.meta.k8s.io"), "", &errors)
}

/// `dryRun` from the query.
pub(super) fn dry_run(query: &Query, kind: &str) -> Result<bool, ApiError> {
    check_dry_run(&query.all("dryRun"), kind)
}

/// Upstream's `ValidateDryRun`: every value is `All`; the whole list is shown when one is not.
pub(super) fn check_dry_run(values: &[impl AsRef<str>], kind: &str) -> Result<bool, ApiError> {
    if values.iter().any(|v| v.as_ref() != "All") {
        let shown: Vec<&str> = values.iter().map(AsRef::as_ref).collect();
        return Err(options_invalid(
            kind,
            FieldError::not_supported("dryRun", &json!(shown), &["All"]),
        ));
    }
    Ok(!values.is_empty())
}

pub(super) fn field_validation(query: &Query) -> FieldValidation {
    match query.get("fieldValidation") {
        Some("Ignore") => FieldValidation::Ignore,
        Some("Strict") => FieldValidation::Strict,
        _ => FieldValidation::Warn,
    }
}

/// The options of a DELETE: query parameters, then a `DeleteOptions` body over them.
pub(super) async fn delete_options(
    call: &Call,
    body: Option<crate::unread::RequestBody>,
) -> Result<DeleteOptions, ApiError> {
    let bytes = match body {
        Some(body) => read_body(body).await?,
        None => Bytes::new(),
    };
    let mut options = DeleteOptions {
        dry_run: dry_run(&call.query, "DeleteOptions")?,
        ..DeleteOptions::default()
    };
    let mut propagation = call.query.get("propagationPolicy").map(str::to_string);
    if let Some(grace) = call.query.get("gracePeriodSeconds") {
        options.grace_period_seconds = Some(grace.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "gracePeriodSeconds: invalid value {}",
                capstan_gostd::quote(grace)
            ))
        })?);
    }
    let mut orphan = call.query.flag("orphanDependents");
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        let body: Value = capstan_machinery::protobuf::decode(&bytes, None)
            .map(|(_, _, object)| object)
            .or_else(|_| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
            .or_else(|_| yaml::from_slice(&bytes).map_err(|e| e.to_string()))
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        let body: k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions =
            serde_json::from_value(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        propagation = body.propagation_policy;
        orphan = body.orphan_dependents;
        if let Some(grace) = body.grace_period_seconds {
            options.grace_period_seconds = Some(grace);
        }
        if let Some(pre) = body.preconditions {
            options.uid = pre.uid;
            options.resource_version = pre.resource_version;
        }
        if let Some(values) = body.dry_run {
            options.dry_run |= check_dry_run(&values, "DeleteOptions")?;
        }
    }
    if let Some(policy) = &propagation {
        let policies = ["Foreground", "Background", "Orphan"];
        let listed = ["Foreground", "Background", "Orphan", "nil"];
        one_of(
            "DeleteOptions",
            "propagationPolicy",
            policy,
            &policies,
            &listed,
        )?;
        if orphan.is_some() {
            return Err(options_invalid(
                "DeleteOptions",
                FieldError::invalid(
                    "propagationPolicy",
                    &json!(policy),
                    "orphanDependents and deletionPropagation cannot be both set",
                ),
            ));
        }
    }
    options.propagation = propagation;
    options.orphan_dependents = orphan;
    Ok(options)
}
