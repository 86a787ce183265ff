//! `migrate_message_sequence_code_items`: the workflow crate's migration run as a builder
//! tool, its result logged to the changelog like any edit.

use std::path::Path;

use serde_json::{Value, json};

use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::PLAN_FILE;
use trellis_workflow::migrate::{MigrationError, migrate_message_sequence_code_items};

use crate::edits::args::req_str;
use crate::edits::changelog::{self, Change};
use crate::{ToolFailure, ToolResult};

/// `migrate_message_sequence_code_items`.
pub(in crate::edits) fn migrate(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let fs = WorkspaceFs::open(root)
        .map_err(|e| ToolFailure::new(format!("the workspace cannot be opened: {e}")))?;
    let before = fs.read(PLAN_FILE).ok();
    let log = changelog::changelog_path(&trellis_sandbox::store::now_rfc3339());
    changelog::read_entries(&fs, &log).map_err(|e| ToolFailure::new(e.to_string()))?;
    let summary = match migrate_message_sequence_code_items(root) {
        Ok(s) => s,
        Err(MigrationError::Blocked(b)) => {
            return Err(ToolFailure::with_details(
                b.to_string(),
                json!({"code": trellis_workflow::migrate::BLOCKED_CODE, "reasons": b.reasons}),
            ));
        }
        Err(MigrationError::Invalid(d)) => {
            let diags: Vec<Value> = d
                .errors()
                .map(|d| json!({"file": d.file, "json_path": d.json_path, "step_id": d.step_id, "message": d.message}))
                .collect();
            return Err(ToolFailure::with_details(
                format!("the migration was refused, nothing was written:\n{d}"),
                json!({"diagnostics": diags}),
            ));
        }
        Err(e) => return Err(ToolFailure::new(format!("the migration failed: {e}"))),
    };
    let after = fs.read(PLAN_FILE).ok();
    let converted: Vec<Value> = summary
        .converted
        .iter()
        .map(|c| json!({"sequence_id": c.sequence_id, "new_step_ids": c.new_step_ids}))
        .collect();
    let scripts: Vec<String> = summary
        .scripts
        .iter()
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .collect();
    let changed =
        before != after || summary.contract_before.as_deref() != Some(&summary.contract_after);
    let mut logged = Value::Null;
    if changed {
        let mut step_ids = Vec::new();
        let mut changes = Vec::new();
        for c in &summary.converted {
            step_ids.push(c.sequence_id.clone());
            step_ids.extend(c.new_step_ids.iter().cloned());
            changes.push(Change::new(
                Some(&c.sequence_id),
                "step",
                json!("message_sequence with code items"),
                json!(c.new_step_ids),
            ));
        }
        changes.push(Change::new(
            None,
            "workflow.version",
            json!(summary.contract_before),
            json!(summary.contract_after),
        ));
        let timestamp = trellis_sandbox::store::now_rfc3339();
        let log = changelog::changelog_path(&timestamp);
        let entry = json!({
            "timestamp": timestamp,
            "tool": "migrate_message_sequence_code_items",
            "reason": reason,
            "step_ids": step_ids,
            "changes": changes.iter().map(Change::to_json).collect::<Vec<_>>(),
            "before_sha256": changelog::sha256(before.as_deref()),
            "after_sha256": changelog::sha256(after.as_deref()),
        });
        changelog::append(&fs, &log, entry).map_err(|e| {
            ToolFailure::new(format!(
                "the migration was written but its changelog entry was not: {e}"
            ))
        })?;
        logged = json!(format!("{}/", changelog::CHANGELOG_DIR));
    }
    Ok(json!({
        "ok": true,
        "changed": changed,
        "contract_before": summary.contract_before,
        "contract_after": summary.contract_after,
        "converted": converted,
        "scripts": scripts,
        "changelog": logged,
    }))
}
