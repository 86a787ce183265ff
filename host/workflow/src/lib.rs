//! The workflow model: what a workspace's `planning/plan.json`, `step_config.json` and
//! `workflow.json` say, checked and typed (spec sections 1, 2, 3 and 9).
//!
//! [`Workspace::open`] loads and checks all three files and returns every problem at once;
//! [`validate_workspace`] returns the diagnostics alone (what `trellis validate` prints).
//! The contract migration lives in [`migrate`], the JSON Schemas for editors in [`json_schema`].

pub mod diagnostics;
pub mod foreach_sql;
pub mod go_template;
pub mod json_schema;
pub mod manifest;
pub mod migrate;
pub mod plan;
pub mod step_config;
pub mod substitution;
pub mod template_fields;
pub mod validation;

#[cfg(test)]
mod test_files {
    /// Test set-up: writes JSON the way Trellis does, without a workspace handle.
    pub(crate) fn write_json_atomic<T: serde::Serialize + ?Sized>(
        path: &std::path::Path,
        value: &T,
    ) -> std::io::Result<()> {
        trellis_sandbox::store::write_named_file_atomic(
            path,
            &trellis_sandbox::store::json_bytes(value)?,
        )
    }
}

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub use diagnostics::{Diagnostic, Diagnostics, Severity};
pub use manifest::{ContractVersion, WORKFLOW_FILE, WorkflowManifest};
pub use plan::{PLAN_FILE, Plan, Step, StepKind};
pub use step_config::{AgentConfigs, STEP_CONFIG_FILE, StepConfigFile, step_config_location};

use diagnostics::{JsonPath, quote};

use trellis_sandbox::store::WorkspaceFs;

/// A loaded workspace: its folder, the run folder selected (if any), and the three files.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The workspace folder.
    pub root: PathBuf,
    /// The workspace folder opened once: every host file access under it goes through this.
    pub fs: WorkspaceFs,
    /// The run folder selected, relative to `runs/` (`iteration-0` or `iteration-0/<group>`).
    pub run_folder: Option<String>,
    /// `planning/plan.json`.
    pub plan: Plan,
    /// The step config in force (run-specific over default).
    pub step_configs: StepConfigFile,
    /// Where `step_configs` was read from, relative to `root`.
    pub step_config_file: PathBuf,
    /// `workflow.json`; the default when the file does not exist.
    pub manifest: WorkflowManifest,
    /// Warnings found while loading.
    pub warnings: Diagnostics,
}

impl Workspace {
    /// Loads the workspace at `root` with no run folder selected (the default step config).
    /// Fails with every diagnostic found when any file has an error.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, Diagnostics> {
        Self::open_run(root, None)
    }

    /// Loads the workspace with `run_folder` selected: its `runs/<run_folder>/planning/
    /// step_config.json` wins over the default one when it exists.
    pub fn open_run(root: impl AsRef<Path>, run_folder: Option<&str>) -> Result<Self, Diagnostics> {
        let root = root.as_ref();
        let (loaded, diags) = load(root, run_folder, None);
        match loaded {
            Some(ws) if !diags.has_errors() => Ok(Self {
                warnings: diags,
                ..ws
            }),
            _ => Err(diags),
        }
    }

    /// The agent settings of a step; the defaults when it has none.
    pub fn agent_configs(&self, step_id: &str) -> AgentConfigs {
        self.step_configs
            .get(step_id)
            .and_then(|c| c.agent_configs.clone())
            .unwrap_or_default()
    }

    /// Writes the step config back where it was read from, atomically, in object format.
    pub fn save_step_configs(&self) -> io::Result<()> {
        self.step_configs.write(&self.fs, &self.step_config_file)
    }

    /// The run folder in use: the selected one, else `iteration-0`.
    pub fn run_dir(&self) -> PathBuf {
        self.root
            .join("runs")
            .join(self.run_folder.as_deref().unwrap_or("iteration-0"))
    }

    /// The output folder of a step in the run folder in use.
    pub fn step_output_dir(&self, step_id: &str) -> PathBuf {
        self.run_dir().join("execution").join(step_id)
    }
}

