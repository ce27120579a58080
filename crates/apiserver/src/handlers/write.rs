//! The write verbs: create, update (PUT), patch (JSON, merge, strategic merge) and server-side apply.

use super::*;

pub(super) async fn create(verb: Verb<'_>) -> Result<Response<Body>, ApiError> {
    let (request, call) = (verb.request, verb.call);
    let options = write_options(call)?;
    let (mut object, mut warnings, body_len) = decode_body(request, call, verb.body).await?;
    // A failure from here on carries the decoding's warnings (upstream has written them).
    let earned = |error: ApiError| error.after_warnings(&warnings);
    settle_namespace(request, &mut object).map_err(earned)?;
    let (registry, namespace) = (request.registry.clone(), request.namespace.clone());
    let mut created = call
        .finish(body_len, async move {
            registry.create_answered(&namespace, object, &options).await
        })
        .await
        .map_err(earned)?;
    warnings.append(&mut created.warnings);
    // Compact JSON is the stored bytes with the resourceVersion in: not encoded again.
    let response = match created.json {
        Some(mut json)
            if verb.encoding.negotiated.output == Output::Json && !verb.encoding.pretty =>
        {
            json.push(b'\n');
            response(StatusCode::CREATED, "application/json", full(json))
        }
        _ => object_response(
            StatusCode::CREATED,
            request.registry.strategy().as_ref(),
            &created.object,
            verb.encoding,
            &call.query,
        ),
    };
    Ok(with_warnings(response, &warnings))
}

pub(super) async fn update(verb: Verb<'_>, name: &str) -> Result<Response<Body>, ApiError> {
    let (request, call) = (verb.request, verb.call);
    let subresource = verb.subresource;
    let options = write_options(call)?;
    let (mut object, mut warnings, body_len) = decode_body(request, call, verb.body).await?;
    // A failure from here on carries the decoding's warnings (upstream has written them).
    let earned = |error: ApiError| error.after_warnings(&warnings);
    check_name(
        request.registry.strategy().info(),
        name,
        &request.namespace,
        &object,
    )
    .map_err(earned)?;
    settle_namespace(request, &mut object).map_err(earned)?;
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let (stored, created) = call
        .finish(body_len, async move {
            registry
                .update(&namespace, &owned_name, object, &options, subresource)
                .await
        })
        .await
        .map_err(earned)?;
    if subresource == Subresource::Main {
        warnings.extend(request.registry.strategy().warnings(&stored));
    }
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_warnings(
        object_response(
            code,
            request.registry.strategy().as_ref(),
            &stored,
            verb.encoding,
            &call.query,
        ),
        &warnings,
    ))
}

pub(super) async fn patch_object(
    mut verb: Verb<'_>,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let (request, call) = (verb.request, verb.call);
    let patch_type = PatchType::from_content_type(
        call.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    )?;
    let mut options = write_options(call)?;
    if call.query.get("force").is_some() && patch_type != PatchType::Apply {
        return Err(options_invalid(
            "PatchOptions",
            FieldError::forbidden("force", "may not be specified for non-apply patch"),
        ));
    }
    let bytes = match verb.body.take() {
        Some(body) => read_body(body).await?,
        None => Bytes::new(),
    };
    if patch_type == PatchType::Apply {
        return apply_object(&verb, name, &bytes, options).await;
    }
    let subresource = verb.subresource;
    let strategic: Option<Value> = if patch_type == PatchType::StrategicMerge {
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        if !value.is_object() {
            return Err(ApiError::bad_request("invalid JSON document"));
        }
        Some(value)
    } else {
        None
    };
    if options.field_manager.is_empty() {
        options.field_manager = "unknown".into();
    }
    let validation = field_validation(&call.query);
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let body_len = bytes.len();
    // The patched object's unknown fields, once it decoded: upstream records them then, so a
    // write refused afterwards (invalid, conflicting) goes out with them.
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let problems_of = recorded.clone();
    let result = call
        .finish(body_len, async move {
            let input = PatchInput {
                patch_type,
                bytes: &bytes,
                strategic: strategic.as_ref(),
                strategy: registry.strategy().as_ref(),
                name: &owned_name,
                namespace: &namespace,
                validation,
            };
            registry
                .patch_viewed(&namespace, &owned_name, &options, subresource, |current| {
                    let (result, view, problems) = patched_object(&input, current)?;
                    *problems_of.lock().unwrap_or_else(|e| e.into_inner()) = problems;
                    Ok((result, view))
                })
                .await
        })
        .await;
    let mut warnings = std::mem::take(&mut *recorded.lock().unwrap_or_else(|e| e.into_inner()));
    let patched = result.map_err(|error| error.after_warnings(&warnings))?;
    if subresource == Subresource::Main {
        warnings.extend(request.registry.strategy().warnings(&patched));
    }
    Ok(with_warnings(
        object_response(
            StatusCode::OK,
            request.registry.strategy().as_ref(),
            &patched,
            verb.encoding,
            &call.query,
        ),
        &warnings,
    ))
}

