//! `debug_step`: what to look at when a step goes wrong, from the files its runs left in
//! `iteration-0` (see [`trellis_runner::runs::show_step`]) and its learnings, plus the error of its
//! last execution in the session.

use std::path::Path;

use serde_json::{Value, json};

use super::super::reads::{has_other_links, refusal_for};
use super::super::tool::{opt_str_arg, str_arg};
use super::super::{ToolContext, ToolFailure, ToolResult};
use super::tracked::{Shared, cut};
use super::{open, unknown_step};
use trellis_runner::run_folder::ACTIVE_RUN;
use trellis_runner::runs::show_step;
use trellis_runner::session::{Status, logs_dir};
use trellis_runner::workflow_run::{existing_group_run_folder, select_groups};
use trellis_sandbox::store::{Kind, WorkspaceFs};

/// Learning files shown, at most, and characters of each.
const LEARNING_FILES: usize = 20;
const LEARNING_CHARS: usize = 4000;
/// Run folders (the groups') of one step a call shows.
const DEBUG_GROUPS: usize = 20;

pub(super) fn debug_step(ctx: &ToolContext<'_>, shared: &Shared, args: &Value) -> ToolResult {
    let root = ctx.root;
    let ws = open(root)?;
    let step_id = str_arg(args, "step_id")?;
    if ws.plan.step(step_id).is_none() {
        return Err(unknown_step(&ws, step_id));
    }
    let group = opt_str_arg(args, "group_name")?;
    let groups =
        select_groups(&ws, group).map_err(|e| ToolFailure::new(format!("group_name: {e:#}")))?;
    let folders: Vec<String> = if groups.is_empty() {
        vec![ACTIVE_RUN.to_string()]
    } else {
        groups
            .iter()
            .map(|g| existing_group_run_folder(&ws.fs, g))
            .collect::<anyhow::Result<_>>()
            .map_err(|e| ToolFailure::new(format!("{e:#}")))?
    };
    // The call's reads and deadline bound it: a step of many groups is shown for the first
    // DEBUG_GROUPS, each after a check of the deadline.
    let fs = ctx.fs()?;
    let mut runs = Vec::new();
    for folder in folders.iter().take(DEBUG_GROUPS) {
        ctx.check_time()?;
        runs.push(run_of(root, &fs, folder, step_id));
    }
    if folders.len() > DEBUG_GROUPS {
        runs.push(json!({"more_run_folders": folders.len() - DEBUG_GROUPS,
                         "note": "give group_name to see one of them"}));
    }
    let last = shared.latest_of_step(step_id).map(|t| {
        json!({
            "execution_id": t.id,
            "status": t.status.to_string(),
            "summary": t.summary,
            "error": t.error,
        })
    });
    Ok(json!({
        "step_id": step_id,
        "learnings": learnings(&fs, step_id),
        "runs": runs,
        "last_execution": last,
    }))
}

/// The step in run folder `folder`: status, failed items, latest validation reports, logs.
fn run_of(root: &Path, fs: &WorkspaceFs, folder: &str, step_id: &str) -> Value {
    let step_dir = root
        .join("runs")
        .join(folder)
        .join("execution")
        .join(step_id);
    if !fs.is_dir(&step_dir) {
        return json!({"run_folder": folder, "status": "not run"});
    }
    let report = match show_step(root, folder, step_id) {
        Ok(report) => report,
        Err(e) => return json!({"run_folder": folder, "error": format!("{e:#}")}),
    };
    let rel = |p: &Path| {
        p.strip_prefix(root)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    let failed_items: Vec<Value> = report
        .entries
        .iter()
        .filter(|e| e.status == Status::Failed)
        .map(|e| {
            json!({
                "entry_id": e.entry_id,
                "item_id": e.item_id,
                "item_type": e.item_type,
                "summary": e.summary.as_deref().map(|s| cut(s, 1000)),
            })
        })
        .collect();
    let validation: Vec<Value> = report
        .gates
        .iter()
        .map(|g| {
            json!({
                "label": g.label,
                "attempt": g.attempt,
                "passed": g.passed,
                "checks": g.checks,
                "report": rel(&logs_dir(&root.join("runs").join(folder), step_id)
                    .join(format!("pre_validation_{}_attempt_{}.json", g.label, g.attempt))),
                "failed_checks": g.failed.iter().map(|c| json!({
                    "file": c.file,
                    "path": c.path,
                    "expected": c.expected,
                    "actual": c.actual,
                    "message": c.message,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut logs: Vec<String> = report
        .turns
        .iter()
        .map(|t| rel(&t.path))
        .chain(report.script_logs.iter().map(|p| rel(p)))
        .collect();
    logs.sort();
    json!({
        "run_folder": folder,
        "status": report.status,
        "concerns": report.concerns,
        "failed_items": failed_items,
        "validation": validation,
        "logs_dir": rel(&logs_dir(&root.join("runs").join(folder), step_id)),
        "logs": logs,
    })
}

/// The files of `learnings/<step>/`, each cut to [`LEARNING_CHARS`].
fn learnings(fs: &WorkspaceFs, step_id: &str) -> Value {
    let dir = Path::new("learnings").join(step_id);
    let mut files = Vec::new();
    collect(fs, &dir, &mut files);
    files.sort();
    let shown: Vec<Value> = files
        .iter()
        .take(LEARNING_FILES)
        .map(|path| {
            // What is shown, not the whole file.
            let text = fs
                .read_head(path, LEARNING_CHARS as u64 * 4)
                .map(|(b, _)| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            json!({"path": path.to_string_lossy(), "content": cut(&text, LEARNING_CHARS)})
        })
        .collect();
    json!({"folder": dir.to_string_lossy(), "files": shown, "total_files": files.len()})
}

/// The files under `dir` (links neither listed nor followed), under the read set's rules:
/// no hidden or secret-looking file or folder, no file with other hard links.
fn collect(fs: &WorkspaceFs, dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    // A folder that cannot be listed ends the listing with what was found before it.
    let _ = fs.walk(dir, |path, kind| {
        if refusal_for(path).is_some() {
            return false;
        }
        match kind {
            Kind::Dir => true,
            Kind::File if !has_other_links(fs, path) => {
                out.push(path.to_path_buf());
                false
            }
            _ => false,
        }
    });
}
