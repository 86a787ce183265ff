//! The preflight of a run: the steps a run can reach, and every check made on them before
//! anything in the workspace changes (inputs, models, groups, the files opened first).

use std::collections::{HashMap, HashSet};

use trellis_workflow::AgentConfigs;
use trellis_workflow::diagnostics::listed;

use super::*;

/// The steps a run would visit from `start` if every branch were taken (routes, yes/no and
/// option routes, `next_step_id`, array order, prerequisite rules). From a single `start`
/// step only its prerequisites are followed, and everything after them.
pub(super) fn reachable<'w>(ws: &'w Workspace, start: Option<&str>) -> Vec<&'w Step> {
    reachable_walk(ws, start, None)
}

/// The steps of the run `opts` asks for: [`reachable`] from its single step, from the step
/// it resumes from (every branch on from there), or from the first step.
pub(super) fn reachable_in<'w>(ws: &'w Workspace, opts: &RunOptions) -> Vec<&'w Step> {
    match (&opts.step, &opts.from) {
        (Some(s), _) => reachable(ws, Some(s)),
        (None, Some(from)) => reachable_walk(ws, None, Some(from)),
        (None, None) => reachable(ws, None),
    }
}

/// The plan by step id, made once for a walk so that each step it visits costs a lookup, not
/// a scan of the plan: the first step of each id (main path, then orphans, as
/// [`trellis_workflow::plan::Plan::step`] finds it), the step after each on the main path and
/// each step's agent settings.
struct PlanIndex<'w> {
    steps: HashMap<&'w str, &'w Step>,
    after: HashMap<&'w str, &'w str>,
    configs: HashMap<&'w str, Option<&'w AgentConfigs>>,
}

impl<'w> PlanIndex<'w> {
    fn new(ws: &'w Workspace) -> Self {
        let mut steps = HashMap::new();
        for step in ws.plan.all_steps() {
            steps.entry(step.id.as_str()).or_insert(step);
        }
        let mut after = HashMap::new();
        for pair in ws.plan.steps.windows(2) {
            after
                .entry(pair[0].id.as_str())
                .or_insert(pair[1].id.as_str());
        }
        let mut configs = HashMap::new();
        for entry in &ws.step_configs.steps {
            // The first entry of an id is the one in force, as `StepConfigFile::get` finds it.
            configs
                .entry(entry.id.as_str())
                .or_insert(entry.agent_configs.as_ref());
        }
        Self {
            steps,
            after,
            configs,
        }
    }

    /// `next_step_id`, else the next step in array order (see `default_next`).
    fn next(&self, step: &'w Step) -> Option<&'w str> {
        match &step.next_step_id {
            Some(n) => Some(n.as_str()),
            None => self.after.get(step.id.as_str()).copied(),
        }
    }
}

fn reachable_walk<'w>(ws: &'w Workspace, start: Option<&str>, from: Option<&str>) -> Vec<&'w Step> {
    let index = PlanIndex::new(ws);
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out = Vec::new();
    let first = match (start, from) {
        (Some(s), _) | (None, Some(s)) => index.steps.get(s).copied(),
        (None, None) => ws.plan.steps.first(),
    };
    let mut todo: Vec<&'w Step> = first.into_iter().collect();
    while let Some(step) = todo.pop() {
        if step.id == "end" || !seen.insert(step.id.as_str()) {
            continue;
        }
        out.push(step);
        let mut next: Vec<&'w str> = Vec::new();
        if let Some(Some(configs)) = index.configs.get(step.id.as_str())
            && configs.enable_prerequisite_detection == Some(true)
        {
            next.extend(
                configs
                    .prerequisite_rules
                    .iter()
                    .flatten()
                    .map(|r| r.depends_on_step.as_str()),
            );
        }
        if start != Some(step.id.as_str()) {
            match &step.kind {
                StepKind::Routing(r) => {
                    next.extend(r.routes.iter().map(|r| r.next_step_id.as_str()))
                }
                StepKind::HumanInput(h) => {
                    next.extend(h.if_yes_next_step_id.as_deref());
                    next.extend(h.if_no_next_step_id.as_deref());
                    next.extend(
                        h.option_routes
                            .iter()
                            .flat_map(|m| m.values().map(String::as_str)),
                    );
                }
                _ => {}
            }
            next.extend(index.next(step));
        }
        todo.extend(
            next.into_iter()
                .filter_map(|id| index.steps.get(id).copied()),
        );
    }
    out
}

