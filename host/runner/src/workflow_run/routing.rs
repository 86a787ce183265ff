//! Routing and human input between steps: which route a routing step takes, the key of a
//! human_input answer, and prerequisite detection (`PREREQUISITE MISSING:` lines matched
//! against the step's `prerequisite_rules`).

use super::*;

/// The key a human_input step's answer is given under: its `variable_name`, else its id.
pub fn input_key<'s>(step: &'s Step, h: &'s HumanInput) -> &'s str {
    h.variable_name.as_deref().unwrap_or(&step.id)
}

pub(super) fn read_selection(fs: &WorkspaceFs, path: &Path) -> Result<String> {
    let text = fs
        .read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    value
        .get("select_route")
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("{}: no string \"select_route\"", path.display()))
}

/// Something other than a folder is at `path` (or cannot be looked at): reading it says what.
pub(super) fn present(fs: &WorkspaceFs, path: &Path) -> bool {
    !matches!(fs.kind(path), Ok(None | Some(Kind::Dir)))
}

/// Picks the route of a routing step (spec section 2): `route_selection.json` in its own
/// output folder, else `route_source_file` (relative to the previous step's output folder,
/// else to `execution/`), else `default_route_id`. Returns `(route_id, next_step_id, how)`.
pub fn select_route(
    ws: &Workspace,
    step: &Step,
    routing: &Routing,
    previous: Option<&str>,
) -> Result<(String, String, String)> {
    let own = ws.step_output_dir(&step.id).join(ROUTE_SELECTION_FILE);
    let (route_id, how) = if present(&ws.fs, &own) {
        (
            read_selection(&ws.fs, &own)?,
            ROUTE_SELECTION_FILE.to_string(),
        )
    } else if let Some(source) = routing.route_source_file.as_deref().and_then(|file| {
        let exec = ws.run_dir().join("execution");
        previous
            .map(|p| exec.join(p).join(file))
            .into_iter()
            .chain([exec.join(file)])
            .find(|p| present(&ws.fs, p))
    }) {
        (
            read_selection(&ws.fs, &source)?,
            source.display().to_string(),
        )
    } else if let Some(default) = &routing.default_route_id {
        (default.clone(), "default_route_id".to_string())
    } else {
        bail!(
            "routing step {:?}: no {ROUTE_SELECTION_FILE}, no route_source_file found and no default_route_id",
            step.id
        );
    };
    let route = routing
        .routes
        .iter()
        .find(|r| r.route_id == route_id)
        .with_context(|| {
            format!(
                "routing step {:?}: route {route_id:?} (from {how}) matches none of {:?}",
                step.id,
                routing
                    .routes
                    .iter()
                    .map(|r| r.route_id.as_str())
                    .collect::<Vec<_>>()
            )
        })?;
    Ok((route_id, route.next_step_id.clone(), how))
}

/// The text after `PREREQUISITE MISSING:` on the first such line of a reply.
pub fn prerequisite_missing(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        line.trim()
            .strip_prefix(PREREQUISITE_MISSING)
            .map(|rest| rest.trim().to_string())
    })
}

pub(super) fn normalized(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches(['.', '!'])
        .to_lowercase()
}

/// The rule a `PREREQUISITE MISSING:` text names: the text is the rule's `depends_on_step`
/// (alone, or followed by `:`, ` -` or a space and a reason), or its `description`
/// (compared without case and repeated spaces).
pub fn matching_rule<'r>(
    rules: &'r [PrerequisiteRule],
    missing: &str,
) -> Option<&'r PrerequisiteRule> {
    let text = missing.trim();
    rules.iter().find(|r| {
        let id = r.depends_on_step.as_str();
        let by_id = text == id
            || text
                .strip_prefix(id)
                .is_some_and(|rest| rest.starts_with([':', ' ', ',', '.', ';']));
        let by_description = r
            .description
            .as_deref()
            .is_some_and(|d| !d.trim().is_empty() && normalized(d) == normalized(text));
        by_id || by_description
    })
}

/// Prerequisite detection after an agent step: `Some(step)` to go back to, or `None` to go
/// on. A reported prerequisite that matches no rule, or one reported once more after
/// [`MAX_PREREQUISITE_RETURNS`] returns, fails the step (its final summary says why).
pub(super) fn check_prerequisite(
    ws: &Workspace,
    report: &mut StepReport,
    returns: &mut BTreeMap<String, u32>,
) -> Result<Option<String>> {
    let configs = ws.agent_configs(&report.step_id);
    if configs.enable_prerequisite_detection != Some(true) || report.status == Status::Stopped {
        return Ok(None);
    }
    let Some(missing) = report
        .outcome
        .as_ref()
        .and_then(|o| o.final_text.as_deref())
        .and_then(prerequisite_missing)
    else {
        return Ok(None);
    };
    let rules = configs.prerequisite_rules.as_deref().unwrap_or_default();
    let failure = match matching_rule(rules, &missing) {
        Some(rule) => {
            let count = returns.entry(report.step_id.clone()).or_insert(0);
            if *count < MAX_PREREQUISITE_RETURNS {
                *count += 1;
                report.detail = format!(
                    "prerequisite missing: {missing} -> back to {} (return {count} of {MAX_PREREQUISITE_RETURNS})",
                    rule.depends_on_step
                );
                return Ok(Some(rule.depends_on_step.clone()));
            }
            format!(
                "prerequisite still missing after going back to {} {MAX_PREREQUISITE_RETURNS} times: {missing}",
                rule.depends_on_step
            )
        }
        None => format!(
            "the agent reported {PREREQUISITE_MISSING} {missing}, which matches none of the step's \
             prerequisite_rules (depends_on_step: {})",
            if rules.is_empty() {
                "none".to_string()
            } else {
                rules
                    .iter()
                    .map(|r| r.depends_on_step.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    };
    report.status = Status::Failed;
    report.detail = failure.clone();
    let concerns = report
        .outcome
        .as_ref()
        .map(|o| o.concerns.clone())
        .unwrap_or_default();
    if let Some(outcome) = report.outcome.as_mut() {
        outcome.status = Status::Failed;
        outcome.error = Some(failure.clone());
    }
    FinalSummary {
        schema_version: FINAL_SUMMARY_SCHEMA_VERSION,
        step_id: report.step_id.clone(),
        run_folder: ws
            .run_folder
            .clone()
            .unwrap_or_else(|| ACTIVE_RUN.to_string()),
        status: Status::Failed,
        execution_result: Some(failure),
        concerns,
        completed_at: now_rfc3339(),
    }
    .write(&ws.fs, &report.output_dir)
    .with_context(|| format!("step {:?}: writing the final summary", report.step_id))?;
    Ok(None)
}
