//! What a request is, worked out once from its method, path and query, as upstream's
//! `RequestInfoFactory` does in its filter chain: every later stage (limits, routing, the
//! verb handlers, and the authorization, audit and metrics stages to come) reads this instead
//! of parsing the path again.

use http::Method;

use crate::request::Query;

/// The path prefixes under which resources are served (upstream's `APIPrefixes`).
const API_PREFIXES: &[&str] = &["api", "apis"];
/// The prefix whose resources have no group (upstream's `GrouplessAPIPrefixes`).
const GROUPLESS_PREFIX: &str = "api";
/// Path segments that name a verb before the resource (upstream's `specialVerbs`).
const SPECIAL_VERBS: &[&str] = &["proxy", "watch"];
/// A Namespace's own subresources: `namespaces/<name>/<one of these>` is the Namespace, not a
/// collection inside it (upstream's `namespaceSubresources`).
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];
/// Subresources that stream for as long as the client wants (upstream's long-running
/// subresources: a pod's attach, exec, log, port-forward, and proxies).
const STREAMING_SUBRESOURCES: &[&str] = &["attach", "exec", "proxy", "log", "portforward"];
/// The health endpoints, served to anyone and never refused for load, with their checks below
/// them (upstream's public-info paths, with `/version`).
const HEALTH_PATHS: &[&str] = &["/healthz", "/livez", "/readyz"];

/// A request as upstream's `RequestInfo` describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// Whether the path names a resource (`/api/v1/…`, `/apis/<group>/<version>/…`) rather
    /// than discovery, OpenAPI, health or another non-resource path.
    pub is_resource_request: bool,
    /// The request path as sent.
    pub path: String,
    /// The verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection` or `proxy` for a resource; the method in lower case otherwise.
    pub verb: String,
    /// `api` or `apis` (empty for a non-resource request).
    pub api_prefix: String,
    /// The API group (empty for core).
    pub api_group: String,
    /// The API version.
    pub api_version: String,
    /// The namespace the path names (for `namespaces/<name>`, that name, as upstream).
    pub namespace: String,
    /// The resource (`services`).
    pub resource: String,
    /// The subresource (`status`).
    pub subresource: String,
    /// The object's name.
    pub name: String,
    /// The path's segments from the resource on (`services`, `web`, `status`), the first four:
    /// more than three names nothing served.
    pub parts: Vec<String>,
    /// Whether the method is GET or HEAD (a legacy `/watch/` path streams only then).
    reads: bool,
    /// Whether the verb came from the path (`/watch/…`, `/proxy/…`).
    verb_in_path: bool,
    /// Whether the path names a collection inside a namespace (`namespaces/<ns>/<resource>…`).
    in_namespace: bool,
}

