//! Where bundles go between a dispatcher and its workers: behind [`ArtifactStore`], the NATS
//! object store (the default: nothing to share but the server) or a folder both sides mount
//! (`--artifacts DIR`: a shared file system, or one machine).

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use async_nats::jetstream::object_store;
use futures::future::BoxFuture;

/// Stores and hands back bundles by name (`input.<hex>`, `output.<hex>`).
pub trait ArtifactStore: Send + Sync + std::fmt::Debug {
    /// Stores `bytes` as `name`.
    fn put<'a>(&'a self, name: &'a str, bytes: Vec<u8>) -> BoxFuture<'a, Result<()>>;
    /// The bytes of `name`, at most `limit`: one larger (by its recorded size, or by what it
    /// turns out to hold) is refused before more than `limit` bytes are held.
    fn get<'a>(&'a self, name: &'a str, limit: u64) -> BoxFuture<'a, Result<Vec<u8>>>;
    /// Forgets `name` (nothing when it is not there).
    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>>;
}

/// The longest a bundle's read waits for its next piece.
pub const READ_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// The NATS object store.
pub struct ObjectStoreArtifacts(pub object_store::ObjectStore);

impl std::fmt::Debug for ObjectStoreArtifacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectStoreArtifacts")
    }
}

impl ArtifactStore for ObjectStoreArtifacts {
    fn put<'a>(&'a self, name: &'a str, bytes: Vec<u8>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut reader = std::io::Cursor::new(bytes);
            self.0
                .put(name, &mut reader)
                .await
                .map_err(|e| anyhow::anyhow!("storing {name}: {e}"))?;
            Ok(())
        })
    }

    fn get<'a>(&'a self, name: &'a str, limit: u64) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            use tokio::io::AsyncReadExt;
            let object = tokio::time::timeout(READ_STALL, self.0.get(name))
                .await
                .map_err(|_| {
                    anyhow::anyhow!("fetching {name}: no answer in {} s", READ_STALL.as_secs())
                })?
                .map_err(|e| anyhow::anyhow!("fetching {name}: {e}"))?;
            let recorded = object.info().size as u64;
            ensure!(
                recorded <= limit,
                "{name} is {recorded} bytes, more than the {limit} a bundle may be"
            );
            // Read piece by piece, each within [`READ_STALL`]: an object whose pieces never
            // come (a record without its chunks) fails instead of waiting forever.
            let mut bytes = Vec::new();
            let mut object = object.take(limit + 1);
            let mut piece = vec![0u8; 64 << 10];
            loop {
                let read = tokio::time::timeout(READ_STALL, object.read(&mut piece))
                    .await
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "reading {name}: nothing came for {} s",
                            READ_STALL.as_secs()
                        )
                    })?
                    .with_context(|| format!("reading {name}"))?;
                if read == 0 {
                    break;
                }
                bytes.extend_from_slice(&piece[..read]);
            }
            ensure!(
                bytes.len() as u64 <= limit,
                "{name} holds more than the {limit} bytes a bundle may be"
            );
            Ok(bytes)
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.0
                .delete(name)
                .await
                .map_err(|e| anyhow::anyhow!("deleting {name}: {e}"))
        })
    }
}

/// A folder both sides reach: each bundle a file named after it, written to a private
/// temporary name first and renamed, so a reader never sees half of one.
#[derive(Debug, Clone)]
pub struct FolderArtifacts {
    dir: PathBuf,
}

impl FolderArtifacts {
    /// Bundles in `dir`, made when missing.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("making the artifacts folder {}", dir.display()))?;
        Ok(FolderArtifacts { dir })
    }

    /// The file of `name`: a plain name of the store's own (`input.<hex>`), never a path.
    fn path(&self, name: &str) -> Result<PathBuf> {
        ensure!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
                && !name.starts_with('.'),
            "{name:?} is not a bundle name"
        );
        Ok(self.dir.join(name))
    }
}

impl ArtifactStore for FolderArtifacts {
    fn put<'a>(&'a self, name: &'a str, bytes: Vec<u8>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let path = self.path(name)?;
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || -> Result<()> {
                let mut file = tempfile::NamedTempFile::new_in(&dir)?;
                std::io::Write::write_all(&mut file, &bytes)?;
                file.as_file().sync_all()?;
                file.persist(&path)
                    .map_err(|e| anyhow::anyhow!("storing {}: {e}", path.display()))?;
                Ok(())
            })
            .await?
        })
    }

    fn get<'a>(&'a self, name: &'a str, limit: u64) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            use std::io::Read;
            let path = self.path(name)?;
            tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
                use std::os::unix::fs::OpenOptionsExt;
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(&path)
                    .with_context(|| format!("fetching {}", path.display()))?;
                let meta = file.metadata()?;
                ensure!(meta.is_file(), "{} is not a file", path.display());
                ensure!(
                    meta.len() <= limit,
                    "{} is {} bytes, more than the {limit} a bundle may be",
                    path.display(),
                    meta.len()
                );
                let mut bytes = Vec::new();
                file.take(limit + 1).read_to_end(&mut bytes)?;
                ensure!(
                    bytes.len() as u64 <= limit,
                    "{} holds more than the {limit} bytes a bundle may be",
                    path.display()
                );
                Ok(bytes)
            })
            .await?
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            match std::fs::remove_file(self.path(name)?) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            }
        })
    }
}
