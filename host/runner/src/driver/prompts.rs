//! The texts the step runner sends to the model: system prompts (with the note naming the
//! unsandboxed tools of external MCP servers), the tool policy note, repair and reflection
//! messages and the reference to an offloaded tool result.

use anyhow::{Context, Result, anyhow};

use crate::grants::{
    AgentFolders, ReflectionDue, SOUL_DIR, TurnAccess, TurnContext, TurnGrant, grant_for_access_in,
};
use crate::mcp_servers::UNSANDBOXED_MARK;
use crate::routes::{AgentHome, delegation_note};
use trellis_sandbox::llm::ToolDefinition;
use trellis_workflow::plan::{Plan, Step};
use trellis_workflow::step_config::LearningDetailLevel;
use trellis_workflow::validation::Report;
use trellis_workflow::{AgentConfigs, Workspace};

/// The short tool policy note closing the system prompt.
pub const TOOL_POLICY_NOTE: &str = "Use the tools offered to read and write files; paths are \
workspace-relative. A tool error comes back as a result starting with `error:`: read it and \
adjust. When the task cannot be done, reply with a line `STATUS: FAILED <reason>`. Report \
doubts on lines starting with `CONCERNS:`.";

/// The user message of the last call of a turn that used its `rounds` tool rounds.
pub fn out_of_tool_rounds(rounds: usize) -> String {
    format!(
        "You are out of tool rounds: this turn has used all {rounds} of them, and tools are no \
         longer available. Answer now with what you have done and found; say what is left \
         undone."
    )
}

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
            "- Record what this run taught you in learnings/_global/, kept as a skill: one \
             markdown file per topic (learnings/_global/<topic>.md; add to the file of a topic \
             that exists rather than starting another), and learnings/_global/SKILL.md as its \
             index, one line per topic file with its name and what it covers (create it if \
             missing, keep it current). Step {step_id} is where this came from. Learning \
             objective: {objective} {detail}\n"
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

