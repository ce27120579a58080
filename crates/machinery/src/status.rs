//! `metav1.Status` errors with kube-apiserver's reasons, codes and message templates.

use serde_json::{Map, Value, json};

use crate::field::{Cause, FieldErrors};
use capstan_gostd::quote;

/// `metav1.StatusReason` values Capstan produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No reason (raw internal errors).
    Unknown,
    /// 401.
    Unauthorized,
    /// 403.
    Forbidden,
    /// 404.
    NotFound,
    /// 409 on create.
    AlreadyExists,
    /// 409 on a stale write.
    Conflict,
    /// 410 for a resource version outside the retained history.
    Expired,
    /// 422.
    Invalid,
    /// 504.
    Timeout,
    /// 500 with a retryable message.
    ServerTimeout,
    /// 400.
    BadRequest,
    /// 405.
    MethodNotAllowed,
    /// 406.
    NotAcceptable,
    /// 413.
    RequestEntityTooLarge,
    /// 415.
    UnsupportedMediaType,
    /// 429.
    TooManyRequests,
    /// 500.
    InternalError,
    /// 503.
    ServiceUnavailable,
}

impl Reason {
    /// The wire spelling (`""` for [`Reason::Unknown`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Unknown => "",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::NotFound => "NotFound",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Expired => "Expired",
            Reason::Invalid => "Invalid",
            Reason::Timeout => "Timeout",
            Reason::ServerTimeout => "ServerTimeout",
            Reason::BadRequest => "BadRequest",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::NotAcceptable => "NotAcceptable",
            Reason::RequestEntityTooLarge => "RequestEntityTooLarge",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::InternalError => "InternalError",
            Reason::ServiceUnavailable => "ServiceUnavailable",
        }
    }
}

/// `metav1.StatusDetails`; empty members are omitted on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    /// The object's name.
    pub name: String,
    /// The API group (empty for core).
    pub group: String,
    /// The resource plural (NotFound, AlreadyExists, Conflict) or Kind (Invalid).
    pub kind: String,
    /// The object's uid.
    pub uid: String,
    /// Per-field causes.
    pub causes: Vec<Cause>,
    /// Seconds a client should wait before retrying (also sent as `Retry-After`).
    pub retry_after_seconds: i32,
}

/// A failed request, rendered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason.
    pub reason: Reason,
    /// Human-readable message.
    pub message: String,
    /// `details`, when present (boxed: errors travel in every `Result`).
    pub details: Option<Box<Details>>,
    /// `metadata.continue` (only for expired continue tokens).
    pub continue_token: Option<String>,
    /// `Warning` headers the request had earned before it failed (upstream writes each
    /// warning to the response as it is recorded, so an error answer carries them too).
    pub warnings: Vec<String>,
}

/// A resource as error messages name it: plural resource and API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupResource<'a> {
    /// API group; empty for core.
    pub group: &'a str,
    /// Plural resource name.
    pub resource: &'a str,
}

impl std::fmt::Display for GroupResource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// The cause reason of a create refused because its namespace is being deleted
/// (`v1.NamespaceTerminatingCause`).
pub const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";

