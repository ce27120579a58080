//! The embedded store's on-disk format: its tables, a change's record, opening the file.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use redb::{Database, ReadableTable, TableDefinition};

use crate::{KeyValue, Result, Revision, StorageError};

pub(super) const HISTORY: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("history");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub(super) const META_REVISION: &str = "revision";
pub(super) const META_COMPACTED: &str = "compacted";
pub(super) const META_CLEANED: &str = "cleaned";

/// The free space a recovery proves before the store takes writes again.
pub(super) const SPACE_PROBE_BYTES: usize = 1024 * 1024;

pub(super) fn db_err(error: impl Into<redb::Error>) -> StorageError {
    match error.into() {
        redb::Error::Io(error) => StorageError::Io(error.to_string()),
        redb::Error::PreviousIo => {
            StorageError::Io("a previous I/O error left the database unusable".into())
        }
        other => StorageError::Embedded(other.to_string()),
    }
}

pub(super) fn to_u64(revision: Revision) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

pub(super) fn to_revision(raw: u64) -> Revision {
    i64::try_from(raw).unwrap_or(i64::MAX)
}

pub(super) fn read_meta(
    table: &impl ReadableTable<&'static str, u64>,
    name: &str,
) -> Result<Revision> {
    let value = table.get(name).map_err(db_err)?.map_or(0, |v| v.value());
    i64::try_from(value).map_err(|_| StorageError::Corrupt(format!("meta {name} = {value}")))
}

// ---- record encoding -------------------------------------------------------------------------

/// One change as kept in `history`: the key, its create revision and version after the
/// change, where its previous change is, and the value (`None`: a delete).
pub(super) struct Record {
    pub(super) key: Arc<str>,
    pub(super) create_revision: Revision,
    pub(super) version: i64,
    pub(super) prev: Option<(u64, u32)>,
    pub(super) value: Option<Bytes>,
}

/// flag, create revision, version, previous change (revision, op), key length.
pub(super) const HEADER: usize = 1 + 8 + 8 + 8 + 4 + 4;

impl Record {
    pub(super) fn encode(&self) -> Vec<u8> {
        let value = self.value.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(HEADER + self.key.len() + value.len());
        out.push(u8::from(self.value.is_none()));
        out.extend_from_slice(&self.create_revision.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        let (prev_revision, prev_op) = self.prev.unwrap_or((0, 0));
        out.extend_from_slice(&prev_revision.to_le_bytes());
        out.extend_from_slice(&prev_op.to_le_bytes());
        out.extend_from_slice(
            &u32::try_from(self.key.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(value);
        out
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Self> {
        let corrupt = || StorageError::Corrupt(format!("history record of {} bytes", bytes.len()));
        let field = |at: usize, len: usize| bytes.get(at..at + len).ok_or_else(corrupt);
        let int = |at: usize| -> Result<u64> {
            let raw: [u8; 8] = field(at, 8)?.try_into().map_err(|_| corrupt())?;
            Ok(u64::from_le_bytes(raw))
        };
        let int32 = |at: usize| -> Result<u32> {
            let raw: [u8; 4] = field(at, 4)?.try_into().map_err(|_| corrupt())?;
            Ok(u32::from_le_bytes(raw))
        };
        let deleted = *field(0, 1)?.first().ok_or_else(corrupt)? == 1;
        let prev_revision = int(17)?;
        let key_len = int32(29)? as usize;
        let key = std::str::from_utf8(field(HEADER, key_len)?)
            .map_err(|_| StorageError::Corrupt("key is not UTF-8".into()))?;
        Ok(Self {
            key: Arc::from(key),
            create_revision: to_revision(int(1)?),
            version: to_revision(int(9)?),
            prev: (prev_revision > 0).then_some((prev_revision, int32(25)?)),
            value: (!deleted).then(|| Bytes::copy_from_slice(&bytes[HEADER + key_len..])),
        })
    }

    /// The key's value after this change, if it was not a delete.
    pub(super) fn into_kv(self, revision: Revision) -> Option<KeyValue> {
        Some(KeyValue {
            value: self.value?,
            key: self.key,
            create_revision: self.create_revision,
            mod_revision: revision,
            version: self.version,
        })
    }
}

pub(super) fn deleted_kv(key: Arc<str>, revision: Revision) -> KeyValue {
    KeyValue {
        key,
        value: Bytes::new(),
        create_revision: 0,
        mod_revision: revision,
        version: 0,
    }
}

pub(super) type HistoryTable = redb::ReadOnlyTable<(u64, u32), &'static [u8]>;

pub(super) fn read_record(
    history: &impl ReadableTable<(u64, u32), &'static [u8]>,
    at: (u64, u32),
) -> Result<Option<Record>> {
    match history.get(at).map_err(db_err)? {
        Some(bytes) => Record::decode(bytes.value()).map(Some),
        None => Ok(None),
    }
}

/// Opens (or creates) the database file; another process holding it is [`StorageError::Locked`].
pub(super) fn open_database(path: &Path, cache_bytes: usize) -> Result<Database> {
    crate::zero_filled::ZeroFilledFile::open(path)
        .and_then(|backend| {
            Database::builder()
                .set_cache_size(cache_bytes)
                .create_with_backend(backend)
        })
        .map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen
            | redb::DatabaseError::LockProtocolMismatch => StorageError::Locked {
                path: path.display().to_string(),
            },
            other => db_err(other),
        })
}

/// Proves the file system has room again: writes [`SPACE_PROBE_BYTES`] next to the store,
/// syncs them, and removes them.
pub(super) fn probe_space(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join(".capstan-space-probe");
    let result = std::fs::File::create(&path).and_then(|mut file| {
        file.write_all(&vec![0u8; SPACE_PROBE_BYTES])?;
        file.sync_all()
    });
    let _ = std::fs::remove_file(&path);
    result
}
