//! A cached object's JSON: stored bytes served without re-encoding, and the scanner that
//! finds their parts.

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::decode::Key;

/// An object's JSON as the cache keeps it.
pub(super) enum Json {
    /// The stored value itself, shared with the storage engine.
    Stored(Stored),
    /// The object as a list item (re-encoded: a stored value of another shape, or a
    /// deletion stamped with its own revision).
    Item(Bytes),
}

/// A stored value (`{"kind":…,"apiVersion":…,…,"metadata":{…},…}`, no `resourceVersion`) and
/// where its parts are, so it is served without re-encoding: a list item skips `kind` and
/// `apiVersion`, and `resourceVersion` goes in at the end of `metadata`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Stored {
    pub(super) bytes: Bytes,
    /// Where the members after `kind` and `apiVersion` start.
    pub(super) members: usize,
    /// Where `metadata`'s opening brace is.
    pub(super) metadata_start: usize,
    /// Where `metadata`'s closing brace is.
    pub(super) metadata_end: usize,
    pub(super) metadata_empty: bool,
    /// Whether `metadata` has a `resourceVersion` member (then the value is not held as
    /// stored: the cache's own goes in at the end).
    pub(super) has_resource_version: bool,
    /// The bytes that hold `metadata.managedFields` with one comma beside it: without them
    /// the bytes are the object without managedFields, which readers of a few fields need not
    /// step over (it is most of a small object's metadata). `None` when there is none.
    pub(super) managed_fields: Option<std::ops::Range<usize>>,
    /// Where `resourceVersion` goes in: in `ObjectMeta`'s order, after the members before it
    /// (`name` to `uid`), or at the end of `metadata` when there is none.
    pub(super) resource_version_at: usize,
}

impl Stored {
    /// Checks a stored value's JSON and finds its parts, in one pass; `None` when it is not
    /// JSON or has another shape (no whitespace around it, `kind` and `apiVersion` first, a
    /// `metadata` object).
    pub(super) fn locate(bytes: Bytes) -> Option<Self> {
        if bytes.first() != Some(&b'{') || bytes.last() != Some(&b'}') {
            return None;
        }
        let mut json = serde_json::Deserializer::from_slice(&bytes);
        let parts = json.deserialize_map(Members).ok().flatten()?;
        json.end().ok()?;
        let base = bytes.as_ptr() as usize;
        // Borrowed values point into the bytes; anything else is refused, not trusted.
        let span = |raw: &RawValue| {
            let start = (raw.get().as_ptr() as usize).checked_sub(base)?;
            let end = start.checked_add(raw.get().len())?;
            (end <= bytes.len()).then_some((start, end))
        };
        // The third member starts after the second's value and its comma.
        let mut scan = Scanner {
            bytes: &bytes,
            at: span(parts.second?)?.1,
        };
        scan.whitespace();
        scan.expect(b',')?;
        scan.whitespace();
        let members = scan.at;
        let (start, end) = span(parts.metadata?)?;
        Self::with_metadata(bytes, members, start..end)
    }

    /// The parts found: the members after `kind` and `apiVersion` start at `members`, and
    /// `metadata` spans `metadata` (`None` when that is not an object).
    fn with_metadata(
        bytes: Bytes,
        members: usize,
        metadata: std::ops::Range<usize>,
    ) -> Option<Self> {
        let (start, end) = (metadata.start, metadata.end);
        if bytes.get(start) != Some(&b'{') || end < start + 2 {
            return None;
        }
        let stored = Self::walked(bytes, members, start)?;
        (stored.metadata_end + 1 == end).then_some(stored)
    }

    /// The parts, `metadata`'s members walked from its opening brace at `start` (which finds
    /// where it ends).
    fn walked(bytes: Bytes, members: usize, start: usize) -> Option<Self> {
        let walk = Self::metadata_members(&bytes, start)?;
        Some(Stored {
            members,
            metadata_start: start,
            metadata_end: walk.end - 1,
            metadata_empty: !walk.members,
            has_resource_version: walk.resource_version,
            managed_fields: walk.managed_fields,
            resource_version_at: walk.resource_version_at.unwrap_or(walk.end - 1),
            bytes,
        })
    }

