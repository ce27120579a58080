//! Name, label and annotation rules (`k8s.io/apimachinery/pkg/util/validation`) and the generic
//! `ObjectMeta` checks every resource shares.

use serde_json::{Map, Value, json};

use crate::field::{FieldError, FieldErrors};

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_KEY_MSG: &str = "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// The detail for a port number out of range.
pub const PORT_RANGE: &str = "must be between 1 and 65535, inclusive";

/// Whether a JSON value is a port number (1–65535).
pub fn is_port(value: &Value) -> bool {
    value.as_i64().is_some_and(|p| (1..=65535).contains(&p))
}

/// The total size allowed for all annotations of one object.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

fn max_len(text: &str, max: usize) -> Option<String> {
    (text.len() > max).then(|| format!("must be no more than {max} characters"))
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn dns1123_label_shape(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        && is_lower_alnum(bytes[0])
        && is_lower_alnum(bytes[bytes.len() - 1])
}

/// RFC 1123 label (what 1.36 requires of Service names and namespaces).
pub fn dns1123_label(text: &str) -> Vec<String> {
    let mut errors: Vec<String> = max_len(text, 63).into_iter().collect();
    if !dns1123_label_shape(text) {
        // A valid subdomain that is not a label (its length was checked above) has dots.
        if is_dns1123_subdomain(text) {
            errors.push("must not contain dots".to_string());
        } else {
            errors.push(DNS1123_LABEL_MSG.to_string());
        }
    }
    errors
}

fn is_dns1123_subdomain(text: &str) -> bool {
    !text.is_empty() && text.split('.').all(dns1123_label_shape)
}

/// RFC 1123 subdomain (names of most objects).
pub fn dns1123_subdomain(text: &str) -> Vec<String> {
    let mut errors: Vec<String> = max_len(text, 253).into_iter().collect();
    if !is_dns1123_subdomain(text) {
        errors.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    errors
}

/// RFC 1035 label (port names' stricter relative; kept for resources that still use it).
pub fn dns1035_label(text: &str) -> Vec<String> {
    let mut errors: Vec<String> = max_len(text, 63).into_iter().collect();
    let bytes = text.as_bytes();
    let ok = !bytes.is_empty()
        && bytes[0].is_ascii_lowercase()
        && bytes.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        && is_lower_alnum(bytes[bytes.len() - 1]);
    if !ok {
        errors.push(DNS1035_LABEL_MSG.to_string());
    }
    errors
}

fn name_part_ok(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// Whether `text` is a qualified name ([`qualified_name`] finds nothing wrong), checked
/// without building anything.
fn is_qualified_name(text: &str) -> bool {
    let (prefix, name) = match text.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, text),
    };
    !name.contains('/')
        && prefix.is_none_or(|p| p.len() <= 253 && is_dns1123_subdomain(p))
        && name.len() <= 63
        && name_part_ok(name)
}

/// Qualified name: `[prefix/]name` (label keys, annotation keys, finalizers).
pub fn qualified_name(text: &str) -> Vec<String> {
    if is_qualified_name(text) {
        return Vec::new();
    }
    qualified_name_problems(text)
}

/// What is wrong with `text` as a qualified name, each problem in upstream's words.
fn qualified_name_problems(text: &str) -> Vec<String> {
    let parts: Vec<&str> = text.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => return vec![LABEL_KEY_MSG.to_string()],
    };
    let mut errors = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errors.push("prefix part must be non-empty".to_string());
        } else {
            errors.extend(
                dns1123_subdomain(prefix)
                    .into_iter()
                    .map(|m| format!("prefix part {m}")),
            );
        }
    }
    if name.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            errors.push("name part must be no more than 63 characters".to_string());
        }
        if !name_part_ok(name) {
            errors.push(QUALIFIED_NAME_MSG.to_string());
        }
    }
    errors
}

