//! `step_config.json`: per-step execution settings (spec section 3).
//!
//! Reading accepts the object format `{"steps": [...]}` and, with a warning, the legacy
//! root-level array. Writing always produces the object format with a 2-space indent,
//! atomically. Every field the original knows is modelled, the bookkeeping ones verbatim, so a
//! file read and written by Trellis loses nothing but the retired `execution_max_turns`.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use super::diagnostics::{Ctx, Diagnostics, JsonPath, Parsed, finish, parse_json, quote};
use super::plan::{Plan, Step};
use crate::validation::schema::{ValidationSchema, parse_schema};

mod parse;
use parse::file_from_value;
pub(crate) use parse::original_tool_categories;
pub(super) use parse::parse_llm_ref;

/// The default step config, relative to the workspace.
pub const STEP_CONFIG_FILE: &str = "planning/step_config.json";

/// Where the step config of a workspace is read from: the run-specific
/// `runs/<run_folder>/planning/step_config.json` when a run folder is selected and that file
/// exists, else the default `planning/step_config.json`. Returns the path relative to the
/// workspace.
pub fn step_config_location(
    workspace: &trellis_sandbox::store::WorkspaceFs,
    run_folder: Option<&str>,
) -> PathBuf {
    if let Some(run) = run_folder {
        let rel = Path::new("runs").join(run).join(STEP_CONFIG_FILE);
        // A link or a FIFO there is not skipped: reading it reports it.
        if trellis_sandbox::store::check_relative(run).is_ok() && workspace.exists(&rel) {
            return rel;
        }
    }
    PathBuf::from(STEP_CONFIG_FILE)
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepConfigFile {
    /// One entry per configured step.
    pub steps: Vec<StepConfig>,
    /// The file was read in the legacy root-level array format (it is always written as
    /// `{"steps": [...]}`).
    #[serde(skip)]
    pub legacy_format: bool,
}

impl StepConfigFile {
    /// The entry of a step.
    pub fn get(&self, id: &str) -> Option<&StepConfig> {
        self.steps.iter().find(|s| s.id == id)
    }

    /// Replaces the `agent_configs` of step `id` (adding an entry when there is none), as the
    /// builder's `update_step_config` does.
    pub fn set_agent_configs(&mut self, id: &str, configs: AgentConfigs) {
        match self.steps.iter_mut().find(|s| s.id == id) {
            Some(entry) => entry.agent_configs = Some(configs),
            None => self.steps.push(StepConfig {
                id: id.to_string(),
                title: None,
                agent_configs: Some(configs),
                validation_schema: None,
            }),
        }
    }

    /// Writes the file in object format, 2-space indent, atomically.
    pub fn write(&self, fs: &trellis_sandbox::store::WorkspaceFs, path: &Path) -> io::Result<()> {
        fs.write_json_atomic(path, self)
    }

    /// Warnings for entries whose id matches no step of `plan` ("orphan config").
    pub fn orphan_warnings(&self, plan: &Plan, file: &str) -> Diagnostics {
        fn collect<'a>(step: &'a Step, ids: &mut HashSet<&'a str>) {
            ids.insert(&step.id);
            for r in step.predefined_routes() {
                collect(&r.sub_agent_step, ids);
            }
        }
        let mut ids = HashSet::new();
        for s in plan.all_steps() {
            collect(s, &mut ids);
        }
        let mut diags = Diagnostics::new();
        let mut ctx = Ctx::new(file, &mut diags);
        let base = if self.legacy_format {
            JsonPath::root()
        } else {
            JsonPath::root().key("steps")
        };
        // A warning (with a search of the plan for a near id) for each of the first
        // MAX_HINTS orphans, then one for the rest: 40,000 orphans of a 3,000-step plan had
        // taken 82 s to list.
        let mut orphans = 0usize;
        for (i, entry) in self.steps.iter().enumerate() {
            ctx.set_step(Some(entry.id.clone()));
            if !ids.contains(entry.id.as_str()) {
                orphans += 1;
                if orphans > super::diagnostics::MAX_HINTS {
                    continue;
                }
                let hint = super::diagnostics::did_you_mean(&entry.id, ids.iter().copied())
                    .map(|c| format!(" (did you mean \"{c}\"?)"))
                    .unwrap_or_default();
                ctx.warning(
                    &base.index(i).key("id"),
                    format!(
                        "orphan config: {} matches no step of the plan{hint}",
                        quote(&entry.id)
                    ),
                );
            }
        }
        if orphans > super::diagnostics::MAX_HINTS {
            ctx.set_step(None);
            ctx.warning(
                &base,
                format!(
                    "orphan config: and {} more entries match no step of the plan",
                    orphans - super::diagnostics::MAX_HINTS
                ),
            );
        }
        diags
    }
}

