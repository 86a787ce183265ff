//! The read set every mode has: plan, step config, workflow config, workspace files (never
//! secrets), the database read-only, run artifacts and logs, costs.
//!
//! Invariants:
//! - Nothing here writes to the workspace.
//! - Workspace files are read under the secret rule of [`refusal_for`]: no hidden file or
//!   folder (`.env`, `.git/`, `.ssh/`), no key- or credential-looking name, no `..`, no
//!   absolute path, no symbolic link anywhere on the way (whether it leads out or not), no
//!   file with other hard links.
//! - `query_database` runs on the connection guests' `workflow-db` calls get, opened
//!   read-only, with the same fences ([`trellis_runner::db_tools`]).
//! - Each call's arguments are checked against its JSON Schema before anything is read.

mod runs;
mod workspace_files;

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value, json};

use trellis_sandbox::store::WorkspaceFs;
use trellis_workflow::manifest::{VARIABLES_FILE, WorkflowManifest};
use trellis_workflow::{Diagnostics, PLAN_FILE, STEP_CONFIG_FILE, WORKFLOW_FILE};

use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};
use trellis_runner::db_tools;

/// The run folder the builder works in (spec section 11).
pub const ACTIVE_RUN: &str = "iteration-0";

/// Diagnostics listed in an answer at most.
const MAX_DIAGNOSTICS: usize = 50;

/// The specs of the read tools ([`super::modes::READ_TOOLS`]).
pub fn specs() -> Vec<ToolSpec> {
    let step_id = json!({"type": "string", "description": "A step id of the plan."});
    let group = json!({
        "type": "string",
        "description": "A group (id or display name); its run folder is runs/iteration-0/<group folder>."
    });
    vec![
        ToolSpec {
            name: "read_plan",
            description: "Reads planning/plan.json: the whole plan, or one step with `step_id`. \
                          Also returns what validating the workspace finds (errors and warnings).",
            parameters: strict(json!({"step_id": step_id.clone()}), &[]),
        },
        ToolSpec {
            name: "read_step_config",
            description: "Reads the step config in force for the builder's run folder \
                          (runs/iteration-0[/<group>]/planning/step_config.json when it exists, \
                          else planning/step_config.json) and says which file that is; one \
                          step's entry with `step_id`.",
            parameters: strict(
                json!({"step_id": step_id.clone(), "group_name": group.clone()}),
                &[],
            ),
        },
        ToolSpec {
            name: "read_workflow_config",
            description: "Reads workflow.json and variables/variables.json: each file as written, \
                          the merged view the runtime uses, and for every variable and group the \
                          file it comes from (variables/variables.json wins over workflow.json).",
            parameters: strict(json!({}), &[]),
        },
        ToolSpec {
            name: "list_workspace_files",
            description: "Lists files and folders of the workspace (or of the folder `path`) down \
                          to `max_depth` levels (default 2). Hidden and secret-looking entries \
                          are left out and counted; symbolic links are listed, never followed.",
            parameters: strict(
                json!({
                    "path": {"type": "string", "description": "Workspace-relative folder; default: the workspace."},
                    "max_depth": {"type": "integer", "minimum": 1, "maximum": workspace_files::MAX_DEPTH}
                }),
                &[],
            ),
        },
        ToolSpec {
            name: "read_workspace_file",
            description: "Reads a UTF-8 text file of the workspace, in a window of lines \
                          (`offset_line` from 1, `max_lines`, default 2000). Refused: hidden \
                          files (.env), key or credential files, symbolic links, paths leaving \
                          the workspace.",
            parameters: strict(
                json!({
                    "path": {"type": "string", "description": "Workspace-relative file, e.g. code/fetch/main.py."},
                    "offset_line": {"type": "integer", "minimum": 1},
                    "max_lines": {"type": "integer", "minimum": 1, "maximum": workspace_files::MAX_LINES}
                }),
                &["path"],
            ),
        },
        ToolSpec {
            name: "query_database",
            description: "Runs one read-only SQL statement (SELECT, WITH, or a table-describing \
                          PRAGMA) on db/db.sqlite and returns its rows as JSON objects. Writes, \
                          ATTACH and pragma writes are refused. `SELECT name, sql FROM \
                          sqlite_schema` lists the tables.",
            parameters: strict(
                json!({
                    "sql": {"type": "string", "minLength": 1},
                    "params": {
                        "type": "array",
                        "description": "Values for the ? placeholders, in order.",
                        "items": {"type": ["string", "number", "integer", "boolean", "null"]}
                    },
                    "max_rows": {"type": "integer", "minimum": 1, "maximum": db_tools::MAX_ROWS}
                }),
                &["sql"],
            ),
        },
        ToolSpec {
            name: "list_run_artifacts",
            description: "Lists the run folders and, for the builder's run folder \
                          (runs/iteration-0[/<group>]), each step's status, final summary, \
                          session entries, turn logs with token counts, gates and output files. \
                          With `path` (under runs/) it reads that one artifact instead.",
            parameters: strict(
                json!({
                    "step_id": step_id,
                    "group_name": group,
                    "path": {"type": "string", "description": "An artifact under runs/ to read, e.g. runs/iteration-0/logs/a/pre_validation.json."}
                }),
                &[],
            ),
        },
        ToolSpec {
            name: "get_cost_summary",
            description: "Token usage and costs: the builder's (costs/phase/token_usage.json and \
                          the daily files) and the steps' of the builder's run folder (from their \
                          turn logs). Says when nothing is recorded.",
            parameters: strict(json!({}), &[]),
        },
    ]
}

