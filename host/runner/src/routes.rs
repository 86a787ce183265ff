//! Routes (spec section 4, "Routes", and the layout of section 8): what a step with
//! `predefined_routes` offers its agent, and where its sub-agents keep their things.
//!
//! The agent gets the host tool `call_sub_agent(route_id, instructions)`. A call runs the
//! route's `sub_agent_step` as a child agent (the driver does that, in
//! [`crate::driver`]); this module holds the pieces around it:
//!
//! - [`call_sub_agent_tool`]: the tool as the model sees it, `route_id` an enum of the routes;
//! - [`delegation_note`]: the short note the system prompt gains;
//! - [`AgentHome`]: `<step output>/agents/<route-id>/`, with the route's `session.json` (its
//!   conversation, kept across calls in the run) and one fresh call folder per call,
//!   `calls/<call-id>/`, the child's `STEP_OUTPUT_DIR`;
//! - [`CallResult`]: what comes back to the caller as the tool result.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};

use crate::filters::CALL_SUB_AGENT;
use crate::session::Status;
use trellis_sandbox::llm::ToolDefinition;
use trellis_sandbox::store::{Kind, WorkspaceFs};
use trellis_workflow::plan::{PredefinedRoute, Step};

/// How deep sub-agents may nest: a step's agent is at depth 0, its sub-agents at 1, theirs
/// at 2, and so on. A call that would go deeper is refused with a tool error.
pub const MAX_ROUTE_DEPTH: usize = 3;

/// The folder of a step output where its sub-agents live, one folder per route.
pub const AGENTS_DIR: &str = "agents";
/// The folder of a route's home holding one folder per call.
pub const CALLS_DIR: &str = "calls";
/// The folder of a step output shared by the step's agent and its sub-agents.
pub const SHARED_DIR: &str = "shared";
/// The folder of an output folder where offloaded tool results go (left out of a call's
/// file list: the host wrote them, not the agent).
pub const TOOL_RESULTS_DIR: &str = "tool-results";

/// The `call_sub_agent` tool for a step's routes: `route_id` is an enum of the route ids,
/// and the description names each route and when to use it.
pub fn call_sub_agent_tool(routes: &[PredefinedRoute]) -> ToolDefinition {
    let ids: Vec<&str> = routes.iter().map(|r| r.route_id.as_str()).collect();
    ToolDefinition {
        name: CALL_SUB_AGENT.to_string(),
        description: format!(
            "Delegates a task to a specialist sub-agent and returns its final answer, its \
             status and the files it wrote. Routes:\n{}",
            route_list(routes)
        ),
        parameters: json!({
            "type": "object",
            "properties": {
                "route_id": {
                    "type": "string",
                    "enum": ids,
                    "description": "The route to delegate to."
                },
                "instructions": {
                    "type": "string",
                    "description": "What the sub-agent should do, with everything it needs: \
                                    it does not see your conversation."
                }
            },
            "required": ["route_id", "instructions"],
            "additionalProperties": false
        }),
    }
}

fn route_list(routes: &[PredefinedRoute]) -> String {
    let mut text = String::new();
    for r in routes {
        text.push_str("- ");
        text.push_str(&r.route_id);
        if let Some(name) = r.route_name.as_deref().filter(|n| !n.trim().is_empty()) {
            text.push_str(&format!(" ({})", name.trim()));
        }
        if let Some(cond) = r.condition.as_deref().filter(|c| !c.trim().is_empty()) {
            text.push_str(&format!(": {}", cond.trim()));
        }
        text.push('\n');
    }
    text
}

/// The note a step with routes adds to its system prompt; empty without routes.
pub fn delegation_note(step: &Step) -> String {
    let routes = step.predefined_routes();
    if routes.is_empty() {
        return String::new();
    }
    format!(
        "You may delegate with the tool `{CALL_SUB_AGENT}(route_id, instructions)`, as often as \
         useful or never. Each route's sub-agent keeps its own conversation across your calls \
         but does not see yours, so give it everything it needs. It answers with its final \
         reply, its status and the files it wrote; files in the shared folder are seen by you \
         both. Routes:\n{}",
        route_list(routes)
    )
}

