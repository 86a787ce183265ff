//! Workflow variables in a plan's texts: `{{NAME}}`, `${NAME}` and `{NAME}` replaced by the
//! variable's value, and the bound on what a substitution may make. A value is as long as
//! `workflow.json` allows and a text may name it thousands of times, so each substituted text
//! is measured as it grows and refused past its limit, before it is held whole.

use std::collections::BTreeMap;

use crate::diagnostics::{Diagnostic, Diagnostics, JsonPath, Severity};
use crate::manifest::{MAX_VARIABLE_NAME, WorkflowManifest};
use crate::plan::{ContextOutput, PLAN_FILE, Plan, Step, StepKind};

/// The most one substituted path (`context_dependencies`, `context_output`) may hold, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;

/// How many spaces around a variable's name between braces [`substitute`] looks through.
const NAME_SPACES: usize = 64;

/// `text` with each workflow variable's `{{NAME}}`, `${NAME}` and `{NAME}` (spaces inside
/// the braces allowed) replaced by its value, in one pass (a value is never substituted
/// again); an unknown name stays as written. For texts whose callers bound them already;
/// see [`substitute_within`].
pub fn substitute(text: &str, variables: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    walk(text, variables, |piece| {
        out.push_str(piece);
        true
    });
    out
}

/// [`substitute`], or `None` when the result would be longer than `limit` bytes (found
/// before more than `limit` bytes are held).
pub fn substitute_within(
    text: &str,
    variables: &BTreeMap<String, String>,
    limit: usize,
) -> Option<String> {
    let mut out = String::new();
    walk(text, variables, |piece| {
        if out.len() + piece.len() > limit {
            return false;
        }
        out.push_str(piece);
        true
    })
    .then_some(out)
}

/// The length [`substitute`] would give `text`, or `None` past `limit`; nothing is held.
pub fn substituted_len(
    text: &str,
    variables: &BTreeMap<String, String>,
    limit: usize,
) -> Option<usize> {
    let mut len = 0usize;
    walk(text, variables, |piece| {
        len += piece.len();
        len <= limit
    })
    .then_some(len)
}

/// Gives `emit` the pieces of `text` substituted, in order, until it answers false; true
/// when every piece was taken.
fn walk(
    text: &str,
    variables: &BTreeMap<String, String>,
    mut emit: impl FnMut(&str) -> bool,
) -> bool {
    // A name between braces is one of the variables' names with spaces around it: the
    // closing brace is looked for that far only, so a text of many unclosed braces costs
    // its length, not its length squared.
    // A name longer than a variable name may be is never looked for: the cost of a text
    // of many unclosed braces stays its length times a bound.
    let window = variables
        .keys()
        .map(String::len)
        .filter(|&n| n <= MAX_VARIABLE_NAME)
        .max()
        .unwrap_or(0)
        + NAME_SPACES;
    let mut rest = text;
    while !rest.is_empty() {
        let Some(at) = rest
            .find('{')
            .map(|i| if rest[..i].ends_with('$') { i - 1 } else { i })
        else {
            return emit(rest);
        };
        if at > 0 {
            if !emit(&rest[..at]) {
                return false;
            }
            rest = &rest[at..];
        }
        let (open, close) = if rest.starts_with("{{") {
            ("{{", "}}")
        } else if rest.starts_with("${") {
            ("${", "}")
        } else {
            ("{", "}")
        };
        let after = &rest[open.len()..];
        let mut reach = after.len().min(window + close.len());
        while !after.is_char_boundary(reach) {
            reach -= 1;
        }
        let found = after[..reach]
            .find(close)
            .and_then(|end| variables.get(after[..end].trim()).map(|v| (end, v)));
        let taken = match found {
            Some((end, value)) => {
                rest = &after[end + close.len()..];
                emit(value)
            }
            None => {
                rest = after;
                emit(open)
            }
        };
        if !taken {
            return false;
        }
    }
    true
}

