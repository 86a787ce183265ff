//! `list_workspace_files` and `read_workspace_file`.
//!
//! Reading goes through the sandboxed `workspace` plugin (`workspace:read_file`) with a
//! read-only grant of exactly the folder holding the file, after the host has checked the
//! path: no `..`, not absolute, not hidden or secret-looking ([`super::refusal_for`]), no
//! symbolic link on the way or at the file. The grant cannot say "this folder but not its
//! `.env`", so the secret rule is the host's; the grant keeps the plugin read-only and inside
//! that one folder, so a link swapped in after the check still cannot lead out. A file with
//! other hard links is refused too: one may be a name made for a file outside the workspace,
//! which no grant can tell from a file of the workspace.
//!
//! Listing goes through [`WorkspaceFs`] instead of the plugin's `list_dir`: the plugin's
//! recursive listing descends into hidden folders (`.git/` alone can spend its whole entry
//! budget) and names secret files, while here hidden and secret-looking entries are left out
//! before anything below them is read. `WorkspaceFs` never follows a link (links are listed
//! as links) and is read-only for this use.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use trellis_sandbox::Grant;
use trellis_sandbox::capabilities::resolve_in_root;
use trellis_sandbox::store::{Kind, WorkspaceFs};

use super::{
    ToolContext, ToolFailure, ToolResult, has_other_links, open_fs, refusal_for, relative_path,
};

/// The deepest `max_depth` of a listing.
pub const MAX_DEPTH: u64 = 8;
/// Entries a listing returns at most.
pub const MAX_ENTRIES: usize = 500;
/// Lines a read returns unless it asks for fewer, and at most.
pub const MAX_LINES: u64 = 2000;

fn shown(rel: &Path) -> String {
    let s = rel.to_string_lossy().replace('\\', "/");
    if s.is_empty() { ".".into() } else { s }
}

/// Refuses a path the read tools never show, or that goes through a link.
fn check_readable(fs: &WorkspaceFs, rel: &Path) -> Result<Option<Kind>, ToolFailure> {
    if let Some(reason) = refusal_for(rel) {
        return Err(ToolFailure::new(format!("refused: {reason}")));
    }
    match fs.kind(rel) {
        Ok(Some(Kind::Link)) => Err(ToolFailure::new(format!(
            "refused: {} is a symbolic link; links are never followed",
            shown(rel)
        ))),
        Ok(Some(Kind::Special)) => Err(ToolFailure::new(format!(
            "refused: {} is not a regular file (a FIFO, socket or device)",
            shown(rel)
        ))),
        Ok(Some(Kind::File)) if has_other_links(fs, rel) => Err(ToolFailure::new(format!(
            "refused: {} has other hard links; a file linked from elsewhere (perhaps outside \
             the workspace) is never read",
            shown(rel)
        ))),
        Ok(kind) => Ok(kind),
        Err(e) => Err(ToolFailure::new(format!("refused: {e}"))),
    }
}

/// `list_workspace_files(path?, max_depth?)`.
pub fn list(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let fs = open_fs(ctx)?;
    let rel = relative_path(args.get("path").and_then(Value::as_str).unwrap_or(""))?;
    let max_depth = args
        .get("max_depth")
        .and_then(Value::as_u64)
        .unwrap_or(2)
        .min(MAX_DEPTH);
    match check_readable(&fs, &rel)? {
        Some(Kind::Dir) => {}
        Some(_) => {
            return Err(ToolFailure::new(format!(
                "{} is a file; read it with read_workspace_file",
                shown(&rel)
            )));
        }
        None => {
            return Err(ToolFailure::new(format!(
                "{} does not exist in the workspace",
                shown(&rel)
            )));
        }
    }
    let mut walk = Walk {
        fs: &fs,
        entries: Vec::new(),
        left_out: 0,
        truncated: false,
    };
    walk.dir(&rel, 1, max_depth)
        .map_err(|e| ToolFailure::new(format!("listing {}: {e}", shown(&rel))))?;
    let mut answer = json!({
        "path": shown(&rel),
        "max_depth": max_depth,
        "entries": walk.entries,
        "truncated": walk.truncated,
    });
    if walk.left_out > 0 {
        answer["left_out"] = json!(walk.left_out);
        answer["left_out_note"] =
            json!("hidden and secret-looking entries are not listed and cannot be read");
    }
    Ok(answer)
}

