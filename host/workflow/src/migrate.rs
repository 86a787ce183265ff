//! Contract migrations (spec section 9): `migrate_message_sequence_code_items` (v1.0.10), then
//! the v1.0.11 stamp.
//!
//! The migration works on the raw JSON of `planning/plan.json` and
//! `planning/step_config.json`, so every step it does not convert is written back exactly as
//! it was read. It decides everything before it touches a file: any ambiguous sequence blocks
//! the whole migration with [`BLOCKED_CODE`] and the reasons, and the converted plan and
//! config must pass the normal checks before anything is written.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::diagnostics::{Diagnostic, Diagnostics, Severity, parse_json};
use super::manifest::{ContractVersion, WORKFLOW_FILE};
use super::plan::{PLAN_FILE, has_code_items, parse_plan_value};
use super::step_config::{STEP_CONFIG_FILE, parse_step_config_value};
use trellis_sandbox::store::WorkspaceFs;

mod convert;
use convert::{Unit, build_steps, nested_code, plan_sequence, rewrite_refs};

/// The code every blocked migration reports.
pub const BLOCKED_CODE: &str = "MESSAGE_SEQUENCE_CODE_MIGRATION_BLOCKED";

/// The run folder converted dependencies point into.
const RUN: &str = "runs/iteration-0/execution";

/// What a successful migration did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationSummary {
    /// `contract_version` before, as written (absent for unversioned workflows).
    pub contract_before: Option<String>,
    /// `contract_version` after.
    pub contract_after: String,
    /// Each converted sequence and the steps that replaced it.
    pub converted: Vec<ConvertedSequence>,
    /// Scripts written, relative to the workspace (`code/<step-id>/main.py`).
    pub scripts: Vec<PathBuf>,
}

/// One sequence replaced by scripted steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertedSequence {
    /// The id of the removed message sequence.
    pub sequence_id: String,
    /// The ids of the regular scripted steps that replace it, in order.
    pub new_step_ids: Vec<String>,
}

/// The migration refused to guess: each reason names the step, the item and what to split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationBlocked {
    /// One sentence per problem.
    pub reasons: Vec<String>,
}

impl fmt::Display for MigrationBlocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{BLOCKED_CODE}: no file was changed")?;
        for r in &self.reasons {
            write!(f, "\n  - {r}")?;
        }
        Ok(())
    }
}

/// Bytes of scripts a migration copies into `code/<step>/main.py`, all steps together.
pub const MAX_SCRIPT_COPY_BYTES: u64 = 256 << 20;

/// Why a migration did not complete.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// An ambiguous sequence; no file was changed.
    #[error("{0}")]
    Blocked(MigrationBlocked),
    /// A workspace file cannot be read as it is, or the converted plan does not validate; no
    /// file was changed.
    #[error("{0}")]
    Invalid(Diagnostics),
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> MigrationError + '_ {
    move |source| MigrationError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(file: &str, message: String) -> MigrationError {
    MigrationError::Invalid(Diagnostics(vec![Diagnostic {
        file: file.into(),
        json_path: String::new(),
        step_id: None,
        message,
        severity: Severity::Error,
    }]))
}

fn read_json(fs: &WorkspaceFs, rel: &str) -> Result<Option<Value>, MigrationError> {
    let path = fs.host_path(Path::new(rel));
    match fs.read_json_text(rel) {
        Ok(text) => {
            let mut d = Diagnostics::new();
            match parse_json(&text, rel, &mut d) {
                Some(v) => Ok(Some(v)),
                None => Err(MigrationError::Invalid(d)),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&path)(e)),
    }
}

fn s<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn is_code(item: &Value) -> bool {
    s(item, "type") == Some("code")
}

fn item_schema(item: &Value) -> Option<&Value> {
    ["validation_schema", "prevalidation"]
        .iter()
        .filter_map(|k| item.get(*k))
        .find(|v| v.is_object())
}

/// "fetch-prices_daily" -> "Fetch prices daily".
fn humanize(id: &str) -> String {
    let words: Vec<&str> = id
        .split(['-', '_', ' '])
        .filter(|w| !w.is_empty())
        .collect();
    let mut out = words.join(" ");
    if let Some(first) = out.get(0..1) {
        out = first.to_uppercase() + &out[1..];
    }
    out
}