impl ApiError {
    /// An error with a code, reason and message and no details.
    pub fn new(code: u16, reason: Reason, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            continue_token: None,
            warnings: Vec::new(),
        }
    }

    /// The error with `earlier` warnings before its own (those recorded before the step
    /// that failed).
    pub fn after_warnings(mut self, earlier: &[String]) -> Self {
        if !earlier.is_empty() {
            self.warnings.splice(0..0, earlier.iter().cloned());
        }
        self
    }

    /// The error with these details.
    pub fn with_details(mut self, details: Details) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    fn about(gr: GroupResource<'_>, name: &str) -> Details {
        Details {
            name: name.to_string(),
            group: gr.group.to_string(),
            kind: gr.resource.to_string(),
            ..Details::default()
        }
    }

    /// `<resource> "<name>" <what>`, with the object named in the details.
    fn named(code: u16, reason: Reason, gr: GroupResource<'_>, name: &str, what: &str) -> Self {
        let message = format!("{gr} {} {what}", quote(name));
        Self::new(code, reason, message).with_details(Self::about(gr, name))
    }

    /// 404 `<resource> "<name>" not found`.
    pub fn not_found(gr: GroupResource<'_>, name: &str) -> Self {
        Self::named(404, Reason::NotFound, gr, name, "not found")
    }

    /// 409 `<resource> "<name>" already exists`.
    pub fn already_exists(gr: GroupResource<'_>, name: &str) -> Self {
        Self::named(409, Reason::AlreadyExists, gr, name, "already exists")
    }

    /// 409 for a generateName that kept colliding.
    pub fn generate_name_exhausted(gr: GroupResource<'_>, name: &str) -> Self {
        let mut details = Self::about(gr, name);
        details.retry_after_seconds = 1;
        Self::new(
            409,
            Reason::AlreadyExists,
            format!(
                "{gr} {} already exists, the server was not able to generate a unique name for the object",
                quote(name)
            ),
        )
        .with_details(details)
    }

    /// 409 `Operation cannot be fulfilled on <resource> "<name>": <why>`.
    pub fn conflict(gr: GroupResource<'_>, name: &str, why: &str) -> Self {
        Self::new(
            409,
            Reason::Conflict,
            format!(
                "Operation cannot be fulfilled on {gr} {}: {why}",
                quote(name)
            ),
        )
        .with_details(Self::about(gr, name))
    }

    /// The optimistic-concurrency conflict.
    pub fn modified(gr: GroupResource<'_>, name: &str) -> Self {
        Self::conflict(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 `<Kind> "<name>" is invalid: <errors>`. `group_kind` is `Kind` or `Kind.group`.
    pub fn invalid(group: &str, group_kind: &str, name: &str, errors: &FieldErrors) -> Self {
        let message = if errors.is_empty() {
            format!("{group_kind} {} is invalid", quote(name))
        } else {
            format!(
                "{group_kind} {} is invalid: {}",
                quote(name),
                errors.aggregate()
            )
        };
        let kind = group_kind
            .split('.')
            .next()
            .unwrap_or(group_kind)
            .to_string();
        Self::new(422, Reason::Invalid, message).with_details(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind,
            causes: errors.causes(),
            ..Details::default()
        })
    }

    /// 400 with free text.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, Reason::BadRequest, message)
    }

    /// 500 `Internal error occurred: <err>`.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        let text = err.to_string();
        Self::new(
            500,
            Reason::InternalError,
            format!("Internal error occurred: {text}"),
        )
        .with_details(Details {
            causes: vec![Cause {
                reason: String::new(),
                message: text,
                field: String::new(),
            }],
            ..Details::default()
        })
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(401, Reason::Unauthorized, "Unauthorized")
    }

    /// 404 for an unknown resource under a served group version.
    pub fn resource_not_found() -> Self {
        Self::new(
            404,
            Reason::NotFound,
            "the server could not find the requested resource",
        )
        .with_details(Details::default())
    }

    /// 405 for a method the path does not route.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            Reason::MethodNotAllowed,
            "the server does not allow this method on the requested resource",
        )
        .with_details(Details::default())
    }

    /// 406 listing what can be served.
    pub fn not_acceptable(accepted: &[&str]) -> Self {
        Self::new(
            406,
            Reason::NotAcceptable,
            format!(
                "only the following media types are accepted: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 406 from upstream's router (go-restful) when no type the route produces is accepted:
    /// its text, with empty details (`NewGenericServerResponse`).
    pub fn route_not_acceptable(produces: &[&str]) -> Self {
        Self::new(
            406,
            Reason::NotAcceptable,
            format!(
                "406: Not Acceptable\n\nAvailable representations: {}",
                produces.join(", ")
            ),
        )
        .with_details(Details::default())
    }

    /// 415 for a request body in an unknown format.
    pub fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            Reason::UnsupportedMediaType,
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 413 `Request entity too large: <what>`.
    pub fn too_large(what: &str) -> Self {
        Self::new(
            413,
            Reason::RequestEntityTooLarge,
            format!("Request entity too large: {what}"),
        )
    }

    /// 410 Expired with a message.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, Reason::Expired, message)
    }

    /// 504 for a resourceVersion the store has not reached.
    pub fn too_large_resource_version(requested: i64, current: i64) -> Self {
        Self::new(
            504,
            Reason::Timeout,
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        )
        .with_details(Details {
            causes: vec![Cause {
                reason: "ResourceVersionTooLarge".into(),
                message: "Too large resource version".into(),
                field: String::new(),
            }],
            retry_after_seconds: 1,
            ..Details::default()
        })
    }

    /// 504 `Timeout: <message>` with empty details (`apierrors.NewTimeoutError(message, 0)`).
    pub fn timeout(message: &str) -> Self {
        Self::new(504, Reason::Timeout, format!("Timeout: {message}"))
            .with_details(Details::default())
    }

    /// What a write too large for the store answers: etcd's refusal, passed through by
    /// kube-apiserver as a reasonless 500.
    pub fn request_too_large_for_storage() -> Self {
        Self::new(500, Reason::Unknown, "etcdserver: request is too large")
    }

    /// 503 with a retry hint.
    pub fn unavailable(message: impl Into<String>, retry_after_seconds: i32) -> Self {
        Self::new(503, Reason::ServiceUnavailable, message).with_details(Details {
            retry_after_seconds,
            ..Details::default()
        })
    }

    /// Whether this is a 404 (the object, or its namespace, does not exist).
    pub fn is_not_found(&self) -> bool {
        self.code == 404
    }

    /// Whether this is a 409 (the object exists, or changed since it was read).
    pub fn is_conflict(&self) -> bool {
        self.code == 409
    }

    /// Whether a create was refused because its namespace is being deleted (a cause
    /// [`NAMESPACE_TERMINATING`], as client-go's `HasStatusCause` checks): the controllers
    /// drop such work instead of retrying it.
    pub fn is_namespace_terminating(&self) -> bool {
        self.details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == NAMESPACE_TERMINATING))
    }

    /// 400 `the name of the object (<sent>) does not match the name on the URL (<url>)`.
    pub fn name_mismatch(sent: &str, url: &str) -> Self {
        Self::bad_request(format!(
            "the name of the object ({sent}) does not match the name on the URL ({url})"
        ))
    }

    /// 400 for a body naming another namespace than the URL.
    pub fn namespace_mismatch() -> Self {
        Self::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    }

    /// 400 `the API version in the data (<sent>) does not match the expected API version
    /// (<expected>)`.
    pub fn version_mismatch(sent: &str, expected: &str) -> Self {
        Self::bad_request(format!(
            "the API version in the data ({sent}) does not match the expected API version ({expected})"
        ))
    }

    /// `retryAfterSeconds`, for the `Retry-After` header.
    pub fn retry_after(&self) -> Option<i32> {
        self.details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
    }

    /// The `metav1.Status` object.
    pub fn to_status(&self) -> Value {
        let mut metadata = Map::new();
        if let Some(token) = &self.continue_token {
            metadata.insert("continue".into(), Value::String(token.clone()));
        }
        let mut status = Map::new();
        status.insert("kind".into(), json!("Status"));
        status.insert("apiVersion".into(), json!("v1"));
        status.insert("metadata".into(), Value::Object(metadata));
        status.insert("status".into(), json!("Failure"));
        if !self.message.is_empty() {
            status.insert("message".into(), json!(self.message));
        }
        if self.reason != Reason::Unknown {
            status.insert("reason".into(), json!(self.reason.as_str()));
        }
        if let Some(details) = &self.details {
            status.insert("details".into(), details_json(details));
        }
        status.insert("code".into(), json!(self.code));
        Value::Object(status)
    }
}

