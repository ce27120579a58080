//! The campaign's requests: generated and mutated from valid objects, or malformed HTTP.

use serde_json::{Value, json};

/// One generated request.
pub(super) struct Planned {
    pub(super) method: String,
    pub(super) target: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
    /// Sent instead of a request built from the rest: malformed HTTP.
    pub(super) raw: Option<Vec<u8>>,
    /// What kind of request this is, for the report (`POST services`, `garbage`, …).
    pub(super) what: String,
}

pub(super) struct Generator {
    pub(super) rng: fastrand::Rng,
    pub(super) namespace: String,
}

pub(super) const METHODS: &[(&str, u32)] = &[
    ("GET", 36),
    ("POST", 16),
    ("PUT", 10),
    ("PATCH", 24),
    ("DELETE", 9),
    ("HEAD", 2),
    ("OPTIONS", 1),
    ("TRACE", 1),
    ("FOO", 1),
];

pub(super) const PARAMS: &[&str] = &[
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "watch",
    "dryRun",
    "fieldManager",
    "fieldValidation",
    "force",
    "propagationPolicy",
    "gracePeriodSeconds",
    "orphanDependents",
    "pretty",
    "timeout",
    "includeObject",
    "allowWatchBookmarks",
    "sendInitialEvents",
    "exclude",
    "verbose",
];

pub(super) const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
    "application/apply-patch+cbor",
    "text/plain",
    "application/json; charset=utf-16",
    "multipart/form-data; boundary=x",
    ";;;",
    "",
];

pub(super) const ACCEPTS: &[&str] = &[
    "application/json",
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json",
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "*/*",
    "text/html;q=0.9, */*;q=0.1",
    "application/json;as=Table;g=meta.k8s.io;v=v9",
    "garbage/;;=",
];

