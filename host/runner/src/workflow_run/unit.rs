//! One run unit's steps: the output folders a single-step, resume or group run empties
//! first, then each step in turn (agent steps through their runner, routing and human_input
//! steps decided here), loops' jumps capped and archived, prerequisite returns followed.

use super::*;

/// Runs the steps of one unit in `runs/<folder>`.
pub(super) async fn run_unit(
    env: &RunEnv<'_>,
    root: &Path,
    group: Option<&Group>,
    folder: &str,
    opts: &RunOptions,
) -> Result<UnitRun> {
    let mut ws = open_workspace(root, Some(folder))?;
    // The plan as written: an answer given while the run waits for it (a server's page)
    // becomes a variable of the steps after it, substituted afresh from this.
    let written = ws.plan.clone();
    let mut answers = opts.inputs.clone();
    let variables = unit_variables_with_answers(&ws, group, &answers);
    // What substitution added to the plan: counted again each time a loop's jump runs
    // steps again (their texts are written again).
    let mut grown = substitute_variables(env, &mut ws, &variables)?;
    let mut block = variables_block(&variables, group);
    let mut given = None;
    let mut unit = UnitRun {
        group: group.map(|g| g.id.clone()),
        run_folder: folder.to_string(),
        run_dir: ws.run_dir(),
        steps: Vec::new(),
    };
    apply_step_config_schemas(&mut ws);
    let mut current = match (&opts.step, &opts.from) {
        (Some(s), _) | (None, Some(s)) => Some(s.clone()),
        (None, None) => ws.plan.steps.first().map(|s| s.id.clone()),
    };
    // A single-step run empties that step's output folder, a resume (and a group's run in
    // the folder it keeps) that step's and every later one's: a gate must never pass on a
    // file an earlier run left. Pre-selected routes go in after.
    if let Some(first) = &current {
        let emptied: Vec<String> = if opts.step.is_some() {
            vec![first.clone()]
        } else if opts.from.is_some() || opts.group.is_some() {
            steps_from(&ws, first)
        } else {
            Vec::new()
        };
        for id in emptied {
            let dir = ws.step_output_dir(&id);
            // A link there is refused, as everywhere a run writes (never removed or followed).
            if ws.fs.kind(&dir)? == Some(Kind::Link) {
                bail!("{}", link_error(&ws.fs.relative(&dir)?));
            }
            ws.fs
                .remove_all(&dir)
                .with_context(|| format!("emptying {} before the step runs", dir.display()))?;
        }
    }
    for (step_id, route) in &opts.route_selections {
        write_json(
            &ws.fs,
            &ws.step_output_dir(step_id).join(ROUTE_SELECTION_FILE),
            &json!({"select_route": route}),
        )?;
    }
    let mut previous: Option<String> = None;
    let mut returns: BTreeMap<String, u32> = opts.prerequisite_returns.clone();
    let mut visited: BTreeSet<String> = BTreeSet::new();
    let mut jumps: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut chosen: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut archives = 0u32;
    while let Some(id) = current.take() {
        if id == "end" {
            break;
        }
        if unit.steps.len() >= MAX_STEPS {
            bail!("more than {MAX_STEPS} steps run: is there a loop in next_step_id?");
        }
        env.take_step_run()?;
        // Going back to a step already run is a loop's jump: bounded per (source, target)
        // pair, and the target's and every later step's outputs are archived first.
        if let Some(from) = &previous
            && visited.contains(&id)
        {
            let from_human = matches!(
                ws.plan.step(from).map(|s| &s.kind),
                Some(StepKind::HumanInput(_))
            );
            let cap = if from_human {
                MAX_HUMAN_JUMPS
            } else {
                MAX_JUMPS
            };
            let count = jumps.entry((from.clone(), id.clone())).or_insert(0);
            *count += 1;
            if *count > cap {
                bail!(
                    "infinite loop: step {from:?} jumped back to step {id:?} more than {cap} times \
                     (the cap for a jump from {} step)",
                    if from_human {
                        "a human_input"
                    } else {
                        "an agent or routing"
                    }
                );
            }
            // The next free number: a resume keeps the archives of the runs before it. A
            // path that cannot be looked at (a link planted at `archived`) ends the run: every
            // number would be taken.
            archives += 1;
            while ws
                .fs
                .kind(archive_dir(&ws, archives))
                .with_context(|| format!("archiving the outputs of the jump to step {id:?}"))?
                .is_some()
            {
                archives += 1;
            }
            env.take_substituted(grown)?;
            let moved = archive_from(&ws, &id, archives)?;
            // The archived steps start afresh: running them again in order is no jump.
            let fresh = steps_from(&ws, &id);
            visited.retain(|v| !fresh.contains(v));
            env.observer.emit(RunEvent::Jump {
                from: from.clone(),
                to: id.clone(),
                count: *count,
                cap,
                moved,
                archive: format!("{ARCHIVED_DIR}/run-{archives}"),
            });
        }
        visited.insert(id.clone());
        // The step asked for alone may be a route's sub-agent step.
        resolve_bare_dependencies(&mut ws, &id);
        take_variables_block(&mut ws, given.take());
        given = give_variables_block(&mut ws, &id, block.as_deref());
        let step = ws
            .plan
            .step(&id)
            .or_else(|| {
                (opts.step.as_deref() == Some(id.as_str()))
                    .then(|| ws.plan.find_step(&id))
                    .flatten()
            })
            .with_context(|| format!("next step {id:?} is not in the plan"))?;
        env.observer.emit(RunEvent::StepStarted {
            step_id: id.clone(),
            step_type: step.type_name().to_string(),
        });
        let output_dir = ws.step_output_dir(&id);
        let mut went_back = false;
        let (mut report, mut next) = match &step.kind {
            StepKind::MessageSequence(_) | StepKind::Regular | StepKind::TodoTask(_)
                if let Some(dispatch) = env
                    .dispatch
                    .as_ref()
                    .filter(|_| crate::dispatch::runs_here(&ws, &id).is_none()) =>
            {
                // What the step does there, kept for `runs show` while it runs.
                let run_dir = ws.run_dir();
                let observer =
                    RemoteProgress::recorder(&ws.fs, &run_dir, &id, env.observer.clone());
                // Messages to the execution do not reach an agent on another machine.
                if let Some(steering) = &env.steering {
                    steering.set_phase(crate::steering::Phase::OnWorker);
                }
                let remote = dispatch
                    .run_step(crate::dispatch::RemoteStep {
                        workspace: root.to_path_buf(),
                        run_folder: folder.to_string(),
                        step_id: id.clone(),
                        group: group.map(|g| g.id.clone()),
                        inputs: answers.clone(),
                        cancel: env.cancel.clone(),
                        observer,
                        prerequisite_returns: returns.get(&id).copied().unwrap_or(0),
                        context: opts.step_context.get(&id).cloned(),
                    })
                    .await;
                if let Some(steering) = &env.steering {
                    steering.set_phase(crate::steering::Phase::Preparing);
                }
                // Its own logs replace the progress once it ends; a step that did not end
                // leaves none behind.
                let progress = logs_dir(&run_dir, &id).join(REMOTE_PROGRESS_FILE);
                if remote.is_err() && ws.fs.kind(&progress)? == Some(Kind::File) {
                    ws.fs.remove_file(&progress)?;
                }
                let remote = remote?;
                let worker = remote.worker.clone().unwrap_or_default();
                let outcome = remote.into_outcome(output_dir.clone());
                let detail = match &outcome.error {
                    Some(e) => format!("{e} (on worker {worker})"),
                    None => format!("{} turn(s) on worker {worker}", outcome.turns),
                };
                (agent_report(step, detail, outcome), default_next(&ws, step))
            }
            StepKind::MessageSequence(_) | StepKind::Regular | StepKind::TodoTask(_) => {
                let returned = returns.get(&id).copied().unwrap_or(0);
                let mut runner = env
                    .step_runner(&ws, &id)?
                    .with_prerequisite_returns(returned)
                    .with_context(opts.step_context.get(&id).cloned());
                if has_scripted(&ws, step) {
                    let options = ScriptOptions {
                        group: group.map(|g| g.id.clone()),
                        variables: answers.clone(),
                        approvals: env.llm.approvals(),
                        ..ScriptOptions::default()
                    };
                    runner = runner.with_scripts(env.scripts()?, options);
                }
                let outcome = runner.run_step(&ws, &id).await?;
                let detail = match (&outcome.error, &outcome.final_text) {
                    (Some(e), _) => e.clone(),
                    // A scripted step that needed no agent: what its script did.
                    (None, Some(text)) if outcome.turns == 0 => {
                        text.lines().next().unwrap_or_default().to_string()
                    }
                    (None, _) => format!("{} turn(s)", outcome.turns),
                };
                (agent_report(step, detail, outcome), default_next(&ws, step))
            }
            StepKind::Routing(routing) => {
                let (route, next, how) = select_route(&ws, step, routing, previous.as_deref())?;
                let times = chosen.entry((id.clone(), route.clone())).or_insert(0);
                *times += 1;
                let (status, detail, next) = if *times > MAX_SAME_ROUTE {
                    (
                        Status::Failed,
                        format!(
                            "infinite loop: routing step {id:?} selected route {route:?} (-> {next}) \
                             a {} time; a route may be taken at most {MAX_SAME_ROUTE} times in a run",
                            ordinal(*times)
                        ),
                        None,
                    )
                } else {
                    (
                        Status::Completed,
                        format!("route {route} (from {how}) -> {next}"),
                        Some(next),
                    )
                };
                let report = StepReport {
                    step_id: id.clone(),
                    step_type: step.type_name(),
                    status,
                    detail,
                    output_dir,
                    outcome: None,
                };
                (report, next)
            }
            StepKind::HumanInput(h) => {
                let key = input_key(step, h).to_string();
                let (answer, asked) = match (answers.get(&key), &env.human) {
                    (Some(given), _) => (Some(given.clone()), false),
                    (None, Some(human)) => (ask_human(env, human, step, h).await, true),
                    (None, None) => bail!("step {id:?}: no --input {key}=VALUE"),
                };
                let ended = match answer {
                    Some(answer) if asked => {
                        let ended = answered(&ws, step, h, &answer, output_dir)?;
                        answers.insert(key, answer);
                        let variables = unit_variables_with_answers(&ws, group, &answers);
                        ws.plan = written.clone();
                        grown = substitute_variables(env, &mut ws, &variables)?;
                        block = variables_block(&variables, group);
                        ended
                    }
                    Some(answer) => answered(&ws, step, h, &answer, output_dir)?,
                    None => {
                        let report = StepReport {
                            step_id: id.clone(),
                            step_type: step.type_name(),
                            status: Status::Stopped,
                            detail: "stopped while waiting for an answer".to_string(),
                            output_dir,
                            outcome: None,
                        };
                        (report, None)
                    }
                };
                record_end(&ws, folder, &ended.0)?;
                ended
            }
        };
        if let Some(back) = report.outcome.as_ref().and_then(|o| o.go_back.clone()) {
            returns.insert(id.clone(), back.count);
            report.detail = format!(
                "prerequisite missing: {} -> back to {} (return {} of {MAX_PREREQUISITE_RETURNS})",
                back.missing, back.step, back.count
            );
            went_back = true;
            next = Some(back.step);
        }
        env.observer.emit(RunEvent::StepEnded {
            step_id: id.clone(),
            status: report.status,
            detail: report.detail.clone(),
        });
        let done = report.status != Status::Completed && !went_back;
        unit.steps.push(report);
        if done || env.cancelled() {
            break;
        }
        if opts.step.as_deref() == Some(id.as_str()) && (!went_back || opts.step_alone) {
            break;
        }
        previous = Some(id);
        current = next;
    }
    Ok(unit)
}