/// Checks the plan, the step config in force and `workflow.json` of the workspace at `root`:
/// every error and warning, in file order. Empty when all is well.
pub fn validate_workspace(root: impl AsRef<Path>) -> Diagnostics {
    load(root.as_ref(), None, None).1
}

/// Files a caller means to write, held in memory: the workspace as it would be once they are
/// written can be checked ([`validate_candidate`]) before any of them touches the disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidate {
    files: BTreeMap<PathBuf, Vec<u8>>,
}

impl Candidate {
    /// No file replaced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces (or creates) the workspace-relative file `rel` with `bytes`.
    pub fn set(&mut self, rel: impl Into<PathBuf>, bytes: Vec<u8>) {
        self.files.insert(rel.into(), bytes);
    }

    /// The replaced files, workspace-relative, in path order.
    pub fn files(&self) -> impl Iterator<Item = (&Path, &[u8])> {
        self.files.iter().map(|(p, b)| (p.as_path(), b.as_slice()))
    }

    fn get(&self, rel: &Path) -> Option<&[u8]> {
        self.files.get(rel).map(Vec::as_slice)
    }
}

/// Checks the workspace at `root` as it would be with the files of `candidate` written (plan,
/// default step config, `workflow.json`, `variables/variables.json`, scripts): the same
/// diagnostics [`validate_workspace`] would give after the write, with nothing written.
pub fn validate_candidate(root: impl AsRef<Path>, candidate: &Candidate) -> Diagnostics {
    load(root.as_ref(), None, Some(candidate)).1
}

/// The workspace files as the loader sees them: the disk, with a candidate's files over it.
#[derive(Clone, Copy)]
struct Source<'a> {
    fs: &'a WorkspaceFs,
    overlay: Option<&'a Candidate>,
}

impl Source<'_> {
    fn replaced(&self, rel: &Path) -> Option<&[u8]> {
        self.overlay.and_then(|c| c.get(rel))
    }

    fn exists(&self, rel: impl AsRef<Path>) -> bool {
        let rel = rel.as_ref();
        self.replaced(rel).is_some() || self.fs.exists(rel)
    }

    fn is_file(&self, rel: impl AsRef<Path>) -> bool {
        let rel = rel.as_ref();
        self.replaced(rel).is_some() || self.fs.is_file(rel)
    }
}

fn file_label(rel: &Path) -> String {
    rel.to_string_lossy().replace('\\', "/")
}

fn read(src: Source<'_>, rel: &Path, diags: &mut Diagnostics) -> Option<String> {
    if let Some(bytes) = src.replaced(rel) {
        return Some(String::from_utf8_lossy(bytes).into_owned());
    }
    match src.fs.read_json_text(rel) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            diags.push(Diagnostic {
                file: file_label(rel),
                json_path: String::new(),
                step_id: None,
                message: format!("cannot be read: {e}"),
                severity: Severity::Error,
            });
            None
        }
    }
}

