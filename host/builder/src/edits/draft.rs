//! The files one edit may change, held as JSON values: the plan, the default step config,
//! `workflow.json`, `variables/variables.json`, and new files (scripts). [`Draft::commit`]
//! checks the whole workspace as it would be with them and writes them only when it has no
//! error, then logs the edit.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use trellis_sandbox::store::{WorkspaceFs, json_bytes, now_rfc3339};
use trellis_workflow::manifest::VARIABLES_FILE;
use trellis_workflow::{Candidate, Diagnostic, PLAN_FILE, STEP_CONFIG_FILE, WORKFLOW_FILE};

use super::changelog::{self, Change};
use crate::ToolFailure;

/// One JSON file of the workspace as it was read and as the edit leaves it.
#[derive(Debug, Clone)]
pub(super) struct JsonFile {
    rel: &'static str,
    before: Option<Vec<u8>>,
    original: Value,
    pub value: Value,
}

impl JsonFile {
    /// `empty` stands for a missing file; with `create` the edit writes it even when it
    /// changes nothing else in it (a workspace needs its plan).
    fn open(
        fs: &WorkspaceFs,
        rel: &'static str,
        empty: Value,
        create: bool,
    ) -> Result<Self, ToolFailure> {
        let before = match fs.read_json_text(rel) {
            Ok(text) => Some(text.into_bytes()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ToolFailure::new(format!("{rel} cannot be read: {e}"))),
        };
        let original = match &before {
            None => empty,
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| {
                ToolFailure::with_details(
                    format!(
                        "{rel} is not valid JSON ({e}): fix it by hand (or with \
                         `trellis validate`) before editing it with a tool"
                    ),
                    json!({"file": rel}),
                )
            })?,
        };
        Ok(JsonFile {
            rel,
            value: original.clone(),
            original: if create && before.is_none() {
                Value::Null
            } else {
                original
            },
            before,
        })
    }

    /// Whether the file exists on disk.
    pub fn exists(&self) -> bool {
        self.before.is_some()
    }

    fn changed(&self) -> bool {
        self.value != self.original
    }
}

/// The files of one edit.
#[derive(Debug)]
pub(super) struct Draft {
    pub fs: WorkspaceFs,
    pub root: PathBuf,
    pub plan: JsonFile,
    pub config: JsonFile,
    pub manifest: JsonFile,
    pub variables: JsonFile,
    /// Files the edit creates or replaces as they are (scripts), workspace-relative.
    pub new_files: Vec<(PathBuf, Vec<u8>)>,
}

/// What [`Draft::commit`] did.
#[derive(Debug)]
pub(super) struct Committed {
    /// The files written, workspace-relative.
    pub written: Vec<String>,
    /// Warnings of the workspace after the edit, one line each.
    pub warnings: Vec<String>,
    /// The changelog file the entry went to, when something changed.
    pub changelog: Option<String>,
}

impl Committed {
    /// The common part of a tool's answer.
    pub fn answer(&self, extra: Value) -> Value {
        let mut out = json!({
            "ok": true,
            "written": self.written,
            // The folder, not the dated file: an answer reads the same on any day (a
            // replayed session compares it).
            "changelog": self.changelog.as_ref().map(|_| format!("{}/", changelog::CHANGELOG_DIR)),
        });
        if !self.warnings.is_empty() {
            out["warnings"] = json!(self.warnings);
        }
        if let (Some(o), Value::Object(extra)) = (out.as_object_mut(), extra) {
            o.extend(extra);
        }
        out
    }
}

/// Keys written first, in this order; the others follow alphabetically. Without it the
/// edited files would come out with every key sorted (`description` before `id`).
const KEY_ORDER: &[&str] = &[
    "schema_version",
    "version",
    "contract_version",
    "objective",
    "success_criteria",
    "id",
    "name",
    "type",
    "title",
    "description",
    "steps",
    "orphan_steps",
    "context_dependencies",
    "context_output",
    "message",
    "source_sql",
    "max_iterations",
    "items",
    "messages",
    "route_id",
    "route_name",
    "condition",
    "routes",
    "default_route_id",
    "route_source_file",
    "question",
    "variable_name",
    "response_type",
    "options",
    "if_yes_next_step_id",
    "if_no_next_step_id",
    "option_routes",
    "predefined_routes",
    "sub_agent_step",
    "orphan_step_ref",
    "agent_configs",
    "validation_schema",
    "next_step_id",
];