/// A step text that substitution would make longer than its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversized {
    /// Where the text is in `planning/plan.json`.
    pub json_path: String,
    /// The step it belongs to.
    pub step_id: String,
    /// What the limit covers and how large it is.
    pub limit: &'static str,
}

impl std::fmt::Display for Oversized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{PLAN_FILE}: {} (step {}): {}",
            self.json_path,
            self.step_id,
            self.message()
        )
    }
}

impl Oversized {
    /// What went over, for a diagnostic that names the file and path apart.
    pub fn message(&self) -> String {
        format!(
            "with its workflow variables substituted it would be longer than {}; use shorter \
             variables or name them fewer times",
            self.limit
        )
    }
}

impl std::error::Error for Oversized {}

/// What substitution may add to one step's texts (question, options, paths) together.
pub const MAX_STEP_GROWTH: usize = 1 << 20;
/// What substitution may add to all the texts of a plan together, in one run unit.
pub const MAX_PLAN_GROWTH: usize = 4 << 20;
/// What substitution may add to the plan's texts over a whole run, every group's unit (and
/// every answer given while it runs) together.
pub const MAX_RUN_GROWTH: usize = 16 << 20;

const PATH_LIMIT: &str = "4 KiB (4,096 bytes), the most a path may hold";
const STEP_LIMIT: &str = "what substitution may add to one step's texts: 1 MiB (1,048,576 bytes) \
     for its question, options and paths together";
const PLAN_LIMIT: &str = "what substitution may add to a plan's texts: 4 MiB (4,194,304 bytes) \
     for all its steps together";

/// What substitution may still add: to the step being substituted, and to the plan.
struct Growth {
    step: usize,
    plan: usize,
}

impl Growth {
    /// The longest `text` may become, and the limit that bounds it.
    fn limit(&self, text: &str, kind: TextKind) -> (usize, &'static str) {
        let (room, limit) = if self.step <= self.plan {
            (self.step, STEP_LIMIT)
        } else {
            (self.plan, PLAN_LIMIT)
        };
        let most = text.len().saturating_add(room);
        match kind {
            TextKind::Path if most > MAX_PATH_BYTES.max(text.len()) => {
                (MAX_PATH_BYTES.max(text.len()), PATH_LIMIT)
            }
            _ => (most, limit),
        }
    }

    /// Takes what a text grew by.
    fn take(&mut self, before: usize, after: usize) {
        let grown = after.saturating_sub(before);
        self.step = self.step.saturating_sub(grown);
        self.plan = self.plan.saturating_sub(grown);
    }
}

/// Substitutes the variables in every step's `context_output` and `context_dependencies`
/// (sub-agent steps of routes included) and in the question and options of `human_input`
/// steps, within the limits: a path at most 4 KiB, and what substitution adds at most 1 MiB
/// to a step's texts and 4 MiB to the plan's. The first text over a limit is the error (the
/// plan is then partly substituted and must not be used).
pub fn substitute_plan(
    plan: &mut Plan,
    variables: &BTreeMap<String, String>,
) -> Result<usize, Oversized> {
    if variables.is_empty() {
        return Ok(0);
    }
    walk_plan(plan, &mut |text, limit| {
        let done = substitute_within(text, variables, limit)?;
        *text = done;
        Some(text.len())
    })
}

/// [`substitute_plan`] measured, nothing changed: what it would add.
fn measure_plan(plan: &mut Plan, variables: &BTreeMap<String, String>) -> Result<usize, Oversized> {
    walk_plan(plan, &mut |text, limit| {
        substituted_len(text, variables, limit)
    })
}