/// The report of agent step `step`, run here or elsewhere, that ended with `outcome`.
fn agent_report(step: &Step, detail: String, outcome: StepOutcome) -> StepReport {
    StepReport {
        step_id: step.id.clone(),
        step_type: step.type_name(),
        status: outcome.status,
        // Kept with the run's report as long as the run (a server keeps 200 ended ones).
        detail: trellis_sandbox::cut::marked(&detail, super::report::DETAIL_BYTES),
        output_dir: outcome.output_dir.clone(),
        outcome: Some(outcome),
    }
}

/// Records `answer` to `human_input` step `step` in its answer file: the step's report and
/// the step it routes to.
fn answered(
    ws: &Workspace,
    step: &Step,
    h: &trellis_workflow::plan::HumanInput,
    answer: &str,
    output_dir: PathBuf,
) -> Result<(StepReport, Option<String>)> {
    let id = &step.id;
    let key = input_key(step, h);
    let decided = answer_human_input(h, answer);
    let next = decided.next.clone().or_else(|| default_next(ws, step));
    let file = human_input_file(ws, step);
    // Joined to the output folder, an absolute path or `.` would replace it (a `..` is
    // refused by the workspace handle; an answer `.` made the folder a file).
    if !trellis_workflow::plan::names_a_file_in_folder(&file) {
        bail!(
            "step {id:?}: the answer file (context_output) {file:?} does not name a file in \
             the step's output folder; expected a name such as \"answer.json\""
        );
    }
    write_json(
        &ws.fs,
        &output_dir.join(&file),
        &json!({
            "question": h.question,
            "response": decided.response,
            "response_type": h.response_type.map(|t| t.name()).unwrap_or("text"),
            "next_step_id": next,
        }),
    )?;
    let report = StepReport {
        step_id: id.clone(),
        step_type: step.type_name(),
        status: Status::Completed,
        detail: format!(
            "{key} = {:?}{}",
            trellis_sandbox::cut::marked(answer, 200),
            next.as_deref()
                .map(|n| format!(" -> {n}"))
                .unwrap_or_default()
        ),
        output_dir,
        outcome: None,
    };
    Ok((report, next))
}