struct Walk<'a> {
    fs: &'a WorkspaceFs,
    entries: Vec<Value>,
    left_out: usize,
    truncated: bool,
}

impl Walk<'_> {
    fn dir(&mut self, rel: &Path, depth: u64, max_depth: u64) -> std::io::Result<()> {
        for (name, kind) in self.fs.list(rel)? {
            let path: PathBuf = rel.join(&name);
            if refusal_for(&path).is_some() {
                self.left_out += 1;
                continue;
            }
            if self.entries.len() >= MAX_ENTRIES {
                self.truncated = true;
                return Ok(());
            }
            let (kind_name, size) = match kind {
                Kind::Dir => ("dir", None),
                Kind::Link => ("symlink", None),
                Kind::Special => ("special", None),
                // lstat, never following: the path was checked to have no link on the way.
                Kind::File => (
                    "file",
                    std::fs::symlink_metadata(self.fs.host_path(&path))
                        .ok()
                        .map(|m| m.len()),
                ),
            };
            let mut entry = json!({"path": shown(&path), "type": kind_name});
            if let Some(size) = size {
                entry["size"] = json!(size);
            }
            if kind == Kind::Dir && depth >= max_depth {
                entry["not_expanded"] = json!(true);
            }
            self.entries.push(entry);
            if kind == Kind::Dir && depth < max_depth {
                self.dir(&path, depth + 1, max_depth)?;
                if self.truncated {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// `read_workspace_file(path, offset_line?, max_lines?)`.
pub async fn read(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let path = args.get("path").and_then(Value::as_str).unwrap_or("");
    let offset = args.get("offset_line").and_then(Value::as_u64);
    let max_lines = args.get("max_lines").and_then(Value::as_u64);
    read_file(ctx, path, offset, max_lines).await
}

/// Reads the text file `path` through the `workspace` plugin under a read-only grant of its
/// folder (see the module header).
pub async fn read_file(
    ctx: &ToolContext<'_>,
    path: &str,
    offset_line: Option<u64>,
    max_lines: Option<u64>,
) -> ToolResult {
    let fs = open_fs(ctx)?;
    let rel = relative_path(path)?;
    if rel.as_os_str().is_empty() {
        return Err(ToolFailure::new(
            "argument \"path\": expected a file; list the workspace with list_workspace_files",
        ));
    }
    match check_readable(&fs, &rel)? {
        Some(Kind::File) => {}
        Some(Kind::Dir) => {
            return Err(ToolFailure::new(format!(
                "{} is a folder; list it with list_workspace_files",
                shown(&rel)
            )));
        }
        _ => {
            return Err(ToolFailure::new(format!(
                "{} does not exist in the workspace",
                shown(&rel)
            )));
        }
    }
    let parent = rel.parent().unwrap_or(Path::new(""));
    let parent_str = parent.to_string_lossy().replace('\\', "/");
    let host = if parent_str.is_empty() {
        ctx.root
            .canonicalize()
            .map_err(|e| ToolFailure::new(format!("resolving the workspace: {e}")))?
    } else {
        resolve_in_root(ctx.root, &parent_str)
            .map_err(|e| ToolFailure::new(format!("refused: {e}")))?
    };
    let grant = Grant::none()
        .read(host, &format!("/{parent_str}"))
        .map_err(|e| ToolFailure::new(e.to_string()))?;
    let max_lines = max_lines.unwrap_or(MAX_LINES).min(MAX_LINES);
    let mut plugin_args = json!({"path": shown(&rel), "max_lines": max_lines});
    if let Some(offset) = offset_line {
        plugin_args["offset_line"] = json!(offset);
    }
    let mut answer = ctx
        .registry
        .call_tool("workspace:read_file", &plugin_args, &grant, ctx.limits)
        .await
        .map_err(|e| ToolFailure::new(format!("reading {}: {e}", shown(&rel))))?;
    answer["offset_line"] = json!(offset_line.unwrap_or(1));
    if answer["truncated"] == true {
        answer["note"] = json!(format!(
            "more lines follow: pass offset_line (and max_lines, at most {MAX_LINES}) to read on"
        ));
    }
    Ok(answer)
}
