//! DELETE of one object and of a collection.

use super::*;

pub(super) async fn delete(verb: Verb<'_>, name: &str) -> Result<Response<Body>, ApiError> {
    let (request, call) = (verb.request, verb.call);
    let options = delete_options(call, verb.body).await?;
    // Upstream answers 202 Accepted only to the legacy `orphanDependents: false` when the
    // object stays (its finalizers still run).
    let accepted = options.orphan_dependents == Some(false);
    let (registry, namespace, owned_name) = (
        request.registry.clone(),
        request.namespace.clone(),
        name.to_string(),
    );
    let result = call
        .finish(0, async move {
            registry.delete(&namespace, &owned_name, &options).await
        })
        .await?;
    let strategy = request.registry.strategy();
    let info = strategy.info();
    if info.delete_returns_object || !result.removed {
        let status = if accepted && !result.removed {
            StatusCode::ACCEPTED
        } else {
            StatusCode::OK
        };
        return Ok(object_response(
            status,
            strategy.as_ref(),
            &result.object,
            verb.encoding,
            &call.query,
        ));
    }
    let details = Details {
        name: name.to_string(),
        group: info.group.to_string(),
        kind: info.plural.to_string(),
        uid: meta::meta_str(&result.object, "uid").to_string(),
        ..Details::default()
    };
    let status = success_status(&details);
    Ok(match verb.encoding.negotiated.output {
        Output::Protobuf => crate::request::protobuf_response(StatusCode::OK, &status, None),
        _ => json_response(StatusCode::OK, &status, verb.encoding.pretty),
    })
}

pub(super) async fn delete_collection(verb: Verb<'_>) -> Result<Response<Body>, ApiError> {
    let (request, call) = (verb.request, verb.call);
    let options = delete_options(call, verb.body).await?;
    let list = list_options(request, &call.query)?;
    // Not bound by the write timeout (as upstream), only by the request's own deadline.
    let (registry, namespace) = (request.registry.clone(), request.namespace.clone());
    let deadline = call
        .admission
        .deadline
        .unwrap_or_else(|| tokio::time::Instant::now() + crate::limits::WRITE_TIMEOUT);
    let result = crate::limits::finish(deadline, false, call.admission.slot.clone(), async move {
        registry
            .delete_collection(&namespace, &list, &options)
            .await
    })
    .await?;
    Ok(list_response(request, call, verb.encoding, result))
}