fn load(
    root: &Path,
    run_folder: Option<&str>,
    overlay: Option<&Candidate>,
) -> (Option<Workspace>, Diagnostics) {
    let mut diags = Diagnostics::new();
    let fs = match WorkspaceFs::open(root) {
        Ok(fs) => fs,
        Err(e) => {
            diags.push(Diagnostic {
                file: root.display().to_string(),
                json_path: String::new(),
                step_id: None,
                message: e.to_string(),
                severity: Severity::Error,
            });
            return (None, diags);
        }
    };
    if let Some(run) = run_folder
        && let Err(e) = check_run_selection(run)
    {
        diags.push(Diagnostic {
            file: "--run".into(),
            json_path: String::new(),
            step_id: None,
            message: e,
            severity: Severity::Error,
        });
        return (None, diags);
    }
    let src = Source { fs: &fs, overlay };

    let mut manifest = match read(src, Path::new(WORKFLOW_FILE), &mut diags) {
        None => Some(WorkflowManifest::default()),
        Some(text) => keep(manifest::parse_manifest(&text, WORKFLOW_FILE), &mut diags),
    };
    if let Some(m) = &mut manifest
        && let Some(text) = read(src, Path::new(manifest::VARIABLES_FILE), &mut diags)
    {
        diags.extend(manifest::merge_variables_file(
            &text,
            manifest::VARIABLES_FILE,
            m,
        ));
    }
    if let Some(m) = &manifest {
        diags.extend(manifest::schedules::check_groups(m));
        diags.extend(m.check_variable_values());
        diags.extend(m.check_group_count());
        diags.extend(m.check_group_folders());
    }

    // The step config first (its diagnostics still come after the plan's): the steps it
    // gates may have prevalidation items without a schema in the plan.
    let config_rel = match overlay {
        // A candidate is always checked against the default step config it replaces.
        Some(_) => PathBuf::from(STEP_CONFIG_FILE),
        None => step_config_location(&fs, run_folder),
    };
    let config_label = file_label(&config_rel);
    let mut config_diags = Diagnostics::new();
    let step_configs = match read(src, &config_rel, &mut config_diags) {
        None => Some(StepConfigFile::default()),
        Some(text) => keep(
            step_config::parse_step_config(&text, &config_label),
            &mut config_diags,
        ),
    };
    let gated = step_configs
        .iter()
        .flat_map(|c| c.steps.iter())
        .filter(|s| s.validation_schema.is_some())
        .map(|s| s.id.clone())
        .collect();

    let plan = match read(src, Path::new(PLAN_FILE), &mut diags) {
        None => {
            if !src.exists(Path::new(PLAN_FILE)) {
                diags.push(Diagnostic {
                    file: PLAN_FILE.into(),
                    json_path: String::new(),
                    step_id: None,
                    message: "missing: a workspace needs planning/plan.json".into(),
                    severity: Severity::Error,
                });
            }
            None
        }
        Some(text) => keep(plan::parse_plan_gated(&text, PLAN_FILE, gated), &mut diags),
    };
    diags.extend(config_diags);

    if let (Some(plan), Some(configs)) = (&plan, &step_configs) {
        diags.extend(configs.orphan_warnings(plan, &config_label));
        check_configs_against_plan(src, plan, configs, &config_label, &mut diags);
    }
    if let (Some(plan), Some(m)) = (&plan, &manifest)
        && m.groups.len() <= manifest::MAX_GROUPS
    {
        diags.extend(substitution::check_plan_substitution(plan, m));
    }
    if let Some(m) = &manifest
        && let Some(v) = m.contract()
        && v < ContractVersion::CURRENT
    {
        diags.push(Diagnostic {
            file: WORKFLOW_FILE.into(),
            json_path: "version".into(),
            step_id: None,
            message: format!(
                "contract {v} is older than {}: run `trellis migrate` ({}) to upgrade",
                ContractVersion::CURRENT,
                plan::CODE_ITEM_MIGRATION
            ),
            severity: Severity::Warning,
        });
    }

    let ws = match (plan, step_configs, manifest) {
        (Some(plan), Some(step_configs), Some(manifest)) => Some(Workspace {
            root: root.to_path_buf(),
            fs,
            run_folder: run_folder.map(str::to_string),
            plan,
            step_configs,
            step_config_file: config_rel,
            manifest,
            warnings: Diagnostics::new(),
        }),
        _ => None,
    };
    (ws, diags)
}

