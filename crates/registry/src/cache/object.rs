//! One object as the watch cache holds it.

use std::sync::Arc;

use bytes::Bytes;
use capstan_machinery::meta;
use capstan_storage::Revision;
use serde_json::Value;

use capstan_machinery::meta::ResourceVersionMember;

use super::json::{Json, Stored, with_type};
use super::{EventType, Projection, Selectable};

/// What a kind's projection reads of a stored object ([`Project::selectable`]: the name,
/// namespace and labels, and field values from `spec` and `status`); the rest is skipped.
/// Used when the kind's type does not decode the JSON ([`Projection::project_json`]).
///
/// [`Project::selectable`]: crate::cache::Project::selectable
#[derive(serde::Deserialize)]
struct Projected {
    metadata: Option<ProjectedMeta>,
    spec: Option<Value>,
    status: Option<Value>,
}

#[derive(serde::Deserialize)]
struct ProjectedMeta {
    name: Option<Value>,
    namespace: Option<Value>,
    labels: Option<Value>,
}

impl Projected {
    fn into_value(self) -> Value {
        let mut object = serde_json::Map::new();
        if let Some(meta) = self.metadata {
            let mut metadata = serde_json::Map::new();
            for (field, value) in [
                ("name", meta.name),
                ("namespace", meta.namespace),
                ("labels", meta.labels),
            ] {
                if let Some(value) = value {
                    metadata.insert(field.into(), value);
                }
            }
            object.insert("metadata".into(), Value::Object(metadata));
        }
        for (field, value) in [("spec", self.spec), ("status", self.status)] {
            if let Some(value) = value {
                object.insert(field.into(), value);
            }
        }
        Value::Object(object)
    }
}

/// What the registry knows of an object it writes, attached to the write ([`Hint`]) so that
/// the watch cache does not scan the stored bytes for their layout, nor decode what selectors
/// read: the encoder's [`StoredLayout`] and the object's [`Selectable`].
///
/// [`Hint`]: capstan_storage::Hint
/// [`StoredLayout`]: capstan_machinery::meta::StoredLayout
#[derive(Debug)]
pub struct Written {
    /// Where the stored bytes' parts are.
    pub layout: capstan_machinery::meta::StoredLayout,
    /// What selectors read of the object.
    pub selectable: Selectable,
}

/// One object as the cache holds it: serialized once, plus what selectors read.
pub struct CachedObject {
    /// Its storage key.
    pub key: Arc<str>,
    /// The revision of its last write (its `resourceVersion`).
    pub revision: Revision,
    /// Its JSON.
    json: Json,
    /// What label and field selectors look at.
    pub selectable: Selectable,
    /// Encoded JSON watch lines (ADDED, MODIFIED, DELETED), built once and shared by every
    /// watcher that sends this object.
    lines: [std::sync::OnceLock<Bytes>; 3],
}

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedObject")
            .field("key", &self.key)
            .field("revision", &self.revision)
            .finish()
    }
}

/// Who wrote the values a cache reads ([`capstan_storage::Storage::exclusive`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// This process alone: every value is the registry's encoding of an object.
    ThisProcess,
    /// Anyone (etcd): a value is checked to be JSON as it is read.
    Anyone,
}

impl CachedObject {
    /// Decodes a stored value; `revision` becomes its `resourceVersion`. The stored bytes
    /// themselves are kept (shared with the storage engine's copy, not duplicated) when they
    /// have the shape Capstan writes: `kind` and `apiVersion` first, then a `metadata` object
    /// without `resourceVersion`.
    pub fn decode(
        key: Arc<str>,
        value: &Bytes,
        revision: Revision,
        project: &Projection,
    ) -> Option<Self> {
        Self::decode_written(Writer::Anyone, key, value, revision, project)
    }

    /// [`CachedObject::decode`] of a value `writer` wrote: one this process wrote is not
    /// checked to be JSON (the registry encoded it), only its leading parts are found.
    pub fn decode_written(
        writer: Writer,
        key: Arc<str>,
        value: &Bytes,
        revision: Revision,
        project: &Projection,
    ) -> Option<Self> {
        Self::decode_hinted(writer, key, value, revision, project, None)
    }

