//! The file tools: `read_file`, `write_file`, `list_dir`, `delete_file`,
//! `move_file`, and the atomic write that `apply_patch` shares.

use std::fs;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufRead, BufReader, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use trellis_plugin_sdk::tool::ToolError;

use crate::paths::WsPath;

/// Largest file `read_file` returns whole, and the most text it returns at once.
pub const MAX_TEXT_BYTES: u64 = 1024 * 1024;

fn yes() -> bool {
    true
}

/// Told to the model for every argument that names a file.
pub const PATH_HELP: &str = "Workspace-relative path, e.g. `knowledgebase/notes/ideas.md`. \
                             Only folders granted to you in this step exist.";

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    #[schemars(description = PATH_HELP)]
    path: String,
    /// First line to return, counting from 1. Default 1.
    #[serde(default)]
    #[schemars(with = "u64", range(min = 1))]
    offset_line: Option<u64>,
    /// Most lines to return. Default: to the end of the file.
    #[serde(default)]
    #[schemars(with = "u64", range(min = 1))]
    max_lines: Option<u64>,
}

pub fn read_file(args: ReadArgs) -> Result<Value, ToolError> {
    let path = WsPath::parse(&args.path);
    // Opened first and looked at through the descriptor: one lookup of the path, not two.
    let file = fs::File::open(path.guest()).map_err(|e| ToolError::from_io(path.display(), &e))?;
    let meta = file
        .metadata()
        .map_err(|e| ToolError::from_io(path.display(), &e))?;
    if meta.is_dir() {
        return Err(ToolError::InvalidArguments(format!(
            "`{path}` is a folder; use list_dir to see what it contains"
        )));
    }
    let windowed = args.offset_line.is_some() || args.max_lines.is_some();
    if !windowed && meta.len() > MAX_TEXT_BYTES {
        return Err(ToolError::InvalidArguments(format!(
            "`{path}` is {} bytes, more than the 1 MiB read_file returns at once; \
             pass offset_line and max_lines to read it in parts",
            meta.len()
        )));
    }
    let first = args.offset_line.unwrap_or(1).max(1);
    let (content, total_lines, truncated) = read_window(
        BufReader::new(file),
        first,
        args.max_lines,
        MAX_TEXT_BYTES as usize,
    )
    .map_err(|e| match e {
        WindowError::Io(e) => ToolError::from_io(path.display(), &e),
        WindowError::NotUtf8 { line } => ToolError::Failed(format!(
            "`{path}` is not UTF-8 text (line {line} has invalid bytes); \
                     read_file only returns text"
        )),
    })?;
    Ok(json!({
        "path": path.display(),
        "content": content,
        "total_lines": total_lines,
        "truncated": truncated,
    }))
}

#[derive(Debug)]
enum WindowError {
    Io(io::Error),
    NotUtf8 { line: u64 },
}

/// Returns lines `first..first + max_lines` (1-based, line endings kept), the
/// file's line count, and whether lines after the window were left out. Lines are
/// counted to the end so the agent knows how much is left; only returned lines
/// must be UTF-8, so a window can read the text part of a mixed file.
fn read_window(
    mut reader: impl BufRead,
    first: u64,
    max_lines: Option<u64>,
    max_bytes: usize,
) -> Result<(String, u64, bool), WindowError> {
    let mut content = String::new();
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut taken = 0u64;
    let mut truncated = false;
    loop {
        line.clear();
        if reader
            .read_until(b'\n', &mut line)
            .map_err(WindowError::Io)?
            == 0
        {
            break;
        }
        number += 1;
        if number < first {
            continue;
        }
        let wanted = max_lines.is_none_or(|max| taken < max);
        if !wanted || truncated || content.len() + line.len() > max_bytes {
            truncated = true;
            continue;
        }
        let text = std::str::from_utf8(&line).map_err(|_| WindowError::NotUtf8 { line: number })?;
        content.push_str(text);
        taken += 1;
    }
    Ok((content, number, truncated))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    #[schemars(description = PATH_HELP)]
    path: String,
    /// The complete new content of the file.
    content: String,
    /// Create missing parent folders. Default true.
    #[serde(default = "yes")]
    create_dirs: bool,
}

pub fn write_file(args: WriteArgs) -> Result<Value, ToolError> {
    let path = WsPath::parse(&args.path);
    refuse_root(&path)?;
    if fs::metadata(path.guest()).is_ok_and(|m| m.is_dir()) {
        return Err(ToolError::InvalidArguments(format!(
            "`{path}` is a folder; write_file writes files"
        )));
    }
    if args.create_dirs {
        create_parent_dirs(&path)?;
    }
    atomic_write(&path, args.content.as_bytes())?;
    Ok(json!({ "path": path.display(), "bytes_written": args.content.len() }))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Workspace-relative folder, e.g. `knowledgebase/notes`.
    path: String,
    /// Also list everything below subfolders. Default false.
    #[serde(default)]
    recursive: bool,
    /// Stop after this many entries and set `truncated`. Default 500.
    #[serde(default = "default_max_entries")]
    #[schemars(range(min = 1, max = 10000))]
    max_entries: usize,
}

