//! The turn grants of a workspace's agents, built the way the driver builds them for run
//! folder `iteration-0`: a step's item, its reflection turn, and a route's sub-agent.

use trellis_runner::grants::{
    AgentFolders, TurnContext, TurnGrant, TurnPurpose, turn_grant, turn_grant_in,
};
use trellis_workflow::{Step, Workspace};

/// The grant of item `item_id` of step `step_id`.
pub fn item_grant(ws: &Workspace, step_id: &str, item_id: &str) -> TurnGrant {
    let step = ws.plan.step(step_id).unwrap();
    let items = step.effective_items();
    let item = items.iter().find(|i| i.id == item_id).unwrap();
    grant_of(ws, step, step_id, TurnPurpose::Item(item), None)
}

/// The grant of the reflection turn of step `step_id`.
pub fn reflection_grant(ws: &Workspace, step_id: &str) -> TurnGrant {
    let step = ws.plan.step(step_id).unwrap();
    grant_of(ws, step, step_id, TurnPurpose::Reflection, None)
}

/// The grant of the sub-agent of route `route_id` (a route of step `step_id`) in the call
/// with these folders, for its first item (where every call starts).
pub fn sub_agent_grant(
    ws: &Workspace,
    step_id: &str,
    route_id: &str,
    folders: &AgentFolders,
) -> TurnGrant {
    let parent = ws.plan.step(step_id).unwrap();
    let step = &parent
        .predefined_routes()
        .iter()
        .find(|r| r.route_id == route_id)
        .unwrap()
        .sub_agent_step;
    let items = step.effective_items();
    grant_of(
        ws,
        step,
        route_id,
        TurnPurpose::Item(&items[0]),
        Some(folders),
    )
}

fn grant_of(
    ws: &Workspace,
    step: &Step,
    config_id: &str,
    purpose: TurnPurpose<'_>,
    folders: Option<&AgentFolders>,
) -> TurnGrant {
    let configs = ws.agent_configs(config_id);
    let ctx = TurnContext {
        root: &ws.root,
        run_folder: "iteration-0",
        step,
        configs: &configs,
    };
    match folders {
        Some(folders) => turn_grant_in(&ctx, purpose, folders),
        None => turn_grant(&ctx, purpose),
    }
    .unwrap()
}