/// A JSON value serialized with [`KEY_ORDER`].
struct Ordered<'a>(&'a Value);

impl serde::Serialize for Ordered<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort_by_key(|k| {
                    let rank = KEY_ORDER.iter().position(|o| o == k);
                    (rank.unwrap_or(KEY_ORDER.len()), k.as_str())
                });
                let mut map = serializer.serialize_map(Some(keys.len()))?;
                for k in keys {
                    map.serialize_entry(k, &Ordered(&m[k]))?;
                }
                map.end()
            }
            Value::Array(a) => {
                let mut seq = serializer.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(&Ordered(v))?;
                }
                seq.end()
            }
            other => other.serialize(serializer),
        }
    }
}

fn diagnostic_json(d: &Diagnostic) -> Value {
    json!({"file": d.file, "json_path": d.json_path, "step_id": d.step_id, "message": d.message})
}

impl Draft {
    /// Reads the files of the workspace at `root`.
    pub fn open(root: &Path) -> Result<Self, ToolFailure> {
        let fs = WorkspaceFs::open(root)
            .map_err(|e| ToolFailure::new(format!("the workspace cannot be opened: {e}")))?;
        let mut config = JsonFile::open(&fs, STEP_CONFIG_FILE, json!({"steps": []}), false)?;
        if let Value::Array(entries) = &config.value {
            // The legacy root-level array is read, and written back in object format.
            config.value = json!({"steps": entries.clone()});
        }
        Ok(Draft {
            plan: JsonFile::open(&fs, PLAN_FILE, json!({"steps": []}), true)?,
            config,
            manifest: JsonFile::open(
                &fs,
                WORKFLOW_FILE,
                json!({"version": trellis_workflow::ContractVersion::CURRENT.to_string()}),
                false,
            )?,
            variables: JsonFile::open(&fs, VARIABLES_FILE, json!({}), false)?,
            fs,
            root: root.to_path_buf(),
            new_files: Vec::new(),
        })
    }

    /// The steps of the default step config (made an array when it is not one).
    pub fn config_entries(&mut self) -> &mut Vec<Value> {
        let v = &mut self.config.value;
        if !v.is_object() {
            *v = json!({"steps": []});
        }
        let steps = v
            .as_object_mut()
            .expect("an object")
            .entry("steps")
            .or_insert_with(|| json!([]));
        if !steps.is_array() {
            *steps = json!([]);
        }
        steps.as_array_mut().expect("an array")
    }

    /// The files the edit changes, with their new bytes.
    fn changed_files(&self) -> Result<Vec<(PathBuf, Vec<u8>)>, ToolFailure> {
        let mut out = Vec::new();
        for f in [&self.plan, &self.config, &self.manifest, &self.variables] {
            if f.changed() {
                let bytes = json_bytes(&Ordered(&f.value))
                    .map_err(|e| ToolFailure::new(format!("{}: {e}", f.rel)))?;
                out.push((PathBuf::from(f.rel), bytes));
            }
        }
        for (rel, bytes) in &self.new_files {
            out.push((rel.clone(), bytes.clone()));
        }
        Ok(out)
    }