/// The settings of one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepConfig {
    /// The plan step this applies to.
    pub id: String,
    /// The step's title, for people reading the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The agent settings; absent means defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_configs: Option<AgentConfigs>,
    /// The step's gate: it wins over the plan step's `validation_schema` (the original lets
    /// it override the plan, and its builder writes gates here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_schema: Option<ValidationSchema>,
}

/// A model choice: provider and model, with provider options.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlmRef {
    /// The LLM provider plugin id (`openai`, `replay`, ...).
    pub provider: String,
    /// The provider's model id.
    pub model_id: String,
    /// Options passed to the provider untouched (temperature, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Map<String, Value>>,
    /// The original's published preset the choice came from; kept, with no effect here
    /// (the provider and model are what run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_llm_id: Option<String>,
}

/// `execution_llm`: the step's model, its fallbacks and bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutionLlm {
    /// The provider; may be left out when `published_llm_id` names a preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model; may be left out when `published_llm_id` names a preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// Options passed to the provider untouched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Map<String, Value>>,
    /// Tried in order when the primary fails.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<LlmRef>,
    /// The id of a published model preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_llm_id: Option<String>,
}

/// How a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionMode {
    /// Runs `code/<id>/main.py` first (spec section 7).
    Scripted,
    /// An agent does the work.
    Agentic,
}

/// `learnings_access`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LearningsAccess {
    /// Read learnings.
    #[serde(rename = "read")]
    Read,
    /// Read and write learnings.
    #[serde(rename = "read-write")]
    ReadWrite,
    /// No learnings at all.
    #[serde(rename = "none")]
    None,
}

/// `learning_detail_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LearningDetailLevel {
    /// Exact selectors, commands, values (the default).
    Exact,
    /// General lessons.
    General,
    /// No detail.
    None,
}

/// `knowledgebase_access`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum KnowledgebaseAccess {
    /// Read notes.
    #[serde(rename = "read")]
    Read,
    /// Write notes.
    #[serde(rename = "write")]
    Write,
    /// Read and write notes.
    #[serde(rename = "read-write")]
    ReadWrite,
    /// No knowledgebase at all.
    #[serde(rename = "none")]
    None,
}

/// `llm_validation_mode` (legacy, recorded only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmValidationMode {
    /// No LLM validation.
    Skip,
    /// LLM validation when useful.
    Auto,
    /// Always.
    Always,
}

/// `execution_tier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionTier {
    /// The strongest model tier.
    High,
    /// The middle tier.
    Medium,
    /// The cheapest tier.
    Low,
}

