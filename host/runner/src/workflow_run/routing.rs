//! Routing and human input between steps: which route a routing step takes, the key of a
//! human_input answer, and prerequisite detection (`PREREQUISITE MISSING:` lines matched
//! against the step's `prerequisite_rules`).

use super::*;
use trellis_workflow::plan::{ResponseType, Route};

/// The key a human_input step's answer is given under: its `variable_name`, else its id.
pub fn input_key<'s>(step: &'s Step, h: &'s HumanInput) -> &'s str {
    h.variable_name.as_deref().unwrap_or(&step.id)
}

/// The keys a selection file may name its route with, in the order they are read.
pub const SELECTION_KEYS: &[&str] = &["select_route", "route_id", "selected_route_id"];

/// The selected value of a selection file: the first of [`SELECTION_KEYS`] holding a string.
pub(super) fn read_selection(fs: &WorkspaceFs, path: &Path) -> Result<String> {
    let value = fs
        .read_json_value(path)
        .with_context(|| format!("reading {}", path.display()))?;
    SELECTION_KEYS
        .iter()
        .find_map(|k| value.get(*k).and_then(Value::as_str))
        .map(str::to_string)
        .with_context(|| {
            format!(
                "{}: no string \"select_route\" (or \"route_id\", \"selected_route_id\")",
                path.display()
            )
        })
}

/// Something other than a folder is at `path` (or cannot be looked at): reading it says what.
pub(super) fn present(fs: &WorkspaceFs, path: &Path) -> bool {
    !matches!(fs.kind(path), Ok(None | Some(Kind::Dir)))
}

/// Picks the route of a routing step (spec section 2): `route_selection.json` in its own
/// output folder; else the declared `route_source_file` (relative to the previous step's
/// output folder, else to `execution/`), which must exist; else, with none declared, a
/// `route_selection.json` listed in `context_dependencies`; else `default_route_id`. The
/// value names a route by id, or is the `next_step_id` of exactly one route. Returns
/// `(route_id, next_step_id, how)`.
pub fn select_route(
    ws: &Workspace,
    step: &Step,
    routing: &Routing,
    previous: Option<&str>,
) -> Result<(String, String, String)> {
    let own = ws.step_output_dir(&step.id).join(ROUTE_SELECTION_FILE);
    let exec = ws.run_dir().join("execution");
    let from_dependencies = || {
        step.context_dependencies
            .iter()
            .flatten()
            .filter(|d| {
                Path::new(d).file_name().and_then(|n| n.to_str()) == Some(ROUTE_SELECTION_FILE)
            })
            .flat_map(|d| [ws.root.join(d), exec.join(d)])
            .find(|p| present(&ws.fs, p))
    };
    let (value, how) = if present(&ws.fs, &own) {
        (
            read_selection(&ws.fs, &own)?,
            ROUTE_SELECTION_FILE.to_string(),
        )
    } else if let Some(file) = routing.route_source_file.as_deref() {
        let candidates: Vec<PathBuf> = previous
            .map(|p| exec.join(p).join(file))
            .into_iter()
            .chain([exec.join(file)])
            .collect();
        let Some(source) = candidates.iter().find(|p| present(&ws.fs, p)) else {
            bail!(
                "routing step {:?}: its route_source_file {file:?} does not exist (looked for {}); \
                 the step that should write it did not",
                step.id,
                candidates
                    .iter()
                    .map(|p| ws
                        .fs
                        .relative(p)
                        .unwrap_or_else(|_| p.clone())
                        .display()
                        .to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
            );
        };
        (
            read_selection(&ws.fs, source)?,
            ws.fs
                .relative(source)
                .unwrap_or_else(|_| source.clone())
                .display()
                .to_string(),
        )
    } else if let Some(source) = from_dependencies() {
        (
            read_selection(&ws.fs, &source)?,
            ws.fs
                .relative(&source)
                .unwrap_or_else(|_| source.clone())
                .display()
                .to_string(),
        )
    } else if let Some(default) = &routing.default_route_id {
        (default.clone(), "default_route_id".to_string())
    } else {
        bail!(
            "routing step {:?}: no {ROUTE_SELECTION_FILE} (in its folder or its context_dependencies), \
             no route_source_file and no default_route_id",
            step.id
        );
    };
    let by_next: Vec<&Route> = routing
        .routes
        .iter()
        .filter(|r| r.next_step_id == value)
        .collect();
    let route = match routing.routes.iter().find(|r| r.route_id == value) {
        Some(r) => r,
        None if by_next.len() == 1 => by_next[0],
        None => bail!(
            "routing step {:?}: route {value:?} (from {how}) matches none of {:?}{}",
            step.id,
            routing
                .routes
                .iter()
                .map(|r| r.route_id.as_str())
                .collect::<Vec<_>>(),
            if by_next.len() > 1 {
                " (it is the next_step_id of several routes: name the route_id)"
            } else {
                ""
            }
        ),
    };
    Ok((route.route_id.clone(), route.next_step_id.clone(), how))
}

/// What a human_input answer means: the response as recorded (a multiple-choice answer
/// given by index becomes the option) and the step it routes to, if it routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HumanAnswer {
    /// The answer, normalized for multiple choice.
    pub response: String,
    /// `if_yes_next_step_id` / `if_no_next_step_id` / the option's route; `None` goes on.
    pub next: Option<String>,
}

