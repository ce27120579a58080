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

/// Const builder setters, each setting one member to the value it is given.
macro_rules! value_setters {
    ($($(#[$doc:meta])* $name:ident($value:ident: $ty:ty) => $field:ident;)*) => {$(
        $(#[$doc])*
        pub const fn $name(mut self, $value: $ty) -> Self {
            self.$field = $value;
            self
        }
    )*};
}

/// Const builder setters, each turning one flag on.
macro_rules! flag_setters {
    ($($(#[$doc:meta])* $name:ident => $field:ident;)*) => {$(
        $(#[$doc])*
        pub const fn $name(mut self) -> Self {
            self.$field = true;
            self
        }
    )*};
}

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

    value_setters! {
        /// With the JSON of the kind's Go zero value.
        zero(json: &'static str) => zero;
        /// With the fields a `/status` write resets.
        status_resets(fields: &'static [&'static [&'static str]]) => status_resets;
        /// With kubectl short names.
        short_names(names: &'static [&'static str]) => short_names;
        /// In these categories.
        categories(categories: &'static [&'static str]) => categories;
        /// These top-level list fields are always written, `null` when empty (Go's fields
        /// without `omitempty`).
        always_present(fields: &'static [&'static str]) => always_present;
        /// Discovery's `storageVersionHash`.
        storage_version_hash(hash: &'static str) => storage_version_hash;
        /// Stored under this key prefix (upstream's etcd layout).
        storage_prefix(prefix: &'static str) => storage_prefix;
        /// Serving these verbs (sorted) instead of all of them.
        verbs(verbs: &'static [&'static str]) => verbs;
    }

    flag_setters! {
        /// With a `/status` subresource.
        with_status => has_status;
        /// A create keeps the status it is given.
        status_on_create => status_on_create;
        /// With a `/finalize` subresource (update only), as Namespaces have.
        with_finalize => has_finalize;
        /// PUT needs no `resourceVersion` (last write wins).
        unconditional_update => allow_unconditional_update;
        /// PUT creates a missing object.
        create_on_update => allow_create_on_update;
        /// DELETE answers with the deleted object.
        delete_returns_object => delete_returns_object;
    }

    /// With the scheme upstream decodes the group's bodies with.
    pub const fn scheme(mut self, name: &'static str, versions: &'static [&'static str]) -> Self {
        self.scheme = (name, versions);
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