/// What a (non-apply) patch needs to turn the stored object into the patched one.
pub(super) struct PatchInput<'a> {
    patch_type: PatchType,
    bytes: &'a [u8],
    strategic: Option<&'a Value>,
    strategy: &'a dyn capstan_registry::DynStrategy,
    name: &'a str,
    namespace: &'a str,
    validation: FieldValidation,
}

/// Applies a JSON, merge or strategic merge patch to the stored object (`current`, as stored:
/// the patch applies to a copy with kind and apiVersion) and checks the result as upstream
/// does; returns it in its type's form, with the rules' view of it and the unknown-field
/// warnings to send.
pub(super) fn patched_object(
    input: &PatchInput<'_>,
    current: &Value,
) -> Result<(Value, capstan_registry::typed::RulesView, Vec<String>), ApiError> {
    let PatchInput {
        patch_type,
        bytes,
        strategic,
        strategy,
        name,
        namespace,
        validation,
    } = *input;
    let info = strategy.info();
    let mut warnings = Vec::new();
    // The one copy of the stored object a patch makes: the patch engines change it in place.
    let apply = || -> Result<Value, ApiError> {
        let target = meta::with_type_meta(current, &info.api_version(), info.kind);
        Ok(match patch_type {
            PatchType::Json => patch::json_patch(target, bytes)?,
            PatchType::StrategicMerge => {
                let patch_value = strategic.unwrap_or(&Value::Null);
                capstan_machinery::smp::apply(target, patch_value, strategy.schema())
                    .map_err(smp_error)?
            }
            _ => patch::merge_patch(target, bytes)?,
        })
    };
    let mut result = apply()?;
    let problems = strategy.unknown_fields(&result);
    match validation {
        FieldValidation::Strict if !problems.is_empty() => {
            let rendered =
                String::from_utf8(capstan_machinery::json::to_vec(&result)).unwrap_or_default();
            let errors = capstan_machinery::field::FieldErrors(vec![
                capstan_machinery::field::FieldError::invalid(
                    "patch",
                    &Value::String(rendered),
                    format!("strict decoding error: {}", problems.join(", ")),
                ),
            ]);
            return Err(ApiError::invalid("", "", "", &errors));
        }
        FieldValidation::Warn => {
            warnings = problems;
        }
        _ => {}
    }
    if let Some(map) = result.as_object_mut() {
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or(info.kind);
        let version = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or(info.version);
        if kind != info.kind || version != info.api_version() {
            return Err(ApiError::version_mismatch(version, &info.api_version()));
        }
    }
    // A patched object with a value of the wrong type: upstream's patcher answers with the
    // decoder's error on the `patch` field, valued with the patched object's JSON. The kind's
    // type refuses every such object, so the schema is searched for one only when the decode
    // fails (on the object patched again: the decode took it), or when `kind` or `apiVersion`,
    // which the decode does not read, is not a string.
    let type_error = |result: &Value| {
        strategy
            .schema()
            .and_then(|schema| capstan_machinery::go_json::type_error(info.kind, schema, result))
    };
    let invalid_patch = |result: &Value, why: String| {
        let rendered = capstan_machinery::smp::value_key(result);
        let errors = capstan_machinery::field::FieldErrors(vec![
            capstan_machinery::field::FieldError::invalid("patch", &Value::String(rendered), why),
        ]);
        ApiError::invalid("", "", "", &errors)
    };
    let untyped_meta = ["kind", "apiVersion"]
        .iter()
        .any(|key| result.get(*key).is_some_and(|v| !v.is_string()));
    if untyped_meta && let Some(why) = type_error(&result) {
        return Err(invalid_patch(&result, why));
    }
    meta::strip_type_meta(&mut result);
    // A name mismatch is answered after a type error and before any other decode error.
    let named = check_name(info, name, namespace, &result);
    #[cfg(debug_assertions)]
    let sent = result.clone();
    match strategy.decode_viewed(result) {
        Ok((decoded, view)) => {
            #[cfg(debug_assertions)]
            assert_eq!(
                type_error(&sent),
                None,
                "the kind's type took an object with a value of the wrong type"
            );
            named?;
            Ok((decoded, view, warnings))
        }
        Err(e) => {
            let result = apply()?;
            if let Some(why) = type_error(&result) {
                return Err(invalid_patch(&result, why));
            }
            named?;
            Err(invalid_patch(&Value::Null, e))
        }
    }
}

