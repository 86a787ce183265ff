//! Files the agent writes (scripts, knowledge notes, learnings, evaluation artefacts,
//! reports), through the sandboxed `workspace` plugin with the folders of the mode granted
//! and nothing else (never `planning/`).
//!
//! Each call's grant is exactly [`Mode::writable_folders`] (created when missing), each
//! read-write, nothing else: `planning/`, `db/`, `runs/` and the rest of the workspace do not
//! exist for the plugin. The host refuses first what it can name (a path outside those
//! folders, `..`, an absolute path, a symbolic link on the way) so the model gets a failure
//! naming the mode's folders; what slips past (a link swapped in since) meets the sandbox,
//! whose denial reaches the model as a failure too.
//!
//! [`Mode::writable_folders`]: super::Mode::writable_folders

use std::path::Path;

use serde_json::{Value, json};

use trellis_sandbox::Grant;
use trellis_sandbox::capabilities::resolve_in_root;
use trellis_sandbox::store::{Kind, WorkspaceFs};

use super::reads::{check_args, relative_path, strict};
use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};

/// The specs of the file tools ([`super::modes::FILE_TOOLS`]).
pub fn specs() -> Vec<ToolSpec> {
    let path = json!({
        "type": "string",
        "minLength": 1,
        "description": "Workspace-relative file inside a folder this mode writes: code/<step>/…, \
                        knowledgebase/notes/…, learnings/… (builder, optimizer), evaluation/… \
                        (eval), reports/… (output)."
    });
    vec![
        ToolSpec {
            name: "write_workspace_file",
            description: "Creates a file or replaces its whole content, atomically, inside the \
                          folders this mode writes (never planning/: change the plan and step \
                          config with their tools). Missing folders are created.",
            parameters: strict(
                json!({
                    "path": path.clone(),
                    "content": {"type": "string", "description": "The complete new content."}
                }),
                &["path", "content"],
            ),
        },
        ToolSpec {
            name: "patch_workspace_file",
            description: "Applies a unified diff (`--- a/<path>`, `+++ b/<path>`, `@@` hunks) to \
                          the file `path`, inside the folders this mode writes. Either every \
                          hunk applies or nothing changes. The diff must name only `path` (or \
                          /dev/null to create it).",
            parameters: strict(
                json!({
                    "path": path,
                    "patch": {"type": "string", "minLength": 1, "description": "The unified diff."}
                }),
                &["path", "patch"],
            ),
        },
    ]
}

/// The folders the builder's shell reads, when they exist (beside the mode's writable ones).
const SHELL_READS: &[&str] = &[
    "planning",
    "code",
    "knowledgebase",
    "learnings",
    "skills",
    "evaluation",
    "reports",
    "runs",
];

/// The spec of `execute_shell_command` ([`super::modes::SHELL_TOOLS`]).
pub fn shell_spec() -> ToolSpec {
    ToolSpec {
        name: "execute_shell_command",
        description: "Runs a bash script in the sandboxed shell (coreutils, sed, grep, find, jq, \
                      diff, python3, sqlite3 /db/db.sqlite) and answers its exit_code, stdout and \
                      stderr. It sees the workspace's planning/, code/, knowledgebase/, \
                      learnings/, skills/, evaluation/, reports/ and runs/ at /planning, /code, \
                      ..., read-only but for the folders this mode writes, and the database \
                      read-only; no network. It starts in the first folder this mode writes.",
        parameters: strict(
            json!({
                "command": {"type": "string", "minLength": 1, "description": "The bash script."},
                "working_dir": {"type": "string", "description": "A folder to start in, e.g. code/fetch."}
            }),
            &["command"],
        ),
    }
}

/// `execute_shell_command`: the bundled shell under the mode's grant: its writable folders
/// read-write (created when missing), the workspace's other content folders read-only, the
/// database read-only. Never `.trellis/`, `builder/`, hidden files at the root or the
/// operator's config.
pub async fn shell(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    check_args(&shell_spec(), args)?;
    let fs = WorkspaceFs::open(ctx.root).map_err(|e| ToolFailure::new(e.to_string()))?;
    let mut grant = Grant::none();
    for folder in SHELL_READS {
        if fs.is_dir(folder) {
            let host = resolve_in_root(ctx.root, folder).map_err(|e| {
                ToolFailure::new(format!("refused: {folder}/ cannot be granted: {e}"))
            })?;
            grant = grant
                .read(host, folder)
                .map_err(|e| ToolFailure::new(e.to_string()))?;
        }
    }
    // The mode's folders last: a later grant of a path replaces an earlier one.
    for folder in mode_grant(ctx)?.folders() {
        grant = grant
            .write(folder.host.clone(), &folder.guest)
            .map_err(|e| ToolFailure::new(e.to_string()))?;
    }
    if fs.kind(DB_FILE).ok().flatten() == Some(Kind::File) {
        grant = grant.with_db(ctx.root.join(DB_FILE), false);
    }
    if let Some(first) = ctx.mode.writable_folders().first() {
        grant = grant
            .with_home(first)
            .map_err(|e| ToolFailure::new(e.to_string()))?;
    }
    let grant = grant.with_turn_writes(ctx.turn_writes);
    ctx.registry
        .call_tool("shell:execute_shell_command", args, &grant, ctx.limits)
        .await
        .map_err(|e| ToolFailure::new(format!("execute_shell_command: {e}")))
}

