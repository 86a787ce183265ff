//! The Trellis runner: runs workflows and their message sequences (spec sections 1, 2, 4,
//! 6, 8 and 10) on top of the sandbox ([`trellis_sandbox`]) and the workflow model
//! ([`trellis_workflow`]).
//!
//! - [`runtime`]: the facade front ends use: executions started, watched, steered and
//!   stopped in the background.
//! - [`grants`]: the turn policy of section 6, a step and item turned into a plain grant.
//! - [`driver`]: the step runner, split by feature (the turn, gates and repair turns,
//!   sub-agent calls, scripted steps, reflection, every prompt text).
//! - [`workflow_run`]: a whole workflow, step after step (section 2).
//! - [`step_script`]: a step's script run with the step's grant.
//! - [`filters`]: which tools a step's turns are offered (section 10).
//! - [`db_tools`]: `query_workflow_db` and `mutate_workflow_db`, the database tools of every
//!   agent turn.
//! - [`template`]: Go `text/template` rendering of foreach messages.
//! - [`foreach`]: the read-only row query of a foreach item, with its cap.
//! - [`scripted`]: texts and names of scripted steps (the loop is in [`driver`]).
//! - [`session`]: `session.json`, the final summary and per-turn logs, written atomically.
//! - [`run_folder`]: rotation of `runs/iteration-0` and group run folders.
//! - [`runs`]: reading what runs left behind (`trellis runs list` / `show`).
//! - [`events`]: what a running step reports as it goes (live progress).
//! - [`steering`]: messages sent to a running step's agent from outside.
//! - [`routes`]: `call_sub_agent` and where a step's sub-agents keep their things.
//! - [`llm_choice`]: the models of each step (`--llm`, `execution_llm`, tiers, default).
//! - [`mcp_servers`]: external MCP servers the operator configured, as tool sources.

pub mod db_tools;
pub mod dispatch;
pub mod driver;
pub mod events;
pub mod filters;
pub mod foreach;
pub mod grants;
pub mod human_inputs;
pub mod llm_choice;
pub mod mcp_servers;
pub mod prerequisites;
pub mod routes;
pub mod run_folder;
pub mod runs;
pub mod runtime;
pub mod scripted;
pub mod session;
pub mod steering;
pub mod step_script;
pub mod template;
pub mod tool_check;
pub mod workflow_run;
pub mod workspace_lock;