    /// Steps over the members of `metadata`, an object whose opening brace is at `start`.
    /// `None` when it is not an object, or repeats `managedFields`.
    fn metadata_members(bytes: &[u8], start: usize) -> Option<MetadataWalk> {
        let mut scan = Scanner { bytes, at: start };
        scan.expect(b'{')?;
        let (mut resource_version, mut managed_fields) = (false, None);
        // After the last member that comes before resourceVersion.
        let mut resource_version_at = None;
        // Where the previous member's value ends; whether managedFields came first (its cut
        // then runs to the start of the member after it).
        let (mut previous_end, mut first) = (None, false);
        loop {
            scan.whitespace();
            if bytes.get(scan.at) == Some(&b'}') && previous_end.is_none() {
                break;
            }
            let member_start = scan.at;
            let key = scan.member()?;
            let member_end = scan.at;
            if capstan_machinery::go_order::before_resource_version()
                .iter()
                .any(|(name, _)| named(key, name))
            {
                resource_version_at = Some(member_end);
            }
            if named(key, "resourceVersion") {
                resource_version = true;
            } else if named(key, "managedFields") {
                if managed_fields.is_some() {
                    // Repeated (not something this process writes): decoded and re-encoded.
                    return None;
                }
                managed_fields = Some(previous_end.unwrap_or(member_start)..member_end);
                first = previous_end.is_none();
            }
            scan.whitespace();
            match scan.next()? {
                b',' => {}
                b'}' => {
                    return Some(MetadataWalk {
                        end: scan.at,
                        members: true,
                        resource_version,
                        managed_fields,
                        resource_version_at,
                    });
                }
                _ => return None,
            }
            if std::mem::take(&mut first) {
                scan.whitespace();
                if let Some(cut) = managed_fields.as_mut() {
                    cut.end = scan.at;
                }
            }
            previous_end = Some(member_end);
        }
        // `{}`
        Some(MetadataWalk {
            end: scan.at + 1,
            members: false,
            resource_version,
            managed_fields,
            resource_version_at,
        })
    }

    /// [`Stored::metadata_without_managed_fields`] as shared bytes (the stored bytes
    /// themselves when there is no managedFields).
    pub(super) fn metadata_bytes_without_managed_fields(&self) -> Bytes {
        match &self.managed_fields {
            Some(_) => Bytes::from(self.metadata_without_managed_fields().into_owned()),
            None => self.bytes.slice(self.metadata_start..=self.metadata_end),
        }
    }

