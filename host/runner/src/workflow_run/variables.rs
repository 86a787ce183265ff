//! Groups and variables of a run: which groups run, each unit's variables (declared values,
//! the group's, human_input answers) and their substitution into the plan's texts.

use super::*;

/// The groups a run covers: all of workflow.json's (none when it has none), or the one
/// named by id or display name. An unknown name is an error listing the known groups.
pub fn select_groups<'w>(ws: &'w Workspace, name: Option<&str>) -> Result<Vec<&'w Group>> {
    let groups = &ws.manifest.groups;
    let known = || {
        groups
            .iter()
            .map(|g| match &g.name {
                Some(n) => format!("{} ({n})", g.id),
                None => g.id.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(name) = name else {
        return Ok(groups.iter().collect());
    };
    if groups.is_empty() {
        bail!("--group {name:?}: workflow.json declares no groups");
    }
    let group = groups
        .iter()
        .find(|g| g.id == name)
        .or_else(|| groups.iter().find(|g| g.name.as_deref() == Some(name)))
        .with_context(|| format!("no group {name:?} in workflow.json (groups: {})", known()))?;
    Ok(vec![group])
}

/// The run folder of a group, relative to `runs/`: `iteration-0/<sanitized name>`.
pub fn group_run_folder(group: &Group) -> Result<String> {
    Ok(format!(
        "{ACTIVE_RUN}/{}",
        group_folder_name(group.name.as_deref(), &group.id)?
    ))
}

/// The run folder of a group for a run that keeps the active run (or a read of it): as
/// [`group_run_folder`], or the folder an earlier Trellis named for the group when only that
/// one exists (see [`crate::run_folder::existing_group_folder`]).
pub fn existing_group_run_folder(fs: &WorkspaceFs, group: &Group) -> Result<String> {
    Ok(format!(
        "{ACTIVE_RUN}/{}",
        crate::run_folder::existing_group_folder(fs, group.name.as_deref(), &group.id)?
    ))
}

/// The workflow variables a run unit sees: declared values, then the group's.
pub fn unit_variables(ws: &Workspace, group: Option<&Group>) -> BTreeMap<String, String> {
    ws.manifest.resolved_variables(group.map(|g| g.id.as_str()))
}

/// The block of workflow variables appended to every step's charter (empty with none).
pub fn variables_block(
    variables: &BTreeMap<String, String>,
    group: Option<&Group>,
) -> Option<String> {
    if variables.is_empty() {
        return None;
    }
    let mut text = match group {
        Some(g) => format!(
            "Workflow variables (group {}{}):",
            g.id,
            g.name
                .as_deref()
                .map(|n| format!(", {n}"))
                .unwrap_or_default()
        ),
        None => "Workflow variables:".to_string(),
    };
    for (name, value) in variables {
        text.push_str(&format!("\n- {name} = {value}"));
    }
    Some(text)
}

/// Appends `block` (the unit's [`variables_block`]) to the description of step `id` when it
/// is a step of the main path or an orphan, for as long as it runs: the block is copied into
/// the one step that runs, not into every step of the plan (a large variable in a plan of
/// many steps would be copied once a step). Returns what [`take_variables_block`] needs to
/// put the description back.
pub fn give_variables_block(
    ws: &mut Workspace,
    id: &str,
    block: Option<&str>,
) -> Option<(String, Option<String>)> {
    let block = block?;
    let step = ws
        .plan
        .steps
        .iter_mut()
        .chain(ws.plan.orphan_steps.iter_mut())
        .find(|s| s.id == id)?;
    let before = step.description.clone();
    step.description = Some(match before.as_deref().map(str::trim_end) {
        Some(d) if !d.is_empty() => format!("{d}\n\n{block}"),
        _ => block.to_string(),
    });
    Some((id.to_string(), before))
}

/// Puts back the description [`give_variables_block`] extended.
pub fn take_variables_block(ws: &mut Workspace, given: Option<(String, Option<String>)>) {
    let Some((id, before)) = given else {
        return;
    };
    if let Some(step) = ws
        .plan
        .steps
        .iter_mut()
        .chain(ws.plan.orphan_steps.iter_mut())
        .find(|s| s.id == id)
    {
        step.description = before;
    }
}

/// The variables of a run unit with the answers of its `human_input` steps: an answer given
/// for a step with a `variable_name` becomes the variable of that name.
pub fn unit_variables_with_answers(
    ws: &Workspace,
    group: Option<&Group>,
    inputs: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut variables = unit_variables(ws, group);
    for step in ws.plan.all_steps() {
        if let StepKind::HumanInput(h) = &step.kind
            && let Some(name) = h.variable_name.as_deref()
            && let Some(answer) = inputs.get(name)
        {
            variables.insert(name.to_string(), answer.clone());
        }
    }
    variables
}

/// Substitutes the unit's variables in the plan's step texts, each within its limit
/// ([`trellis_workflow::substitution::substitute_plan`]), what they add counted against the
/// run's ([`trellis_workflow::substitution::MAX_RUN_GROWTH`]).
pub fn substitute_variables(
    env: &RunEnv<'_>,
    ws: &mut Workspace,
    variables: &BTreeMap<String, String>,
) -> Result<usize> {
    let grown = trellis_workflow::substitution::substitute_plan(&mut ws.plan, variables)?;
    env.take_substituted(grown)?;
    Ok(grown)
}
