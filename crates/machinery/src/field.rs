//! Field errors (`field.ErrorList` upstream): what `Invalid` responses carry.

use serde_json::Value;

/// One entry of `details.causes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `reason` (a `CauseType` such as `FieldValueInvalid`); empty is omitted.
    pub reason: String,
    /// Human-readable text.
    pub message: String,
    /// The field path; empty is omitted.
    pub field: String,
}

/// A field's path, put into words only when an error names it (upstream's `field.Path`):
/// `FieldPath::root("subsets").index(0).child("addresses")` reads `subsets[0].addresses`.
/// Validation walks every element of a list; building each one's path as a `String` first
/// cost more than the checks themselves.
#[derive(Debug, Clone, Copy)]
pub struct FieldPath<'a> {
    parent: Option<&'a FieldPath<'a>>,
    step: Step<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Step<'a> {
    Field(&'a str),
    Index(usize),
}

impl<'a> FieldPath<'a> {
    /// A top-level field.
    pub fn root(name: &'a str) -> Self {
        FieldPath {
            parent: None,
            step: Step::Field(name),
        }
    }

    /// A field of this one.
    pub fn child(&'a self, name: &'a str) -> FieldPath<'a> {
        FieldPath {
            parent: Some(self),
            step: Step::Field(name),
        }
    }

    /// An element of this list.
    pub fn index(&'a self, index: usize) -> FieldPath<'a> {
        FieldPath {
            parent: Some(self),
            step: Step::Index(index),
        }
    }
}

impl std::fmt::Display for FieldPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(parent) = self.parent {
            parent.fmt(f)?;
        }
        match self.step {
            Step::Field(name) if self.parent.is_some() => write!(f, ".{name}"),
            Step::Field(name) => f.write_str(name),
            Step::Index(index) => write!(f, "[{index}]"),
        }
    }
}

impl From<&FieldPath<'_>> for String {
    fn from(path: &FieldPath<'_>) -> String {
        path.to_string()
    }
}

/// The kind of a field error (`field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// `FieldValueNotFound`.
    NotFound,
    /// `FieldValueRequired`.
    Required,
    /// `FieldValueDuplicate`.
    Duplicate,
    /// `FieldValueInvalid`.
    Invalid,
    /// `FieldValueNotSupported`.
    NotSupported,
    /// `FieldValueForbidden`.
    Forbidden,
    /// `FieldValueTooLong`.
    TooLong,
    /// `FieldValueTooMany`.
    TooMany,
    /// `InternalError`.
    Internal,
    /// `FieldValueTypeInvalid`.
    TypeInvalid,
}

impl ErrorType {
    /// The `reason` of the cause.
    pub fn cause_type(self) -> &'static str {
        match self {
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::Internal => "InternalError",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    fn text(self) -> &'static str {
        match self {
            ErrorType::NotFound => "Not found",
            ErrorType::Required => "Required value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Invalid | ErrorType::TypeInvalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::Internal => "Internal error",
        }
    }

    fn shows_value(self) -> bool {
        !matches!(
            self,
            ErrorType::Required | ErrorType::Forbidden | ErrorType::TooLong | ErrorType::Internal
        )
    }
}

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// What is wrong.
    pub kind: ErrorType,
    /// The field path, e.g. `spec.ports[0].port`.
    pub field: String,
    /// The offending value as the message shows it (JSON, as kube-apiserver 1.36 prints it).
    pub value: String,
    /// Explanation.
    pub detail: String,
}

impl FieldError {
    fn new(kind: ErrorType, field: impl Into<String>, value: String, detail: String) -> Self {
        FieldError {
            kind,
            field: field.into(),
            value,
            detail,
        }
    }

    /// `Invalid value: <value>: <detail>`.
    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Invalid, field, render(value), detail.into())
    }

    /// `Required value[: <detail>]`.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Required, field, String::new(), detail.into())
    }

    /// `Forbidden: <detail>`.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, field, String::new(), detail.into())
    }

    /// `Duplicate value: <value>`.
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Self::new(ErrorType::Duplicate, field, render(value), String::new())
    }

    /// `Not found: <value>`.
    pub fn not_found(field: impl Into<String>, value: &Value) -> Self {
        Self::new(ErrorType::NotFound, field, render(value), String::new())
    }

    /// `Unsupported value: <value>: supported values: "a", "b"`.
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = supported.iter().map(|s| capstan_gostd::quote(s)).collect();
            format!("supported values: {}", list.join(", "))
        };
        Self::new(ErrorType::NotSupported, field, render(value), detail)
    }

    /// `Too long: may not be more than <max> bytes`.
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self::new(
            ErrorType::TooLong,
            field,
            String::new(),
            format!("may not be more than {max} bytes"),
        )
    }

    /// `Too many: <actual>: must have at most <max> items`.
    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> Self {
        Self::new(
            ErrorType::TooMany,
            field,
            actual.to_string(),
            format!("must have at most {max} items"),
        )
    }

    /// `Internal error: <detail>`.
    pub fn internal(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Internal, field, String::new(), detail.into())
    }

    /// The cause's `message`: type text, value, detail.
    pub fn body(&self) -> String {
        let mut text = self.kind.text().to_string();
        if self.kind.shows_value() {
            text.push_str(": ");
            text.push_str(&self.value);
        }
        if !self.detail.is_empty() {
            text.push_str(": ");
            text.push_str(&self.detail);
        }
        text
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.body())
        } else {
            write!(f, "{}: {}", self.field, self.body())
        }
    }
}