/// Calls read tool `name`.
pub async fn call(ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
    let spec = specs()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ToolFailure::new(format!("{name:?} is not a read tool")))?;
    check_args(&spec, args)?;
    match name {
        "read_plan" => read_plan(ctx, args),
        "read_step_config" => read_step_config(ctx, args),
        "read_workflow_config" => read_workflow_config(ctx),
        "list_workspace_files" => workspace_files::list(ctx, args),
        "read_workspace_file" => workspace_files::read(ctx, args).await,
        "query_database" => query_database(ctx, args).await,
        "list_run_artifacts" => runs::list_run_artifacts(ctx, args).await,
        "get_cost_summary" => runs::cost_summary(ctx),
        _ => unreachable!("every spec is dispatched"),
    }
}

/// A strict object schema with `properties` and `required`.
pub fn strict(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// Checks `args` against `spec`'s schema: a failure naming each argument that does not fit
/// and what was expected. A refusal quotes the arguments it names, so each problem is cut to
/// [`PROBLEM_BYTES`] and the message to [`crate::MAX_ERROR_BYTES`]: a model's megabytes of
/// wrong arguments come back as a line, not as themselves.
pub fn check_args(spec: &ToolSpec, args: &Value) -> Result<(), ToolFailure> {
    use trellis_sandbox::cut::marked;
    let validator = jsonschema::validator_for(&spec.parameters).map_err(|e| {
        ToolFailure::new(format!("the schema of {} does not compile: {e}", spec.name))
    })?;
    let problems: Vec<String> = validator
        .iter_errors(args)
        .take(20)
        .map(|err| {
            let at = err.instance_path().to_string();
            let at = marked(at.trim_start_matches('/'), PROBLEM_BYTES);
            let err = marked(&err.to_string(), PROBLEM_BYTES);
            if at.is_empty() {
                format!("arguments: {err}")
            } else {
                format!("argument {at:?}: {err}")
            }
        })
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    Err(ToolFailure::with_details(
        marked(
            &format!(
                "invalid arguments for {}: {}",
                spec.name,
                problems.join("; ")
            ),
            crate::MAX_ERROR_BYTES,
        ),
        json!({"expected": spec.parameters}),
    ))
}

/// The bytes of one schema problem a refusal keeps (it quotes the value it refuses).
pub const PROBLEM_BYTES: usize = 512;

/// The workspace-relative path `input` names, checked lexically: not absolute, no `..`.
/// `.` and the empty string are the workspace itself.
pub fn relative_path(input: &str) -> Result<PathBuf, ToolFailure> {
    let trimmed = input.trim();
    if trimmed.starts_with('/') || Path::new(trimmed).is_absolute() {
        return Err(ToolFailure::new(format!(
            "{input:?} is an absolute path: give a path relative to the workspace \
             (code/<step>/main.py)"
        )));
    }
    let mut out = PathBuf::new();
    for part in Path::new(trimmed).components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => {
                return Err(ToolFailure::new(format!(
                    "{input:?} leaves the workspace: `..` is refused; give a path relative to \
                     the workspace"
                )));
            }
        }
    }
    Ok(out)
}

pub use trellis_sandbox::store::private_names::{has_other_links, refusal_for};

fn open_fs(ctx: &ToolContext<'_>) -> Result<WorkspaceFs, ToolFailure> {
    ctx.fs()
}

/// The text of a workspace file, `Ok(None)` when it does not exist; a file with other hard
/// links is refused ([`has_other_links`] says why).
fn read_text(fs: &WorkspaceFs, rel: &str) -> std::io::Result<Option<String>> {
    if fs.is_file(rel) && has_other_links(fs, Path::new(rel)) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "refused: it has other hard links; a file linked from elsewhere (perhaps outside \
             the workspace) is never read",
        ));
    }
    fs.read_optional(rel)
}

