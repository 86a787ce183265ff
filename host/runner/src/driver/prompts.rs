//! The texts the step runner sends to the model: system prompts, the tool policy note,
//! repair and reflection messages and the reference to an offloaded tool result.

use anyhow::{Context, Result, anyhow};

use crate::grants::{
    AgentFolders, ReflectionDue, TurnAccess, TurnContext, TurnGrant, grant_for_access_in,
};
use crate::routes::{AgentHome, delegation_note};
use trellis_workflow::plan::Step;
use trellis_workflow::step_config::LearningDetailLevel;
use trellis_workflow::validation::Report;
use trellis_workflow::{AgentConfigs, Workspace};

/// The short tool policy note closing the system prompt.
pub const TOOL_POLICY_NOTE: &str = "Use the tools offered to read and write files; paths are \
workspace-relative. A tool error comes back as a result starting with `error:`: read it and \
adjust. When the task cannot be done, reply with a line `STATUS: FAILED <reason>`. Report \
doubts on lines starting with `CONCERNS:`.";

/// The reference that replaces an offloaded tool result of `bytes` bytes written to `rel`
/// (workspace-relative).
pub fn offload_reference(rel: &str, bytes: usize) -> String {
    format!(
        "The result of this tool call ({bytes} bytes) is too large to show here. It was \
         written to {rel}: read it with your tools when you need it."
    )
}

/// The message of the reflection turn: what to record and where, per store due.
pub fn reflection_message(step_id: &str, configs: &AgentConfigs, due: ReflectionDue) -> String {
    let mut text = String::from(
        "Reflection: the work of this step is done and accepted; its output folder is \
         read-only now.\n",
    );
    if due.learnings {
        let objective = configs.learning_objective.as_deref().unwrap_or("").trim();
        let detail = match configs.effective_learning_detail_level() {
            LearningDetailLevel::Exact => {
                "Be exact: name the values, queries, commands and file names that mattered."
            }
            LearningDetailLevel::General => {
                "Keep to general lessons that carry over to similar runs."
            }
            LearningDetailLevel::None => "State each lesson in one line, without detail.",
        };
        text.push_str(&format!(
            "- Record what this run taught you in learnings/_global/{step_id}.md (add to it if \
             it exists). Learning objective: {objective} {detail}\n"
        ));
    }
    if due.knowledgebase {
        let contribution = configs
            .knowledgebase_contribution
            .as_deref()
            .unwrap_or("")
            .trim();
        text.push_str(&format!(
            "- Contribute to the knowledgebase: write or update a markdown note in \
             knowledgebase/notes/. What to contribute: {contribution}\n"
        ));
    }
    text.push_str("Write nowhere else, then reply briefly with what you recorded.");
    text
}

/// The system prompt of a step: its description, the grant and the tool policy note.
pub fn system_prompt(step: &Step, grant: &TurnGrant) -> String {
    let mut text = String::new();
    if let Some(d) = step.description.as_deref().filter(|d| !d.trim().is_empty()) {
        text.push_str(d.trim());
        text.push_str("\n\n");
    }
    text.push_str(&grant.describe());
    text.push('\n');
    text.push_str(TOOL_POLICY_NOTE);
    let note = delegation_note(step);
    if !note.is_empty() {
        text.push_str("\n\n");
        text.push_str(note.trim_end());
    }
    text
}

/// The system prompt `run_step` will use for step `step_id` of `ws` (for tests and cassettes).
pub fn step_system_prompt(ws: &Workspace, step_id: &str) -> Result<String> {
    let step = ws
        .plan
        .step(step_id)
        .ok_or_else(|| anyhow!("no step {step_id:?} in the plan"))?;
    let configs = ws.agent_configs(step_id);
    let run_folder = ws.run_folder.as_deref().unwrap_or("iteration-0");
    let ctx = TurnContext {
        root: &ws.root,
        run_folder,
        step,
        configs: &configs,
    };
    let folders = AgentFolders::for_step(run_folder, step);
    let grant = grant_for_access_in(&ctx, TurnAccess::for_step(&configs), &folders)?;
    Ok(system_prompt(step, &grant))
}

/// The system prompt of call `call_id` of the sub-agent reached from step `step_id` through
/// the routes `route_path` (one route id per level), for tests and cassettes. The folders
/// its grant would create are created, except the call folder itself, which is left to the
/// run (so the run's call numbering is unchanged).
pub fn sub_agent_system_prompt(
    ws: &Workspace,
    step_id: &str,
    route_path: &[&str],
    call_id: &str,
) -> Result<String> {
    let mut step = ws
        .plan
        .step(step_id)
        .ok_or_else(|| anyhow!("no step {step_id:?} in the plan"))?;
    let run_folder = ws.run_folder.as_deref().unwrap_or("iteration-0");
    let top = AgentFolders::for_step(run_folder, step);
    let shared = Some(format!("{}/{}", top.output, crate::routes::SHARED_DIR));
    let mut owner = top.output;
    for route_id in route_path {
        let route = step
            .predefined_routes()
            .iter()
            .find(|r| r.route_id == *route_id)
            .ok_or_else(|| anyhow!("step {:?} has no route {route_id:?}", step.id))?;
        step = &route.sub_agent_step;
        owner = AgentHome::new(&ws.root, &owner, route_id)?.rel;
    }
    route_path.last().context("no route given")?;
    let configs = ws.agent_configs(&step.id);
    let ctx = TurnContext {
        root: &ws.root,
        run_folder,
        step,
        configs: &configs,
    };
    let output = format!("{owner}/{}/{call_id}", crate::routes::CALLS_DIR);
    let existed = ws.fs.exists(&output);
    let folders = AgentFolders {
        output: output.clone(),
        shared,
        sub_agent: true,
    };
    let grant = grant_for_access_in(&ctx, TurnAccess::for_step(&configs), &folders);
    if !existed {
        let _ = ws.fs.remove_dir(&output);
    }
    Ok(system_prompt(step, &grant?))
}

/// The message of a repair turn: every failing check with file, path, expected and actual.
pub fn repair_message(item_id: &str, report: &Report) -> String {
    format!(
        "The validation gate {item_id} failed. Failing checks:\n{}\nRe-read the files named \
         above, fix them with your tools, then reply briefly.",
        failing_checks(report)
    )
}

pub(super) fn failing_checks(report: &Report) -> String {
    let mut text = String::new();
    for c in report.failures() {
        let path = if c.path.is_empty() {
            "(whole file)"
        } else {
            &c.path
        };
        text.push_str(&format!(
            "- file {}, path {path}, check {}: expected {}, actual {}. {}\n",
            c.file, c.kind, c.expected, c.actual, c.message
        ));
    }
    text
}