/// Renders `details` with empty members left out, as Go's `omitempty` does.
pub fn details_json(details: &Details) -> Value {
    let mut out = Map::new();
    for (key, value) in [
        ("name", &details.name),
        ("group", &details.group),
        ("kind", &details.kind),
        ("uid", &details.uid),
    ] {
        if !value.is_empty() {
            out.insert(key.into(), json!(value));
        }
    }
    if !details.causes.is_empty() {
        let causes = details
            .causes
            .iter()
            .map(|c| {
                let mut cause = Map::new();
                if !c.reason.is_empty() {
                    cause.insert("reason".into(), json!(c.reason));
                }
                if !c.message.is_empty() {
                    cause.insert("message".into(), json!(c.message));
                }
                if !c.field.is_empty() {
                    cause.insert("field".into(), json!(c.field));
                }
                Value::Object(cause)
            })
            .collect();
        out.insert("causes".into(), Value::Array(causes));
    }
    if details.retry_after_seconds > 0 {
        out.insert(
            "retryAfterSeconds".into(),
            json!(details.retry_after_seconds),
        );
    }
    Value::Object(out)
}

/// The `Status` a successful delete returns for kinds that do not return the object.
pub fn success_status(details: &Details) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details_json(details),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICES: GroupResource<'static> = GroupResource {
        group: "",
        resource: "services",
    };

    #[test]
    fn not_found_matches_kube_apiserver() {
        let status = ApiError::not_found(SERVICES, "nope").to_status();
        assert_eq!(
            status,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "message":"services \"nope\" not found","reason":"NotFound",
                   "details":{"name":"nope","kind":"services"},"code":404})
        );
    }

    #[test]
    fn conflict_names_the_resource() {
        let err = ApiError::modified(SERVICES, "web");
        assert_eq!(
            err.message,
            "Operation cannot be fulfilled on services \"web\": the object has been modified; please apply your changes to the latest version and try again"
        );
    }

    #[test]
    fn group_is_appended_to_the_resource() {
        let gr = GroupResource {
            group: "apiregistration.k8s.io",
            resource: "apiservices",
        };
        assert_eq!(
            ApiError::not_found(gr, "v1.x").message,
            "apiservices.apiregistration.k8s.io \"v1.x\" not found"
        );
    }
}
