//! The builder's system prompt, made in this one place from the workspace as it is at the
//! start of each turn (spec section 11): role, mode, workspace state, phase, execution policy
//! and the tools by category.

use std::fmt::Write as _;
use std::path::Path;

use super::modes::{
    CONFIG_TOOLS, FILE_TOOLS, Mode, PLAN_TOOLS, READ_TOOLS, START_TOOLS, STOP_TOOLS, WATCH_TOOLS,
};
use trellis_runner::runs::list_runs;
use trellis_workflow::Workspace;

/// Where the workflow is, as the builder should see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No plan yet (or one that does not load): design it.
    Design,
    /// A plan, but no run in which every step completed: stabilize by running steps.
    Stabilize,
    /// Runs completed: review them and improve.
    Improve,
}

impl Phase {
    fn advice(self) -> &'static str {
        match self {
            Phase::Design => {
                "design: there is no working plan yet. Ask what the workflow is for if that \
                 is unclear, then build the plan step by step."
            }
            Phase::Stabilize => {
                "stabilize: the plan has not had a passing run. Run steps one at a time, read \
                 what they produced and fix what fails."
            }
            Phase::Improve => {
                "review and improve: runs exist. Read their results and logs, and improve \
                 what the evidence shows is weak."
            }
        }
    }
}

/// The phase of the workspace at `root`: `ws` is the workspace when it loads.
pub fn phase(root: &Path, ws: Option<&Workspace>) -> Phase {
    let Some(ws) = ws else {
        return Phase::Design;
    };
    if ws.plan.steps.is_empty() {
        return Phase::Design;
    }
    let runs = list_runs(root).unwrap_or_default();
    let passed = runs.iter().any(|run| {
        !run.steps.is_empty()
            && ws.plan.steps.iter().all(|step| {
                run.steps
                    .iter()
                    .any(|s| s.step_id == step.id && s.status == "completed")
            })
    });
    if passed {
        Phase::Improve
    } else {
        Phase::Stabilize
    }
}

/// The system prompt of a turn in `mode` on the workspace at `root`.
pub fn system_prompt(root: &Path, mode: Mode) -> String {
    let loaded = Workspace::open(root);
    let ws = loaded.as_ref().ok();
    let mut out = String::new();
    out.push_str(
        "You are the workflow builder. You design, run and repair agent workflows that \
         cheaper agents execute step by step. The person you talk to is an operator, not \
         necessarily technical: reply briefly and plainly, say what you changed and what you \
         found, and ask when a choice is theirs.\n\n",
    );
    let _ = writeln!(
        out,
        "Mode: {mode} ({}). You may use only the tools listed below; the operator changes \
         the mode.",
        mode.purpose()
    );
    if !mode.writable_folders().is_empty() {
        let _ = writeln!(
            out,
            "Files you may write: {} (planning/ changes only through the plan and config tools).",
            mode.writable_folders()
                .iter()
                .map(|f| format!("{f}/"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out.push_str("\n# Workspace\n");
    match &loaded {
        Ok(ws) => describe(&mut out, root, ws),
        Err(diags) => {
            let _ = writeln!(
                out,
                "The workspace does not load yet ({} problem(s)); the first: {}",
                diags.iter().count(),
                diags
                    .iter()
                    .next()
                    .map(|d| d.to_string())
                    .unwrap_or_default()
            );
        }
    }
    let _ = writeln!(out, "\nPhase: {}", phase(root, ws).advice());
    out.push_str(
        "\n# Executions\nStarting a step or a run returns at once and the work goes on in the \
         background. After starting work, end your turn and wait: you get a message when it \
         finishes. Do not poll query_step or list_executions in a loop.\n",
    );
    out.push_str("\n# Tools\n");
    for (label, group) in [
        ("Read", READ_TOOLS),
        (
            "Plan edits (each needs a reason; refused whole if invalid)",
            PLAN_TOOLS,
        ),
        ("Configuration", CONFIG_TOOLS),
        ("Schedules", crate::modes::SCHEDULE_TOOLS),
        ("Files", FILE_TOOLS),
        ("Run and steer", START_TOOLS),
        ("Watch", WATCH_TOOLS),
        ("Stop", STOP_TOOLS),
        (
            "Whole runs and diagnosis",
            &["run_full_workflow", "debug_step"],
        ),
    ] {
        let tools: Vec<&str> = group.iter().copied().filter(|t| mode.allows(t)).collect();
        if !tools.is_empty() {
            let _ = writeln!(out, "- {label}: {}", tools.join(", "));
        }
    }
    out
}

fn describe(out: &mut String, root: &Path, ws: &Workspace) {
    if let Some(objective) = &ws.plan.objective {
        let _ = writeln!(out, "Objective: {objective}");
    }
    let runs = list_runs(root).unwrap_or_default();
    let current = runs.iter().find(|r| r.run_folder == "iteration-0");
    if ws.plan.steps.is_empty() {
        out.push_str("Steps: none yet.\n");
    } else {
        out.push_str("Steps (in plan order):\n");
    }
    for step in ws.plan.all_steps() {
        let status = current
            .and_then(|r| r.steps.iter().find(|s| s.step_id == step.id))
            .map(|s| s.status.as_str())
            .unwrap_or("not run");
        let _ = writeln!(
            out,
            "- {} ({}{}): last status {status}",
            step.id,
            step.type_name(),
            if ws.agent_configs(&step.id).is_scripted() {
                ", scripted"
            } else {
                ""
            }
        );
    }
    if !ws.manifest.groups.is_empty() {
        let names: Vec<String> = ws
            .manifest
            .groups
            .iter()
            .map(|g| g.name.clone().unwrap_or_else(|| g.id.clone()))
            .collect();
        let _ = writeln!(out, "Groups: {}", names.join(", "));
    }
    let _ = writeln!(
        out,
        "Run folder: runs/iteration-0{} (every execution you start works there and re-reads \
         the plan and step config)",
        if ws.manifest.groups.is_empty() {
            ""
        } else {
            "/<group>"
        }
    );
}