/// Gives `each` every substituted text of the plan with the longest it may become; `each`
/// answers its length once substituted, or `None` past that. What the texts grew by.
fn walk_plan(
    plan: &mut Plan,
    each: &mut impl FnMut(&mut String, usize) -> Option<usize>,
) -> Result<usize, Oversized> {
    let mut growth = Growth {
        step: MAX_STEP_GROWTH,
        plan: MAX_PLAN_GROWTH,
    };
    for (path, step) in top_steps_mut(plan) {
        growth.step = MAX_STEP_GROWTH;
        visit_step(step, &path, &mut |step_id, json_path, text, kind| {
            let before = text.len();
            let (most, limit) = growth.limit(text, kind);
            let after = each(text, most).ok_or_else(|| Oversized {
                json_path: json_path.to_string(),
                step_id: step_id.to_string(),
                limit,
            })?;
            growth.take(before, after);
            Ok(())
        })?;
    }
    Ok(MAX_PLAN_GROWTH - growth.plan)
}

/// The plan's texts that substitution would make longer than their limits, with the values
/// of workflow.json's variables (without a group and in each group), as `trellis validate`
/// reports them. A `human_input` answer that becomes a variable is not known until the run,
/// which checks again.
pub fn check_plan_substitution(plan: &Plan, manifest: &WorkflowManifest) -> Diagnostics {
    let mut diags = Diagnostics::new();
    // The units (no group, then each group) are made one at a time: each holds every
    // variable's value, and a thousand groups of large values held at once were gigabytes.
    let units = 1 + manifest.groups.len();
    let unit = |i: usize| match i {
        0 => manifest.resolved_variables(None),
        _ => manifest.resolved_variables(Some(&manifest.groups[i - 1].id)),
    };
    // Every unit's values at their longest (the declared values, or a group's when longer):
    // a plan within its limits with these is within them in every unit, so each unit is
    // measured only when it may not be.
    let mut longest = unit(0);
    for group in &manifest.groups {
        for (name, value) in &group.variables {
            let kept = longest.entry(name.clone()).or_default();
            if value.len() > kept.len() {
                kept.clone_from(value);
            }
        }
    }
    if longest.is_empty() {
        return diags;
    }
    let mut scratch = plan.clone();
    if let Ok(grown) = measure_plan(&mut scratch, &longest)
        && grown.saturating_mul(units) <= MAX_RUN_GROWTH
    {
        return diags;
    }
    let mut said: Vec<String> = Vec::new();
    let mut run = 0usize;
    for i in 0..units {
        match measure_plan(&mut scratch, &unit(i)) {
            Ok(grown) => run = run.saturating_add(grown),
            Err(e) if !said.contains(&e.json_path) => {
                said.push(e.json_path.clone());
                diags.push(Diagnostic {
                    file: PLAN_FILE.into(),
                    message: e.message(),
                    json_path: e.json_path,
                    step_id: Some(e.step_id),
                    severity: Severity::Error,
                });
            }
            Err(_) => {}
        }
    }
    if run > MAX_RUN_GROWTH {
        diags.push(Diagnostic {
            file: PLAN_FILE.into(),
            json_path: String::new(),
            step_id: None,
            message: format!("{}", RunOversized { grown: run }),
            severity: Severity::Error,
        });
    }
    diags
}

/// A run whose units' substitutions together would add more than [`MAX_RUN_GROWTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOversized {
    /// What they would add, at least.
    pub grown: usize,
}

impl std::fmt::Display for RunOversized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "with the workflow variables of every group substituted (and counted again each \
             time a loop runs its steps again), the plan's texts would grow by {} bytes or \
             more in one run, more than the 16 MiB (16,777,216 bytes) substitution may add \
             over a run; use shorter variables, name them fewer times, or run fewer groups or \
             loops at once",
            self.grown
        )
    }
}

impl std::error::Error for RunOversized {}

#[derive(Clone, Copy)]
enum TextKind {
    /// A path (`context_dependencies`, `context_output`).
    Path,
    /// A question or an option.
    Prose,
}

