//! Building blocks of the message-sequence runtime (spec sections 1, 4, 8 and 10).
//!
//! The agent loop composes these; each is pure and tested on its own:
//!
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
//! - [`workflow_run`]: a whole workflow, step after step (section 2).
//! - [`runtime`]: the facade front ends use: executions started, watched, steered and
//!   stopped in the background.
//!
//! The grant of each turn (section 6) lives with the other grants, in
//! [`crate::capabilities::turn`].

pub mod db_tools;
pub mod driver;
pub mod events;
pub mod filters;
pub mod foreach;
pub mod llm_choice;
pub mod routes;
pub mod run_folder;
pub mod runs;
pub mod runtime;
pub mod scripted;
pub mod session;
pub mod steering;
pub mod template;
pub mod workflow_run;