/// The system prompt of a step: its description, the workflow's north star (the plan's
/// objective and success criteria, `soul/soul.md` when the turn can read it, the step's
/// expected output files), the grant and the tool policy note.
pub fn system_prompt(plan: &Plan, step: &Step, grant: &TurnGrant) -> String {
    let mut text = String::new();
    if let Some(d) = step.description.as_deref().filter(|d| !d.trim().is_empty()) {
        text.push_str(d.trim());
        text.push_str("\n\n");
    }
    let north_star = north_star(plan, step, grant);
    if !north_star.is_empty() {
        text.push_str(&north_star);
        text.push('\n');
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

/// What every turn is reminded of: the plan's objective and success criteria, the step's
/// own success criteria (the original's step key), to read
/// `soul/soul.md` (when granted), and the files the step must leave in its output folder.
fn north_star(plan: &Plan, step: &Step, grant: &TurnGrant) -> String {
    let mut text = String::new();
    let non_empty = |s: Option<&str>| s.map(str::trim).filter(|s| !s.is_empty()).map(String::from);
    if let Some(objective) = non_empty(plan.objective.as_deref()) {
        text.push_str(&format!("Workflow objective: {objective}\n"));
    }
    if let Some(criteria) = non_empty(plan.success_criteria.as_deref()) {
        text.push_str(&format!("Success criteria: {criteria}\n"));
    }
    if let Some(criteria) = non_empty(step.compat.success_criteria.as_deref()) {
        text.push_str(&format!("Success criteria of this step: {criteria}\n"));
    }
    if grant.folders.iter().any(|f| f.path == SOUL_DIR) {
        text.push_str(
            "Read soul/soul.md before you start: the workflow's objective, success criteria \
             and constraints. Keep to them.\n",
        );
    }
    let outputs = step.outputs();
    if !outputs.is_empty() {
        text.push_str(&format!(
            "Expected outputs of this step, in its output folder: {}\n",
            outputs.join(", ")
        ));
    }
    text
}

/// The largest dependency file inlined in a regular step's prompt, as in the original.
pub const MAX_INLINE_FILE: usize = 15 * 1024;
/// The most bytes of dependency files inlined in one prompt, as in the original.
pub const MAX_INLINE_TOTAL: usize = 50 * 1024;

/// The `context_dependencies` files of a regular step, for its prompt as the original gives
/// them: each small text file (at most [`MAX_INLINE_FILE`] bytes, [`MAX_INLINE_TOTAL`] in
/// all, no NUL byte in its first 512) inlined, a larger or binary one named to read with the
/// tools. Folders, and files that cannot be read, are left to the grant; empty when no entry
/// is a file.
pub fn inlined_dependencies(fs: &trellis_sandbox::store::WorkspaceFs, deps: &[&str]) -> String {
    let mut text = String::new();
    let mut total = 0usize;
    for dep in deps {
        if !matches!(fs.kind(dep), Ok(Some(trellis_sandbox::store::Kind::File))) {
            continue;
        }
        // Larger than the cap: named, never read whole. One the host does not read (a
        // file with other hard links, say) is named with why.
        let bytes = match fs.read_capped(dep, MAX_INLINE_FILE as u64) {
            Ok(bytes) => bytes,
            Err(_)
                if fs
                    .metadata_len(dep)
                    .is_some_and(|n| n > MAX_INLINE_FILE as u64) =>
            {
                text.push_str(&format!(
                    "File: {dep} (over {MAX_INLINE_FILE} bytes; read it with your tools)\n"
                ));
                continue;
            }
            Err(e) => {
                text.push_str(&format!("File: {dep} (not read: {e})\n"));
                continue;
            }
        };
        let size = bytes.len();
        let is_text = !bytes[..size.min(512)].contains(&0);
        match std::str::from_utf8(&bytes) {
            Ok(content) if is_text && total + size <= MAX_INLINE_TOTAL => {
                total += size;
                text.push_str(&format!(
                    "File: {dep} (inlined, {size} bytes)\n<content>\n{content}\n</content>\n"
                ));
            }
            _ => text.push_str(&format!(
                "File: {dep} ({size} bytes; read it with your tools)\n"
            )),
        }
    }
    if text.is_empty() {
        return text;
    }
    format!("\n\nContext files (context_dependencies):\n{text}")
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
    Ok(system_prompt(&ws.plan, step, &grant))
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
    Ok(system_prompt(&ws.plan, step, &grant?))
}

/// `system` with, when the agent is offered tools of external MCP servers, a paragraph
/// naming them as running outside the sandbox.
pub(super) fn unsandboxed_note(mut system: String, tools: &[ToolDefinition]) -> String {
    let names: Vec<&str> = tools
        .iter()
        .filter(|t| t.description.starts_with(UNSANDBOXED_MARK))
        .map(|t| t.name.as_str())
        .collect();
    if !names.is_empty() {
        system.push_str(&format!(
            "\n\nUnsandboxed tools (external MCP servers the operator configured; they run \
             outside the sandbox, with no grant of this step): {}",
            names.join(", ")
        ));
    }
    system
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
    if report.failures_left_out > 0 {
        text.push_str(&format!(
            "- and {} more failing checks, not listed (fix the ones above first)\n",
            report.failures_left_out
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small file with another hard link is not read, and the prompt says why, not that
    /// it is too large (round 30).
    #[test]
    fn dependencies_are_inlined_named_when_large_and_refused_with_why() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("small.md"), "hello").unwrap();
        std::fs::write(root.join("large.md"), "x".repeat(MAX_INLINE_FILE + 1)).unwrap();
        std::fs::write(root.join("linked.md"), "secret").unwrap();
        std::fs::hard_link(root.join("linked.md"), root.join("other-link.md")).unwrap();
        let fs = trellis_sandbox::store::WorkspaceFs::open(root).unwrap();
        let text = inlined_dependencies(&fs, &["small.md", "large.md", "linked.md"]);
        assert!(
            text.contains("File: small.md (inlined, 5 bytes)\n<content>\nhello"),
            "{text}"
        );
        assert!(
            text.contains(&format!("File: large.md (over {MAX_INLINE_FILE} bytes;")),
            "{text}"
        );
        assert!(text.contains("File: linked.md (not read: "), "{text}");
        assert!(text.contains("hard link"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}
