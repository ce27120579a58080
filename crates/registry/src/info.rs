//! A kind's identity: what discovery, URLs, storage keys and error messages call it.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use capstan_machinery::GroupVersionData;
use capstan_machinery::status::GroupResource;

/// Whether a `k8s_openapi` scope is namespaced.
pub trait Scope {
    /// `true` for `NamespaceResourceScope`.
    const NAMESPACED: bool;
}

impl Scope for k8s_openapi::NamespaceResourceScope {
    const NAMESPACED: bool = true;
}

impl Scope for k8s_openapi::ClusterResourceScope {
    const NAMESPACED: bool = false;
}

/// The verbs of a kind with every verb (create … watch, deletecollection), sorted.
pub const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// A kind's identity as discovery, URLs, storage and error messages name it. The group,
/// version, kind, resource and scope come from the kind's `k8s_openapi::Resource`
/// ([`ResourceInfo::of`]); the rest is what upstream's REST storage for the kind declares.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    /// API group; empty for core.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind (`Service`).
    pub kind: &'static str,
    /// Plural resource (`services`).
    pub plural: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Categories (`all`).
    pub categories: &'static [&'static str],
    /// Verbs served on the main resource, sorted.
    pub verbs: &'static [&'static str],
    /// Whether a `/status` subresource exists.
    pub has_status: bool,
    /// Whether it has a `/finalize` subresource (Namespaces).
    pub has_finalize: bool,
    /// Whether a create keeps the status it is given (Nodes: the kubelet registers its node
    /// with its status); other kinds with a status start without one.
    pub status_on_create: bool,
    /// Top-level list fields Go always writes (no `omitempty`): `null` when empty or unset.
    pub always_present: &'static [&'static str],
    /// Discovery's `storageVersionHash`.
    pub storage_version_hash: &'static str,
    /// Storage key prefix, without a trailing slash (`services/specs`).
    pub storage_prefix: &'static str,
    /// PUT on a missing object creates it.
    pub allow_create_on_update: bool,
    /// PUT without `metadata.resourceVersion` is accepted (last write wins).
    pub allow_unconditional_update: bool,
    /// DELETE answers with the object (Services) instead of a Success `Status`.
    pub delete_returns_object: bool,
    /// The OpenAPI definition of the kind (`io.k8s.api.core.v1.Service`).
    pub definition: &'static str,
    /// What upstream generates from its group version's types: the `/openapi/v3` document,
    /// the protobuf messages request bodies decode as, Go's member order.
    pub data: &'static GroupVersionData,
    /// Aggregated discovery's group and version priorities (upstream's
    /// `groupVersionPriority` for the kube-apiserver's own groups).
    pub priority: (i64, i64),
    /// The JSON of the kind's Go zero value (`scope.Creater.New(kind)` converted to
    /// unstructured): the live object a create's managedFields are computed against, so a
    /// struct Go always has (`spec`, `status.loadBalancer`) is never "added" by a create.
    pub zero: &'static str,
    /// The fields a `/status` write resets (its strategy's `GetResetFields`): managedFields
    /// never record them for that write.
    pub status_resets: &'static [&'static [&'static str]],
    /// The scheme upstream decodes the group's bodies with, as its errors name it (a Go source
    /// location), and the group versions it knows: a body naming another version is "not
    /// registered" there. Empty for a group Capstan alone serves.
    pub scheme: (&'static str, &'static [&'static str]),
}

impl ResourceInfo {
    /// The identity of `T`'s kind, its definition in its group version's `data`, with
    /// upstream's defaults: every verb, no status, no short names or categories, stored under
    /// its resource name.
    pub const fn of<T>(data: &'static GroupVersionData, definition: &'static str) -> Self
    where
        T: k8s_openapi::Resource,
        T::Scope: Scope,
    {
        ResourceInfo {
            group: T::GROUP,
            version: T::VERSION,
            kind: T::KIND,
            plural: T::URL_PATH_SEGMENT,
            namespaced: <T::Scope as Scope>::NAMESPACED,
            short_names: &[],
            categories: &[],
            verbs: ALL_VERBS,
            has_status: false,
            has_finalize: false,
            status_on_create: false,
            always_present: &[],
            storage_version_hash: "",
            storage_prefix: T::URL_PATH_SEGMENT,
            allow_create_on_update: false,
            allow_unconditional_update: false,
            delete_returns_object: false,
            definition,
            data,
            priority: (0, 0),
            zero: r#"{"metadata":{"creationTimestamp":null}}"#,
            status_resets: &[&["spec"]],
            scheme: if T::GROUP.is_empty() {
                ("pkg/api/legacyscheme/scheme.go:30", &["v1"])
            } else {
                ("", &[])
            },
        }
    }

    /// With the scheme upstream decodes the group's bodies with.
    pub const fn scheme(mut self, name: &'static str, versions: &'static [&'static str]) -> Self {
        self.scheme = (name, versions);
        self
    }

    /// With the JSON of the kind's Go zero value.
    pub const fn zero(mut self, json: &'static str) -> Self {
        self.zero = json;
        self
    }

    /// With the fields a `/status` write resets.
    pub const fn status_resets(mut self, fields: &'static [&'static [&'static str]]) -> Self {
        self.status_resets = fields;
        self
    }

    /// The fields a write through `subresource` resets (upstream's `GetResetFields` of the
    /// strategy serving it): status for the main resource of a kind with a status, and for
    /// a Namespace's `/finalize`.
    pub fn resets(&self, subresource: crate::Subresource) -> &'static [&'static [&'static str]] {
        match subresource {
            crate::Subresource::Status => self.status_resets,
            _ if self.has_status => &[&["status"]],
            _ => &[],
        }
    }

    /// With kubectl short names.
    pub const fn short_names(mut self, names: &'static [&'static str]) -> Self {
        self.short_names = names;
        self
    }

    /// In these categories.
    pub const fn categories(mut self, categories: &'static [&'static str]) -> Self {
        self.categories = categories;
        self
    }

    /// With a `/status` subresource.
    pub const fn with_status(mut self) -> Self {
        self.has_status = true;
        self
    }

    /// A create keeps the status it is given.
    pub const fn status_on_create(mut self) -> Self {
        self.status_on_create = true;
        self
    }

    /// These top-level list fields are always written, `null` when empty (Go's fields
    /// without `omitempty`).
    pub const fn always_present(mut self, fields: &'static [&'static str]) -> Self {
        self.always_present = fields;
        self
    }

    /// With a `/finalize` subresource (update only), as Namespaces have.
    pub const fn with_finalize(mut self) -> Self {
        self.has_finalize = true;
        self
    }

    /// Discovery's `storageVersionHash`.
    pub const fn storage_version_hash(mut self, hash: &'static str) -> Self {
        self.storage_version_hash = hash;
        self
    }

    /// Stored under this key prefix (upstream's etcd layout).
    pub const fn storage_prefix(mut self, prefix: &'static str) -> Self {
        self.storage_prefix = prefix;
        self
    }

    /// Serving these verbs (sorted) instead of all of them.
    pub const fn verbs(mut self, verbs: &'static [&'static str]) -> Self {
        self.verbs = verbs;
        self
    }

    /// PUT needs no `resourceVersion` (last write wins).
    pub const fn unconditional_update(mut self) -> Self {
        self.allow_unconditional_update = true;
        self
    }

    /// PUT creates a missing object.
    pub const fn create_on_update(mut self) -> Self {
        self.allow_create_on_update = true;
        self
    }

    /// DELETE answers with the deleted object.
    pub const fn delete_returns_object(mut self) -> Self {
        self.delete_returns_object = true;
        self
    }

    /// Its OpenAPI definition, with its group's member order known to the writer.
    pub fn schema(&self) -> Option<&'static serde_json::Value> {
        self.data.definition(self.definition)
    }

    /// Aggregated discovery's group and version priorities.
    pub const fn priority(mut self, group: i64, version: i64) -> Self {
        self.priority = (group, version);
        self
    }

    /// Upstream's `checkName`: a body's name must be the URL's, and the namespace it names, if
    /// any, the URL's. Update, patch and apply check their object with it.
    pub fn check_name(
        &self,
        name: &str,
        namespace: &str,
        object: &serde_json::Value,
    ) -> Result<(), capstan_machinery::ApiError> {
        use capstan_machinery::{ApiError, meta};
        let sent = meta::name(object);
        if sent != name {
            return Err(ApiError::name_mismatch(sent, name));
        }
        let sent = meta::namespace(object);
        if self.namespaced && !sent.is_empty() && sent != namespace {
            return Err(ApiError::namespace_mismatch());
        }
        Ok(())
    }

    /// `<Kind>List`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The singular resource: the kind in lower case.
    pub fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    /// [`ResourceInfo::zero`] parsed (once per kind for the life of the process).
    pub fn zero_value(&self) -> &'static serde_json::Value {
        parsed_zero(self.zero)
    }

    /// `group/version`, or `version` for core.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource as error messages name it.
    pub fn group_resource(&self) -> GroupResource<'static> {
        GroupResource {
            group: self.group,
            resource: self.plural,
        }
    }

    /// `Kind` or `Kind.group`, as `Invalid` messages name it.
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// The storage key of one object.
    pub fn key(&self, namespace: &str, name: &str) -> String {
        // Put together by hand: `format!` costs ten times as much, on every write and read.
        let prefix = self.storage_prefix;
        let mut key = String::with_capacity(prefix.len() + namespace.len() + name.len() + 2);
        key.push_str(prefix);
        key.push('/');
        if self.namespaced {
            key.push_str(namespace);
            key.push('/');
        }
        key.push_str(name);
        key
    }

    /// The storage prefix of a list: one namespace, or everything when `namespace` is empty.
    pub fn list_prefix(&self, namespace: &str) -> String {
        let prefix = self.storage_prefix;
        let mut key = String::with_capacity(prefix.len() + namespace.len() + 2);
        key.push_str(prefix);
        key.push('/');
        if self.namespaced && !namespace.is_empty() {
            key.push_str(namespace);
            key.push('/');
        }
        key
    }
}

/// A kind's Go zero value ([`ResourceInfo::zero`]) parsed, once per kind for the life of the
/// process.
pub(crate) fn parsed_zero(json: &'static str) -> &'static serde_json::Value {
    type Zeros = Mutex<HashMap<&'static str, &'static serde_json::Value>>;
    static ZEROS: OnceLock<Zeros> = OnceLock::new();
    let mut zeros = ZEROS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    zeros.entry(json).or_insert_with(|| {
        // One per kind, kept for the life of the process.
        Box::leak(Box::new(
            serde_json::from_str(json).unwrap_or_else(|_| serde_json::json!({})),
        ))
    })
}