    /// Checks the workspace with the edit applied; writes every changed file (new files
    /// first, the plan last) only when there is no error; then appends the changelog entry.
    pub fn commit(
        self,
        tool: &str,
        reason: &str,
        step_ids: &[String],
        changes: &[Change],
    ) -> Result<Committed, ToolFailure> {
        let files = self.changed_files()?;
        // A file Trellis would refuse to read is not written: the workspace would no longer
        // load, and no edit through the same reader could undo it.
        for (rel, bytes) in &files {
            let values = trellis_sandbox::json_values::json_values(bytes);
            let (cap, most) = (
                trellis_sandbox::store::workspace_fs::JSON_READ_CAP,
                trellis_sandbox::json_values::MAX_FILE_VALUES,
            );
            if bytes.len() as u64 > cap || values > most {
                return Err(ToolFailure::new(format!(
                    "refused: this edit would make {} {} bytes and about {values} JSON values, \
                     more than the {cap} bytes and {most} values Trellis reads of a JSON file; \
                     nothing was written",
                    rel.display(),
                    bytes.len()
                )));
            }
        }
        let mut candidate = Candidate::new();
        for (rel, bytes) in &files {
            candidate.set(rel.clone(), bytes.clone());
        }
        let diags = trellis_workflow::validate_candidate(&self.root, &candidate);
        let warnings: Vec<String> = diags.warnings().map(ToString::to_string).collect();
        if diags.has_errors() {
            // Errors the workspace had before the edit are marked: the model can tell what
            // its edit broke from what it still has to fix.
            let before = trellis_workflow::validate_workspace(&self.root);
            let errors: Vec<Value> = diags
                .errors()
                .map(|d| {
                    let mut j = diagnostic_json(d);
                    j["before_edit"] = json!(before.errors().any(|b| b == d));
                    j
                })
                .collect();
            let lines: Vec<String> = diags.errors().map(ToString::to_string).collect();
            return Err(ToolFailure::with_details(
                format!(
                    "refused: the workspace would not validate after this edit, so nothing \
                     was written. Fix these and call {tool} again:\n- {}",
                    lines.join("\n- ")
                ),
                json!({"diagnostics": errors, "warnings": warnings}),
            ));
        }
        if files.is_empty() {
            return Ok(Committed {
                written: Vec::new(),
                warnings,
                changelog: None,
            });
        }
        let timestamp = now_rfc3339();
        let log = changelog::changelog_file(&self.fs, &timestamp);
        // Every file of the day full: the edit is not written rather than one file growing
        // past what its reader takes, each edit rewriting it whole.
        if changelog::is_full(&self.fs, &log) {
            return Err(ToolFailure::new(format!(
                "refused: today's changelog fills its {} files ({} is full: {} bytes or {} \
                 JSON values); nothing was written. Move the day's changelog files out of \
                 planning/changelog/, then retry",
                changelog::CHANGELOG_FILES_A_DAY,
                log.display(),
                changelog::CHANGELOG_FILE_BYTES,
                changelog::CHANGELOG_FILE_VALUES
            )));
        }
        changelog::read_entries(&self.fs, &log).map_err(|e| ToolFailure::new(e.to_string()))?;

        // Plan last: a crash part way leaves the plan as it was, its scripts and configs
        // already there.
        let mut order: Vec<&(PathBuf, Vec<u8>)> = files
            .iter()
            .filter(|(p, _)| p != Path::new(PLAN_FILE))
            .collect();
        order.extend(files.iter().filter(|(p, _)| p == Path::new(PLAN_FILE)));
        let mut written = Vec::new();
        for (rel, bytes) in order {
            self.fs.write_atomic(rel, bytes).map_err(|e| {
                ToolFailure::with_details(
                    format!(
                        "writing {} failed: {e} (already written: {})",
                        rel.display(),
                        if written.is_empty() {
                            "nothing".to_string()
                        } else {
                            written.join(", ")
                        }
                    ),
                    json!({"written": written}),
                )
            })?;
            written.push(rel.to_string_lossy().replace('\\', "/"));
        }
        let after = files
            .iter()
            .find(|(p, _)| p == Path::new(PLAN_FILE))
            .map(|(_, b)| b.as_slice())
            .or(self.plan.before.as_deref());
        let entry = json!({
            "timestamp": timestamp,
            "tool": tool,
            // The model's reason is its own text: kept as long as a sentence or a few,
            // so an entry stays the size of its changes' summary.
            "reason": trellis_sandbox::cut::marked(reason, changelog::REASON_BYTES),
            "step_ids": step_ids,
            "changes": changelog::entry_changes(changes),
            "before_sha256": changelog::sha256(self.plan.before.as_deref()),
            "after_sha256": changelog::sha256(after),
        });
        changelog::append(&self.fs, &log, entry).map_err(|e| {
            ToolFailure::new(format!(
                "the edit was written ({}) but its changelog entry was not: {e}",
                written.join(", ")
            ))
        })?;
        Ok(Committed {
            written,
            warnings,
            changelog: Some(log.to_string_lossy().replace('\\', "/")),
        })
    }
}