impl Generator {
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.usize(..items.len())]
    }

    fn chance(&mut self, percent: u32) -> bool {
        self.rng.u32(..100) < percent
    }

    /// A random string: ASCII, unicode, control characters, or long.
    fn string(&mut self) -> String {
        match self.rng.u32(..10) {
            0 => "é€漢字🙂\u{200b}"
                .chars()
                .cycle()
                .take(self.rng.usize(1..40))
                .collect(),
            1 => (0..self.rng.usize(1..20))
                .map(|_| char::from_u32(self.rng.u32(0..0x3000)).unwrap_or('x'))
                .collect(),
            2 => "a".repeat(self.rng.usize(64..70_000)),
            3 => String::new(),
            4 => self
                .pick(&[
                    "..", ".", "%00", "\\", "/", "=", ",", "!", "(", ")", "in", "notin",
                ])
                .to_string(),
            _ => (0..self.rng.usize(1..24))
                .map(|_| self.rng.alphanumeric().to_ascii_lowercase())
                .collect(),
        }
    }

    fn name(&mut self) -> String {
        if self.chance(70) {
            format!("f{}", self.rng.u32(..64))
        } else {
            self.string()
        }
    }

    fn namespace(&mut self) -> String {
        match self.rng.u32(..20) {
            0 => "default".into(),
            1 => "kube-system".into(),
            2 => self.string(),
            _ => self.namespace.clone(),
        }
    }

    fn path(&mut self) -> (String, String) {
        let ns = self.namespace();
        let name = self.name();
        let kind = self.pick(&["services", "endpoints", "pods"]).to_string();
        let sub = if self.chance(20) { "/status" } else { "" };
        let (path, what) = match self.rng.u32(..24) {
            0..=6 => (
                format!("/api/v1/namespaces/{ns}/{kind}/{name}{sub}"),
                format!("{kind} item"),
            ),
            7..=10 => (
                format!("/api/v1/namespaces/{ns}/{kind}"),
                format!("{kind} collection"),
            ),
            11 => (format!("/api/v1/{kind}"), format!("{kind} all namespaces")),
            12 => (
                format!("/api/v1/watch/namespaces/{ns}/{kind}"),
                format!("{kind} watch path"),
            ),
            13 => (
                format!("/apis/apiregistration.k8s.io/v1/apiservices/v1.{name}.example.com{sub}"),
                "apiservices item".into(),
            ),
            14 => (
                "/apis/apiregistration.k8s.io/v1/apiservices".into(),
                "apiservices collection".into(),
            ),
            15 => (
                format!("/api/v1/namespaces/{name}{sub}"),
                "namespaces item".into(),
            ),
            16 => ("/api/v1/namespaces".into(), "namespaces collection".into()),
            17 => (
                self.pick(&[
                    "/api",
                    "/api/v1",
                    "/apis",
                    "/apis/apiregistration.k8s.io",
                    "/apis/apiregistration.k8s.io/v1",
                    "/version",
                ])
                .to_string(),
                "discovery".into(),
            ),
            18 => (
                self.pick(&[
                    "/openapi/v2",
                    "/openapi/v3",
                    "/openapi/v3/api/v1",
                    "/openapi/v3/apis/apiregistration.k8s.io/v1",
                ])
                .to_string(),
                "openapi".into(),
            ),
            19 => (
                self.pick(&[
                    "/healthz",
                    "/livez",
                    "/readyz",
                    "/readyz/etcd",
                    "/livez/ping",
                    "/healthz/nothing",
                ])
                .to_string(),
                "health".into(),
            ),
            20 => (
                format!("/apis/{name}.example.com/v1/things/{name}"),
                "aggregated".into(),
            ),
            _ => {
                let segments: Vec<String> =
                    (0..self.rng.usize(0..7)).map(|_| self.string()).collect();
                (format!("/{}", segments.join("/")), "random path".into())
            }
        };
        (path, what)
    }

    fn param_value(&mut self, key: &str) -> String {
        if self.chance(25) {
            return self.string();
        }
        match key {
            "labelSelector" => self
                .pick(&[
                    "app=web",
                    "a in (x,y),!b",
                    "x notin (",
                    "a=b,c!=d",
                    "!!",
                    "a==é",
                    "(((",
                    "a,b,c=",
                    "a in ()",
                ])
                .to_string(),
            "fieldSelector" => self
                .pick(&[
                    "metadata.name=a",
                    "spec.type!=NodePort",
                    "é",
                    "\\é",
                    "a\\",
                    "metadata.namespace==x,=",
                    "status.podIP=1.1.1.1",
                    "metadata.name=\\,",
                ])
                .to_string(),
            "limit" | "timeoutSeconds" | "gracePeriodSeconds" => self
                .pick(&[
                    "0",
                    "1",
                    "-1",
                    "500",
                    "99999999999999999999",
                    "1e3",
                    "1.5",
                    "-9223372036854775808",
                ])
                .to_string(),
            "resourceVersion" => self
                .pick(&["0", "1", "999999999", "-5", "abc", ""])
                .to_string(),
            "resourceVersionMatch" => self
                .pick(&["Exact", "NotOlderThan", "exact", ""])
                .to_string(),
            "continue" => self
                .pick(&[
                    "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJ4In0",
                    "!!!",
                    "e30",
                    "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTUsInN0YXJ0IjoiXHUwMDAwIn0",
                ])
                .to_string(),
            "dryRun" => self.pick(&["All", "all", "x"]).to_string(),
            "fieldValidation" => self
                .pick(&["Strict", "Warn", "Ignore", "strict"])
                .to_string(),
            "propagationPolicy" => self
                .pick(&["Orphan", "Background", "Foreground", "Never"])
                .to_string(),
            "timeout" => self
                .pick(&["1s", "0", "-1s", "5", "1h", "1.5.5s", "9999999999h"])
                .to_string(),
            "includeObject" => self
                .pick(&["Object", "None", "Metadata", "all"])
                .to_string(),
            _ => self
                .pick(&["true", "false", "1", "0", "", "maybe"])
                .to_string(),
        }
    }

    fn query(&mut self) -> String {
        let mut pairs = Vec::new();
        for _ in 0..self.rng.usize(0..5) {
            let key = if self.chance(90) {
                self.pick(PARAMS).to_string()
            } else {
                self.string()
            };
            let value = self.param_value(&key);
            pairs.push(format!("{}={}", encode(&key), encode(&value)));
        }
        // Most watches end on their own, so workers are not held for the client timeout.
        if pairs.iter().any(|p| p.starts_with("watch=")) && self.chance(80) {
            pairs.push("timeoutSeconds=1".into());
        }
        pairs.join("&")
    }

    fn document(&mut self, what: &str) -> Value {
        let name = format!("f{}", self.rng.u32(..64));
        match what {
            w if w.starts_with("services") => json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "labels": {"app": "capstan-abuse"}},
                "spec": {"type": self.pick(&["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]).to_string(),
                    "selector": {"app": name}, "externalName": "example.com",
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
                    "ipFamilyPolicy": self.pick(&["SingleStack", "PreferDualStack"]).to_string(),
                    "sessionAffinity": "ClientIP", "externalIPs": ["192.0.2.7"]}}),
            w if w.starts_with("endpoints") => json!({"apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": name, "labels": {"app": "capstan-abuse"}},
                "subsets": [{"addresses": [{"ip": "10.1.2.3", "hostname": "a", "targetRef": {"kind": "Pod", "name": "p"}}],
                    "notReadyAddresses": [{"ip": "10.1.2.4"}], "ports": [{"port": 80, "name": "http", "protocol": "TCP"}]}]}),
            w if w.starts_with("pods") => json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "capstan-abuse"}, "finalizers": []},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 8080, "name": "http"}]}]},
                "status": {"podIP": "10.244.0.9", "podIPs": [{"ip": "10.244.0.9"}], "conditions": [{"type": "Ready", "status": "True"}]}}),
            w if w.starts_with("apiservices") => {
                json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": format!("v1.{name}.example.com")},
                "spec": {"group": format!("{name}.example.com"), "version": "v1", "groupPriorityMinimum": 100, "versionPriority": 10,
                    "insecureSkipTLSVerify": true, "service": {"namespace": self.namespace, "name": name, "port": 443}}})
            }
            w if w.starts_with("namespaces") => json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": format!("abuse-{name}")}}),
            _ => json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "propagationPolicy": "Background", "preconditions": {"uid": "x"}, "dryRun": ["All"]}),
        }
    }

    fn patch(&mut self, content_type: &str, document: Value) -> Value {
        match content_type {
            "application/json-patch+json" => {
                let mut ops = Vec::new();
                for _ in 0..self.rng.usize(1..6) {
                    let path = self
                        .pick(&[
                            "/metadata/labels",
                            "/metadata/labels/a",
                            "/spec/ports/0/port",
                            "/spec/ports/-",
                            "/metadata/annotations",
                            "/spec",
                            "",
                            "/x~1y",
                            "/metadata/finalizers/-",
                        ])
                        .to_string();
                    ops.push(match self.rng.u32(..7) {
                        0 => json!({"op": "add", "path": path, "value": self.value(2)}),
                        1 => json!({"op": "remove", "path": path}),
                        2 => json!({"op": "replace", "path": path, "value": self.value(2)}),
                        3 => json!({"op": "move", "from": "/metadata/labels", "path": path}),
                        4 => json!({"op": "test", "path": path, "value": self.value(1)}),
                        5 => {
                            // A copy that doubles what it copies.
                            json!({"op": "copy", "from": "/metadata", "path": "/metadata/annotations/x"})
                        }
                        _ => json!({"op": self.string(), "path": path}),
                    });
                }
                Value::Array(ops)
            }
            "application/strategic-merge-patch+json" => json!({
                "metadata": {"labels": {"a": null, "b": "c"}, "$deleteFromPrimitiveList/finalizers": ["x"], "finalizers": ["y"]},
                "spec": {"ports": [{"port": 80, "$patch": self.pick(&["delete", "replace", "merge", "bogus"]).to_string()}, {"name": "nokey"}],
                    "$setElementOrder/ports": [{"port": 81}, {"port": 80}], "$retainKeys": ["ports"], "selector": {"$patch": "replace"}},
                "$patch": if self.chance(10) { json!("delete") } else { json!(null) },
            }),
            _ => document,
        }
    }

    /// A random JSON value of at most `depth` levels.
    fn value(&mut self, depth: usize) -> Value {
        match self.rng.u32(..9) {
            0 => Value::Null,
            1 => json!(self.rng.bool()),
            2 => json!(*self.pick(&[i64::MIN, -1, 0, 1, 65_536, i64::MAX])),
            3 => json!(*self.pick(&[1.5, -0.0, 1e308, 3.0e-7])),
            4 | 5 => json!(self.string()),
            6 if depth > 0 => Value::Array(
                (0..self.rng.usize(0..4))
                    .map(|_| self.value(depth - 1))
                    .collect(),
            ),
            7 if depth > 0 => {
                let mut map = serde_json::Map::new();
                for _ in 0..self.rng.usize(0..4) {
                    map.insert(self.string(), self.value(depth - 1));
                }
                Value::Object(map)
            }
            _ => json!("x"),
        }
    }

    /// Mutates a JSON document in place: a node replaced, removed, multiplied or added.
    fn mutate(&mut self, value: &mut Value, depth: usize) {
        let children = match value {
            Value::Object(map) => map.len(),
            Value::Array(list) => list.len(),
            _ => 0,
        };
        if children == 0 || depth > 8 || self.chance(30) {
            *value = match self.rng.u32(..6) {
                0 => self.value(3),
                1 => {
                    // Deep nesting.
                    let mut nested = json!(1);
                    for _ in 0..self.rng.usize(10..200) {
                        nested = json!([nested]);
                    }
                    nested
                }
                2 => {
                    // Copies of the node, at most ~1 MB of them (repeated mutations multiply).
                    let size = serde_json::to_vec(value).map_or(1, |b| b.len().max(1));
                    let copies = self.rng.usize(2..2000).min(1_000_000 / size).max(1);
                    Value::Array(vec![value.clone(); copies])
                }
                _ => self.value(1),
            };
            return;
        }
        let i = self.rng.usize(..children);
        match value {
            Value::Object(map) => {
                if self.chance(20) {
                    let key = map.keys().nth(i).cloned().unwrap_or_default();
                    map.shift_remove(&key);
                } else if self.chance(15) {
                    map.insert(self.string(), self.value(2));
                } else if let Some((_, child)) = map.iter_mut().nth(i) {
                    self.mutate(child, depth + 1);
                }
            }
            Value::Array(list) => {
                if let Some(child) = list.get_mut(i) {
                    self.mutate(child, depth + 1);
                }
            }
            _ => {}
        }
    }

    /// Byte-level damage: flips, truncation, insertions.
    fn damage(&mut self, bytes: &mut Vec<u8>) {
        for _ in 0..self.rng.usize(1..4) {
            if bytes.is_empty() {
                bytes.push(self.rng.u8(..));
                continue;
            }
            let at = self.rng.usize(..bytes.len());
            match self.rng.u32(..4) {
                0 => bytes[at] ^= 1 << self.rng.u32(..8),
                1 => bytes.truncate(at),
                2 => bytes.insert(at, *self.pick(b"{}[]\",:\\\x00\xff\n")),
                _ => bytes
                    .splice(at..at, std::iter::repeat_n(b'{', self.rng.usize(1..300)))
                    .for_each(drop),
            }
        }
    }

    fn body(&mut self, content_type: &str, what: &str) -> Vec<u8> {
        let mut document = self.document(what);
        document = self.patch(content_type, document);
        if self.chance(60) {
            for _ in 0..self.rng.usize(1..4) {
                self.mutate(&mut document, 0);
                if serde_json::to_vec(&document).map_or(0, |b| b.len()) > 4_000_000 {
                    break;
                }
            }
        }
        let mut bytes = match content_type {
            "application/yaml" | "application/apply-patch+yaml" if self.chance(70) => {
                yaml(&document)
            }
            "application/vnd.kubernetes.protobuf" => {
                let mut bytes = b"k8s\x00".to_vec();
                bytes.extend((0..self.rng.usize(0..300)).map(|_| self.rng.u8(..)));
                bytes
            }
            _ => serde_json::to_vec(&document).unwrap_or_default(),
        };
        if self.chance(15) {
            self.damage(&mut bytes);
        }
        if self.chance(1) {
            // Near and over the body limit.
            bytes.resize(self.rng.usize(3_000_000..3_300_000), b' ');
        }
        bytes
    }

    fn garbage(&mut self, credentials: &[(String, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        match self.rng.u32(..6) {
            0 => out.extend((0..self.rng.usize(1..2000)).map(|_| self.rng.u8(..))),
            1 => out.extend_from_slice(b"GET /version HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
            2 => out.extend_from_slice(b"POST /api/v1/namespaces/default/services HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"),
            3 => {
                out.extend_from_slice(b"GET /api/v1/services HTTP/1.1\r\nHost: x\r\n");
                for _ in 0..self.rng.usize(100..3000) {
                    out.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
                }
                out.extend_from_slice(b"\r\n");
            }
            4 => out.extend_from_slice("G\u{e9}T /\u{e9} HTTP/1.1\r\nHost: \u{1}\r\n\r\n".as_bytes()),
            _ => {
                out.extend_from_slice(b"PATCH /api/v1/namespaces/default/services/x HTTP/1.1\r\nHost: x\r\n");
                for (name, value) in credentials {
                    out.extend_from_slice(name.as_bytes());
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(value);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"Content-Type: application/json-patch+json\r\nContent-Length: 10\r\nContent-Length: 20\r\n\r\n[]");
            }
        }
        out
    }

    pub(super) fn plan(&mut self, credentials: &[(String, Vec<u8>)]) -> Planned {
        if self.chance(3) {
            return Planned {
                method: String::new(),
                target: String::new(),
                headers: Vec::new(),
                body: Vec::new(),
                raw: Some(self.garbage(credentials)),
                what: "malformed HTTP".into(),
            };
        }
        let total: u32 = METHODS.iter().map(|(_, w)| w).sum();
        let mut roll = self.rng.u32(..total);
        let mut method = "GET";
        for (m, w) in METHODS {
            if roll < *w {
                method = m;
                break;
            }
            roll -= w;
        }
        let (path, what) = self.path();
        let query = self.query();
        let target = if query.is_empty() {
            encode_path(&path)
        } else {
            format!("{}?{query}", encode_path(&path))
        };
        let mut headers = Vec::new();
        if self.chance(97) {
            headers.push(("Accept".to_string(), self.pick(ACCEPTS).to_string()));
        }
        if self.chance(3) {
            headers.push((
                "Authorization".to_string(),
                self.pick(&[
                    "Bearer",
                    "Bearer  x",
                    "Basic YTpi",
                    "bearer wrong",
                    "Bearer \u{7f}",
                ])
                .to_string(),
            ));
        }
        if self.chance(5) {
            headers.push((
                "User-Agent".to_string(),
                self.string()
                    .chars()
                    .filter(|c| c.is_ascii() && !c.is_control())
                    .collect(),
            ));
        }
        let mut body = Vec::new();
        if matches!(method, "POST" | "PUT" | "PATCH" | "DELETE") && self.chance(85) {
            let content_type = if method == "PATCH" && self.chance(70) {
                self.pick(&CONTENT_TYPES[4..9]).to_string()
            } else {
                self.pick(CONTENT_TYPES).to_string()
            };
            body = self.body(&content_type, &what);
            if !content_type.is_empty() {
                headers.push(("Content-Type".to_string(), content_type));
            }
        }
        Planned {
            what: format!("{method} {what}"),
            method: method.to_string(),
            target,
            headers,
            body,
            raw: None,
        }
    }
}

/// Percent-encodes everything but unreserved characters (a query key or value).
pub(super) fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Percent-encodes a path, keeping its slashes.
pub(super) fn encode_path(path: &str) -> String {
    path.split('/').map(encode).collect::<Vec<_>>().join("/")
}

pub(super) fn yaml(value: &Value) -> Vec<u8> {
    // JSON is YAML; flow style with a document marker exercises the YAML decoder's path.
    let mut out = b"---\n".to_vec();
    out.extend(serde_json::to_vec_pretty(value).unwrap_or_default());
    out
}
