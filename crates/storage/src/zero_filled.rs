//! redb's file backend, growing the file by writing zeros instead of leaving a hole.
//!
//! redb grows its file with `set_len` in large steps and then writes pages into the new space
//! one commit at a time. Left as a hole, every commit's first write to a page there makes the
//! file system allocate blocks, so each fsync also writes block bitmaps, extent tree and inode
//! (ext4 without a journal: several extra block requests per commit; with one, a journal
//! commit). Writing the zeros when the file grows allocates the space once per growth step, as
//! etcd preallocates its WAL segments; later commits overwrite blocks that already exist and
//! their fsyncs carry only the pages they changed. At most [`MOST_ZEROED`] of one growth is
//! written, so a growth never stalls the commit behind it for long.

use std::fs::File;
use std::ops::Bound;

use redb::backends::FileBackend;
use redb::{BackendError, DatabaseError, StorageBackend};

/// Zeros written per call while the file grows.
const CHUNK: usize = 1 << 20;
/// The most of one growth step written as zeros; the rest stays a hole. redb fsyncs the file
/// right after growing it, so this bounds the pause a growth adds to the commit that needs it
/// (a full region is hundreds of MiB once the file is large).
const MOST_ZEROED: u64 = 4 << 20;

/// A [`FileBackend`] whose growth is written out as zeros.
#[derive(Debug)]
pub(crate) struct ZeroFilledFile {
    inner: FileBackend,
}

impl ZeroFilledFile {
    /// Opens (or creates) the file at `path`, as redb's own `Builder::create` does.
    pub(crate) fn open(path: &std::path::Path) -> Result<Self, DatabaseError> {
        let file: File = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(ZeroFilledFile {
            inner: FileBackend::new(file)?,
        })
    }
}

impl StorageBackend for ZeroFilledFile {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let old = self.inner.len()?;
        self.inner.set_len(len)?;
        if len <= old {
            return Ok(());
        }
        // Zeros from the old end on (redb allocates from the low end of new space first): the
        // space reads as zeros either way, as the contract asks, and this much is allocated
        // now rather than commit by commit.
        let zeros = vec![0u8; CHUNK];
        let end = len.min(old.saturating_add(MOST_ZEROED));
        let mut at = old;
        while at < end {
            let n = usize::try_from(end - at).map_or(CHUNK, |left| left.min(CHUNK));
            // Best effort: the file has grown and its new space reads as zeros already; a
            // disk too full for the zeros must not fail the growth (a hole needs no space).
            if let Err(error) = self.inner.write(at, &zeros[..n]) {
                tracing::warn!(%error, "could not preallocate the store's new space");
                break;
            }
            at += n as u64;
        }
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write(offset, data)
    }

    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition};

    use super::*;

    fn backend(path: &std::path::Path) -> ZeroFilledFile {
        ZeroFilledFile::open(path).expect("backend")
    }

    #[test]
    fn growth_is_written_as_zeros_and_shrinking_truncates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = backend(&path);
        file.write(0, b"head").expect("write");
        let len = 3 * CHUNK as u64 + 12_345;
        file.set_len(len).expect("grow");
        assert_eq!(file.len().expect("len"), len);
        let meta = std::fs::metadata(&path).expect("metadata");
        // Allocated, not a hole: every block of the new length is on disk.
        assert!(
            meta.blocks() * 512 >= len,
            "{} of {len}",
            meta.blocks() * 512
        );
        let mut out = vec![1u8; 4096];
        file.read(len - 4096, &mut out).expect("read");
        assert!(out.iter().all(|b| *b == 0));
        let mut head = [0u8; 4];
        file.read(0, &mut head).expect("read");
        assert_eq!(&head, b"head");
        file.set_len(10).expect("shrink");
        assert_eq!(file.len().expect("len"), 10);
    }

    #[test]
    fn redb_on_it_keeps_what_it_committed_across_a_reopen() {
        const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        {
            let db = Database::builder()
                .create_with_backend(backend(&path))
                .expect("create");
            let wt = db.begin_write().expect("write");
            {
                let mut t = wt.open_table(T).expect("table");
                for i in 0..2_000u64 {
                    t.insert(i, vec![7u8; 1024].as_slice()).expect("insert");
                }
            }
            wt.commit().expect("commit");
        }
        let db = Database::builder()
            .create_with_backend(backend(&path))
            .expect("reopen");
        let rt = db.begin_read().expect("read");
        let t = rt.open_table(T).expect("table");
        assert_eq!(t.len().expect("len"), 2_000);
        let value = t.get(1_999).expect("get").expect("present");
        assert_eq!(value.value(), vec![7u8; 1024].as_slice());
    }
}