/// The first user message of a call: the caller's instructions, then the message of the
/// sub-agent's first turn.
pub fn call_opening(call_id: &str, instructions: &str, message: &str) -> String {
    format!("{}\n\n{message}", call_preamble(call_id, instructions))
}

/// The caller's instructions as the sub-agent reads them.
pub fn call_preamble(call_id: &str, instructions: &str) -> String {
    format!("Instructions from the agent that called you ({call_id}):\n{instructions}")
}

/// A route's home: `<owner>/agents/<route-id>/` where `<owner>` is the step output folder
/// for a step's routes, or the home of the sub-agent whose routes they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHome {
    /// The home, workspace-relative.
    pub rel: String,
    /// The home on the host.
    pub dir: PathBuf,
}

impl AgentHome {
    /// The home of `route_id` under `owner_rel` (workspace-relative) in workspace `root`.
    /// The route id must be a single path component.
    pub fn new(root: &Path, owner_rel: &str, route_id: &str) -> Result<Self> {
        if route_id.is_empty()
            || route_id.contains(['/', '\\'])
            || route_id == "."
            || route_id == ".."
        {
            bail!("route id {route_id:?} cannot name a folder");
        }
        let rel = format!("{owner_rel}/{AGENTS_DIR}/{route_id}");
        Ok(AgentHome {
            dir: root.join(&rel),
            rel,
        })
    }

    /// Reserves the next call folder, `calls/call-NNNN` (one more than the highest there),
    /// creating it. Returns the call id.
    /// Everything goes through `fs`: a link planted on the way is refused, not followed.
    pub fn next_call(&self, fs: &WorkspaceFs) -> Result<String> {
        let calls = self.dir.join(CALLS_DIR);
        fs.create_dir_all(&calls)
            .with_context(|| format!("creating {}", calls.display()))?;
        let mut highest = 0u32;
        for (name, _) in fs
            .list(&calls)
            .with_context(|| format!("reading {}", calls.display()))?
        {
            if let Some(n) = name
                .strip_prefix("call-")
                .and_then(|n| n.parse::<u32>().ok())
            {
                highest = highest.max(n);
            }
        }
        // The names are the caller's to plant (its folder is writable): a number with no
        // successor is refused, never wrapped to an earlier call.
        let past_last = || {
            anyhow::anyhow!(
                "{} holds call-{highest}, the last call number there can be: move it away",
                calls.display()
            )
        };
        let mut n = highest.checked_add(1).ok_or_else(past_last)?;
        loop {
            let id = call_id(n);
            match fs.create_dir(calls.join(&id)) {
                Ok(()) => return Ok(id),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    n = n.checked_add(1).ok_or_else(past_last)?;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("creating {}", calls.display()));
                }
            }
        }
    }

    /// The call folder of `call_id`, workspace-relative.
    pub fn call_rel(&self, call_id: &str) -> String {
        format!("{}/{CALLS_DIR}/{call_id}", self.rel)
    }
}

/// The id of call `n` (1-based): `call-0001`.
pub fn call_id(n: u32) -> String {
    format!("call-{n:04}")
}

/// The files under `dir` (symbolic links not followed, at most
/// [`trellis_sandbox::store::workspace_fs::MAX_WALK_DEPTH`] folders down), as paths
/// relative to `root` with `/` separators, sorted; `tool-results/` at the top of `dir` is
/// left out.
pub fn files_written(fs: &WorkspaceFs, root: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let tool_results = dir.join(TOOL_RESULTS_DIR);
    // A folder that cannot be listed ends the listing with what was found before it.
    let _ = fs.walk(dir, |path, kind| {
        if kind == Kind::Dir {
            return path != tool_results;
        }
        if let Ok(rel) = path.strip_prefix(root) {
            out.push(
                rel.components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/"),
            );
        }
        false
    });
    out.sort();
    out
}

/// What a call returns to the agent that made it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallResult {
    /// The route called.
    pub route_id: String,
    /// The call's id (its folder name).
    pub call_id: String,
    /// `completed`, `failed` or `stopped`.
    pub status: Status,
    /// The sub-agent's last reply.
    pub answer: Option<String>,
    /// Why it failed or stopped.
    pub error: Option<String>,
    /// The call folder (workspace-relative), the sub-agent's `STEP_OUTPUT_DIR`.
    pub output_folder: String,
    /// The files in the call folder (workspace-relative).
    pub files: Vec<String>,
}