/// The database file the shell's `sqlite3` reads.
const DB_FILE: &str = "db/db.sqlite";

/// Calls file tool `name`.
pub async fn call(ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
    let spec = specs()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ToolFailure::new(format!("{name:?} is not a file tool")))?;
    check_args(&spec, args)?;
    let path = args["path"].as_str().unwrap_or_default();
    let target = writable_target(ctx, path)?;
    let (tool, plugin_args) = match name {
        "write_workspace_file" => (
            "workspace:write_file",
            json!({"path": target, "content": args["content"]}),
        ),
        _ => {
            let patch = args["patch"].as_str().unwrap_or_default();
            check_patch_names(patch, &target)?;
            ("workspace:apply_patch", json!({"patch": patch}))
        }
    };
    // Last: it creates the mode's missing folders, which a refused call must not do.
    let grant = mode_grant(ctx)?.with_turn_writes(ctx.turn_writes);
    let answer = ctx
        .registry
        .call_tool(tool, &plugin_args, &grant, ctx.limits)
        .await
        .map_err(|e| {
            ToolFailure::with_details(
                format!("{name} {target}: {e}"),
                json!({"writable_folders": folder_list(ctx)}),
            )
        })?;
    Ok(json!({"path": target, "mode": ctx.mode.as_str(), "result": answer}))
}

fn folder_list(ctx: &ToolContext<'_>) -> Vec<String> {
    ctx.mode
        .writable_folders()
        .iter()
        .map(|f| format!("{f}/"))
        .collect()
}

/// The refusal of a write: `what` (the path and why it is refused), then the folders the
/// mode writes.
fn outside(ctx: &ToolContext<'_>, what: &str) -> ToolFailure {
    let folders = folder_list(ctx);
    let allowed = if folders.is_empty() {
        format!("{} mode writes no files", ctx.mode)
    } else {
        format!("{} mode writes only under {}", ctx.mode, folders.join(", "))
    };
    ToolFailure::with_details(
        format!(
            "refused: {what}; {allowed} (planning/ changes only through the plan and step \
             config tools)"
        ),
        json!({"writable_folders": folders}),
    )
}

/// The workspace-relative path of `path` when it is a file inside one of the mode's folders,
/// with no symbolic link on the way.
fn writable_target(ctx: &ToolContext<'_>, path: &str) -> Result<String, ToolFailure> {
    // The message names the path already.
    let rel = relative_path(path).map_err(|e| outside(ctx, &e.message))?;
    let inside = ctx
        .mode
        .writable_folders()
        .iter()
        .any(|f| rel.starts_with(f) && rel != Path::new(f));
    if !inside {
        return Err(outside(
            ctx,
            &format!("{path:?} is outside the folders this mode writes"),
        ));
    }
    let fs = WorkspaceFs::open(ctx.root).map_err(|e| ToolFailure::new(e.to_string()))?;
    match fs.kind(&rel) {
        Ok(Some(Kind::Link)) => {
            return Err(outside(
                ctx,
                &format!("{path:?} is a symbolic link; files are never written through links"),
            ));
        }
        Ok(Some(Kind::Dir)) => {
            return Err(ToolFailure::new(format!(
                "{path:?} is a folder; give the path of a file in it"
            )));
        }
        Ok(_) => {}
        Err(e) => {
            return Err(outside(ctx, &format!("{path:?} cannot be written: {e}")));
        }
    }
    Ok(rel.to_string_lossy().replace('\\', "/"))
}

/// The grant of a file call: each of the mode's folders read-write (created when missing),
/// nothing else.
fn mode_grant(ctx: &ToolContext<'_>) -> Result<Grant, ToolFailure> {
    let fs = WorkspaceFs::open(ctx.root).map_err(|e| ToolFailure::new(e.to_string()))?;
    let mut grant = Grant::none();
    for folder in ctx.mode.writable_folders() {
        fs.create_dir_all(folder).map_err(|e| {
            ToolFailure::new(format!("refused: cannot create {folder}/ to write in: {e}"))
        })?;
        let host = resolve_in_root(ctx.root, folder)
            .map_err(|e| ToolFailure::new(format!("refused: {folder}/ cannot be granted: {e}")))?;
        grant = grant
            .write(host, folder)
            .map_err(|e| ToolFailure::new(e.to_string()))?;
    }
    Ok(grant)
}