/// A rule of prerequisite detection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrerequisiteRule {
    /// The step the run goes back to.
    pub depends_on_step: String,
    /// When the rule applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `agent_configs`. Every field is optional: absent means "use the default", never false.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentConfigs {
    /// Tool plugins bound for this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected_servers: Option<Vec<String>>,
    /// Tool filter: `server:tool` or `server:*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected_tools: Option<Vec<String>>,
    /// Host-provided tools: `category:tool` or `category:*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled_custom_tools: Option<Vec<String>>,
    /// Legacy form of `enabled_custom_tools` categories.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled_custom_tool_categories: Option<Vec<String>>,
    /// The step's model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_llm: Option<ExecutionLlm>,
    /// Why the model is pinned (recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_llm_reason: Option<String>,
    /// A model tier instead of a pinned model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_tier: Option<ExecutionTier>,
    /// Why the tier was chosen (recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_tier_reason: Option<String>,
    /// The agent may write and run scripts in the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_code_execution_mode: Option<bool>,
    /// Scripted or agentic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared_execution_mode: Option<ExecutionMode>,
    /// Learnings access.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learnings_access: Option<LearningsAccess>,
    /// What the closing learning turn should capture.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning_objective: Option<String>,
    /// How detailed learnings are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning_detail_level: Option<LearningDetailLevel>,
    /// Knowledgebase access.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knowledgebase_access: Option<KnowledgebaseAccess>,
    /// What the step should add to the knowledgebase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knowledgebase_contribution: Option<String>,
    /// Extra workspace-relative folders the step may read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub additional_read_paths: Option<Vec<String>>,
    /// Hosts (`api.example.com`, `host:port`) the step's script may send HTTP(S)
    /// requests to; none when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_hosts: Option<Vec<String>>,
    /// Tool calls of one response run one at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_parallel_tool_execution: Option<bool>,
    /// Skip the validation gate (legacy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_validation: Option<bool>,
    /// Legacy, recorded only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_validation_mode: Option<LlmValidationMode>,
    /// Go back to a prerequisite step when a turn reports one missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_prerequisite_detection: Option<bool>,
    /// The prerequisite rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prerequisite_rules: Option<Vec<PrerequisiteRule>>,
    /// Large tool results go to a file, replaced by a reference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_context_offloading: Option<bool>,
    /// The saved script must not be rewritten by a repair.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_code: Option<bool>,
    /// Learnings are frozen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_learnings: Option<bool>,
    /// Why learnings are frozen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_learnings_reason: Option<String>,
    /// Legacy: read learnings, no closing learning turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_learning: Option<bool>,
    /// Skill folders readable to the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled_skills: Option<Vec<String>>,
    /// Bookkeeping of the original, kept verbatim: `declared_execution_mode_reason`,
    /// `description_reviewed`, `review_notes`, `successful_runs`,
    /// `coding_agent_tmux_lifecycle`, `validation_llm`.
    #[serde(flatten)]
    pub bookkeeping: BTreeMap<String, Value>,
}

/// Keys accepted and kept verbatim, with no runtime effect.
pub const BOOKKEEPING_KEYS: &[&str] = &[
    "db_access",
    "declared_execution_mode_reason",
    "description_reviewed",
    "review_notes",
    "successful_runs",
    "coding_agent_tmux_lifecycle",
    "validation_llm",
];

impl AgentConfigs {
    /// Whether the step is scripted.
    pub fn is_scripted(&self) -> bool {
        self.declared_execution_mode == Some(ExecutionMode::Scripted)
    }

    /// Learnings access after the defaults of spec section 3: explicit value, else
    /// `read-write` when a learning objective is set, else `read`; a frozen or disabled step
    /// never writes learnings.
    pub fn effective_learnings_access(&self) -> LearningsAccess {
        let objective = self
            .learning_objective
            .as_deref()
            .is_some_and(|s| !s.trim().is_empty());
        let access = match self.learnings_access {
            Some(a) => a,
            None if objective => LearningsAccess::ReadWrite,
            None => LearningsAccess::Read,
        };
        let frozen = self.lock_learnings == Some(true) || self.disable_learning == Some(true);
        if frozen && access == LearningsAccess::ReadWrite {
            LearningsAccess::Read
        } else {
            access
        }
    }

