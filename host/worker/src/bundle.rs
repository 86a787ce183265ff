//! A bundle: workspace files carried between a dispatcher and a worker as one object, with a
//! sha256 manifest. Files are read and written through the workspace handle (no link is
//! followed, nothing outside is reached); a bundle is bounded in size and in files, and an
//! entry whose path is not a plain relative path, or whose bytes do not match the manifest,
//! refuses the whole bundle before anything is written.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use trellis_sandbox::store::{Kind, WorkspaceFs, check_relative};

/// The most bytes one bundle carries.
pub const MAX_BUNDLE_BYTES: u64 = 512 << 20;
/// The most files one bundle carries.
pub const MAX_BUNDLE_FILES: usize = 100_000;
/// The most bytes of manifest one bundle carries (its paths, sizes and digests).
pub const MAX_MANIFEST_BYTES: usize = 64 << 20;
/// The most bytes of an encoded bundle: its files and its manifest.
pub const MAX_ENCODED_BYTES: u64 = MAX_BUNDLE_BYTES + MAX_MANIFEST_BYTES as u64 + 1;

/// One file of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Workspace-relative path.
    pub path: String,
    /// Its length in bytes.
    pub size: u64,
    /// The sha256 of its bytes, in hex.
    pub sha256: String,
}

/// Files gathered to be sent.
#[derive(Debug, Default)]
pub struct Bundle {
    entries: Vec<Entry>,
    bytes: Vec<u8>,
    /// What the manifest takes, about.
    manifest: usize,
    /// The paths added: a file named again (a folder of the grant and a context dependency
    /// both holding it) is sent once.
    paths: std::collections::HashSet<String>,
}

impl Bundle {
    /// An empty bundle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the file at workspace-relative `rel` of `fs`, when it is a regular file.
    pub fn add_file(&mut self, fs: &WorkspaceFs, rel: &str) -> Result<()> {
        if self.paths.contains(rel) || fs.kind(rel)? != Some(Kind::File) {
            return Ok(());
        }
        let data = fs.read(rel).with_context(|| format!("reading {rel}"))?;
        self.add_bytes(rel, &data)
    }

    /// Adds `data` as the file `rel` (once: a path added already is left as it was).
    pub fn add_bytes(&mut self, rel: &str, data: &[u8]) -> Result<()> {
        if self.paths.contains(rel) {
            return Ok(());
        }
        ensure!(
            self.entries.len() < MAX_BUNDLE_FILES,
            "more than {MAX_BUNDLE_FILES} files to send"
        );
        ensure!(
            (self.bytes.len() + data.len()) as u64 <= MAX_BUNDLE_BYTES,
            "more than {} MiB to send",
            MAX_BUNDLE_BYTES >> 20
        );
        ensure!(
            rel.len() <= MAX_PATH_BYTES,
            "{:?}... is a path of {} bytes, more than the {MAX_PATH_BYTES} a bundle carries",
            trellis_sandbox::cut::marked(rel, 200),
            rel.len()
        );
        // A path escaped in JSON at worst, a size and a digest.
        self.manifest += rel.len() * 6 + 128;
        ensure!(
            self.manifest <= MAX_MANIFEST_BYTES,
            "the names of the files to send take more than {} MiB",
            MAX_MANIFEST_BYTES >> 20
        );
        self.paths.insert(rel.to_string());
        self.entries.push(Entry {
            path: rel.to_string(),
            size: data.len() as u64,
            sha256: hex::encode(Sha256::digest(data)),
        });
        self.bytes.extend_from_slice(data);
        Ok(())
    }

    /// Adds every regular file under the folder `rel` of `fs` (links and special files are
    /// left out, never followed).
    pub fn add_folder(&mut self, fs: &WorkspaceFs, rel: &str) -> Result<()> {
        if fs.kind(rel)? != Some(Kind::Dir) {
            return Ok(());
        }
        let mut files = Vec::new();
        fs.walk(rel, |path, kind| {
            if kind == Kind::File {
                files.push(path.to_string_lossy().into_owned());
            }
            kind == Kind::Dir
        })?;
        for file in files {
            self.add_file(fs, &file)?;
        }
        Ok(())
    }