/// Refuses a diff whose file headers name anything but `target` (or `/dev/null`).
fn check_patch_names(patch: &str, target: &str) -> Result<(), ToolFailure> {
    let lines: Vec<&str> = patch
        .lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    // Git's extended headers can name other files (`rename to planning/plan.json`); the
    // tool never renames or copies, so those are refused, and a `diff --git` line must name
    // `target` on both sides.
    for line in &lines {
        let extended = [
            "rename from ",
            "rename to ",
            "copy from ",
            "copy to ",
            "similarity index ",
            "dissimilarity index ",
        ]
        .iter()
        .any(|p| line.starts_with(p));
        let git_names_other = line
            .strip_prefix("diff --git ")
            .is_some_and(|rest| rest != format!("a/{target} b/{target}"));
        if extended || git_names_other {
            return Err(ToolFailure::new(format!(
                "refused: the patch line {line:?} renames, copies or names another file; \
                 patch_workspace_file changes only the content of {target:?}"
            )));
        }
    }
    let mut headers = 0;
    for pair in lines.windows(2) {
        let (Some(old), Some(new)) = (pair[0].strip_prefix("--- "), pair[1].strip_prefix("+++ "))
        else {
            continue;
        };
        headers += 1;
        let (old, new) = (header_path(old), header_path(new));
        let prefixed = old.as_deref().is_none_or(|p| p.starts_with("a/"))
            && new.as_deref().is_none_or(|p| p.starts_with("b/"));
        for named in [old, new].into_iter().flatten() {
            let named = if prefixed { &named[2..] } else { &named[..] };
            let same = relative_path(named)
                .map(|p| p.to_string_lossy().replace('\\', "/") == target)
                .unwrap_or(false);
            if !same {
                return Err(ToolFailure::new(format!(
                    "refused: the patch names {named:?}, but patch_workspace_file changes only \
                     {target:?} (its `path`); patch one file per call"
                )));
            }
        }
    }
    if headers == 0 {
        return Err(ToolFailure::new(format!(
            "argument \"patch\": no file header found; a unified diff needs `--- a/{target}` \
             and `+++ b/{target}` lines before its `@@` hunks"
        )));
    }
    Ok(())
}

/// The path of a `---`/`+++` header (a tab and timestamp after it dropped); `None` for
/// `/dev/null`.
fn header_path(text: &str) -> Option<String> {
    let path = text.split('\t').next().unwrap_or("").trim();
    (path != "/dev/null").then(|| path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_names_only_its_path() {
        let ok = "--- a/code/s/main.py\n+++ b/code/s/main.py\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check_patch_names(ok, "code/s/main.py").is_ok());
        let new = "--- /dev/null\n+++ b/code/s/new.py\n@@ -0,0 +1 @@\n+x\n";
        assert!(check_patch_names(new, "code/s/new.py").is_ok());
        let other = "--- a/planning/plan.json\n+++ b/planning/plan.json\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(check_patch_names(other, "code/s/main.py").is_err());
        let two = format!("{ok}{other}");
        assert!(check_patch_names(&two, "code/s/main.py").is_err());
        assert!(check_patch_names("@@ -1 +1 @@\n-a\n+b\n", "code/s/main.py").is_err());
        let git = "diff --git a/code/s/main.py b/code/s/main.py\n";
        assert!(check_patch_names(&format!("{git}{ok}"), "code/s/main.py").is_ok());
        let renamed = format!(
            "diff --git a/code/s/main.py b/planning/plan.json\nrename from code/s/main.py\n\
             rename to planning/plan.json\n{ok}"
        );
        assert!(check_patch_names(&renamed, "code/s/main.py").is_err());
        let created = format!("{git}new file mode 100644\n{new}");
        assert!(check_patch_names(&created, "code/s/new.py").is_err());
        let created = "diff --git a/code/s/new.py b/code/s/new.py\nnew file mode 100644\n";
        assert!(check_patch_names(&format!("{created}{new}"), "code/s/new.py").is_ok());
    }

    #[test]
    fn every_spec_is_strict_and_named_in_the_table() {
        let names: Vec<&str> = specs().iter().map(|s| s.name).collect();
        assert_eq!(names, super::super::modes::FILE_TOOLS);
        for spec in specs() {
            assert_eq!(spec.parameters["additionalProperties"], false);
            jsonschema::validator_for(&spec.parameters).unwrap();
        }
    }
}
