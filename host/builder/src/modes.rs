//! Workshop modes (spec section 11): one table says which tools each mode has. The same
//! table chooses the tools offered in a turn and refuses a call to any other.

use std::fmt;
use std::str::FromStr;

/// A workshop mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Design and test (the default).
    Builder,
    /// Harden the workflow against run evidence.
    Optimizer,
    /// Operate: run, and answer from the results; no edits.
    Run,
    /// Read-heavy diagnosis.
    Debugger,
    /// Evaluation artefacts under `evaluation/`.
    Eval,
    /// Reports under `reports/`.
    Output,
}

impl Mode {
    /// Every mode, in the order the help lists them.
    pub const ALL: [Mode; 6] = [
        Mode::Builder,
        Mode::Optimizer,
        Mode::Run,
        Mode::Debugger,
        Mode::Eval,
        Mode::Output,
    ];

    /// Its name (`builder`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Builder => "builder",
            Mode::Optimizer => "optimizer",
            Mode::Run => "run",
            Mode::Debugger => "debugger",
            Mode::Eval => "eval",
            Mode::Output => "output",
        }
    }

    /// What the mode is for, in a line.
    pub fn purpose(self) -> &'static str {
        match self {
            Mode::Builder => "design and test the workflow",
            Mode::Optimizer => "harden the workflow against run evidence",
            Mode::Run => "operate the workflow and answer from its results; no edits",
            Mode::Debugger => "diagnose: read runs, logs and reports",
            Mode::Eval => "write evaluation artefacts under evaluation/",
            Mode::Output => "write reports under reports/",
        }
    }

    /// The tools of the mode, in the order they are offered.
    pub fn tools(self) -> Vec<&'static str> {
        TABLE
            .iter()
            .filter(|(_, modes)| modes.contains(&self))
            .flat_map(|(tools, _)| tools.iter().copied())
            .collect()
    }

    /// Whether the mode has `tool`.
    pub fn allows(self, tool: &str) -> bool {
        TABLE
            .iter()
            .any(|(tools, modes)| modes.contains(&self) && tools.contains(&tool))
    }

    /// The folders (workspace-relative) its file tools may write; empty when it has none.
    pub fn writable_folders(self) -> &'static [&'static str] {
        match self {
            Mode::Builder | Mode::Optimizer => &["code", "knowledgebase/notes", "learnings"],
            Mode::Eval => &["evaluation"],
            Mode::Output => &["reports"],
            Mode::Run | Mode::Debugger => &[],
        }
    }
}

/// The modes that have `tool`; empty for a tool no mode has.
pub fn modes_allowing(tool: &str) -> Vec<Mode> {
    Mode::ALL.into_iter().filter(|m| m.allows(tool)).collect()
}

/// Whether some mode has `tool`.
pub fn is_builder_tool(tool: &str) -> bool {
    TABLE.iter().any(|(tools, _)| tools.contains(&tool))
}

/// The refusal of a call to `tool` in `mode`: names the mode and the modes that have it.
pub fn refusal(mode: Mode, tool: &str) -> String {
    let allowing = modes_allowing(tool);
    if allowing.is_empty() {
        return format!("there is no builder tool {tool:?}");
    }
    let names: Vec<&str> = allowing.iter().map(|m| m.as_str()).collect();
    format!(
        "tool {tool:?} is not available in {} mode; it is available in: {} (the operator \
         switches modes with /mode NAME)",
        mode.as_str(),
        names.join(", ")
    )
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;

    /// A mode by name or alias (`workshop` is builder, `runner` and `ask` are run,
    /// `reporting`, the original system's name, is output).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "builder" | "workshop" => Ok(Mode::Builder),
            "optimizer" => Ok(Mode::Optimizer),
            "run" | "runner" | "ask" => Ok(Mode::Run),
            "debugger" => Ok(Mode::Debugger),
            "eval" => Ok(Mode::Eval),
            "output" | "reporting" => Ok(Mode::Output),
            _ => Err(format!(
                "unknown mode {name:?}: expected one of builder, optimizer, run, debugger, \
                 eval, output (aliases: workshop = builder, runner and ask = run, reporting \
                 = output)"
            )),
        }
    }
}

use Mode::{Builder, Debugger, Eval, Optimizer, Output, Run};

/// Reading: plan, step config, workflow config, workspace files (never secrets), the
/// database read-only, run artifacts and logs, costs.
pub const READ_TOOLS: &[&str] = &[
    "read_plan",
    "read_step_config",
    "read_workflow_config",
    "list_workspace_files",
    "read_workspace_file",
    "query_database",
    "list_run_artifacts",
    "get_cost_summary",
];

/// The original's read tools Trellis lacked: configs, models, prompts, plan-change checks,
/// script reviews.
pub const INSPECT_TOOLS: &[&str] = &[
    "get_workflow_config",
    "get_llm_config",
    "get_step_prompts",
    "validate_plan_change",
    "review_step_code",
];

/// The database read-only, under the original's name and arguments.
pub const DB_READ_TOOLS: &[&str] = &["query_workflow_db"];

/// Changing the database's rows (and tables).
pub const DB_WRITE_TOOLS: &[&str] = &["mutate_workflow_db"];