    /// Knowledgebase access after the defaults: explicit value, else `read-write` when a
    /// contribution is set, else `read`.
    pub fn effective_knowledgebase_access(&self) -> KnowledgebaseAccess {
        match self.knowledgebase_access {
            Some(a) => a,
            None if self
                .knowledgebase_contribution
                .as_deref()
                .is_some_and(|s| !s.trim().is_empty()) =>
            {
                KnowledgebaseAccess::ReadWrite
            }
            None => KnowledgebaseAccess::Read,
        }
    }

    /// The learning detail level, `exact` by default.
    pub fn effective_learning_detail_level(&self) -> LearningDetailLevel {
        self.learning_detail_level
            .unwrap_or(LearningDetailLevel::Exact)
    }
}

/// Reads a step config file from its text. `file` names it in diagnostics.
pub fn parse_step_config(text: &str, file: &str) -> Parsed<StepConfigFile> {
    let mut diags = Diagnostics::new();
    let parsed = parse_json(text, file, &mut diags).and_then(|v| {
        let mut ctx = Ctx::new(file, &mut diags);
        file_from_value(&mut ctx, &v)
    });
    finish(parsed, diags)
}

/// Reads a step config file from a JSON value already parsed.
pub fn parse_step_config_value(value: &Value, file: &str) -> Parsed<StepConfigFile> {
    let mut diags = Diagnostics::new();
    let parsed = {
        let mut ctx = Ctx::new(file, &mut diags);
        file_from_value(&mut ctx, value)
    };
    finish(parsed, diags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookkeeping_is_kept_and_max_turns_dropped() {
        let text = r#"{"steps":[{"id":"a","agent_configs":{"execution_max_turns":30,
            "review_notes":"ok","successful_runs":3,"validation_llm":{"provider":"x"},
            "learnings_access":"","learning_objective":"o"}}]}"#;
        let (file, warnings) = parse_step_config(text, STEP_CONFIG_FILE).unwrap();
        assert_eq!(
            warnings.lines(),
            [
                "planning/step_config.json: steps[0].agent_configs.execution_max_turns (step \"a\"): retired: ignored (one runtime turn limit applies) and dropped when the file is saved"
            ]
        );
        let c = file.get("a").unwrap().agent_configs.as_ref().unwrap();
        assert_eq!(c.effective_learnings_access(), LearningsAccess::ReadWrite);
        let back = serde_json::to_value(&file).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"steps":[{"id":"a","agent_configs":{"review_notes":"ok",
                "successful_runs":3,"validation_llm":{"provider":"x"},"learning_objective":"o"}}]})
        );
    }

    #[test]
    fn legacy_array_is_a_warning_and_saves_as_object() {
        let (mut file, warnings) = parse_step_config(r#"[{"id":"a"}]"#, STEP_CONFIG_FILE).unwrap();
        assert_eq!(warnings.len(), 1);
        file.set_agent_configs(
            "a",
            AgentConfigs {
                lock_code: Some(true),
                ..AgentConfigs::default()
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STEP_CONFIG_FILE);
        let fs = trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap();
        file.write(&fs, &path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\n  \"steps\": [\n    {\n      \"id\": \"a\",\n      \"agent_configs\": {\n        \"lock_code\": true\n      }\n    }\n  ]\n}\n"
        );
    }

    #[test]
    fn run_specific_config_wins_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let fs = trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap();
        assert_eq!(
            step_config_location(&fs, Some("iteration-0")),
            PathBuf::from(STEP_CONFIG_FILE)
        );
        let run = dir.path().join("runs/iteration-0/planning");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("step_config.json"), "{\"steps\":[]}").unwrap();
        assert_eq!(
            step_config_location(&fs, Some("iteration-0")),
            PathBuf::from("runs/iteration-0/planning/step_config.json")
        );
        assert_eq!(
            step_config_location(&fs, None),
            PathBuf::from(STEP_CONFIG_FILE)
        );
        assert_eq!(
            step_config_location(&fs, Some("../x")),
            PathBuf::from(STEP_CONFIG_FILE)
        );
    }
}