/// A JSON file of the workspace: `Ok(None)` when it does not exist.
fn read_json_file(fs: &WorkspaceFs, rel: &str) -> Result<Option<Value>, ToolFailure> {
    let Some(text) = read_text(fs, rel).map_err(|e| ToolFailure::new(format!("{rel}: {e}")))?
    else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ToolFailure::new(format!("{rel} is not valid JSON: {e}")))
}

fn diagnostics_json(diags: &Diagnostics) -> Value {
    let list: Vec<Value> = diags
        .iter()
        .take(MAX_DIAGNOSTICS)
        .map(|d| serde_json::to_value(d).unwrap_or(Value::Null))
        .collect();
    Value::Array(list)
}

/// The step ids of the plan as written (empty without a readable plan).
fn plan_step_ids(plan: Option<&Value>) -> Vec<String> {
    plan.and_then(|p| p["steps"].as_array())
        .map(|steps| {
            steps
                .iter()
                .filter_map(|s| s["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The failure of an unknown step id: lists the valid ones.
fn unknown_step(step_id: &str, valid: &[String]) -> ToolFailure {
    let listed = if valid.is_empty() {
        "the plan has no steps yet".to_string()
    } else {
        format!("the plan's steps are: {}", valid.join(", "))
    };
    ToolFailure::with_details(
        format!("unknown step id {step_id:?}; {listed}"),
        json!({"valid_step_ids": valid}),
    )
}

fn read_plan(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let fs = open_fs(ctx)?;
    let Some(plan) = read_json_file(&fs, PLAN_FILE)? else {
        return Ok(json!({
            "file": PLAN_FILE,
            "exists": false,
            "note": "there is no plan yet: add steps with the plan tools",
        }));
    };
    let diagnostics = trellis_workflow::validate_workspace(ctx.root);
    let base = json!({
        "file": PLAN_FILE,
        "exists": true,
        "valid": !diagnostics.has_errors(),
        "diagnostics": diagnostics_json(&diagnostics),
    });
    let mut answer = base.as_object().cloned().unwrap_or_default();
    match args.get("step_id").and_then(Value::as_str) {
        Some(id) => {
            let step = plan["steps"]
                .as_array()
                .and_then(|steps| steps.iter().find(|s| s["id"] == id))
                .cloned()
                .ok_or_else(|| unknown_step(id, &plan_step_ids(Some(&plan))))?;
            answer.insert("step".into(), step);
        }
        None => {
            answer.insert("plan".into(), plan);
        }
    }
    Ok(Value::Object(answer))
}

/// The run folder of the builder for `group_name`: `iteration-0`, or
/// `iteration-0/<group folder>` for a group of the workflow config.
fn run_folder(ctx: &ToolContext<'_>, group_name: Option<&str>) -> Result<String, ToolFailure> {
    let Some(wanted) = group_name.filter(|g| !g.trim().is_empty()) else {
        return Ok(ACTIVE_RUN.to_string());
    };
    let fs = open_fs(ctx)?;
    let manifest = merged_manifest(&fs).0.unwrap_or_default();
    let mut names = Vec::new();
    for group in &manifest.groups {
        let folder = group.folder_name().ok();
        let matches = group.id == wanted
            || group.name.as_deref() == Some(wanted)
            || folder.as_deref() == Some(wanted);
        if matches {
            let folder = folder.ok_or_else(|| {
                ToolFailure::new(format!("group {wanted:?} has no usable folder name"))
            })?;
            return Ok(format!("{ACTIVE_RUN}/{folder}"));
        }
        names.push(group.name.clone().unwrap_or_else(|| group.id.clone()));
    }
    let listed = if names.is_empty() {
        "the workflow has no groups".to_string()
    } else {
        format!("the groups are: {}", names.join(", "))
    };
    Err(ToolFailure::with_details(
        format!("unknown group {wanted:?}; {listed}"),
        json!({"valid_groups": names}),
    ))
}

fn read_step_config(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let fs = open_fs(ctx)?;
    let run = run_folder(ctx, args.get("group_name").and_then(Value::as_str))?;
    let location = trellis_workflow::step_config_location(&fs, Some(&run));
    let file = location.to_string_lossy().replace('\\', "/");
    let run_specific = file != STEP_CONFIG_FILE;
    let config = read_json_file(&fs, &file)?;
    let mut answer = Map::new();
    answer.insert("file".into(), json!(file));
    answer.insert("run_folder".into(), json!(run));
    answer.insert("exists".into(), json!(config.is_some()));
    if run_specific {
        answer.insert(
            "note".into(),
            json!(format!(
                "{file} is in force: it wins over {STEP_CONFIG_FILE}, which \
                 update_step_config writes"
            )),
        );
    }
    // Both formats: `{"steps": [...]}` and the legacy root-level array.
    let entries: Vec<Value> = match &config {
        Some(Value::Array(list)) => list.clone(),
        Some(v) => v["steps"].as_array().cloned().unwrap_or_default(),
        None => Vec::new(),
    };
    match args.get("step_id").and_then(Value::as_str) {
        Some(id) => {
            let plan = read_json_file(&fs, PLAN_FILE).ok().flatten();
            let mut valid = plan_step_ids(plan.as_ref());
            let entry = entries.iter().find(|e| e["id"] == id).cloned();
            if entry.is_none() && !valid.iter().any(|v| v == id) {
                for e in &entries {
                    if let Some(eid) = e["id"].as_str()
                        && !valid.iter().any(|v| v == eid)
                    {
                        valid.push(eid.to_string());
                    }
                }
                return Err(unknown_step(id, &valid));
            }
            if let Some(e) = &entry
                && e.get("validation_schema").is_some_and(|v| !v.is_null())
            {
                answer.insert(
                    "validation_schema_note".into(),
                    json!(format!(
                        "this entry's validation_schema (in {file}) wins over the plan's"
                    )),
                );
            }
            if entry.is_none() {
                answer.insert(
                    "defaults".into(),
                    json!("the step has no entry: the defaults of section 3 apply"),
                );
            }
            answer.insert("step_id".into(), json!(id));
            answer.insert("entry".into(), entry.unwrap_or(Value::Null));
        }
        None => {
            answer.insert("step_config".into(), config.unwrap_or(json!({"steps": []})));
        }
    }
    Ok(Value::Object(answer))
}

/// `workflow.json` with `variables/variables.json` merged in, as the runtime reads them, and
/// the diagnostics of both. `None` when either file has an error.
fn merged_manifest(fs: &WorkspaceFs) -> (Option<WorkflowManifest>, Diagnostics) {
    let mut diags = Diagnostics::new();
    let mut manifest = match read_text(fs, WORKFLOW_FILE) {
        Ok(None) => Some(WorkflowManifest::default()),
        Ok(Some(text)) => match trellis_workflow::manifest::parse_manifest(&text, WORKFLOW_FILE) {
            Ok((m, d)) => {
                diags.extend(d);
                Some(m)
            }
            Err(d) => {
                diags.extend(d);
                None
            }
        },
        Err(e) => {
            diags.push(read_error(WORKFLOW_FILE, &e));
            None
        }
    };
    if let Some(m) = &mut manifest {
        match read_text(fs, VARIABLES_FILE) {
            Ok(None) => {}
            Ok(Some(text)) => {
                let d = trellis_workflow::manifest::merge_variables_file(&text, VARIABLES_FILE, m);
                let bad = d.has_errors();
                diags.extend(d);
                if bad {
                    manifest = None;
                }
            }
            Err(e) => {
                diags.push(read_error(VARIABLES_FILE, &e));
                manifest = None;
            }
        }
    }
    (manifest, diags)
}

fn read_error(file: &str, e: &std::io::Error) -> trellis_workflow::Diagnostic {
    trellis_workflow::Diagnostic {
        file: file.to_string(),
        json_path: String::new(),
        step_id: None,
        message: format!("cannot be read: {e}"),
        severity: trellis_workflow::Severity::Error,
    }
}

/// The names a list of `{name, ...}` objects under `key` declares.
fn declared_names(value: Option<&Value>, key: &str) -> BTreeSet<String> {
    value
        .and_then(|v| v[key].as_array())
        .map(|list| {
            list.iter()
                .filter_map(|e| e["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn read_workflow_config(ctx: &ToolContext<'_>) -> ToolResult {
    let fs = open_fs(ctx)?;
    let raw_workflow = read_json_file(&fs, WORKFLOW_FILE);
    let raw_variables = read_json_file(&fs, VARIABLES_FILE);
    let variables_file = raw_variables.as_ref().ok().cloned().flatten();
    let workflow_file = raw_workflow.as_ref().ok().cloned().flatten();
    let (manifest, diags) = merged_manifest(&fs);

    let in_variables_file = declared_names(variables_file.as_ref(), "variables");
    let in_workflow: BTreeSet<String> = workflow_file
        .as_ref()
        .and_then(|w| w["variables"].as_object())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let groups_in_variables_file = declared_names(variables_file.as_ref(), "groups");

    let mut answer = Map::new();
    let file_value = |raw: &Result<Option<Value>, ToolFailure>| match raw {
        Ok(Some(v)) => json!({"exists": true, "content": v}),
        Ok(None) => json!({"exists": false}),
        Err(e) => json!({"exists": true, "error": e.message}),
    };
    answer.insert(
        "files".into(),
        json!({WORKFLOW_FILE: file_value(&raw_workflow), VARIABLES_FILE: file_value(&raw_variables)}),
    );
    answer.insert(
        "variables_written_to".into(),
        json!(if variables_file.is_some() || fs.exists(VARIABLES_FILE) {
            VARIABLES_FILE
        } else {
            WORKFLOW_FILE
        }),
    );
    answer.insert("valid".into(), json!(!diags.has_errors()));
    answer.insert("diagnostics".into(), diagnostics_json(&diags));
    if let Some(m) = &manifest {
        let mut variables = Map::new();
        for (name, var) in &m.variables {
            let from_variables_file = in_variables_file.contains(name);
            let mut entry = serde_json::to_value(var).unwrap_or(Value::Null);
            if !entry.is_object() {
                entry = json!({"value": entry});
            }
            entry["file"] = json!(if from_variables_file {
                VARIABLES_FILE
            } else {
                WORKFLOW_FILE
            });
            if from_variables_file && in_workflow.contains(name) {
                entry["shadows"] = json!(format!(
                    "{WORKFLOW_FILE} also declares {name}: the value in {VARIABLES_FILE} wins"
                ));
            }
            variables.insert(name.clone(), entry);
        }
        let groups: Vec<Value> = m
            .groups
            .iter()
            .map(|g| {
                json!({
                    "id": g.id,
                    "name": g.name,
                    "folder": g.folder_name().ok(),
                    "variables": g.variables,
                    "file": if groups_in_variables_file.contains(&g.id) { VARIABLES_FILE } else { WORKFLOW_FILE },
                })
            })
            .collect();
        let mut merged = serde_json::to_value(m).unwrap_or(Value::Null);
        if let Some(obj) = merged.as_object_mut() {
            obj.remove("variables");
            obj.remove("groups");
        }
        answer.insert("settings".into(), merged);
        answer.insert("variables".into(), Value::Object(variables));
        answer.insert("groups".into(), Value::Array(groups));
    }
    Ok(Value::Object(answer))
}

async fn query_database(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let grant = super::db::grant(ctx, false)?;
    ctx.check_time()?;
    let mut query = Map::new();
    for key in ["sql", "params", "max_rows"] {
        if let Some(v) = args.get(key) {
            query.insert(key.into(), v.clone());
        }
    }
    db_tools::call(
        db_tools::QUERY_WORKFLOW_DB,
        Value::Object(query),
        Some(grant),
        &ctx.limits_in_time(),
        ctx.turn_writes,
    )
    .await
    .map_err(|e| ToolFailure::new(format!("query refused or failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_hidden_paths_are_refused() {
        for path in [
            ".env",
            ".env.local",
            "code/a/.env",
            ".git/config",
            "knowledgebase/.ssh/id_rsa",
            "code/a/id_ed25519",
            "code/a/server.pem",
            "notes/client_secret.json",
            "config/credentials.json",
            "secrets/x.txt",
            "prod.env",
        ] {
            assert!(refusal_for(Path::new(path)).is_some(), "{path}");
        }
        for path in [
            "code/a/main.py",
            "costs/phase/token_usage.json",
            "knowledgebase/notes/keys-to-success.md",
            "planning/plan.json",
            "environment.md",
        ] {
            assert!(refusal_for(Path::new(path)).is_none(), "{path}");
        }
    }

    #[test]
    fn paths_leaving_the_workspace_are_refused() {
        assert!(relative_path("../x").is_err());
        assert!(relative_path("code/../../x").is_err());
        assert!(relative_path("/etc/passwd").is_err());
        assert_eq!(relative_path("./code/a").unwrap(), PathBuf::from("code/a"));
        assert_eq!(relative_path("").unwrap(), PathBuf::new());
    }

    #[test]
    fn every_spec_is_strict_and_named_in_the_table() {
        let names: Vec<&str> = specs().iter().map(|s| s.name).collect();
        assert_eq!(names, super::super::modes::READ_TOOLS);
        for spec in specs() {
            assert_eq!(spec.parameters["additionalProperties"], false);
            assert_eq!(spec.parameters["type"], "object");
            assert!(spec.parameters["required"].is_array());
            jsonschema::validator_for(&spec.parameters).unwrap();
        }
    }
}