/// A strategic-merge failure as upstream's patch handler answers it
/// (`interpretStrategicMergePatchError`, then `ErrorToAPIStatus` for plain errors).
fn smp_error(error: capstan_machinery::smp::SmpError) -> ApiError {
    use capstan_machinery::smp::SmpErrorKind;
    match error.kind {
        SmpErrorKind::BadRequest => ApiError::bad_request(error.message),
        SmpErrorKind::Unprocessable => ApiError::new(
            422,
            Reason::Invalid,
            "the server rejected our request due to an error in our request",
        )
        .with_details(capstan_machinery::status::Details::default()),
        SmpErrorKind::Internal => ApiError::new(500, Reason::Unknown, error.message),
    }
}

/// PATCH with `application/apply-patch+yaml`: server-side apply.
pub(super) async fn apply_object(
    verb: &Verb<'_>,
    name: &str,
    bytes: &Bytes,
    options: WriteOptions,
) -> Result<Response<Body>, ApiError> {
    let (request, call, subresource) = (verb.request, verb.call, verb.subresource);
    if call.query.get("fieldManager").is_none_or(|m| m.is_empty()) {
        return Err(options_invalid(
            "PatchOptions",
            FieldError::required("fieldManager", "is required for apply patch"),
        ));
    }
    let strategy = request.registry.strategy().clone();
    let info = strategy.info();
    let mut config = yaml::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let Some(map) = config.as_object_mut() else {
        return Err(ApiError::bad_request(
            "error decoding YAML: the applied configuration is not an object",
        ));
    };
    let version = meta::text(map.get("apiVersion"));
    let kind = meta::text(map.get("kind"));
    if version != info.api_version() || kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "Incorrect version specified in apply patch. Specified patch version: {version}, expected: {}",
            info.api_version()
        )));
    }
    if meta::metadata(&config).is_some_and(|m| m.get("managedFields").is_some_and(|f| !f.is_null()))
    {
        return Err(ApiError::bad_request("metadata.managedFields must be nil"));
    }
    let unknown = strategy.unknown_fields(&config);
    if let Some(first) = unknown.first() {
        let field = first.split('"').nth(1).unwrap_or(first);
        let group_version = if info.group.is_empty() {
            format!("/{}", info.version)
        } else {
            format!("{}/{}", info.group, info.version)
        };
        return Err(ApiError::bad_request(format!(
            "failed to create typed patch object ({}/{name}; {group_version}, Kind={}): .{field}: field not declared in schema",
            request.namespace, info.kind
        )));
    }
    // An applied configuration may leave its name out: it is the URL's.
    if meta::name(&config).is_empty() {
        meta::set_meta_str(&mut config, "name", name);
    }
    check_name(info, name, &request.namespace, &config)?;
    meta::strip_type_meta(&mut config);
    if info.namespaced {
        meta::set_meta_str(&mut config, "namespace", &request.namespace);
    }
    // The typed decode only checks types: it would add defaults for required fields the
    // applier never sent, which would then count as applied.
    strategy.decode(config.clone()).map_err(|e| {
        ApiError::new(
            422,
            Reason::Invalid,
            format!(" \"\" is invalid: patch: Invalid value: \"\": {e}"),
        )
    })?;
    let force = call
        .query
        .get("force")
        .is_some_and(|f| f == "true" || f == "1" || f.is_empty());
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let (stored, created) = call
        .finish(bytes.len(), async move {
            registry
                .apply(
                    &namespace,
                    &owned_name,
                    config,
                    &options,
                    subresource,
                    force,
                )
                .await
        })
        .await?;
    let warnings = if subresource == Subresource::Status {
        Vec::new()
    } else if created {
        strategy.create_warnings(&stored)
    } else {
        strategy.warnings(&stored)
    };
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(with_warnings(
        object_response(code, strategy.as_ref(), &stored, verb.encoding, &call.query),
        &warnings,
    ))
}