fn default_max_entries() -> usize {
    500
}

pub fn list_dir(args: ListArgs) -> Result<Value, ToolError> {
    let path = WsPath::parse(&args.path);
    let meta = fs::metadata(path.guest())
        .map_err(|e| root_hint(&path, ToolError::from_io(path.display(), &e)))?;
    if !meta.is_dir() {
        return Err(ToolError::InvalidArguments(format!(
            "`{path}` is a file; use read_file to read it"
        )));
    }
    let mut entries = Vec::new();
    let truncated = walk_listing(&path, args.recursive, args.max_entries, &mut entries)?;
    Ok(json!({ "path": path.display(), "entries": entries, "truncated": truncated }))
}

/// Depth-first with each folder's entries sorted by name, so the listing is in
/// path order and stopping at `limit` keeps a stable prefix. Symbolic links are
/// listed but not followed: a link may point outside the grant, or back up.
fn walk_listing(
    dir: &WsPath,
    recursive: bool,
    limit: usize,
    out: &mut Vec<Value>,
) -> Result<bool, ToolError> {
    for entry in sorted_entries(dir)? {
        if out.len() >= limit {
            return Ok(true);
        }
        out.push(
            json!({ "path": entry.path.display(), "type": entry.kind.name(), "size": entry.size }),
        );
        if recursive && entry.kind == Kind::Dir && walk_listing(&entry.path, recursive, limit, out)?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
        }
    }
}

#[derive(Debug)]
pub struct Entry {
    pub path: WsPath,
    pub kind: Kind,
    pub size: u64,
}

/// A folder's entries sorted by name, without following symbolic links.
pub fn sorted_entries(dir: &WsPath) -> Result<Vec<Entry>, ToolError> {
    let read = fs::read_dir(dir.guest()).map_err(|e| ToolError::from_io(dir.display(), &e))?;
    let mut entries = Vec::new();
    for entry in read {
        let entry = entry.map_err(|e| ToolError::from_io(dir.display(), &e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = dir.join(&name);
        let meta = entry
            .metadata()
            .map_err(|e| ToolError::from_io(path.display(), &e))?;
        let kind = if meta.is_symlink() {
            Kind::Symlink
        } else if meta.is_dir() {
            Kind::Dir
        } else {
            Kind::File
        };
        let size = if kind == Kind::File { meta.len() } else { 0 };
        entries.push(Entry { path, kind, size });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    #[schemars(description = PATH_HELP)]
    path: String,
}

pub fn delete_file(args: DeleteArgs) -> Result<Value, ToolError> {
    let path = WsPath::parse(&args.path);
    refuse_root(&path)?;
    let meta =
        fs::symlink_metadata(path.guest()).map_err(|e| ToolError::from_io(path.display(), &e))?;
    if meta.is_dir() {
        return Err(ToolError::InvalidArguments(format!(
            "`{path}` is a folder; delete_file only deletes files"
        )));
    }
    fs::remove_file(path.guest()).map_err(|e| ToolError::from_io_write(path.display(), &e))?;
    Ok(json!({ "path": path.display(), "deleted": true }))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveArgs {
    /// Workspace-relative path of the file to move.
    from: String,
    /// Workspace-relative destination path, including the file name.
    to: String,
    /// Replace the destination if it exists. Default false.
    #[serde(default)]
    overwrite: bool,
}

pub fn move_file(args: MoveArgs) -> Result<Value, ToolError> {
    let from = WsPath::parse(&args.from);
    let to = WsPath::parse(&args.to);
    refuse_root(&from)?;
    refuse_root(&to)?;
    let meta =
        fs::symlink_metadata(from.guest()).map_err(|e| ToolError::from_io(from.display(), &e))?;
    if meta.is_dir() {
        return Err(ToolError::InvalidArguments(format!(
            "`{from}` is a folder; move_file only moves files"
        )));
    }
    if from != to {
        match fs::symlink_metadata(to.guest()) {
            Ok(target) if target.is_dir() => {
                return Err(ToolError::InvalidArguments(format!(
                    "`{to}` is a folder; give the full destination path, e.g. `{to}/{}`",
                    from.file_name()
                )));
            }
            Ok(_) if !args.overwrite => {
                return Err(ToolError::InvalidArguments(format!(
                    "`{to}` already exists; pass overwrite: true to replace it"
                )));
            }
            _ => {}
        }
        create_parent_dirs(&to)?;
        match fs::rename(from.guest(), to.guest()) {
            Ok(()) => {}
            // Two grants may be different host folders; rename cannot cross them.
            Err(e) if e.kind() == io::ErrorKind::CrossesDevices => copy_then_remove(&from, &to)?,
            // WASI does not say which side refused, and either folder may be the
            // read-only one.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(ToolError::Denied(format!(
                    "`{from}` cannot be moved to `{to}`: one of the two folders is read-only"
                )));
            }
            Err(e) => return Err(ToolError::from_io_write(from.display(), &e)),
        }
    }
    Ok(json!({ "from": from.display(), "to": to.display() }))
}