fn top_steps_mut(plan: &mut Plan) -> impl Iterator<Item = (JsonPath, &mut Step)> {
    let steps = plan
        .steps
        .iter_mut()
        .enumerate()
        .map(|(i, s)| (JsonPath::root().key("steps").index(i), s));
    let orphans = plan
        .orphan_steps
        .iter_mut()
        .enumerate()
        .map(|(i, s)| (JsonPath::root().key("orphan_steps").index(i), s));
    steps.chain(orphans)
}

/// Hands `each` every substituted text of `step` and of its routes' sub-agent steps, with
/// its path and kind.
fn visit_step(
    step: &mut Step,
    path: &JsonPath,
    each: &mut impl FnMut(&str, &JsonPath, &mut String, TextKind) -> Result<(), Oversized>,
) -> Result<(), Oversized> {
    let id = step.id.clone();
    for (i, dep) in step.context_dependencies.iter_mut().flatten().enumerate() {
        each(
            &id,
            &path.key("context_dependencies").index(i),
            dep,
            TextKind::Path,
        )?;
    }
    match &mut step.context_output {
        Some(ContextOutput::One(o)) => each(&id, &path.key("context_output"), o, TextKind::Path)?,
        Some(ContextOutput::Many(list)) => {
            for (i, o) in list.iter_mut().enumerate() {
                each(&id, &path.key("context_output").index(i), o, TextKind::Path)?;
            }
        }
        None => {}
    }
    match &mut step.kind {
        StepKind::HumanInput(h) => {
            if let Some(q) = &mut h.question {
                each(&id, &path.key("question"), q, TextKind::Prose)?;
            }
            for (i, o) in h.options.iter_mut().flatten().enumerate() {
                each(&id, &path.key("options").index(i), o, TextKind::Prose)?;
            }
        }
        StepKind::MessageSequence(m) => {
            for (i, r) in m.predefined_routes.iter_mut().enumerate() {
                let at = path.key("predefined_routes").index(i).key("sub_agent_step");
                visit_step(&mut r.sub_agent_step, &at, each)?;
            }
        }
        StepKind::TodoTask(t) => {
            for (i, r) in t.predefined_routes.iter_mut().enumerate() {
                let at = path.key("predefined_routes").index(i).key("sub_agent_step");
                visit_step(&mut r.sub_agent_step, &at, each)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn variables_are_substituted_where_named_and_unknown_ones_stay() {
        let v = vars(&[("A", "1"), ("B", "x/y")]);
        assert_eq!(substitute("{{A}}-{{ B }}-{{C}}-{{A", &v), "1-x/y-{{C}}-{{A");
        assert_eq!(substitute("no braces", &v), "no braces");
        assert_eq!(substitute("{{{{A}}}}", &v), "{{1}}");
        assert_eq!(substitute("k/{A}/${A}/$A/${ B }", &v), "k/1/1/$A/x/y");
        assert_eq!(substitute("é{A}ü", &v), "é1ü");
    }

    #[test]
    fn substituting_in_a_text_of_unclosed_braces_keeps_it_as_written() {
        let v = vars(&[("A", "1")]);
        let text = format!("{}{{ A }}{}", "{".repeat(300_000), "{".repeat(10));
        assert_eq!(
            substitute(&text, &v),
            format!("{}1{}", "{".repeat(300_000), "{".repeat(10))
        );
        let spaced = format!("{{{}A}}", " ".repeat(100));
        assert_eq!(
            substitute(&spaced, &v),
            spaced,
            "past the spaces looked through"
        );
    }

    #[test]
    fn a_substitution_past_its_limit_stops_before_holding_it() {
        let v = vars(&[("A", &"a".repeat(1000))]);
        let text = "{{A}}".repeat(1000);
        assert_eq!(substitute_within(&text, &v, 999_999), None);
        assert_eq!(substituted_len(&text, &v, 999_999), None);
        assert_eq!(substituted_len(&text, &v, 1_000_000), Some(1_000_000));
        assert_eq!(
            substitute_within(&text, &v, 1_000_000).map(|s| s.len()),
            Some(1_000_000)
        );
    }
}
