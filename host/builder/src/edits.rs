//! Plan, step config, workflow config, variables and groups: every edit validated through
//! the typed model before it is written, written atomically, and logged to
//! `planning/changelog/changelog-<UTC date>.json`.
//!
//! Each edit works on the files as JSON values (keys the typed model does not hold survive),
//! builds the candidate files in memory, checks the whole workspace as it would be with them
//! ([`trellis_workflow::validate_candidate`]) and writes nothing unless that has no error.
//!
//! - [`specs`](self::specs()): the tools and their argument schemas (from the workflow
//!   model's own JSON Schemas where it has them).
//! - `draft`: the files of one edit, their validation, the write and the changelog entry.
//! - `plan_tools`: the plan edits; `config_tools`: step config, workflow config, variables
//!   and groups; `compat_tools`: the original system's tools Trellis lacked (todo_task
//!   routes, orphan step configs, the contract stamp, the LLM config).

mod args;
pub mod changelog;
mod compat_tools;
mod config_tools;
mod draft;
mod plan_tools;
mod schedule_tools;
mod tool_specs;

use serde_json::Value;

use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};

pub use changelog::{CHANGELOG_DIR, changelog_path};
pub use schedule_tools::{add_schedule, delete_schedule, replace_schedule, set_schedule_enabled};

/// The specs of the plan and config tools ([`super::modes::PLAN_TOOLS`],
/// [`super::modes::CONFIG_TOOLS`]).
pub fn specs() -> Vec<ToolSpec> {
    let mut specs = tool_specs::all();
    specs.extend(compat_tools::specs());
    specs.extend(schedule_tools::specs());
    // In the order of the mode table's rows.
    let order: Vec<&str> = super::modes::PLAN_TOOLS
        .iter()
        .chain(super::modes::CONFIG_TOOLS)
        .chain(super::modes::SCHEDULE_TOOLS)
        .copied()
        .collect();
    specs.sort_by_key(|s| {
        order
            .iter()
            .position(|n| *n == s.name)
            .unwrap_or(usize::MAX)
    });
    specs
}

/// `trigger_schedule`: queues a firing through `hook`, the front end's (see
/// [`crate::schedules::TriggerHook`]).
pub fn trigger_schedule(
    ctx: &ToolContext<'_>,
    hook: Option<&crate::schedules::TriggerHook>,
    args: &Value,
) -> ToolResult {
    schedule_tools::trigger(ctx.root, hook, args)
}

/// Calls plan or config tool `name`: the arguments are checked against its schema first.
pub fn call(ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
    // A read: nothing to budget.
    if name == "list_schedules" {
        let spec = specs()
            .into_iter()
            .find(|s| s.name == name)
            .expect("its spec");
        args::check(&spec, args)?;
        return schedule_tools::list(ctx.root);
    }
    // An edit rewrites the files it changes whole (the plan up to 16 MiB) and the
    // changelog file it appends to: what it may write comes out of the turn's write budget,
    // checked before (the files it may rewrite, and its arguments) and charged after.
    let fs = trellis_sandbox::store::WorkspaceFs::open(ctx.root)
        .map_err(|e| ToolFailure::new(e.to_string()))?;
    let timestamp = trellis_runner::session::now_rfc3339();
    let log = changelog::changelog_file(&fs, &timestamp);
    let rewritable = [
        std::path::Path::new(trellis_workflow::PLAN_FILE),
        std::path::Path::new(trellis_workflow::STEP_CONFIG_FILE),
        std::path::Path::new(trellis_workflow::WORKFLOW_FILE),
        std::path::Path::new(trellis_workflow::manifest::VARIABLES_FILE),
        log.as_path(),
    ];
    let sizes = |fs: &trellis_sandbox::store::WorkspaceFs| -> u64 {
        rewritable
            .iter()
            .filter_map(|p| fs.metadata_len(p))
            .fold(0, u64::saturating_add)
    };
    let at_most = sizes(&fs).saturating_add(2 * args.to_string().len() as u64);
    let left = ctx.turn_writes.bytes_left();
    if at_most > left {
        return Err(ToolFailure::new(format!(
            "refused: this edit may rewrite {at_most} bytes (the plan, configs and today's \
             changelog it changes), and this turn may write {left} more (what is left of the \
             turn's, the run's and the workspace's budgets: --max-turn-write-mib, \
             --max-run-write-mib, --max-workspace-mib); nothing was written. Make the plan \
             smaller, or end the turn and tell the operator which budget ran out"
        )));
    }
    let answer = edit(ctx, name, args);
    if answer.is_ok() {
        ctx.turn_writes.charge(sizes(&fs));
    }
    answer
}

fn edit(ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
    let Some(spec) = specs().into_iter().find(|s| s.name == name) else {
        return Err(ToolFailure::new(format!(
            "{name:?} is not a plan or config tool"
        )));
    };
    args::check(&spec, args)?;
    let root = ctx.root;
    match name {
        "add_message_sequence_step" => plan_tools::add(root, plan_tools::Kind::Sequence, args),
        "add_scripted_step" => plan_tools::add(root, plan_tools::Kind::Scripted, args),
        "add_routing_step" => plan_tools::add(root, plan_tools::Kind::Routing, args),
        "add_human_input_step" => plan_tools::add(root, plan_tools::Kind::HumanInput, args),
        "add_todo_task_step" => plan_tools::add(root, plan_tools::Kind::TodoTask, args),
        "update_message_sequence_step" => {
            plan_tools::update(root, plan_tools::Kind::Sequence, args)
        }
        "update_scripted_step" => plan_tools::update(root, plan_tools::Kind::Scripted, args),
        "update_routing_step" => plan_tools::update(root, plan_tools::Kind::Routing, args),
        "update_human_input_step" => plan_tools::update(root, plan_tools::Kind::HumanInput, args),
        "update_todo_task_step" => plan_tools::update(root, plan_tools::Kind::TodoTask, args),
        "delete_plan_steps" => plan_tools::delete(root, args),
        "update_validation_schema" => plan_tools::update_validation_schema(root, args),
        "migrate_message_sequence_code_items" => plan_tools::migrate(root, args),
        "update_step_config" => config_tools::update_step_config(root, args),
        "update_workflow_config" => config_tools::update_workflow_config(root, args),
        "update_variable" => config_tools::update_variable(root, args),
        "add_group" => config_tools::add_group(root, args),
        "update_group" => config_tools::update_group(root, args),
        "delete_group" => config_tools::delete_group(root, args),
        "add_todo_task_route" => compat_tools::add_todo_task_route(root, args),
        "update_todo_task_route" => compat_tools::update_todo_task_route(root, args),
        "delete_todo_task_route" => compat_tools::delete_todo_task_route(root, args),
        "cleanup_orphan_step_configs" => compat_tools::cleanup_orphan_step_configs(root, args),
        "set_workflow_contract_version" => compat_tools::set_workflow_contract_version(root, args),
        "set_workflow_llm_config" => compat_tools::set_workflow_llm_config(root, args),
        "add_schedule" => schedule_tools::add(root, args),
        "update_schedule" => schedule_tools::update(root, args),
        "delete_schedule" => schedule_tools::delete(root, args),
        "set_schedule_enabled" => schedule_tools::set_enabled(root, args),
        _ => Err(ToolFailure::new(format!(
            "tool {name:?} is not implemented"
        ))),
    }
}