fn copy_then_remove(from: &WsPath, to: &WsPath) -> Result<(), ToolError> {
    let temp = temp_path(to);
    if let Err(e) = fs::copy(from.guest(), temp.guest()) {
        let _ = fs::remove_file(temp.guest());
        return Err(ToolError::from_io_write(to.display(), &e));
    }
    Staged {
        temp,
        target: to.clone(),
    }
    .commit()?;
    fs::remove_file(from.guest()).map_err(|e| ToolError::from_io_write(from.display(), &e))
}

fn refuse_root(path: &WsPath) -> Result<(), ToolError> {
    if path.is_root() {
        return Err(ToolError::InvalidArguments(
            "the path names the workspace root, not a file".to_owned(),
        ));
    }
    Ok(())
}

/// Points the agent at its grants when it used the root, which is rarely granted.
pub fn root_hint(path: &WsPath, err: ToolError) -> ToolError {
    match err {
        ToolError::Denied(_) if path.is_root() => ToolError::Denied(
            "the workspace root is not granted to this call; pass one of the folders you were \
             given access to as `path`"
                .to_owned(),
        ),
        other => other,
    }
}

pub fn create_parent_dirs(path: &WsPath) -> Result<(), ToolError> {
    let parent = path.parent();
    // A granted folder is a preopen, where `create_dir_all` would try `mkdir` on
    // the preopen itself; existing folders need nothing anyway.
    if parent.is_root() || fs::metadata(parent.guest()).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    fs::create_dir_all(parent.guest()).map_err(|e| ToolError::from_io_write(path.display(), &e))
}

/// Writes through a temporary file in the same folder and renames it over the
/// target, so a reader (or a killed run) sees the old file or the new one, never
/// a half-written one.
pub fn atomic_write(path: &WsPath, bytes: &[u8]) -> Result<(), ToolError> {
    stage(path, bytes)?.commit()
}

/// A complete temporary file waiting to be renamed over its target.
#[derive(Debug)]
pub struct Staged {
    temp: WsPath,
    target: WsPath,
}

pub fn stage(path: &WsPath, bytes: &[u8]) -> Result<Staged, ToolError> {
    let temp = temp_path(path);
    let written = fs::File::create_new(temp.guest()).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    match written {
        Ok(()) => Ok(Staged {
            temp,
            target: path.clone(),
        }),
        Err(e) => {
            let _ = fs::remove_file(temp.guest());
            Err(ToolError::from_io_write(path.display(), &e))
        }
    }
}

impl Staged {
    pub fn commit(self) -> Result<(), ToolError> {
        fs::rename(self.temp.guest(), self.target.guest()).map_err(|e| {
            let _ = fs::remove_file(self.temp.guest());
            ToolError::from_io_write(self.target.display(), &e)
        })
    }

    pub fn discard(self) {
        let _ = fs::remove_file(self.temp.guest());
    }
}

/// A hidden name next to `path` that no other call will pick.
pub fn temp_path(path: &WsPath) -> WsPath {
    // Instances are fresh per call, so the counter alone would repeat across calls;
    // the random seed keeps concurrent calls on one folder apart.
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let unique = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    path.parent()
        .join(&format!(".{}.{unique:016x}.trellis-tmp", path.file_name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(text: &str, first: u64, max: Option<u64>, max_bytes: usize) -> (String, u64, bool) {
        read_window(text.as_bytes(), first, max, max_bytes).unwrap()
    }

    #[test]
    fn whole_file_keeps_line_endings() {
        assert_eq!(
            window("a\r\nb\nc", 1, None, 100),
            ("a\r\nb\nc".to_owned(), 3, false)
        );
        assert_eq!(window("", 1, None, 100), (String::new(), 0, false));
        assert_eq!(window("a\n", 1, None, 100), ("a\n".to_owned(), 1, false));
    }

    #[test]
    fn window_counts_every_line_and_flags_the_rest() {
        let text = "1\n2\n3\n4\n5\n";
        assert_eq!(
            window(text, 2, Some(2), 100),
            ("2\n3\n".to_owned(), 5, true)
        );
        assert_eq!(window(text, 4, None, 100), ("4\n5\n".to_owned(), 5, false));
        assert_eq!(window(text, 9, Some(3), 100), (String::new(), 5, false));
    }

    #[test]
    fn byte_cap_stops_at_a_line_boundary() {
        assert_eq!(
            window("aaa\nbbb\nccc\n", 1, None, 9),
            ("aaa\nbbb\n".to_owned(), 3, true)
        );
    }

    #[test]
    fn invalid_utf8_names_the_line_but_only_inside_the_window() {
        let bytes: &[u8] = b"ok\n\xff\xfe\nok\n";
        assert!(matches!(
            read_window(bytes, 1, None, 100),
            Err(WindowError::NotUtf8 { line: 2 })
        ));
        assert_eq!(
            read_window(bytes, 3, None, 100).unwrap(),
            ("ok\n".to_owned(), 3, false)
        );
    }
}