/// Label value.
pub fn label_value(text: &str) -> Vec<String> {
    let mut errors: Vec<String> = max_len(text, 63).into_iter().collect();
    if !text.is_empty() && !name_part_ok(text) {
        errors.push(LABEL_VALUE_MSG.to_string());
    }
    errors
}

/// Checks a `map[string]string` of labels at `path`.
pub fn validate_labels(labels: &Map<String, Value>, path: &str) -> FieldErrors {
    let mut errors = FieldErrors::new();
    for (key, value) in labels {
        match value.as_str() {
            Some(text) => errors.extend(validate_label_pairs([(key.as_ref(), text)], path)),
            None => {
                for message in qualified_name(key) {
                    errors.push(FieldError::invalid(path, &json!(key), message));
                }
                errors.push(FieldError::invalid(path, value, "must be a string"));
            }
        }
    }
    errors
}

/// Checks label keys and values (a typed `map[string]string`) at `path`.
pub fn validate_label_pairs<'a>(
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
    path: &str,
) -> FieldErrors {
    let mut errors = FieldErrors::new();
    for (key, value) in labels {
        for message in qualified_name(key) {
            errors.push(FieldError::invalid(path, &json!(key), message));
        }
        for message in label_value(value) {
            errors.push(FieldError::invalid(path, &json!(value), message));
        }
    }
    errors
}

/// Checks annotation keys and their total size.
pub fn validate_annotations(annotations: &Map<String, Value>, path: &str) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let mut total = 0usize;
    for (key, value) in annotations {
        // Judged in lower case (most keys are already).
        let lower = match key.is_ascii() && !key.bytes().any(|b| b.is_ascii_uppercase()) {
            true => std::borrow::Cow::Borrowed(key.as_str()),
            false => std::borrow::Cow::Owned(key.to_lowercase()),
        };
        for message in qualified_name(&lower) {
            errors.push(FieldError::invalid(path, &json!(key), message));
        }
        total += key.len() + value.as_str().map_or(0, str::len);
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errors.push(FieldError::too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errors
}

/// The generic `ObjectMeta` rules of a create (labels, annotations, owner references,
/// finalizers). Name rules belong to the resource.
pub fn validate_object_meta(meta: &Map<String, Value>) -> FieldErrors {
    let mut errors = validate_object_meta_update(meta);
    if let Some(finalizers) = meta.get("finalizers").and_then(Value::as_array) {
        errors.extend(validate_finalizers(finalizers));
    }
    errors
}

/// The `ObjectMeta` rules an update judges again (ValidateObjectMetaAccessorUpdate: labels,
/// annotations, owner references; finalizers are not).
pub fn validate_object_meta_update(meta: &Map<String, Value>) -> FieldErrors {
    let mut errors = FieldErrors::new();
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        errors.extend(validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        errors.extend(validate_annotations(annotations, "metadata.annotations"));
    }
    // Upstream's ValidateOwnerReferences, then ValidateFinalizers: both report at the list's
    // path, without an index.
    if let Some(owners) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut first_controller: Option<(&str, &str)> = None;
        for owner in owners {
            let text = |field: &str| crate::meta::text(owner.get(field));
            let version = text("apiVersion").rsplit('/').next().unwrap_or_default();
            if version.is_empty() {
                errors.push(FieldError::invalid(
                    "metadata.ownerReferences.apiVersion",
                    &json!(text("apiVersion")),
                    "version must not be empty",
                ));
            }
            for field in ["kind", "name", "uid"] {
                if text(field).is_empty() {
                    errors.push(FieldError::invalid(
                        format!("metadata.ownerReferences.{field}"),
                        &json!(""),
                        "must not be empty",
                    ));
                }
            }
            if owner.get("controller").and_then(Value::as_bool) == Some(true) {
                let this = (text("kind"), text("name"));
                match first_controller {
                    Some((kind, name)) => errors.push(FieldError::invalid(
                        "metadata.ownerReferences",
                        &Value::Array(owners.clone()),
                        format!(
                            "Only one reference can have Controller set to true. Found \"true\" in references for {kind}/{name} and {}/{}",
                            this.0, this.1
                        ),
                    )),
                    None => first_controller = Some(this),
                }
            }
        }
    }
    errors
}