/// Checks up front that every reachable `human_input` step has its answer.
/// An `--input` naming no `human_input` step's variable is an error too (a typo would
/// otherwise leave the answer unused).
pub fn check_inputs(ws: &Workspace, opts: &RunOptions) -> Result<()> {
    check_input_names(ws, opts)?;
    let missing: Vec<String> = missing_inputs(ws, opts)
        .into_iter()
        .map(|(step, h)| {
            format!(
                "step {:?} needs --input {}=VALUE{}",
                step.id,
                input_key(step, h),
                h.question
                    .as_deref()
                    .map(|q| format!(" ({})", question_head(q)))
                    .unwrap_or_default()
            )
        })
        .collect();
    if !missing.is_empty() {
        bail!("missing human input: {}", listed(&missing, "; "));
    }
    Ok(())
}

/// Refuses an `--input` naming no `human_input` step's variable (a typo would otherwise
/// leave the answer unused).
pub fn check_input_names(ws: &Workspace, opts: &RunOptions) -> Result<()> {
    let asked: Vec<&str> = ws
        .plan
        .steps
        .iter()
        .filter_map(|step| match &step.kind {
            StepKind::HumanInput(h) => Some(input_key(step, h)),
            _ => None,
        })
        .collect();
    let asked_set: HashSet<&str> = asked.iter().copied().collect();
    let unknown: Vec<&str> = opts
        .inputs
        .keys()
        .map(String::as_str)
        .filter(|name| !asked_set.contains(name))
        .collect();
    if !unknown.is_empty() {
        bail!(
            "--input {}: no human_input step of the plan asks for {} (it asks for: {})",
            unknown.join(", --input "),
            if unknown.len() == 1 { "it" } else { "them" },
            if asked.is_empty() {
                "nothing".to_string()
            } else {
                listed(&asked, ", ")
            }
        );
    }
    Ok(())
}

/// The `human_input` steps the run `opts` can reach whose answer `opts.inputs` lacks, in the
/// order they are reached.
pub fn missing_inputs<'w>(ws: &'w Workspace, opts: &RunOptions) -> Vec<(&'w Step, &'w HumanInput)> {
    reachable_in(ws, opts)
        .into_iter()
        .filter_map(|step| match &step.kind {
            StepKind::HumanInput(h) if !opts.inputs.contains_key(input_key(step, h)) => {
                Some((step, h))
            }
            _ => None,
        })
        .collect()
}

/// Whether any reachable step needs a model (see [`llm_choice::needs_model`]).
pub fn needs_llm(ws: &Workspace, step: Option<&str>) -> bool {
    reachable(ws, step)
        .iter()
        .any(|s| llm_choice::needs_model(ws, s))
}

/// Checks up front that every reachable step that needs a model has one that can be
/// reached (see [`check_models`]).
pub fn check_step_models(ws: &Workspace, opts: &RunOptions, llm: &LlmSetup) -> Result<()> {
    check_models(ws, reachable_in(ws, opts), llm)
}