/// Plan edits, each validated before it is written.
pub const PLAN_TOOLS: &[&str] = &[
    "add_message_sequence_step",
    "add_scripted_step",
    "add_routing_step",
    "add_human_input_step",
    "add_todo_task_step",
    "update_message_sequence_step",
    "update_scripted_step",
    "update_routing_step",
    "update_human_input_step",
    "update_todo_task_step",
    "delete_plan_steps",
    "update_validation_schema",
    "migrate_message_sequence_code_items",
    "add_todo_task_route",
    "update_todo_task_route",
    "delete_todo_task_route",
    "cleanup_orphan_step_configs",
];

/// The step config, workflow config, variables and groups.
pub const CONFIG_TOOLS: &[&str] = &[
    "update_step_config",
    "update_workflow_config",
    "update_variable",
    "add_group",
    "update_group",
    "delete_group",
    "set_workflow_contract_version",
    "set_workflow_llm_config",
];

/// The schedules of workflow.json: listed, added, changed, removed, turned on and off.
pub const SCHEDULE_TOOLS: &[&str] = &[
    "list_schedules",
    "add_schedule",
    "update_schedule",
    "delete_schedule",
    "set_schedule_enabled",
    "trigger_schedule",
];

/// Writing files in the folders of the mode ([`Mode::writable_folders`]).
pub const FILE_TOOLS: &[&str] = &["write_workspace_file", "patch_workspace_file"];

/// The sandboxed shell, under the mode's folders ([`crate::files::shell`]).
pub const SHELL_TOOLS: &[&str] = &["execute_shell_command"];

/// Starting and steering single steps and side agents.
pub const START_TOOLS: &[&str] = &["execute_step", "send_step_message", "run_in_background"];

/// Watching executions.
pub const WATCH_TOOLS: &[&str] = &["query_step", "list_executions"];

/// Stopping executions.
pub const STOP_TOOLS: &[&str] = &["stop_step", "stop_all_executions"];

/// The table: each group of tools and the modes that have it.
const TABLE: &[(&[&str], &[Mode])] = &[
    (
        READ_TOOLS,
        &[Builder, Optimizer, Run, Debugger, Eval, Output],
    ),
    (
        INSPECT_TOOLS,
        &[Builder, Optimizer, Run, Debugger, Eval, Output],
    ),
    (
        DB_READ_TOOLS,
        &[Builder, Optimizer, Run, Debugger, Eval, Output],
    ),
    (DB_WRITE_TOOLS, &[Builder, Optimizer]),
    (PLAN_TOOLS, &[Builder, Optimizer]),
    (CONFIG_TOOLS, &[Builder, Optimizer]),
    (SCHEDULE_TOOLS, &[Builder, Optimizer]),
    (FILE_TOOLS, &[Builder, Optimizer, Eval, Output]),
    (SHELL_TOOLS, &[Builder, Optimizer, Eval, Output]),
    (START_TOOLS, &[Builder, Optimizer, Run]),
    (
        WATCH_TOOLS,
        &[Builder, Optimizer, Run, Debugger, Eval, Output],
    ),
    (STOP_TOOLS, &[Builder, Optimizer, Run, Eval, Output]),
    (&["run_full_workflow"], &[Optimizer, Run, Eval]),
    (&["debug_step"], &[Optimizer, Run, Debugger]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_name_their_modes() {
        assert_eq!("workshop".parse::<Mode>(), Ok(Mode::Builder));
        assert_eq!("Runner".parse::<Mode>(), Ok(Mode::Run));
        assert_eq!("ask".parse::<Mode>(), Ok(Mode::Run));
        assert_eq!("reporting".parse::<Mode>(), Ok(Mode::Output));
        assert!(
            "editor"
                .parse::<Mode>()
                .unwrap_err()
                .contains("builder, optimizer")
        );
    }

    #[test]
    fn the_table_matches_the_spec_rows() {
        assert!(Mode::Builder.allows("add_scripted_step"));
        assert!(!Mode::Builder.allows("run_full_workflow"));
        assert!(Mode::Optimizer.allows("run_full_workflow"));
        assert!(Mode::Optimizer.allows("debug_step"));
        assert!(!Mode::Run.allows("update_step_config"));
        assert!(Mode::Run.allows("execute_step"));
        assert_eq!(
            Mode::Debugger.tools()[READ_TOOLS.len()..],
            [
                "get_workflow_config",
                "get_llm_config",
                "get_step_prompts",
                "validate_plan_change",
                "review_step_code",
                "query_workflow_db",
                "query_step",
                "list_executions",
                "debug_step"
            ]
        );
        assert!(Mode::Builder.allows("mutate_workflow_db"));
        assert!(!Mode::Run.allows("mutate_workflow_db"));
        assert!(!Mode::Eval.allows("execute_step"));
        assert!(Mode::Output.allows("stop_step"));
        assert!(!Mode::Output.allows("run_full_workflow"));
    }

    #[test]
    fn a_refusal_names_the_mode_and_the_modes_allowing() {
        let text = refusal(Mode::Run, "add_scripted_step");
        assert!(text.contains("run mode"), "{text}");
        assert!(text.contains("builder, optimizer"), "{text}");
    }
}
