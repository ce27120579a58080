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
    let info = request.registry.strategy().info();
    info.check_name(name, &request.namespace, &object)
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
    if options.field_manager.is_empty() {
        options.field_manager = "unknown".into();
    }
    let validation = field_validation(&call.query);
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let (patched, mut warnings) = call
        .finish(bytes.len(), async move {
            let patch = Patch {
                patch_type,
                bytes: &bytes,
                validation,
            };
            let object = (namespace.as_str(), owned_name.as_str());
            registry
                .patch_object(object, patch, &options, subresource)
                .await
        })
        .await?;
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
    info.check_name(name, &request.namespace, &config)?;
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
