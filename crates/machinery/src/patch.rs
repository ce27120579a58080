//! JSON patch (RFC 6902) and JSON merge patch (RFC 7386) on objects, with kube-apiserver's
//! error mapping. Strategic merge and server-side apply arrive with the patch issue.

use serde_json::Value;

use crate::status::{ApiError, Reason};

/// The most operations a JSON patch may carry.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The most bytes the `copy` operations of one JSON patch may add, together (kube-apiserver's
/// `JSONPatchMaxCopyBytes`, 3 MiB): a small patch that copies a map into itself doubles it
/// with every operation.
pub const MAX_JSON_PATCH_COPY_BYTES: u64 = 3 * 1024 * 1024;

/// The deepest nesting a JSON patch may produce. Request bodies cannot nest deeper than the
/// JSON decoder's limit (128), but copying a value into its own deepest leaf doubles its depth
/// with every operation; past this the result could neither be decoded again from storage nor
/// be freed without exhausting the stack.
pub const MAX_PATCHED_DEPTH: usize = 100;

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
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
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
pub fn json_patch(target: Value, patch: &[u8]) -> Result<Value, ApiError> {
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
    // Upstream answers every failure to apply with the same text and no details of why.
    let unprocessable = || {
        ApiError::new(
            422,
            Reason::Invalid,
            "the server rejected our request due to an error in our request",
        )
        .with_details(Default::default())
    };
    let mut result = target;
    let mut copied: u64 = 0;
    // One operation at a time: a copy is measured before it runs, so no operation can blow
    // the document up first.
    for operation in &patch.0 {
        // Where a value lands, and the value: too deep a result is refused before it exists.
        let placed = match operation {
            json_patch::PatchOperation::Add(op) => Some((&op.path, Some(&op.value))),
            json_patch::PatchOperation::Replace(op) => Some((&op.path, Some(&op.value))),
            json_patch::PatchOperation::Copy(op) => {
                Some((&op.path, result.pointer(op.from.as_str())))
            }
            json_patch::PatchOperation::Move(op) => {
                Some((&op.path, result.pointer(op.from.as_str())))
            }
            _ => None,
        };
        if let Some((path, value)) = placed {
            let at = path.as_str().matches('/').count();
            if at + value.map_or(0, |v| depth_within(v, MAX_PATCHED_DEPTH + 1)) > MAX_PATCHED_DEPTH
            {
                return Err(unprocessable());
            }
        }
        if let json_patch::PatchOperation::Copy(copy) = operation {
            let size = result.pointer(copy.from.as_str()).map_or(0, serialized_len);
            copied = copied.saturating_add(size);
            if copied > MAX_JSON_PATCH_COPY_BYTES {
                return Err(unprocessable());
            }
        }
        json_patch::patch(&mut result, std::slice::from_ref(operation))
            .map_err(|_| unprocessable())?;
    }
    Ok(result)
}

/// How deep a value nests (a scalar is 0), counted without recursion and no further than
/// `limit`.
fn depth_within(value: &Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((node, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match node {
            Value::Object(map) => Box::new(map.values()),
            Value::Array(items) => Box::new(items.iter()),
            _ => continue,
        };
        let depth = depth + 1;
        deepest = deepest.max(depth);
        if deepest >= limit {
            return deepest;
        }
        stack.extend(children.map(|child| (child, depth)));
    }
    deepest
}

/// The length of a value's compact JSON encoding, without building it.
fn serialized_len(value: &Value) -> u64 {
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Applies an RFC 7386 merge patch to `target`.
pub fn merge_patch(target: Value, patch: &[u8]) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "error decoding patch: invalid JSON document",
        ));
    }
    let mut result = target;
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
        let patched =
            merge_patch(target, br#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#).expect("applies");
        assert_eq!(patched, json!({"metadata":{"labels":{"b":"2","c":"3"}}}));
    }

    #[test]
    fn failing_json_patch_test_is_422() {
        let err = json_patch(json!({"a":1}), br#"[{"op":"test","path":"/a","value":2}]"#)
            .expect_err("must fail");
        assert_eq!(err.code, 422);
    }

    #[test]
    fn copies_that_double_a_map_stop_at_the_copy_limit() {
        let mut ops = vec![json!({"op": "add", "path": "/a", "value": {"x": "a".repeat(80)}})];
        for i in 0..40 {
            ops.push(json!({"op": "copy", "from": "/a", "path": format!("/a/k{i}")}));
        }
        let body = serde_json::to_vec(&ops).expect("encodes");
        let err = json_patch(json!({}), &body).expect_err("over the copy limit");
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "the server rejected our request due to an error in our request"
        );
        // A few copies stay well inside it.
        let small = serde_json::to_vec(&ops[..4]).expect("encodes");
        let patched = json_patch(json!({}), &small).expect("applies");
        assert!(patched["a"]["k2"]["k1"]["k0"]["x"].is_string());
    }

    #[test]
    fn copies_into_their_own_deepest_leaf_stop_at_the_depth_limit() {
        // Each copy of /a into its deepest leaf doubles its depth.
        let copies = |n: u32| {
            let mut ops = vec![json!({"op": "add", "path": "/a", "value": {"": 1}})];
            for i in 0..n {
                let leaf = format!("/a{}", "/".repeat(1 << i));
                ops.push(json!({"op": "copy", "from": "/a", "path": leaf}));
            }
            serde_json::to_vec(&ops).expect("encodes")
        };
        let shallow = json_patch(json!({}), &copies(5)).expect("32 deep is fine");
        assert_eq!(depth_within(&shallow, 1000), 33);
        let err = json_patch(json!({}), &copies(12)).expect_err("too deep");
        assert_eq!(err.code, 422);
        assert_eq!(depth_within(&json!({"a": [[1]]}), 10), 3);
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
