//! Edits of `workflow.json` `schedules[]` made outside a turn (the server's scheduler API):
//! validated and logged like every other edit.

use std::path::Path;

use serde_json::{Value, json};

use super::changelog::Change;
use super::draft::Draft;
use crate::{ToolFailure, ToolResult};

/// Sets `enabled` of schedule `id` in `workflow.json`, for `reason` (logged to the changelog).
/// A schedule already so answers `changed: false`; an unknown one is a failure naming the
/// schedules there are.
pub fn set_schedule_enabled(root: &Path, id: &str, enabled: bool, reason: &str) -> ToolResult {
    let mut draft = Draft::open(root)?;
    let schedules = draft
        .manifest
        .value
        .get_mut("schedules")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| ToolFailure::new("workflow.json has no schedules"))?;
    let ids: Vec<String> = schedules
        .iter()
        .filter_map(|s| s.get("id").and_then(Value::as_str).map(str::to_string))
        .collect();
    let Some(schedule) = schedules
        .iter_mut()
        .find(|s| s.get("id").and_then(Value::as_str) == Some(id))
    else {
        return Err(ToolFailure::new(format!(
            "no schedule {id:?} in workflow.json (its schedules: {})",
            ids.join(", ")
        )));
    };
    let old = schedule.get("enabled").cloned().unwrap_or(Value::Null);
    if old == json!(enabled) {
        return Ok(json!({"ok": true, "changed": false, "schedule_id": id, "enabled": enabled}));
    }
    schedule["enabled"] = json!(enabled);
    let change = Change::new(None, format!("schedules.{id}.enabled"), old, json!(enabled));
    let tool = if enabled {
        "enable_schedule"
    } else {
        "disable_schedule"
    };
    let done = draft.commit(tool, reason, &[], &[change])?;
    Ok(done.answer(json!({"schedule_id": id, "enabled": enabled})))
}