/// Answers a yes/no question with yes (any other answer is no), as the original does.
pub const YES_ANSWERS: &[&str] = &["yes", "y", "true", "approve", "approved"];

/// Reads `answer` the way the original does: yes/no questions are yes for
/// [`YES_ANSWERS`] (any case) and no otherwise; multiple-choice answers match an option
/// without regard to case, or by its 0-based index; `option_routes` are looked up by the
/// option or its index. A question without a `response_type` is yes/no when it has yes/no
/// routes.
pub fn answer_human_input(h: &HumanInput, answer: &str) -> HumanAnswer {
    let trimmed = answer.trim();
    let yes_no = h.response_type == Some(ResponseType::Yesno)
        || (h.response_type.is_none()
            && (h.if_yes_next_step_id.is_some() || h.if_no_next_step_id.is_some()));
    if yes_no {
        let yes = YES_ANSWERS.iter().any(|y| trimmed.eq_ignore_ascii_case(y));
        let next = if yes {
            h.if_yes_next_step_id.clone()
        } else {
            h.if_no_next_step_id.clone()
        };
        return HumanAnswer {
            response: answer.to_string(),
            next,
        };
    }
    let options = h.options.as_deref().unwrap_or_default();
    let index = options
        .iter()
        .position(|o| o.trim().eq_ignore_ascii_case(trimmed))
        .or_else(|| trimmed.parse::<usize>().ok().filter(|i| *i < options.len()));
    let response = index
        .map(|i| options[i].clone())
        .unwrap_or_else(|| answer.to_string());
    let next = h.option_routes.as_ref().and_then(|routes| {
        let by_key = |key: &str| {
            routes
                .iter()
                .find(|(k, _)| k.trim().eq_ignore_ascii_case(key.trim()))
                .map(|(_, v)| v.clone())
        };
        by_key(&response)
            .or_else(|| index.and_then(|i| by_key(&i.to_string())))
            .or_else(|| by_key(answer))
    });
    HumanAnswer { response, next }
}

/// The file a human_input step writes its answer to, in its output folder: its
/// `context_output` (the first name), else `step-N.json` with N its 1-based position in
/// `steps` (an orphan: its position after them).
pub fn human_input_file(ws: &Workspace, step: &Step) -> String {
    if let Some(name) = step.outputs().into_iter().find(|n| !n.trim().is_empty()) {
        return name;
    }
    let n = ws
        .plan
        .all_steps()
        .position(|s| s.id == step.id)
        .unwrap_or(0)
        + 1;
    format!("step-{n}.json")
}
