//! `list_run_artifacts` and `get_cost_summary`: what runs and builder sessions left behind,
//! read through [`trellis_runner::runs`] (which only reads, never follows links) and, for one
//! artifact by path, through the same sandboxed read as `read_workspace_file`.

use std::path::Path;

use serde_json::{Map, Value, json};

use trellis_runner::runs::{StepReport, first_line, list_runs, show_step};
use trellis_sandbox::store::WorkspaceFs;

use super::workspace_files::read_file;
use super::{
    ACTIVE_RUN, ToolContext, ToolFailure, ToolResult, open_fs, plan_step_ids, read_json_file,
    relative_path, run_folder, unknown_step,
};

/// Characters of a summary or result shown in a listing.
const SHORT: usize = 300;
/// Output files listed per step at most.
const MAX_OUTPUTS: usize = 50;
/// The builder's token usage, written by the builder session (spec section 11).
pub const TOKEN_USAGE_FILE: &str = "costs/phase/token_usage.json";
/// The builder's daily token usage files.
pub const DAILY_DIR: &str = "costs/phase/daily";

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max).collect();
    out.push('…');
    out
}

fn rel_str(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// `list_run_artifacts(step_id?, group_name?, path?)`.
pub async fn list_run_artifacts(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    if let Some(path) = args.get("path").and_then(Value::as_str) {
        return read_artifact(ctx, path).await;
    }
    let run = run_folder(ctx, args.get("group_name").and_then(Value::as_str))?;
    let fs = open_fs(ctx)?;
    let plan = read_json_file(&fs, trellis_workflow::PLAN_FILE)
        .ok()
        .flatten();
    let plan_ids = plan_step_ids(plan.as_ref());
    let listings =
        list_runs(ctx.root).map_err(|e| ToolFailure::new(format!("reading runs/: {e:#}")))?;
    let run_folders: Vec<Value> = listings
        .iter()
        .map(|l| {
            json!({
                "run_folder": l.run_folder,
                "active": l.run_folder == ACTIVE_RUN || l.run_folder.starts_with(&format!("{ACTIVE_RUN}/")),
                "steps": l.steps.iter().map(|s| json!({
                    "step_id": s.step_id, "status": s.status, "completed_at": s.completed_at,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let ran: Vec<String> = listings
        .iter()
        .find(|l| l.run_folder == run)
        .map(|l| l.steps.iter().map(|s| s.step_id.clone()).collect())
        .unwrap_or_default();
    let wanted: Vec<String> = match args.get("step_id").and_then(Value::as_str) {
        Some(id) if ran.iter().any(|r| r == id) => vec![id.to_string()],
        Some(id) if plan_ids.iter().any(|p| p == id) => {
            return Ok(json!({
                "run_folder": run,
                "step_id": id,
                "status": "not run",
                "note": format!("step {id:?} has no output in runs/{run}: it has not run there"),
            }));
        }
        Some(id) => return Err(unknown_step(id, &plan_ids)),
        None => ran,
    };
    let mut steps = Vec::new();
    for id in &wanted {
        ctx.check_time()?;
        match show_step(ctx.root, &run, id) {
            Ok(report) => steps.push(step_json(ctx.root, &fs, &run, &report)),
            Err(e) => steps.push(json!({"step_id": id, "error": format!("{e:#}")})),
        }
    }
    let mut answer = Map::new();
    answer.insert("run_folder".into(), json!(run));
    answer.insert("run_folders".into(), Value::Array(run_folders));
    if steps.is_empty() {
        answer.insert(
            "note".into(),
            json!(format!("nothing has run in runs/{run} yet")),
        );
    }
    answer.insert("steps".into(), Value::Array(steps));
    Ok(Value::Object(answer))
}

fn step_json(root: &Path, fs: &WorkspaceFs, run: &str, r: &StepReport) -> Value {
    let step_dir = format!("runs/{run}/execution/{}", r.step_id);
    let logs_dir = format!("runs/{run}/logs/{}", r.step_id);
    let session = root
        .join(&step_dir)
        .join(trellis_runner::session::SESSION_FILE);
    // Beside the turn logs (where the original system puts it), else in the output folder
    // (run folders of the earlier layout).
    let summary_path = [
        root.join(&logs_dir)
            .join(trellis_runner::session::TURN_LOGS_DIR),
        root.join(&step_dir),
    ]
    .into_iter()
    .map(|dir| dir.join(trellis_runner::session::FINAL_SUMMARY_FILE))
    .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()));
    let final_summary = summary_path.and_then(|summary_path| {
        let v = fs.read_json_value(&summary_path).ok()?;
        Some(json!({
            "path": rel_str(root, &summary_path),
            "status": v["status"],
            "execution_result": cut(&text_of(&v["execution_result"]), SHORT),
            "concerns": v["concerns"],
            "completed_at": v["completed_at"],
        }))
    });
    json!({
        "step_id": r.step_id,
        "status": r.status,
        "completed_at": r.completed_at,
        "concerns": r.concerns,
        "session": std::fs::symlink_metadata(&session).is_ok_and(|m| m.is_file()).then(|| rel_str(root, &session)),
        "final_summary": final_summary,
        "entries": r.entries.iter().map(|e| json!({
            "entry_id": e.entry_id,
            "item_id": e.item_id,
            "item_type": e.item_type,
            "status": e.status.to_string(),
            "summary": cut(first_line(e.summary.as_deref()), SHORT),
        })).collect::<Vec<_>>(),
        "turn_logs": r.turns.iter().map(|t| json!({
            "path": rel_str(root, &t.path),
            "item_id": t.item_id,
            "attempt": t.attempt,
            "iteration": t.iteration,
            "status": t.status.to_string(),
            "model": t.model,
            "tool_calls": t.tool_calls,
            "tool_errors": t.tool_errors,
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
        })).collect::<Vec<_>>(),
        "gates": r.gates.iter().map(|g| json!({
            "label": g.label,
            "attempt": g.attempt,
            "passed": g.passed,
            "checks": g.checks,
            "failed": g.failed.iter().map(|f| json!({
                "file": f.file, "path": f.path, "message": cut(&f.message, SHORT),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "script_logs": r.script_logs.iter().map(|p| rel_str(root, p)).collect::<Vec<_>>(),
        "outputs": r.outputs.iter().take(MAX_OUTPUTS).map(|p| rel_str(root, p)).collect::<Vec<_>>(),
        "outputs_truncated": r.outputs.len() > MAX_OUTPUTS,
        "logs_dir": logs_dir,
    })
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Reads one artifact under `runs/`: JSON files parsed, text files in a window.
async fn read_artifact(ctx: &ToolContext<'_>, path: &str) -> ToolResult {
    let rel = relative_path(path)?;
    if !rel.starts_with("runs") || rel == Path::new("runs") {
        return Err(ToolFailure::new(format!(
            "argument \"path\": {path:?} is not under runs/; read other files with \
             read_workspace_file"
        )));
    }
    let shown = rel.to_string_lossy().replace('\\', "/");
    let mut answer = read_file(ctx, &shown, None, None).await?;
    if shown.ends_with(".json")
        && answer["truncated"] == false
        && let Some(parsed) = answer["content"]
            .as_str()
            .filter(|t| {
                trellis_sandbox::json_values::json_values(t.as_bytes())
                    <= trellis_sandbox::json_values::MAX_FILE_VALUES
            })
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
    {
        answer["json"] = parsed;
        if let Some(obj) = answer.as_object_mut() {
            obj.remove("content");
        }
    }
    Ok(answer)
}

/// `get_cost_summary()`.
pub fn cost_summary(ctx: &ToolContext<'_>) -> ToolResult {
    let fs = open_fs(ctx)?;
    let mut answer = Map::new();
    let builder = match read_json_file(&fs, TOKEN_USAGE_FILE) {
        Ok(Some(v)) => json!({"file": TOKEN_USAGE_FILE, "recorded": true, "usage": v}),
        Ok(None) => json!({"file": TOKEN_USAGE_FILE, "recorded": false}),
        Err(e) => json!({"file": TOKEN_USAGE_FILE, "recorded": true, "error": e.message}),
    };
    answer.insert("builder".into(), builder);
    let mut daily = Vec::new();
    if fs.is_dir(DAILY_DIR)
        && let Ok(entries) = fs.list(DAILY_DIR)
    {
        for (name, kind) in entries {
            ctx.check_time()?;
            if kind != trellis_sandbox::store::Kind::File || !name.ends_with(".json") {
                continue;
            }
            let file = format!("{DAILY_DIR}/{name}");
            let usage = read_json_file(&fs, &file)
                .ok()
                .flatten()
                .unwrap_or(Value::Null);
            daily.push(json!({"file": file, "usage": usage}));
        }
    }
    answer.insert("builder_daily".into(), Value::Array(daily));

    // The steps' token usage, from the turn logs of the builder's run folders.
    let listings = list_runs(ctx.root).unwrap_or_default();
    let mut runs = Vec::new();
    let (mut total_prompt, mut total_completion) = (0u64, 0u64);
    for listing in listings.iter().filter(|l| {
        l.run_folder == ACTIVE_RUN || l.run_folder.starts_with(&format!("{ACTIVE_RUN}/"))
    }) {
        let mut steps = Vec::new();
        for step in &listing.steps {
            ctx.check_time()?;
            let Ok(report) = show_step(ctx.root, &listing.run_folder, &step.step_id) else {
                continue;
            };
            // The counts come from files anyone who wrote the workspace may have planted:
            // their sums saturate rather than overflow (which panics).
            let sum = |count: fn(&trellis_runner::runs::TurnLog) -> u64| {
                report.turns.iter().map(count).fold(0, u64::saturating_add)
            };
            let prompt = sum(|t| t.prompt_tokens);
            let completion = sum(|t| t.completion_tokens);
            if report.turns.is_empty() {
                continue;
            }
            total_prompt = total_prompt.saturating_add(prompt);
            total_completion = total_completion.saturating_add(completion);
            steps.push(json!({
                "step_id": step.step_id,
                "turns": report.turns.len(),
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "models": report.turns.iter().map(|t| t.model.clone()).collect::<std::collections::BTreeSet<_>>(),
            }));
        }
        if !steps.is_empty() {
            runs.push(json!({"run_folder": listing.run_folder, "steps": steps}));
        }
    }
    let recorded_runs = !runs.is_empty();
    answer.insert(
        "runs".into(),
        json!({
            "recorded": recorded_runs,
            "prompt_tokens": total_prompt,
            "completion_tokens": total_completion,
            "by_run_folder": runs,
        }),
    );
    let builder_recorded = answer["builder"]["recorded"] == true;
    if !builder_recorded && !recorded_runs {
        answer.insert(
            "note".into(),
            json!(format!(
                "nothing is recorded yet: no {TOKEN_USAGE_FILE} and no turn logs with token \
                 counts in runs/{ACTIVE_RUN}"
            )),
        );
    }
    Ok(Value::Object(answer))
}
