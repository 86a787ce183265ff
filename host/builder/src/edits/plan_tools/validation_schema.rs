//! `update_validation_schema`: a step's gate set in the plan, with a note when a run's
//! own step config holds one that wins over it.

use std::path::Path;

use serde_json::{Value, json};

use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::{STEP_CONFIG_FILE, step_config_location};

use super::{id_of, locate, step_config_entries, steps_mut, top_ids, unknown_step};
use crate::ToolResult;
use crate::edits::args::req_str;
use crate::edits::changelog::Change;
use crate::edits::draft::Draft;

/// The step config in force for builder runs (`runs/iteration-0/...` when it exists) and the
/// `validation_schema` it holds for step `id`.
fn config_schema_in_force(fs: &WorkspaceFs, draft_config: &Value, id: &str) -> Option<String> {
    let rel = step_config_location(fs, Some("iteration-0"));
    let text = if rel == Path::new(STEP_CONFIG_FILE) {
        draft_config.clone()
    } else {
        serde_json::from_str(&fs.read_json_text(&rel).ok()?).ok()?
    };
    step_config_entries(&text)
        .iter()
        .find(|e| id_of(e) == Some(id))
        .filter(|e| e.get("validation_schema").is_some_and(|v| !v.is_null()))
        .map(|_| rel.to_string_lossy().replace('\\', "/"))
}

/// `update_validation_schema`.
pub(in crate::edits) fn update_validation_schema(root: &Path, args: &Value) -> ToolResult {
    let reason = req_str(args, "reason")?;
    let id = req_str(args, "step_id")?;
    let new = args
        .get("validation_schema")
        .cloned()
        .unwrap_or(Value::Null);
    let mut draft = Draft::open(root)?;
    let Some((list, index)) = locate(&draft.plan.value, id) else {
        return Err(unknown_step(id, top_ids(&draft.plan.value)));
    };
    let step = &mut steps_mut(&mut draft.plan.value, list)[index];
    let old = step
        .get("validation_schema")
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(o) = step.as_object_mut() {
        if new.is_null() {
            o.remove("validation_schema");
        } else {
            o.insert("validation_schema".into(), new.clone());
        }
    }
    let shadowed = config_schema_in_force(&draft.fs, &draft.config.value, id);
    let changes = [Change::new(Some(id), "validation_schema", old, new)];
    let done = draft.commit(
        "update_validation_schema",
        reason,
        &[id.to_string()],
        &changes,
    )?;
    let mut extra = json!({"step_id": id});
    if let Some(file) = shadowed {
        extra["shadowed_by"] = json!(file);
        extra["note"] = json!(format!(
            "{file} holds a validation_schema for step {id:?}: that one wins over the plan's \
             at run time; change it there (update_step_config cannot) or remove it for this \
             edit to take effect"
        ));
    }
    Ok(done.answer(extra))
}