    /// The `metadata` member's value without `managedFields`, braces included.
    pub(super) fn metadata_without_managed_fields(&self) -> std::borrow::Cow<'_, [u8]> {
        self.without_managed_fields_in(self.metadata_start..self.metadata_end + 1)
    }

    /// The bytes in `range` (which holds `metadata`'s) without `managedFields`.
    fn without_managed_fields_in(
        &self,
        range: std::ops::Range<usize>,
    ) -> std::borrow::Cow<'_, [u8]> {
        match &self.managed_fields {
            Some(cut) => {
                let mut out = Vec::with_capacity(range.len() - cut.len());
                out.extend_from_slice(&self.bytes[range.start..cut.start]);
                out.extend_from_slice(&self.bytes[cut.end..range.end]);
                std::borrow::Cow::Owned(out)
            }
            None => std::borrow::Cow::Borrowed(&self.bytes[range]),
        }
    }

    /// The stored value without `metadata.managedFields`.
    pub(super) fn without_managed_fields(&self) -> std::borrow::Cow<'_, [u8]> {
        self.without_managed_fields_in(0..self.bytes.len())
    }

    /// The parts of a value this process's registry encoded, as its encoder laid them out
    /// (nothing is scanned); `None` when the layout does not fit the bytes.
    pub(super) fn laid_out(
        bytes: Bytes,
        layout: &capstan_machinery::meta::StoredLayout,
    ) -> Option<Self> {
        let fits = bytes.len() == layout.len
            && bytes.get(layout.metadata_start) == Some(&b'{')
            && bytes.get(layout.metadata_end) == Some(&b'}')
            && layout.members < layout.metadata_start
            && bytes.last() == Some(&b'}')
            && layout.managed_fields.as_ref().is_none_or(|cut| {
                layout.metadata_start < cut.start && cut.end <= layout.metadata_end
            })
            && layout.metadata_start < layout.resource_version_at
            && layout.resource_version_at <= layout.metadata_end;
        fits.then(|| Stored {
            members: layout.members,
            metadata_start: layout.metadata_start,
            metadata_end: layout.metadata_end,
            metadata_empty: layout.metadata_empty,
            has_resource_version: false,
            managed_fields: layout.managed_fields.clone(),
            resource_version_at: layout.resource_version_at,
            bytes,
        })
    }

    /// [`Stored::locate`] of a value this process's registry encoded (`kind`, `apiVersion`
    /// and `metadata` first, in that order): only those three members are read, and the
    /// rest is not checked; `None` when they are not where the registry puts them (then
    /// [`Stored::locate`] reads the value).
    pub(super) fn locate_own(bytes: Bytes) -> Option<Self> {
        if bytes.last() != Some(&b'}') {
            return None;
        }
        let mut scan = Scanner {
            bytes: &bytes,
            at: 0,
        };
        scan.expect(b'{')?;
        for name in ["kind", "apiVersion"] {
            scan.whitespace();
            let key = scan.member()?;
            if !named(key, name) {
                return None;
            }
            scan.whitespace();
            scan.expect(b',')?;
        }
        scan.whitespace();
        let members = scan.at;
        if !named(scan.string()?, "metadata") {
            return None;
        }
        scan.whitespace();
        scan.expect(b':')?;
        scan.whitespace();
        let start = scan.at;
        if bytes.get(start) != Some(&b'{') {
            return None;
        }
        // One walk over metadata's members finds its end and what it holds.
        Self::walked(bytes, members, start)
    }
}

/// What a walk over `metadata`'s members found.
struct MetadataWalk {
    /// Where `metadata` ends (after its closing brace).
    end: usize,
    /// Whether it has any member.
    members: bool,
    /// Whether a member is `resourceVersion`.
    resource_version: bool,
    /// The bytes to leave out for it without `managedFields`: the member and the comma before
    /// it, or after it when it comes first.
    managed_fields: Option<std::ops::Range<usize>>,
    /// Where the last member before `resourceVersion` in `ObjectMeta`'s order ends.
    resource_version_at: Option<usize>,
}

/// What [`Stored::locate`] reads of a JSON object while checking all of it, when it has
/// Capstan's shape: the second member's value (`apiVersion`'s) and the `metadata` member's,
/// both borrowed, so their places in the bytes are known.
#[derive(Default)]
struct Parts<'a> {
    second: Option<&'a RawValue>,
    metadata: Option<&'a RawValue>,
}

/// Reads a JSON object's members into [`Parts`]: `None` when `kind` and `apiVersion` are not
/// first, or a member is repeated (it would be served twice, and Go's decoder merges what the
/// cache's readers take the last of: such an object is decoded and re-encoded).
struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = Option<Parts<'de>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut parts, mut shaped) = (Parts::default(), true);
        let mut seen = std::collections::BTreeSet::new();
        while let Some(Key(key)) = map.next_key()? {
            let value: &'de RawValue = map.next_value()?;
            match (seen.len(), key.as_ref()) {
                (0, "kind") => {}
                (1, "apiVersion") => parts.second = Some(value),
                (0 | 1, _) => shaped = false,
                (_, "metadata") => parts.metadata = Some(value),
                _ => {}
            }
            // Every member is read all the same: the whole object is checked.
            shaped &= seen.insert(key);
        }
        Ok(shaped.then_some(parts))
    }
}