/// Checks a run folder given on the command line (`--run`) like a plan path: `iteration-N`
/// or `iteration-N/<group>`, nothing absolute, no `..`.
pub fn check_run_selection(run: &str) -> Result<(), String> {
    let shown = serde_json::Value::String(run.to_string());
    let mut parts = run.split('/');
    let first = parts.next().unwrap_or_default();
    let group = parts.next();
    let iteration_ok = first
        .strip_prefix("iteration-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let group_ok =
        group.is_none_or(|g| !g.is_empty() && g != "." && g != ".." && !g.contains('\\'));
    if !iteration_ok || !group_ok || parts.next().is_some() {
        return Err(format!(
            "{shown} is not a run folder: expected a run folder under runs/, `iteration-N` \
             or `iteration-N/<group>` (no `..`, not an absolute path)"
        ));
    }
    Ok(())
}

fn keep<T>(parsed: diagnostics::Parsed<T>, diags: &mut Diagnostics) -> Option<T> {
    match parsed {
        Ok((v, warnings)) => {
            diags.extend(warnings);
            Some(v)
        }
        Err(errors) => {
            diags.extend(errors);
            None
        }
    }
}

/// What only plan and config together can tell: scripted settings on steps that cannot be
/// scripted, scripts that are missing, prerequisite rules naming no step.
fn check_configs_against_plan(
    fs: Source<'_>,
    plan: &Plan,
    configs: &StepConfigFile,
    file: &str,
    diags: &mut Diagnostics,
) {
    let mut ctx = diagnostics::Ctx::new(file, diags);
    // One index for every entry: a lookup per entry was a scan of the plan each.
    let steps: std::collections::HashMap<&str, &Step> =
        plan.all_steps().map(|s| (s.id.as_str(), s)).collect();
    let mut hints = 0usize;
    for (i, entry) in configs.steps.iter().enumerate() {
        let Some(c) = &entry.agent_configs else {
            continue;
        };
        let path = JsonPath::root().key("steps").index(i).key("agent_configs");
        ctx.set_step(Some(entry.id.clone()));
        if c.is_scripted()
            && let Some(step) = steps.get(entry.id.as_str())
        {
            if !matches!(step.kind, StepKind::Regular) {
                ctx.error(
                    &path.key("declared_execution_mode"),
                    format!(
                        "only regular steps can be scripted; {} is a {} step",
                        quote(&step.id),
                        step.type_name()
                    ),
                );
            } else if !fs.is_file(Path::new("code").join(&step.id).join("main.py"))
                && !fs.is_file(Path::new("code").join(&step.id).join("main.wasm"))
            {
                let in_learnings =
                    fs.is_file(Path::new("learnings").join(&step.id).join("main.py"));
                let message = if in_learnings {
                    format!(
                        "the script is at learnings/{0}/main.py, where the original keeps \
                         scripted steps: it runs there; move it to code/{0}/main.py",
                        step.id
                    )
                } else {
                    format!(
                        "scripted step has no script yet: code/{}/main.py does not exist",
                        step.id
                    )
                };
                ctx.warning(&path.key("declared_execution_mode"), message);
            }
        }
        for (j, rule) in c.prerequisite_rules.iter().flatten().enumerate() {
            if !steps.contains_key(rule.depends_on_step.as_str()) {
                // A search of the plan each: for the first few only.
                hints += 1;
                let hint = (hints <= diagnostics::MAX_HINTS)
                    .then(|| {
                        diagnostics::did_you_mean(&rule.depends_on_step, steps.keys().copied())
                    })
                    .flatten()
                    .map(|c| format!(" (did you mean \"{c}\"?)"))
                    .unwrap_or_default();
                ctx.error(
                    &path
                        .key("prerequisite_rules")
                        .index(j)
                        .key("depends_on_step"),
                    format!(
                        "names no step of the plan: {}{hint}",
                        quote(&rule.depends_on_step)
                    ),
                );
            }
        }
    }
    ctx.set_step(None);
}

#[cfg(test)]
pub(crate) mod tests;