/// How 1.36 prints a bad value inside a field error (`ErrorBody`): a string quoted as Go's
/// `%q` quotes it, anything else as JSON (Go's escapes and all).
pub fn render(value: &Value) -> String {
    match value {
        Value::String(text) => capstan_gostd::quote(text),
        _ => String::from_utf8(crate::json::to_vec(value)).unwrap_or_else(|_| "null".into()),
    }
}

/// An ordered list of field errors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    /// One `Invalid value` error at `path` for each problem `rule` finds with `value` (the
    /// format rules of [`crate::validation`]).
    pub fn check<M: Into<String>>(
        &mut self,
        path: impl Into<String>,
        value: &str,
        rule: impl FnOnce(&str) -> Vec<M>,
    ) {
        let messages = rule(value);
        if messages.is_empty() {
            return;
        }
        // Put into words only when there is something wrong (a `&FieldPath` is built here).
        let path = path.into();
        for message in messages {
            self.push(FieldError::invalid(
                path.clone(),
                &Value::String(value.into()),
                message,
            ));
        }
    }

    /// No errors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one.
    pub fn push(&mut self, error: FieldError) {
        self.0.push(error);
    }

    /// Adds several.
    pub fn extend(&mut self, other: FieldErrors) {
        self.0.extend(other.0);
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `field: body` for one error, `[e1, e2]` for several, duplicates removed.
    pub fn aggregate(&self) -> String {
        let mut seen = std::collections::HashSet::new();
        let texts: Vec<String> = self
            .0
            .iter()
            .map(|e| e.to_string())
            .filter(|t| seen.insert(t.clone()))
            .collect();
        if texts.len() == 1 {
            texts.into_iter().next().unwrap_or_default()
        } else {
            format!("[{}]", texts.join(", "))
        }
    }

    /// `details.causes`.
    pub fn causes(&self) -> Vec<Cause> {
        self.0
            .iter()
            .map(|e| Cause {
                reason: e.kind.cause_type().to_string(),
                message: e.body(),
                field: e.field.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A string as Go's `%q` quotes it (no HTML escapes, `\x` for control bytes), anything
    /// else as Go's encoder writes JSON.
    #[test]
    fn bad_values_render_as_upstreams_error_body() {
        assert_eq!(render(&json!("a<b>&\u{1}")), r#""a<b>&\x01""#);
        assert_eq!(render(&json!({"k": "a<b"})), r#"{"k":"a\u003cb"}"#);
        assert_eq!(render(&json!(5)), "5");
        assert_eq!(render(&Value::Null), "null");
    }

    #[test]
    fn bodies_read_like_upstream() {
        assert_eq!(
            FieldError::invalid(
                "spec.ports[0].port",
                &json!(0),
                "must be between 1 and 65535, inclusive"
            )
            .to_string(),
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            FieldError::not_supported("spec.type", &json!("X"), &["ClusterIP", "NodePort"]).body(),
            "Unsupported value: \"X\": supported values: \"ClusterIP\", \"NodePort\""
        );
        assert_eq!(
            FieldError::required("spec.ports", "").body(),
            "Required value"
        );
    }

    #[test]
    fn several_errors_aggregate_in_brackets_without_duplicates() {
        let mut errors = FieldErrors::new();
        errors.push(FieldError::required("a", ""));
        errors.push(FieldError::required("a", ""));
        errors.push(FieldError::required("b", ""));
        assert_eq!(errors.aggregate(), "[a: Required value, b: Required value]");
    }

    #[test]
    fn a_field_path_reads_as_upstream_writes_it_and_only_when_an_error_names_it() {
        let subsets = FieldPath::root("subsets");
        let subset = subsets.index(1);
        let address = subset.child("addresses");
        assert_eq!(
            address.index(0).child("ip").to_string(),
            "subsets[1].addresses[0].ip"
        );
        let mut errors = FieldErrors::new();
        errors.check(&subset.child("hostname"), "ok", |_| Vec::<String>::new());
        errors.check(&subset.child("nodeName"), "No", |v| {
            vec![format!("{v} is bad")]
        });
        assert_eq!(
            errors.aggregate(),
            "subsets[1].nodeName: Invalid value: \"No\": No is bad"
        );
    }
}