/// Whether a member's raw name (escapes not decoded) is `name`.
fn named(raw: &[u8], name: &str) -> bool {
    if !raw.contains(&b'\\') {
        return raw == name.as_bytes();
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    serde_json::from_slice::<String>(&quoted).is_ok_and(|decoded| decoded == name)
}

/// Steps over the members and values of JSON already known to be valid.
struct Scanner<'a> {
    pub(super) bytes: &'a [u8],
    at: usize,
}

/// The raw JSON of the member at `path` (`["spec", "selector"]`) of the JSON object `json`
/// (valid JSON, as stored values are): the first such member (a decoder would take the last
/// of a repeated key; Capstan never writes one), its value not decoded. `None` when a step is
/// missing or not an object.
pub fn member<'a>(json: &'a [u8], path: &[&str]) -> Option<&'a [u8]> {
    Scanner { bytes: json, at: 0 }.find(path)
}

impl Stored {
    /// [`member`] of the stored value, not stepping over `metadata` to find a member after
    /// it (`metadata` itself, and `kind` and `apiVersion` before it, are not found).
    pub(super) fn member(&self, path: &[&str]) -> Option<&[u8]> {
        let after_metadata = self.bytes[self.members..].starts_with(b"\"metadata\"");
        let at = if after_metadata {
            self.metadata_end + 1
        } else {
            0
        };
        Scanner {
            bytes: &self.bytes,
            at,
        }
        .find(path)
    }
}

impl<'a> Scanner<'a> {
    /// The raw value of the member at `path` of the object the scan is in: at its opening
    /// brace, or just after one of its members.
    fn find(mut self, path: &[&str]) -> Option<&'a [u8]> {
        let (first, rest) = path.split_first()?;
        self.whitespace();
        if !matches!(self.next()?, b'{' | b',') {
            return None;
        }
        loop {
            self.whitespace();
            if self.bytes.get(self.at) == Some(&b'}') {
                return None;
            }
            let key = self.string()?;
            self.whitespace();
            self.expect(b':')?;
            self.whitespace();
            let start = self.at;
            self.value()?;
            if named(key, first) {
                let value = &self.bytes[start..self.at];
                return match rest {
                    [] => Some(value),
                    _ => Scanner {
                        bytes: value,
                        at: 0,
                    }
                    .find(rest),
                };
            }
            self.whitespace();
            self.expect(b',')?;
        }
    }

    fn next(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn whitespace(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    /// A string; returns its raw contents (escapes not decoded).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.at;
        loop {
            // Most of a stored object's bytes are in strings (managedFields' keys above all):
            // they are stepped over to the next quote or backslash at once.
            self.at += memchr::memchr2(b'"', b'\\', self.bytes.get(self.at..)?)?;
            match self.next()? {
                b'\\' => {
                    self.next()?;
                }
                _ => return Some(&self.bytes[start..self.at - 1]),
            }
        }
    }

    /// A member (`"key": value`); returns its raw key.
    fn member(&mut self) -> Option<&'a [u8]> {
        let key = self.string()?;
        self.whitespace();
        self.expect(b':')?;
        self.whitespace();
        self.value()?;
        Some(key)
    }

    fn value(&mut self) -> Option<()> {
        match *self.bytes.get(self.at)? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.bytes.get(self.at)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                while self
                    .bytes
                    .get(self.at)
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    self.at += 1;
                }
                Some(())
            }
        }
    }
}

/// `head` (`{"kind":…,"apiVersion":…,`) and the members of the JSON object `item`.
pub(super) fn with_type(head: &[u8], item: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + item.len());
    out.extend_from_slice(head);
    if item.len() > 2 {
        out.extend_from_slice(&item[1..]);
    } else {
        // `{}`: no members, so no comma after the type either.
        out.pop();
        out.push(b'}');
    }
    out
}