    /// [`CachedObject::decode_written`] of a value whose writer said what it knew of it
    /// ([`Written`], the hint of a write of this process): neither scanned nor decoded.
    pub fn decode_hinted(
        writer: Writer,
        key: Arc<str>,
        value: &Bytes,
        revision: Revision,
        project: &Projection,
        hint: Option<&capstan_storage::Hint>,
    ) -> Option<Self> {
        if let Some(written) = hint.and_then(|h| h.get::<Written>())
            && let Some(stored) = Stored::laid_out(value.clone(), &written.layout)
        {
            let object = CachedObject {
                selectable: written.selectable.clone(),
                key: key.clone(),
                revision,
                json: Json::Stored(stored),
                lines: Default::default(),
            };
            #[cfg(debug_assertions)]
            {
                // What reading the bytes finds.
                let read = Self::decode_hinted(writer, key, value, revision, project, None);
                let read = read.as_ref();
                debug_assert_eq!(read.map(|o| &o.selectable), Some(&object.selectable));
                match (read.map(|o| &o.json), &object.json) {
                    (Some(Json::Stored(read)), Json::Stored(hinted)) => {
                        debug_assert_eq!(read, hinted)
                    }
                    _ => debug_assert!(false, "the hinted layout is not the one read"),
                }
            }
            return Some(object);
        }
        // The stored bytes are kept when they have Capstan's shape; the projection reads their
        // metadata alone, or (a kind with selectable fields in `spec` or `status`) the object
        // without managedFields, straight into the kind's type.
        // The text is checked first: finding the parts checks the JSON's syntax, not that
        // what its strings hold is UTF-8.
        let located = match writer {
            Writer::ThisProcess => Stored::locate_own(value.clone()),
            Writer::Anyone => None,
        };
        let located = located.or_else(|| {
            std::str::from_utf8(value).ok()?;
            Stored::locate(value.clone())
        });
        if let Some(stored) = located
            && !stored.has_resource_version
        {
            let metadata = stored.metadata_bytes_without_managed_fields();
            let mut object = CachedObject {
                selectable: Selectable::default(),
                key: key.clone(),
                revision,
                json: Json::Stored(stored),
                lines: Default::default(),
            };
            let for_rules = || {
                let mut for_rules = Vec::with_capacity(value.len());
                object.write_item_for_rules(&mut for_rules);
                for_rules
            };
            let projected = project.project_json(&metadata, &for_rules).or_else(|| {
                // Only what the projection reads is decoded (not managedFields, not the rest).
                serde_json::from_slice::<Projected>(value)
                    .ok()
                    .map(|projected| project.project(&projected.into_value()))
            });
            if let Some(selectable) = projected {
                object.selectable = selectable;
                return Some(object);
            }
            // Neither decodes it (a repeated member, say): decoded whole and re-encoded below.
        }
        let mut object: Value = match serde_json::from_slice(value) {
            Ok(object) => object,
            Err(error) => {
                tracing::warn!(%key, %error, "skipping an undecodable stored object");
                return None;
            }
        };
        Some(Self::from_object(key, &mut object, revision, project))
    }

    /// Wraps an object, stamping `revision` as its `resourceVersion`.
    pub fn from_object(
        key: Arc<str>,
        object: &mut Value,
        revision: Revision,
        project: &Projection,
    ) -> Self {
        meta::strip_type_meta(object);
        meta::set_meta_str(object, "resourceVersion", &revision.to_string());
        let json = Json::Item(Bytes::from(meta::item_json_bytes(object, project.schema())));
        CachedObject {
            key,
            revision,
            json,
            selectable: project.project(object),
            lines: Default::default(),
        }
    }

    /// The watch line for this object as a `kind` event, built by `encode` the first time.
    pub fn watch_line(&self, kind: EventType, encode: impl FnOnce() -> Bytes) -> Bytes {
        let slot = match kind {
            EventType::Added => &self.lines[0],
            EventType::Modified => &self.lines[1],
            EventType::Deleted => &self.lines[2],
        };
        slot.get_or_init(encode).clone()
    }

    /// The object itself (decoded from its JSON).
    pub fn object(&self) -> Value {
        let mut item = Vec::with_capacity(self.item_len());
        self.write_item(&mut item);
        serde_json::from_slice(&item).unwrap_or(Value::Null)
    }

    /// The object's JSON as held: with or without `kind` and `apiVersion`, and without
    /// `metadata.resourceVersion` when stored bytes are held. For reading a few fields with a
    /// partial decode; [`CachedObject::object`] is the object itself.
    pub fn raw_json(&self) -> &[u8] {
        match &self.json {
            Json::Item(json) => json,
            Json::Stored(stored) => &stored.bytes,
        }
    }