    /// The bundle as bytes: a line of JSON (the manifest), then the files' bytes in order.
    pub fn encode(self) -> Vec<u8> {
        let mut out = serde_json::to_vec(&self.entries).unwrap_or_default();
        out.push(b'\n');
        out.extend_from_slice(&self.bytes);
        out
    }
}

/// A bundle read back: its entries, each with its bytes, checked against the manifest.
#[derive(Debug)]
pub struct Received {
    files: Vec<(Entry, std::ops::Range<usize>)>,
    bytes: Vec<u8>,
}

impl Received {
    /// Reads `bytes` (of [`Bundle::encode`]): every path plain and relative, every file's
    /// sha256 as the manifest says, nothing left over.
    pub fn decode(bytes: Vec<u8>) -> Result<Received> {
        ensure!(
            bytes.len() as u64 <= MAX_ENCODED_BYTES,
            "the bundle is {} bytes, more than a bundle may be",
            bytes.len()
        );
        let line = bytes
            .iter()
            .take(MAX_MANIFEST_BYTES + 1)
            .position(|&b| b == b'\n')
            .context("the bundle has no manifest within its first 64 MiB")?;
        let entries: Vec<Entry> =
            serde_json::from_slice(&bytes[..line]).context("the bundle's manifest")?;
        ensure!(
            entries.len() <= MAX_BUNDLE_FILES,
            "the bundle has more than {MAX_BUNDLE_FILES} files"
        );
        let mut at = line + 1;
        let mut files = Vec::with_capacity(entries.len());
        for entry in entries {
            check_relative(&entry.path)
                .map_err(|e| anyhow::anyhow!("the bundle names {:?}: {e}", entry.path))?;
            let end = usize::try_from(entry.size)
                .ok()
                .and_then(|n| at.checked_add(n))
                .filter(|&end| end <= bytes.len())
                .with_context(|| format!("the bundle is cut short at {:?}", entry.path))?;
            let digest = hex::encode(Sha256::digest(&bytes[at..end]));
            if digest != entry.sha256 {
                bail!(
                    "the bundle's {:?} does not match its sha256 in the manifest",
                    entry.path
                );
            }
            files.push((entry, at..end));
            at = end;
        }
        ensure!(at == bytes.len(), "the bundle has bytes past its manifest");
        check_tree(files.iter().map(|(e, _)| e.path.as_str()))?;
        Ok(Received { files, bytes })
    }

    /// The files, in order.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.files.iter().map(|(e, _)| e)
    }

    /// Writes every file whose path is under one of `under` (all when `None`) into `fs`,
    /// creating folders, through the handle's atomic writer (which refuses links).
    pub fn write_into(&self, fs: &WorkspaceFs, under: Option<&[String]>) -> Result<()> {
        for (entry, range) in &self.files {
            if let Some(prefixes) = under
                && !prefixes.iter().any(|p| is_under(&entry.path, p))
            {
                continue;
            }
            if let Some(parent) = Path::new(&entry.path).parent()
                && !parent.as_os_str().is_empty()
            {
                fs.create_dir_all(parent)?;
            }
            fs.write_atomic(&entry.path, &self.bytes[range.clone()])
                .with_context(|| format!("writing {}", entry.path))?;
        }
        Ok(())
    }
}

/// The bytes of a path of a bundle, and of one of its names, at most: what one system call
/// takes of a path, and of a name, on Linux (a longer one fails as the file is written).
pub const MAX_PATH_BYTES: usize = 4000;
/// See [`MAX_PATH_BYTES`].
pub const MAX_NAME_BYTES: usize = 255;