/// Converts the unambiguous legacy `code` items of the workspace at `root` into scripted regular
/// steps (spec section 9), then stamps `version` 1.0.10 and 1.0.11 in `workflow.json` (dropping
/// Trellis's earlier `contract_version`).
///
/// Nothing is written unless every sequence with code items can be converted and the new plan
/// and step config pass their checks; a blocked migration returns every reason at once. Safe to
/// run again: a workspace already on the current contract is left as it is.
pub fn migrate_message_sequence_code_items(
    root: &Path,
) -> Result<MigrationSummary, MigrationError> {
    let fs = WorkspaceFs::open(root).map_err(io_err(root))?;
    let fs = &fs;
    let Some(plan) = read_json(fs, PLAN_FILE)? else {
        return Err(invalid(
            PLAN_FILE,
            "missing: a workspace needs planning/plan.json".into(),
        ));
    };
    let config = read_json(fs, STEP_CONFIG_FILE)?;
    let manifest = read_json(fs, WORKFLOW_FILE)?.unwrap_or_else(|| json!({}));
    if !manifest.is_object() {
        return Err(invalid(WORKFLOW_FILE, "expected an object".into()));
    }
    // The original's `version`, else Trellis's earlier `contract_version`.
    let contract_before = s(&manifest, "version")
        .or_else(|| s(&manifest, "contract_version"))
        .map(str::to_string);
    let version = contract_before.as_deref().and_then(ContractVersion::parse);
    let mut summary = MigrationSummary {
        contract_before: contract_before.clone(),
        contract_after: ContractVersion::CURRENT.to_string(),
        ..MigrationSummary::default()
    };
    if version.is_some_and(|v| v >= ContractVersion::CURRENT) && !has_code_items(&plan) {
        summary.contract_after = contract_before.unwrap_or_default();
        // One key: Trellis's earlier `contract_version` becomes `version`.
        if manifest.get("contract_version").is_some() {
            let mut manifest = manifest;
            let p = root.join(WORKFLOW_FILE);
            stamp(&mut manifest, summary.contract_after.clone());
            fs.write_json_atomic(&p, &manifest).map_err(io_err(&p))?;
        }
        return Ok(summary);
    }

    let mut reasons = Vec::new();
    let mut existing_ids: HashSet<String> = HashSet::new();
    fn collect_ids(step: &Value, ids: &mut HashSet<String>) {
        if let Some(id) = s(step, "id") {
            ids.insert(id.to_string());
        }
        for r in arr(step, "predefined_routes") {
            if let Some(sub) = r.get("sub_agent_step") {
                collect_ids(sub, ids);
            }
        }
    }
    for st in arr(&plan, "steps").iter().chain(arr(&plan, "orphan_steps")) {
        collect_ids(st, &mut existing_ids);
    }
    for st in arr(&plan, "orphan_steps") {
        let sid = s(st, "id").unwrap_or("?");
        for item in arr(st, "items").iter().chain(arr(st, "messages")) {
            if is_code(item) {
                reasons.push(format!(
                    "orphan step \"{sid}\" item \"{}\": code items in an orphan step cannot be converted: make the script its own scripted regular orphan step by hand",
                    s(item, "id").unwrap_or("?")
                ));
            }
        }
        nested_code(st, &format!("orphan step \"{sid}\""), &mut reasons);
    }
    let mut new_ids = HashSet::new();
    let mut plans: Vec<(usize, Vec<Unit>)> = Vec::new();
    for (idx, st) in arr(&plan, "steps").iter().enumerate() {
        nested_code(
            st,
            &format!("step \"{}\"", s(st, "id").unwrap_or("?")),
            &mut reasons,
        );
        let has_code = arr(st, "items")
            .iter()
            .chain(arr(st, "messages"))
            .any(is_code);
        if has_code {
            let units = plan_sequence(fs, st, &existing_ids, &mut new_ids, &mut reasons);
            plans.push((idx, units));
        }
    }
    if !reasons.is_empty() {
        return Err(MigrationError::Blocked(MigrationBlocked { reasons }));
    }

    // Build the new plan: each converted sequence replaced in place by its new steps.
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    let mut producer: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut replacement: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    for (idx, units) in &plans {
        let seq = &arr(&plan, "steps")[*idx];
        let sid = s(seq, "id").unwrap_or_default().to_string();
        first.insert(sid.clone(), units[0].id.clone());
        for u in units {
            for f in arr(u.item, "output_files").iter().filter_map(Value::as_str) {
                producer.insert((sid.clone(), f.to_string()), u.id.clone());
            }
        }
        let cap = trellis_sandbox::store::workspace_fs::JSON_READ_CAP;
        let steps = build_steps(seq, units, cap as usize)
            .map_err(|reached| too_big(PLAN_FILE, &format!("at least {reached}"), cap))?;
        replacement.insert(*idx, steps);
        summary.converted.push(ConvertedSequence {
            sequence_id: sid,
            new_step_ids: units.iter().map(|u| u.id.clone()).collect(),
        });
    }
    let mut new_plan = plan.clone();
    if !plans.is_empty() {
        let mut steps = Vec::new();
        for (idx, st) in arr(&plan, "steps").iter().enumerate() {
            match replacement.remove(&idx) {
                Some(new_steps) => steps.extend(new_steps),
                None => steps.push(st.clone()),
            }
        }
        for st in steps.iter_mut() {
            rewrite_refs(st, &first, &producer);
        }
        new_plan["steps"] = Value::Array(steps);
        if let Some(Value::Array(orphans)) = new_plan.get_mut("orphan_steps") {
            for st in orphans {
                rewrite_refs(st, &first, &producer);
            }
        }
    }

    // Step configs: each new step gets a clone of its sequence's config, scripted.
    let (mut entries, legacy_array) = match &config {
        None => (Vec::new(), false),
        Some(Value::Array(a)) => (a.clone(), true),
        Some(v) => (arr(v, "steps").to_vec(), false),
    };
    let config_changes = !summary.converted.is_empty() || legacy_array;
    for conv in &summary.converted {
        let pos = entries
            .iter()
            .position(|e| s(e, "id") == Some(conv.sequence_id.as_str()));
        let base = pos.map(|p| entries.remove(p));
        let at = pos.unwrap_or(entries.len());
        let new_steps = &new_plan["steps"];
        for (n, id) in conv.new_step_ids.iter().enumerate() {
            let mut e = base.clone().unwrap_or_else(|| json!({}));
            let title = new_steps
                .as_array()
                .into_iter()
                .flatten()
                .find(|st| s(st, "id") == Some(id))
                .and_then(|st| s(st, "title"))
                .map(str::to_string);
            let obj = e.as_object_mut().expect("a step config entry is an object");
            obj.insert("id".into(), json!(id));
            match title {
                Some(t) => obj.insert("title".into(), json!(t)),
                None => obj.remove("title"),
            };
            if n + 1 != conv.new_step_ids.len() {
                obj.remove("validation_schema");
            }
            let ac = obj.entry("agent_configs").or_insert_with(|| json!({}));
            if !ac.is_object() {
                *ac = json!({});
            }
            ac["declared_execution_mode"] = json!("scripted");
            if let Some(Value::Array(rules)) = ac.get_mut("prerequisite_rules") {
                for r in rules {
                    if let Some(v) = r.get_mut("depends_on_step")
                        && let Some(t) = v.as_str()
                        && let Some(n) = first.get(t)
                    {
                        *v = json!(n);
                    }
                }
            }
            entries.insert(at + n, e);
        }
    }
    for e in entries.iter_mut() {
        if let Some(Value::Array(rules)) = e.pointer_mut("/agent_configs/prerequisite_rules") {
            for r in rules {
                if let Some(v) = r.get_mut("depends_on_step")
                    && let Some(t) = v.as_str()
                    && let Some(n) = first.get(t)
                {
                    *v = json!(n);
                }
            }
        }
    }
    let new_config = json!({ "steps": entries });

    // A file Trellis would not read back is not written: each is measured before the
    // validation, whose work grows with it.
    for (file, value) in [(PLAN_FILE, &new_plan), (STEP_CONFIG_FILE, &new_config)] {
        let len = trellis_sandbox::store::json_bytes(value).map_or(0, |b| b.len() as u64);
        let cap = trellis_sandbox::store::workspace_fs::JSON_READ_CAP;
        if len > cap {
            return Err(too_big(file, &len.to_string(), cap));
        }
    }
    // Validate before anything is replaced.
    let mut diags = Diagnostics::new();
    let parsed_plan = match parse_plan_value(&new_plan, PLAN_FILE) {
        Ok((p, _)) => Some(p),
        Err(d) => {
            diags.extend(d);
            None
        }
    };
    match parse_step_config_value(&new_config, STEP_CONFIG_FILE) {
        Ok((c, _)) => {
            if let Some(p) = &parsed_plan {
                // An orphan config is only a warning for users; a migration must not create one.
                let orphans = c.orphan_warnings(p, STEP_CONFIG_FILE);
                for d in orphans.iter().filter(|d| {
                    summary
                        .converted
                        .iter()
                        .flat_map(|c| &c.new_step_ids)
                        .any(|id| d.message.contains(&format!("\"{id}\"")))
                }) {
                    diags.push(Diagnostic {
                        severity: Severity::Error,
                        ..d.clone()
                    });
                }
            }
        }
        Err(d) => diags.extend(d),
    }
    if diags.has_errors() {
        return Err(MigrationError::Invalid(diags));
    }

    // Each converted step gets its own copy of its script: what they come to together is
    // bounded before anything is written (one big script named by many items would
    // otherwise be copied for each).
    let copies: u64 = plans
        .iter()
        .flat_map(|(_, units)| units)
        .map(|u| {
            fs.metadata_len(root.join(s(u.item, "script_path").unwrap_or_default()))
                .unwrap_or(0)
        })
        .fold(0, u64::saturating_add);
    if copies > MAX_SCRIPT_COPY_BYTES {
        let mut too_big = Diagnostics::new();
        too_big.push(Diagnostic {
            file: PLAN_FILE.to_string(),
            json_path: String::new(),
            step_id: None,
            message: format!(
                "the migration would write {copies} bytes of scripts (one copy per converted \
                 step in code/<step>/main.py), more than the {MAX_SCRIPT_COPY_BYTES} it \
                 writes; nothing was changed. Make the scripts smaller, or have fewer items \
                 name the same big script"
            ),
            severity: Severity::Error,
        });
        return Err(MigrationError::Invalid(too_big));
    }
    // Write: scripts first (new files), then config, plan, and the contract stamps.
    for (_, units) in &plans {
        for u in units {
            let src = root.join(s(u.item, "script_path").unwrap_or_default());
            let rel = PathBuf::from("code").join(&u.id).join("main.py");
            // Checked again on the descriptor: a hard link made since the check is refused.
            let bytes = fs
                .read_capped(&src, trellis_sandbox::store::workspace_fs::READ_CAP)
                .map_err(io_err(&src))?;
            let dst = root.join(&rel);
            fs.write_atomic(&dst, &bytes).map_err(io_err(&dst))?;
            summary.scripts.push(rel);
        }
    }
    if config_changes {
        let p = root.join(STEP_CONFIG_FILE);
        fs.write_json_atomic(&p, &new_config).map_err(io_err(&p))?;
    }
    if !plans.is_empty() {
        let p = root.join(PLAN_FILE);
        fs.write_json_atomic(&p, &new_plan).map_err(io_err(&p))?;
    }
    let mut manifest = manifest;
    let p = root.join(WORKFLOW_FILE);
    for v in [ContractVersion::V1_0_10, ContractVersion::V1_0_11] {
        if version.is_none_or(|cur| cur < v) {
            stamp(&mut manifest, v.to_string());
            fs.write_json_atomic(&p, &manifest).map_err(io_err(&p))?;
        }
    }
    Ok(summary)
}

/// The refusal of a migration whose `file` would be `len` bytes, past `cap`.
fn too_big(file: &str, len: &str, cap: u64) -> MigrationError {
    let mut too_big = Diagnostics::new();
    too_big.push(Diagnostic {
        file: file.to_string(),
        json_path: String::new(),
        step_id: None,
        message: format!(
            "the migrated {file} would be {len} bytes, more than the {cap} Trellis reads of \
             a JSON file; nothing was changed. Convert fewer code items at a time, or make \
             the sequences' descriptions and contexts smaller"
        ),
        severity: Severity::Error,
    });
    MigrationError::Invalid(too_big)
}

/// Sets the contract version of a `workflow.json` value under the original's key,
/// `version`, and drops Trellis's earlier `contract_version`.
fn stamp(manifest: &mut Value, version: String) {
    if let Some(m) = manifest.as_object_mut() {
        m.remove("contract_version");
        m.insert("version".into(), json!(version));
    }
}

#[cfg(test)]
mod tests;