/// `ValidateFinalizers`: qualified names, and not both `orphan` and `foregroundDeletion`; at
/// the list's path.
fn validate_finalizers(finalizers: &[Value]) -> FieldErrors {
    let mut errors = FieldErrors::new();
    let mut has_orphan = false;
    let mut has_foreground = false;
    for finalizer in finalizers {
        let text = finalizer.as_str().unwrap_or_default();
        for message in qualified_name(text) {
            errors.push(FieldError::invalid(
                "metadata.finalizers",
                finalizer,
                message,
            ));
        }
        has_orphan |= text == "orphan";
        has_foreground |= text == "foregroundDeletion";
    }
    if has_orphan && has_foreground {
        errors.push(FieldError::invalid(
            "metadata.finalizers",
            &Value::Array(finalizers.to_vec()),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errors
}

/// The finalizers Kubernetes itself defines (`IsStandardFinalizerName`).
pub const STANDARD_FINALIZERS: &[&str] = &["kubernetes", "orphan", "foregroundDeletion"];

/// The core group's extra rule (`validateKubeFinalizerName`): a finalizer without a `/` must
/// be a standard one.
pub fn kube_finalizer_name(name: &str) -> Vec<String> {
    if name.contains('/') || STANDARD_FINALIZERS.contains(&name) {
        Vec::new()
    } else {
        vec!["name is neither a standard finalizer name nor is it fully qualified".to_string()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1123_labels_may_start_with_a_digit() {
        assert!(dns1123_label("1svc").is_empty());
        assert_eq!(
            dns1123_label("Bad_Name"),
            vec![DNS1123_LABEL_MSG.to_string()]
        );
        assert_eq!(
            dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
        // 1.36: a valid subdomain that is not a label is told about its dots.
        assert_eq!(dns1123_label("web.v2"), vec!["must not contain dots"]);
        assert_eq!(dns1123_label("a..b"), vec![DNS1123_LABEL_MSG.to_string()]);
        assert_eq!(
            dns1123_label(&format!("{}.b", "a".repeat(63))),
            vec![
                "must be no more than 63 characters",
                "must not contain dots"
            ]
        );
    }

    #[test]
    fn the_quick_check_of_a_qualified_name_finds_what_the_full_one_does() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::default();
        let text = "[a-zA-Z0-9./_-]{0,4}(/[a-z0-9.-]{0,3})?(/[a-zA-Z0-9._-]{0,3})?";
        let long = (0usize..2, 60usize..70, 250usize..256).prop_map(|(slash, name, prefix)| {
            let name = "n".repeat(name);
            if slash == 0 {
                name
            } else {
                format!("{}/{name}", "p".repeat(prefix))
            }
        });
        runner
            .run(&prop_oneof![text.prop_map(String::from), long], |t| {
                prop_assert_eq!(
                    is_qualified_name(&t),
                    qualified_name_problems(&t).is_empty(),
                    "{:?}",
                    t
                );
                Ok(())
            })
            .expect("agree");
    }

    #[test]
    fn qualified_names_allow_a_subdomain_prefix() {
        assert!(qualified_name("example.com/my-key").is_empty());
        assert!(qualified_name("app").is_empty());
        assert_eq!(qualified_name("-a"), vec![QUALIFIED_NAME_MSG.to_string()]);
        assert_eq!(qualified_name("a/b/c"), vec![LABEL_KEY_MSG.to_string()]);
    }

    #[test]
    fn label_values_may_be_empty() {
        assert!(label_value("").is_empty());
        assert_eq!(label_value("a b"), vec![LABEL_VALUE_MSG.to_string()]);
    }
}