    /// [`CachedObject::raw_json`] without `metadata.managedFields` when stored bytes are held
    /// (a re-encoded object is as held): for partial decodes that do not read managedFields,
    /// which then need not step over it (it is a third or more of a small object).
    pub fn lean_json(&self) -> std::borrow::Cow<'_, [u8]> {
        match &self.json {
            Json::Item(json) => std::borrow::Cow::Borrowed(json),
            Json::Stored(stored) => stored.without_managed_fields(),
        }
    }

    /// The raw JSON of the object's member at `path` (`["spec", "selector"]`), found without
    /// decoding anything and, when the stored bytes are held, without stepping over
    /// `metadata` (a member of `metadata` is not found there); `None` when it is absent.
    pub fn member(&self, path: &[&str]) -> Option<&[u8]> {
        match &self.json {
            Json::Item(json) => super::json::member(json, path),
            Json::Stored(stored) => stored.member(path),
        }
    }

    /// Decodes what a reader needs of the object's `metadata`, into a partial type such as one
    /// with a few of its fields. When the stored value is held, only its `metadata` member is
    /// read, not the rest of the object (a 50-endpoint EndpointSlice is 13 KB, its metadata a
    /// tenth of that), and not its `managedFields`; `resourceVersion` is then absent, as in
    /// [`CachedObject::raw_json`].
    /// A re-encoded object is read whole, with its `resourceVersion`.
    pub fn decode_metadata<T>(&self) -> Result<T, serde_json::Error>
    where
        T: serde::de::DeserializeOwned + Default,
    {
        #[derive(serde::Deserialize)]
        #[serde(bound = "T: serde::de::DeserializeOwned + Default")]
        struct Of<T> {
            #[serde(default)]
            metadata: T,
        }
        match &self.json {
            Json::Stored(stored) => {
                serde_json::from_slice(&stored.metadata_without_managed_fields())
            }
            Json::Item(json) => serde_json::from_slice::<Of<T>>(json).map(|of| of.metadata),
        }
    }

    /// Whether the stored bytes themselves are held (not a re-encoded object).
    #[cfg(test)]
    pub(super) fn holds_stored_bytes(&self) -> bool {
        matches!(self.json, Json::Stored(_))
    }

    /// The length of [`CachedObject::write_item`]'s output.
    pub fn item_len(&self) -> usize {
        match &self.json {
            Json::Item(json) => json.len(),
            Json::Stored(stored) => {
                1 + (stored.bytes.len() - stored.members)
                    + ResourceVersionMember::new(stored.metadata_empty, self.revision)
                        .as_bytes()
                        .len()
            }
        }
    }

    /// Writes the object as a list item: without `kind` and `apiVersion`, with
    /// `metadata.resourceVersion`.
    pub fn write_item(&self, out: &mut Vec<u8>) {
        match &self.json {
            Json::Item(json) => out.extend_from_slice(json),
            Json::Stored(stored) => {
                let at = stored.resource_version_at;
                out.push(b'{');
                out.extend_from_slice(&stored.bytes[stored.members..at]);
                out.extend_from_slice(
                    ResourceVersionMember::new(stored.metadata_empty, self.revision).as_bytes(),
                );
                out.extend_from_slice(&stored.bytes[at..]);
            }
        }
    }

    /// Writes the object as [`CachedObject::write_item`] does but without
    /// `metadata.managedFields`: what typed rules read (they ignore it), for less to decode.
    pub fn write_item_for_rules(&self, out: &mut Vec<u8>) {
        match &self.json {
            Json::Stored(stored) => {
                out.push(b'{');
                let metadata = stored.metadata_without_managed_fields();
                out.extend_from_slice(&stored.bytes[stored.members..stored.metadata_start]);
                // The metadata without its closing brace, then resourceVersion.
                let members = &metadata[..metadata.len() - 1];
                out.extend_from_slice(members);
                let empty = members[1..].iter().all(u8::is_ascii_whitespace);
                out.extend_from_slice(ResourceVersionMember::new(empty, self.revision).as_bytes());
                out.extend_from_slice(&stored.bytes[stored.metadata_end..]);
            }
            Json::Item(json) => out.extend_from_slice(json),
        }
    }

    /// Writes the object's `metadata` (with `resourceVersion`), as `write_item` has it.
    pub fn write_metadata(&self, out: &mut Vec<u8>) {
        match &self.json {
            Json::Stored(stored) => {
                let at = stored.resource_version_at;
                out.extend_from_slice(&stored.bytes[stored.metadata_start..at]);
                out.extend_from_slice(
                    ResourceVersionMember::new(stored.metadata_empty, self.revision).as_bytes(),
                );
                out.extend_from_slice(&stored.bytes[at..=stored.metadata_end]);
            }
            Json::Item(_) => {
                let object = self.object();
                let empty = Value::Object(serde_json::Map::new());
                let metadata = object.get("metadata").unwrap_or(&empty);
                let _ = capstan_machinery::json::to_writer(out, metadata);
            }
        }
    }

    /// The object with `kind` and `apiVersion` (as served alone or in a watch event).
    pub fn typed_json(&self, kind: &str, api_version: &str) -> Vec<u8> {
        let mut head = meta::type_head(kind, api_version);
        head.push(b',');
        match &self.json {
            // Stored with another type: served as the item with this one.
            Json::Stored(stored) if !stored.bytes.starts_with(&head) => {
                let mut item = Vec::with_capacity(self.item_len());
                self.write_item(&mut item);
                with_type(&head, &item)
            }
            Json::Item(json) => with_type(&head, json),
            Json::Stored(stored) => meta::with_resource_version(
                &stored.bytes,
                (stored.resource_version_at, !stored.metadata_empty),
                self.revision,
            ),
        }
    }

    /// The same object stamped with another revision (a deletion's).
    pub fn at_revision(&self, revision: Revision, project: &Projection) -> Self {
        match &self.json {
            // The stored bytes take the revision when written out: shared, not re-encoded.
            Json::Stored(stored) => CachedObject {
                key: self.key.clone(),
                revision,
                json: Json::Stored(stored.clone()),
                selectable: self.selectable.clone(),
                lines: Default::default(),
            },
            Json::Item(_) => {
                let mut object = self.object();
                Self::from_object(self.key.clone(), &mut object, revision, project)
            }
        }
    }
}
