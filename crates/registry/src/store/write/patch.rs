//! PATCH with a JSON patch, a merge patch or a strategic merge patch: the patch applied to the
//! stored object inside the write's loop (again on a conflict), the result checked as
//! upstream's patcher checks it (unknown fields by `fieldValidation`, a type error, the kind,
//! the name), then written as an update. Server-side apply is [`Registry::apply`].

use capstan_machinery::patch::{self, PatchType};
use capstan_machinery::{Reason, meta};

use super::*;
use crate::under_write::UnderWrite;

/// What to do about fields the kind does not declare (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them quietly.
    Ignore,
    /// Drop them with a warning each (the default).
    Warn,
    /// Refuse the write.
    Strict,
}

/// A PATCH request's patch.
#[derive(Debug, Clone, Copy)]
pub struct Patch<'a> {
    /// JSON patch, merge patch or strategic merge patch (apply is [`Registry::apply`]).
    pub patch_type: PatchType,
    /// The patch as sent.
    pub bytes: &'a [u8],
    /// What to do about unknown fields in the patched object.
    pub validation: FieldValidation,
}

impl Registry {
    /// Patches the object `namespace/name` through `subresource`: answers the patched object
    /// as stored, and the warnings its unknown fields earned (which a refused write carries
    /// too, as upstream records them before it refuses).
    pub async fn patch_object(
        &self,
        (namespace, name): (&str, &str),
        patch: Patch<'_>,
        options: &WriteOptions,
        subresource: Subresource,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let strategic: Option<Value> = if patch.patch_type == PatchType::StrategicMerge {
            let value: Value = serde_json::from_slice(patch.bytes)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if !value.is_object() {
                return Err(ApiError::bad_request("invalid JSON document"));
            }
            Some(value)
        } else {
            None
        };
        let input = PatchInput {
            patch_type: patch.patch_type,
            bytes: patch.bytes,
            strategic: strategic.as_ref(),
            strategy: self.strategy.as_ref(),
            name,
            namespace,
            validation: patch.validation,
        };
        // The patched object's unknown fields, once it decoded: upstream records them then,
        // so a write refused afterwards (invalid, conflicting) goes out with them.
        let recorded = std::sync::Mutex::new(Vec::<String>::new());
        // The patched object comes in its type's form (decoded into the type and encoded
        // again), with the rules' view of it: defaulting and the other rules start from that
        // object instead of decoding the JSON again.
        let written = self
            .patch_with(
                (namespace, name),
                options,
                subresource,
                Reads::Whole,
                |current| {
                    let (result, problems) = patched_object(&input, current.whole()?)?;
                    *recorded.lock().unwrap_or_else(|e| e.into_inner()) = problems;
                    Ok(result)
                },
            )
            .await;
        let warnings = recorded.into_inner().unwrap_or_else(|e| e.into_inner());
        match written {
            Ok(patched) => Ok((patched, warnings)),
            Err(error) => Err(error.after_warnings(&warnings)),
        }
    }
}

/// What a (non-apply) patch needs to turn the stored object into the patched one.
struct PatchInput<'a> {
    patch_type: PatchType,
    bytes: &'a [u8],
    strategic: Option<&'a Value>,
    strategy: &'a dyn DynStrategy,
    name: &'a str,
    namespace: &'a str,
    validation: FieldValidation,
}

/// Applies a JSON, merge or strategic merge patch to the stored object (`current`, as stored:
/// the patch applies to a copy with kind and apiVersion) and checks the result as upstream
/// does; returns it in its type's form, under write (its rules take the typed object decoded
/// here), and the unknown-field warnings to send.
fn patched_object(
    input: &PatchInput<'_>,
    current: &Value,
) -> Result<(UnderWrite, Vec<String>), ApiError> {
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
    let named = info.check_name(name, namespace, &result);
    #[cfg(debug_assertions)]
    let sent = result.clone();
    match strategy.decode_for_write(result) {
        Ok(decoded) => {
            #[cfg(debug_assertions)]
            assert_eq!(
                type_error(&sent),
                None,
                "the kind's type took an object with a value of the wrong type"
            );
            named?;
            Ok((decoded, warnings))
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