/// The preflight of a run: every check that can be made before anything in the workspace
/// changes (run-folder rotation, database creation). The step, group and inputs asked for,
/// the models of every reachable step with their keys' approvals, and the workspace files
/// the run will open first; last, the external MCP servers the steps name are started and
/// the tools named of them checked. Returns the groups, the units (group, run folder) to run
/// and the started servers.
#[allow(clippy::type_complexity)]
pub(super) async fn preflight<'w>(
    env: &RunEnv<'_>,
    root: &Path,
    ws: &'w Workspace,
    opts: &RunOptions,
) -> Result<(Vec<&'w Group>, Vec<Unit<'w>>, Box<dyn ToolServers>)> {
    if let Some(step) = &opts.step {
        ws.plan.find_step(step).with_context(|| {
            let ids: Vec<&str> = ws.plan.steps.iter().map(|s| s.id.as_str()).collect();
            format!(
                "no step {step:?} in the plan; its steps are: {}",
                ids.join(", ")
            )
        })?;
    }
    if let Some(step) = &opts.from {
        ensure!(
            opts.step.is_none(),
            "--from and --step cannot be given together"
        );
        ws.plan
            .step(step)
            .with_context(|| format!("--from: no step {step:?} in the plan"))?;
    }
    for (step, route) in &opts.route_selections {
        let Some(StepKind::Routing(r)) = ws.plan.step(step).map(|s| &s.kind) else {
            bail!("--route {step}={route}: {step:?} is not a routing step of the plan");
        };
        if !r.routes.iter().any(|x| &x.route_id == route) {
            bail!(
                "--route {step}={route}: routing step {step:?} has no route {route:?} (routes: {})",
                r.routes
                    .iter()
                    .map(|x| x.route_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let groups = select_groups(ws, opts.group.as_deref())?;
    if (opts.step.is_some() || opts.from.is_some()) && opts.group.is_none() && !groups.is_empty() {
        bail!(
            "workflow.json declares groups: --step runs in one group's run folder, give --group \
             (groups: {})",
            groups
                .iter()
                .map(|g| g.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut units: Vec<Unit<'w>> = Vec::new();
    // A full run makes fresh group folders; any other keeps the active run, where a group's
    // folder may still have the name an earlier Trellis gave it.
    let full = opts.step.is_none() && opts.from.is_none() && opts.group.is_none();
    for g in &groups {
        let folder = if full {
            group_run_folder(g)?
        } else {
            existing_group_run_folder(&ws.fs, g)?
        };
        if let Some((other, _)) = units.iter().find(|(_, f)| *f == folder) {
            bail!(
                "workflow.json: groups {:?} and {:?} both use the run folder runs/{folder}",
                other.map(|o| o.id.as_str()).unwrap_or_default(),
                g.id
            );
        }
        units.push((Some(*g), folder));
    }
    if units.is_empty() {
        units.push((None, ACTIVE_RUN.to_string()));
    }
    let full = opts.step.is_none() && opts.from.is_none() && opts.group.is_none();
    // External MCP servers: the operator's, named (never defined) by the workspace; a key
    // must not be a plugin id, or selected_servers could not tell them apart.
    env.mcp_config
        .check_collisions(env.registry.plugins().map(|p| p.manifest().id.as_str()))?;
    for warning in crate::mcp_servers::workspace_server_files(ws) {
        env.observer.emit(RunEvent::Warning { message: warning });
    }
    let configured: BTreeMap<String, Option<Vec<String>>> = env
        .mcp_config
        .servers()
        .map(|(key, _)| (key.to_string(), None))
        .collect();
    // Tool names: one no loaded plugin has is an error; an unloaded server a warning. The
    // tools of external servers are checked once they run, below.
    let tools = crate::tool_check::check_step_tools_with(ws, env.registry, &configured);
    for warning in tools.warnings() {
        env.observer.emit(RunEvent::Warning {
            message: warning.to_string(),
        });
    }
    if tools.has_errors() {
        let errors: Vec<String> = tools.errors().map(|d| d.to_string()).collect();
        bail!("{}", errors.join("\n"));
    }
    if env.human.is_some() {
        check_input_names(ws, opts)?;
    } else {
        check_inputs(ws, opts)?;
    }
    let mut mcp_keys = crate::mcp_servers::named_servers(ws, &env.mcp_config);
    for (_, folder) in &units {
        // A full run starts from fresh run folders: the default step config applies.
        let unit_ws = if full {
            ws.clone()
        } else {
            open_workspace(root, Some(folder))?
        };
        check_step_models(&unit_ws, opts, &env.llm)?;
        mcp_keys.extend(crate::mcp_servers::named_servers(&unit_ws, &env.mcp_config));
    }
    // Foreach queries that cannot run on the database (or the one the seed makes) when no
    // earlier step could change it.
    let queries = trellis_workflow::foreach_sql::check_foreach_queries(ws);
    if queries.has_errors() {
        let errors: Vec<String> = queries.errors().map(|d| d.to_string()).collect();
        bail!("{}", errors.join("\n"));
    }
    // The database, or the seed it is made from, must be a regular file reached without a
    // link: refused here rather than half-way through setting the run up.
    for path in [DB_FILE, SEED_SQL] {
        match ws.fs.kind(path)? {
            None | Some(Kind::File) => {}
            Some(Kind::Link) => bail!("{}", link_error(Path::new(path))),
            Some(_) => bail!("{path} is not a regular file"),
        }
    }
    // Last: the external servers the steps name are started (they run outside the sandbox,
    // and change nothing in the workspace by being started) and their tools checked.
    let mut servers = env.tool_servers.start(&env.mcp_config, &mcp_keys).await?;
    let tools = crate::tool_check::check_external_tools(ws, &servers.tool_names());
    if tools.has_errors() {
        servers.stop().await;
        let errors: Vec<String> = tools.errors().map(|d| d.to_string()).collect();
        bail!("{}", errors.join("\n"));
    }
    Ok((groups, units, servers))
}

/// A question as an error names it: its first 200 characters, then how many more.
fn question_head(question: &str) -> String {
    const SHOWN: usize = 200;
    match question.char_indices().nth(SHOWN) {
        None => question.to_string(),
        Some((at, _)) => format!(
            "{}... and {} more characters",
            &question[..at],
            question[at..].chars().count()
        ),
    }
}