/// Refuses a bundle whose files could not all be written: a path past [`MAX_PATH_BYTES`] or
/// with a name past [`MAX_NAME_BYTES`], a path named twice, or a file that is also a folder
/// of another's path. Checked before any file is written, so a bundle is written whole or
/// not at all.
fn check_tree<'a>(paths: impl Iterator<Item = &'a str> + Clone) -> Result<()> {
    let mut files = std::collections::BTreeSet::new();
    for path in paths.clone() {
        ensure!(
            path.len() <= MAX_PATH_BYTES,
            "the bundle names a path of {} bytes, more than the {MAX_PATH_BYTES} a path may be: \
             {:?}...",
            path.len(),
            trellis_sandbox::cut::marked(path, 200)
        );
        if let Some(name) = path.split('/').find(|n| n.len() > MAX_NAME_BYTES) {
            bail!(
                "the bundle names {:?}, whose name {:?}... is more than the {MAX_NAME_BYTES} \
                 bytes a name may be",
                trellis_sandbox::cut::marked(path, 200),
                trellis_sandbox::cut::marked(name, 64)
            );
        }
        ensure!(files.insert(path), "the bundle names {path:?} twice");
    }
    for path in paths {
        for (i, _) in path.match_indices('/') {
            ensure!(
                !files.contains(&path[..i]),
                "the bundle names {:?} as a file and as a folder of {path:?}",
                &path[..i]
            );
        }
    }
    Ok(())
}

/// Whether `path` is `folder` or below it.
pub fn is_under(path: &str, folder: &str) -> bool {
    let folder = folder.trim_end_matches('/');
    path == folder
        || path
            .strip_prefix(folder)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_round_trips_and_a_changed_byte_refuses_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/one.txt"), "one").unwrap();
        std::fs::write(dir.path().join("a/two.txt"), "two").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("a/link")).unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        let mut bundle = Bundle::new();
        bundle.add_folder(&fs, "a").unwrap();
        let bytes = bundle.encode();
        let received = Received::decode(bytes.clone()).unwrap();
        let paths: Vec<&str> = received.entries().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a/b/one.txt", "a/two.txt"], "the link is left out");

        let out = tempfile::tempdir().unwrap();
        let out_fs = WorkspaceFs::open(out.path()).unwrap();
        received
            .write_into(&out_fs, Some(&["a/b".to_string()]))
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(out.path().join("a/b/one.txt")).unwrap(),
            "one"
        );
        assert!(!out.path().join("a/two.txt").exists());

        let mut changed = bytes.clone();
        let last = changed.len() - 1;
        changed[last] ^= 1;
        let err = Received::decode(changed).unwrap_err().to_string();
        assert!(err.contains("does not match its sha256"), "{err}");
        let forged = br#"[{"path":"../x","size":0,"sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}]
"#
        .to_vec();
        let err = Received::decode(forged).unwrap_err().to_string();
        assert!(err.contains("../x"), "{err}");
    }

    /// A bundle none of whose files can all be written is refused before any is: a file that
    /// is a folder of another (a worker's forged `x` and `x/y` left `x` and the files before
    /// it written, LOW), a path named twice, a path or name too long to write ("File name too
    /// long", naming nothing, LOW).
    #[test]
    fn a_bundle_that_cannot_be_written_whole_is_refused_unwritten() {
        // A forged bundle: its manifest written by hand, as a client with a worker's rights
        // may.
        let encode = |paths: &[&str]| {
            let digest = hex::encode(Sha256::digest(b"x"));
            let manifest: Vec<Entry> = paths
                .iter()
                .map(|p| Entry {
                    path: p.to_string(),
                    size: 1,
                    sha256: digest.clone(),
                })
                .collect();
            let mut bytes = serde_json::to_vec(&manifest).unwrap();
            bytes.push(b'\n');
            bytes.extend(std::iter::repeat_n(b'x', paths.len()));
            bytes
        };
        let refused = |paths: &[&str]| {
            Received::decode(encode(paths))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let err = refused(&["w/counts.json", "w/x", "w/x/y"]);
        assert!(
            err.contains("\"w/x\" as a file and as a folder of \"w/x/y\""),
            "{err}"
        );
        assert!(refused(&["w/a", "w/a"]).contains("twice"));
        let deep = format!("w/{}f", "d/".repeat(3000));
        assert!(refused(&[&deep]).contains("more than the 4000"));
        assert!(
            Bundle::new().add_bytes(&deep, b"x").is_err(),
            "not sent either"
        );
        let long = format!("w/{}", "n".repeat(300));
        assert!(refused(&[&long]).contains("more than the 255"));
        assert!(Received::decode(encode(&["w/x/y", "w/xy", "w/x/z"])).is_ok());
    }
}