impl CallResult {
    /// The result as the tool result value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_workflow::plan::{Item, ItemBody, MessageSequence, StepKind};

    fn route(id: &str, name: Option<&str>, condition: Option<&str>) -> PredefinedRoute {
        PredefinedRoute {
            route_id: id.into(),
            route_name: name.map(String::from),
            condition: condition.map(String::from),
            sub_agent_step: Box::new(Step {
                id: id.into(),
                title: Some("t".into()),
                description: Some("d".into()),
                context_dependencies: None,
                context_output: None,
                validation_schema: None,
                next_step_id: None,
                compat: Default::default(),
                kind: StepKind::MessageSequence(MessageSequence {
                    items: vec![Item {
                        id: "go".into(),
                        title: None,
                        kind: None,
                        body: ItemBody::UserMessage {
                            message: "go".into(),
                            write_access: None,
                        },
                    }],
                    predefined_routes: Vec::new(),
                }),
            }),
            orphan_step_ref: None,
        }
    }

    #[test]
    fn the_tool_lists_the_routes_as_an_enum() {
        let routes = [
            route("refunds", Some("Refunds"), Some("money back")),
            route("legal", None, None),
        ];
        let tool = call_sub_agent_tool(&routes);
        assert_eq!(tool.name, "call_sub_agent");
        assert_eq!(
            tool.parameters["properties"]["route_id"]["enum"],
            json!(["refunds", "legal"])
        );
        assert_eq!(
            tool.parameters["required"],
            json!(["route_id", "instructions"])
        );
        assert!(
            tool.description
                .contains("- refunds (Refunds): money back\n- legal\n"),
            "{}",
            tool.description
        );
    }

    #[test]
    fn a_planted_last_call_number_is_refused_not_wrapped() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path(), "runs/iteration-0/execution/s", "refunds").unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        std::fs::create_dir_all(home.dir.join("calls/call-4294967295")).unwrap();
        let err = home.next_call(&fs).unwrap_err().to_string();
        assert!(
            err.ends_with("holds call-4294967295, the last call number there can be: move it away"),
            "{err}"
        );
        assert!(!home.dir.join("calls/call-0000").exists());
        // A number past u32 is not a call name at all: numbering goes on from the others.
        std::fs::remove_dir(home.dir.join("calls/call-4294967295")).unwrap();
        std::fs::create_dir_all(home.dir.join("calls/call-99999999999")).unwrap();
        assert_eq!(home.next_call(&fs).unwrap(), "call-0001");
    }

    #[test]
    fn call_folders_are_numbered_and_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path(), "runs/iteration-0/execution/s", "refunds").unwrap();
        let fs = WorkspaceFs::open(dir.path()).unwrap();
        assert_eq!(home.rel, "runs/iteration-0/execution/s/agents/refunds");
        assert_eq!(home.next_call(&fs).unwrap(), "call-0001");
        assert_eq!(home.next_call(&fs).unwrap(), "call-0002");
        std::fs::create_dir_all(home.dir.join("calls/call-0009")).unwrap();
        assert_eq!(home.next_call(&fs).unwrap(), "call-0010");
        assert_eq!(
            home.call_rel("call-0010"),
            "runs/iteration-0/execution/s/agents/refunds/calls/call-0010"
        );
        for bad in ["", "..", "a/b", "."] {
            assert!(AgentHome::new(dir.path(), "x", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_file_list_leaves_out_offloaded_tool_results() {
        let dir = tempfile::tempdir().unwrap();
        let call = dir.path().join("out/call-0001");
        std::fs::create_dir_all(call.join("tool-results")).unwrap();
        std::fs::create_dir_all(call.join("sub")).unwrap();
        std::fs::write(call.join("b.json"), "{}").unwrap();
        std::fs::write(call.join("sub/a.txt"), "a").unwrap();
        std::fs::write(call.join("tool-results/c1.json"), "{}").unwrap();
        assert_eq!(
            files_written(&WorkspaceFs::open(dir.path()).unwrap(), dir.path(), &call),
            ["out/call-0001/b.json", "out/call-0001/sub/a.txt"]
        );
    }
}