impl RequestInfo {
    /// Upstream's `NewRequestInfo`: the request described from its method, path and query.
    pub fn new(method: &Method, path: &str, query: &Query) -> Self {
        let reads = matches!(*method, Method::GET | Method::HEAD);
        let mut info = RequestInfo {
            path: path.to_string(),
            verb: method.as_str().to_ascii_lowercase(),
            reads,
            ..RequestInfo::default()
        };
        let trimmed = path.trim_matches('/');
        let mut parts: Vec<&str> = if trimmed.is_empty() {
            Vec::new()
        } else {
            trimmed.split('/').collect()
        };
        // A resource path is at least a prefix, a version and a resource (or `api/v1/x`).
        if parts.len() < 3 || !API_PREFIXES.contains(&parts[0]) {
            return info;
        }
        let prefix = parts.remove(0);
        if prefix != GROUPLESS_PREFIX {
            // A group, a version and a resource: `/apis/<group>/<version>` is discovery.
            if parts.len() < 3 {
                return info;
            }
            info.api_group = parts.remove(0).to_string();
        }
        info.api_prefix = prefix.to_string();
        info.api_version = parts.remove(0).to_string();
        if parts.first().is_some_and(|p| SPECIAL_VERBS.contains(p)) {
            // `/watch` or `/proxy` alone names nothing.
            if parts.len() < 2 {
                return info;
            }
            info.verb = parts.remove(0).to_string();
            info.verb_in_path = true;
        } else {
            info.verb = match *method {
                Method::POST => "create",
                Method::GET | Method::HEAD => "get",
                Method::PUT => "update",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "",
            }
            .to_string();
        }
        info.is_resource_request = true;
        if parts.first() == Some(&"namespaces")
            && let Some(namespace) = parts.get(1)
        {
            info.namespace = namespace.to_string();
            if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
                parts.drain(..2);
                info.in_namespace = true;
            }
        }
        // Four are enough to tell a served path (at most three) from one that names nothing,
        // however many segments a client sends.
        info.parts = parts.iter().take(4).map(|p| p.to_string()).collect();
        let part = |i: usize| parts.get(i).map(|p| p.to_string()).unwrap_or_default();
        (info.resource, info.name, info.subresource) = (part(0), part(1), part(2));
        if info.name.is_empty() && info.verb == "get" {
            info.verb = "list".into();
        }
        if info.verb == "list" && query.flag("watch") == Some(true) {
            info.verb = "watch".into();
        }
        if info.name.is_empty() && info.verb == "delete" {
            info.verb = "deletecollection".into();
        }
        info
    }

    /// The namespace whose objects the path names (`namespaces/<ns>/<resource>…`); empty for
    /// a cluster-wide path and for a Namespace itself (whose [`RequestInfo::namespace`] is its
    /// name, as upstream has it).
    pub fn collection_namespace(&self) -> &str {
        if self.in_namespace {
            &self.namespace
        } else {
            ""
        }
    }

    /// Whether it came through a legacy `/watch/` path.
    pub fn watch_path(&self) -> bool {
        self.verb_in_path && self.verb == "watch"
    }

    /// A request that streams for as long as the client wants (a watch, a proxy, a pod's
    /// exec): no in-flight slot and no deadline. A legacy `/watch/` path streams for GET only
    /// (anything else there is answered at once with 405, as a request with a deadline).
    pub fn long_running(&self) -> bool {
        match self.verb.as_str() {
            "watch" => self.reads,
            "proxy" => true,
            _ => STREAMING_SUBRESOURCES.contains(&self.subresource.as_str()),
        }
    }

    /// Not a get, list or watch: counted against the mutating in-flight limit.
    pub fn mutating(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list" | "watch")
    }

    /// A health probe (`/healthz`, `/livez`, `/readyz` and their checks): never refused for
    /// load.
    pub fn health_probe(&self) -> bool {
        HEALTH_PATHS.iter().any(|p| self.under(p))
    }

    /// Served to anyone, authenticated or not: version (`/version` and `/version/`, as
    /// upstream's `system:public-info-viewer` allows) and health.
    pub fn public(&self) -> bool {
        matches!(self.path.as_str(), "/version" | "/version/") || self.health_probe()
    }

    /// Whether the path is `prefix` or below it.
    fn under(&self, prefix: &str) -> bool {
        self.path == prefix
            || self
                .path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, target: &str) -> RequestInfo {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        RequestInfo::new(&method, path, &Query::parse(Some(query)))
    }

    /// Upstream's `TestGetAPIRequestInfo` cases (staging/src/k8s.io/apiserver/pkg/endpoints/
    /// request/requestinfo_test.go), with Capstan's kinds.
    #[test]
    fn resource_requests_read_as_upstreams_request_info() {
        use Method as M;
        #[rustfmt::skip]
        let cases = [
            // method, path, verb, prefix, group, version, namespace, resource, name, subresource
            (M::GET, "/api/v1/namespaces", "list", "api", "", "v1", "", "namespaces", "", ""),
            (M::GET, "/api/v1/namespaces/other", "get", "api", "", "v1", "other", "namespaces", "other", ""),
            (M::GET, "/api/v1/namespaces/other/services/web", "get", "api", "", "v1", "other", "services", "web", ""),
            (M::GET, "/api/v1/namespaces/other/services", "list", "api", "", "v1", "other", "services", "", ""),
            (M::HEAD, "/api/v1/namespaces/other/services/web", "get", "api", "", "v1", "other", "services", "web", ""),
            (M::GET, "/api/v1/services", "list", "api", "", "v1", "", "services", "", ""),
            (M::GET, "/api/v1/namespaces/other/services?watch=true", "watch", "api", "", "v1", "other", "services", "", ""),
            (M::GET, "/api/v1/watch/namespaces/other/services", "watch", "api", "", "v1", "other", "services", "", ""),
            (M::GET, "/api/v1/watch/services", "watch", "api", "", "v1", "", "services", "", ""),
            (M::POST, "/api/v1/namespaces/other/services", "create", "api", "", "v1", "other", "services", "", ""),
            (M::PUT, "/api/v1/namespaces/other/services/web", "update", "api", "", "v1", "other", "services", "web", ""),
            (M::PUT, "/api/v1/namespaces/other/services/web/status", "update", "api", "", "v1", "other", "services", "web", "status"),
            (M::PATCH, "/api/v1/namespaces/other/services/web", "patch", "api", "", "v1", "other", "services", "web", ""),
            (M::DELETE, "/api/v1/namespaces/other/services/web", "delete", "api", "", "v1", "other", "services", "web", ""),
            (M::DELETE, "/api/v1/namespaces/other/services", "deletecollection", "api", "", "v1", "other", "services", "", ""),
            (M::PUT, "/api/v1/namespaces/other/finalize", "update", "api", "", "v1", "other", "namespaces", "other", "finalize"),
            (M::PUT, "/api/v1/namespaces/other/status", "update", "api", "", "v1", "other", "namespaces", "other", "status"),
            (M::GET, "/apis/discovery.k8s.io/v1/namespaces/other/endpointslices", "list", "apis", "discovery.k8s.io", "v1", "other", "endpointslices", "", ""),
            (M::GET, "/apis/apiregistration.k8s.io/v1/apiservices/v1.x", "get", "apis", "apiregistration.k8s.io", "v1", "", "apiservices", "v1.x", ""),
            (M::GET, "/api/v1/proxy/namespaces/other/pods/p", "proxy", "api", "", "v1", "other", "pods", "p", ""),
            (M::GET, "/api/v1/namespaces/other/pods/p/log", "get", "api", "", "v1", "other", "pods", "p", "log"),
        ];
        for (method, path, verb, prefix, group, version, namespace, resource, name, sub) in cases {
            let got = info(method, path);
            assert!(got.is_resource_request, "{path}");
            let fields = (
                got.verb.as_str(),
                got.api_prefix.as_str(),
                got.api_group.as_str(),
                got.api_version.as_str(),
                got.namespace.as_str(),
                got.resource.as_str(),
                got.name.as_str(),
                got.subresource.as_str(),
            );
            let wanted = (verb, prefix, group, version, namespace, resource, name, sub);
            assert_eq!(fields, wanted, "{path}");
            let collection = if resource == "namespaces" {
                ""
            } else {
                namespace
            };
            assert_eq!(got.collection_namespace(), collection, "{path}");
        }
    }

    #[test]
    fn a_path_of_many_segments_keeps_four_of_them() {
        let path = format!("/api/v1/namespaces/a/services/x{}", "/y".repeat(10_000));
        let got = info(Method::GET, &path);
        assert_eq!(got.parts, ["services", "x", "y", "y"]);
        assert_eq!((got.name.as_str(), got.subresource.as_str()), ("x", "y"));
    }

    #[test]
    fn other_paths_are_non_resource_requests_with_the_method_as_verb() {
        for (method, path) in [
            (Method::GET, "/"),
            (Method::GET, "/api"),
            (Method::GET, "/api/v1"),
            (Method::GET, "/apis/discovery.k8s.io"),
            (Method::GET, "/apis/discovery.k8s.io/v1"),
            (Method::GET, "/healthz/etcd"),
            (Method::GET, "/version"),
            (Method::POST, "/openapi/v3"),
            (Method::GET, "/api/v1/watch"),
        ] {
            let got = info(method.clone(), path);
            assert!(!got.is_resource_request, "{path}");
            assert_eq!(got.verb, method.as_str().to_ascii_lowercase(), "{path}");
        }
    }

    #[test]
    fn watches_proxies_and_streaming_subresources_are_long_running() {
        for (method, path, long_running, mutating) in [
            (Method::GET, "/api/v1/services?watch=1", true, false),
            (Method::GET, "/api/v1/services?watch=true", true, false),
            (Method::GET, "/api/v1/watch/services", true, false),
            (
                Method::GET,
                "/api/v1/watch/namespaces/a/services",
                true,
                false,
            ),
            (
                Method::PUT,
                "/api/v1/watch/namespaces/a/services/x",
                false,
                false,
            ),
            (
                Method::GET,
                "/api/v1/namespaces/x/status?watch=1",
                false,
                false,
            ),
            (
                Method::GET,
                "/apis/metrics.k8s.io/v1beta1/pods?watch=1",
                true,
                false,
            ),
            (Method::GET, "/api/v1/services?watch=false", false, false),
            (
                Method::GET,
                "/api/v1/namespaces/a/services/b?watch=true",
                false,
                false,
            ),
            (Method::GET, "/api/v1/namespaces/a/pods/p/log", true, false),
            (Method::GET, "/api/v1/namespaces/a/pods/p/exec", true, false),
            (Method::GET, "/api/v1/services", false, false),
            (Method::POST, "/api/v1/namespaces/a/services", false, true),
            (Method::DELETE, "/api/v1/namespaces/a/services", false, true),
            (Method::PATCH, "/apis/example.com/v1/things/x", false, true),
            (Method::GET, "/version", false, false),
            (Method::POST, "/version", false, true),
            (Method::GET, "/healthz", false, false),
            (Method::POST, "/healthz", false, true),
        ] {
            let got = info(method, path);
            assert_eq!(got.long_running(), long_running, "{path}");
            assert_eq!(got.mutating(), mutating, "{path}");
        }
    }

    #[test]
    fn version_and_health_are_public_and_probes_exempt() {
        for (path, public, probe) in [
            ("/version", true, false),
            ("/version/", true, false),
            ("/version/x", false, false),
            ("/healthz", true, true),
            ("/readyz/etcd", true, true),
            ("/readyzx", false, false),
            ("/livez", true, true),
            ("/healthzz", false, false),
            ("/api/v1/services", false, false),
        ] {
            let got = info(Method::GET, path);
            assert_eq!(
                (got.public(), got.health_probe()),
                (public, probe),
                "{path}"
            );
        }
    }
}