/// Records how a step the run decides itself ended (a `human_input` step), as an agent
/// step's end is recorded: its final summary beside its logs, which the runs listing and the
/// page read.
fn record_end(ws: &Workspace, folder: &str, report: &StepReport) -> Result<()> {
    let summary = crate::session::FinalSummary {
        schema_version: crate::session::FINAL_SUMMARY_SCHEMA_VERSION,
        step_id: report.step_id.clone(),
        run_folder: folder.to_string(),
        status: report.status,
        execution_result: Some(report.detail.clone()),
        concerns: Vec::new(),
        completed_at: trellis_sandbox::store::now_rfc3339(),
    };
    let dir =
        crate::session::turn_logs_dir(&crate::session::logs_dir(&ws.run_dir(), &report.step_id));
    summary
        .write(&ws.fs, &dir)
        .with_context(|| format!("recording the end of step {:?}", report.step_id))
}

/// Asks for the answer of `human_input` step `step` and waits for it; `None` when the run
/// is stopped first.
async fn ask_human(
    env: &RunEnv<'_>,
    human: &crate::human_inputs::HumanInputs,
    step: &Step,
    h: &trellis_workflow::plan::HumanInput,
) -> Option<String> {
    let question = crate::human_inputs::Question {
        step_id: step.id.clone(),
        variable: input_key(step, h).to_string(),
        question: h
            .question
            .as_deref()
            .map(|q| trellis_sandbox::cut::marked(q, trellis_sandbox::cut::EVENT_JSON_BYTES)),
        response_type: h
            .response_type
            .map(|t| t.name())
            .unwrap_or("text")
            .to_string(),
        options: h.options.clone().unwrap_or_default(),
    };
    env.observer.emit(RunEvent::InputRequested {
        question: question.clone(),
    });
    human
        .ask(question, &env.cancel_calls, || env.cancelled())
        .await
}

fn has_scripted(ws: &Workspace, step: &Step) -> bool {
    fn within(ws: &Workspace, step: &Step, depth: usize) -> bool {
        (matches!(step.kind, StepKind::Regular) && ws.agent_configs(&step.id).is_scripted())
            || (depth < 8
                && step
                    .predefined_routes()
                    .iter()
                    .any(|r| within(ws, &r.sub_agent_step, depth + 1)))
    }
    ws.agent_configs(&step.id).is_scripted() || within(ws, step, 0)
}
