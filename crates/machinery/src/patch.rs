//! JSON patch (RFC 6902) and JSON merge patch (RFC 7386) on objects, with kube-apiserver's
//! error mapping. Strategic merge and server-side apply arrive with the patch issue.

use serde_json::Value;

use crate::status::{ApiError, Reason};

/// The most operations a JSON patch may carry.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The patch formats kube-apiserver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    StrategicMerge,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// From a PATCH request's `Content-Type` (parameters ignored); anything else is a 415.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self, ApiError> {
        let essence = content_type
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::StrategicMerge),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
            _ => Err(ApiError {
                details: Some(Default::default()),
                ..ApiError::new(
                    415,
                    Reason::UnsupportedMediaType,
                    "415: Unsupported Media Type",
                )
            }),
        }
    }
}

/// Applies an RFC 6902 patch document to `target`.
pub fn json_patch(target: &Value, patch: &[u8]) -> Result<Value, ApiError> {
    let operations: Vec<Value> = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if operations.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::too_large(&format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            operations.len()
        )));
    }
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(operations))
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut result = target.clone();
    json_patch::patch(&mut result, &patch).map_err(|_| {
        ApiError::new(
            422,
            Reason::Invalid,
            "the server rejected our request due to an error in our request",
        )
    })?;
    Ok(result)
}

/// Applies an RFC 7386 merge patch to `target`.
pub fn merge_patch(target: &Value, patch: &[u8]) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "error decoding patch: invalid JSON document",
        ));
    }
    let mut result = target.clone();
    json_patch::merge(&mut result, &patch);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_adds_and_removes_labels() {
        let target = json!({"metadata":{"labels":{"a":"1","b":"2"}}});
        let patched = merge_patch(&target, br#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#)
            .expect("applies");
        assert_eq!(patched, json!({"metadata":{"labels":{"b":"2","c":"3"}}}));
    }

    #[test]
    fn failing_json_patch_test_is_422() {
        let err = json_patch(&json!({"a":1}), br#"[{"op":"test","path":"/a","value":2}]"#)
            .expect_err("must fail");
        assert_eq!(err.code, 422);
    }

    #[test]
    fn unknown_patch_type_is_415() {
        let err = PatchType::from_content_type(Some("text/plain")).expect_err("must fail");
        assert_eq!(
            (err.code, err.message.as_str()),
            (415, "415: Unsupported Media Type")
        );
        assert_eq!(
            PatchType::from_content_type(Some("application/merge-patch+json; charset=utf-8")),
            Ok(PatchType::Merge)
        );
    }
}
