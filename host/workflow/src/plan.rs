//! `planning/plan.json`: the structure of a workflow (spec section 2).
//!
//! [`parse_plan`] walks the JSON and reports every problem at once; the typed [`Plan`] it
//! returns has no unknown keys (they are errors) and serializes back to the keys it was read
//! from, so a plan written by Trellis reads the same in the original tools.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;
use serde_json::Value;

use super::diagnostics::{
    Ctx, Diagnostics, JsonPath, Obj, Parsed, did_you_mean, enum_value, finish, kind_of, parse_json,
    quote,
};
use crate::validation::schema::{ValidationSchema, parse_schema};

mod ids;
mod items;
mod step_types;

use ids::{check_references, check_sharing};
pub use items::{Item, ItemBody, ItemKind, WriteAccess};
use items::{parse_item, parse_items};
pub use step_types::{HumanInput, PredefinedRoute, ResponseType, Route, Routing};
use step_types::{parse_human_input, parse_routes, parse_routing, resolve_orphan_refs};

/// Where the plan lives in a workspace.
pub const PLAN_FILE: &str = "planning/plan.json";

/// The `next_step_id` value that ends a run.
pub const END: &str = "end";

/// The id of the single item a `regular` step runs as.
pub const REGULAR_ITEM_ID: &str = "execute-and-verify";

/// The id of the single turn a `todo_task` (an orchestrator without items) runs as.
pub const TODO_TASK_ITEM_ID: &str = "orchestrate";

/// The name of the migration that removes legacy `code` items (spec section 9).
pub const CODE_ITEM_MIGRATION: &str = "migrate_message_sequence_code_items";

/// A whole plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    /// What the workflow is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective: Option<String>,
    /// How a run is judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_criteria: Option<String>,
    /// The main path, run in array order unless `next_step_id` says otherwise.
    pub steps: Vec<Step>,
    /// Utility steps run only when invoked by id.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub orphan_steps: Vec<Step>,
}

impl Plan {
    /// Every step, main path first, then orphans.
    pub fn all_steps(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().chain(self.orphan_steps.iter())
    }

    /// The step with this id, on the main path or among the orphans.
    pub fn step(&self, id: &str) -> Option<&Step> {
        self.all_steps().find(|s| s.id == id)
    }

    /// The step with this id anywhere: on the main path, among the orphans, or a route's
    /// sub-agent step at any depth (the first found).
    pub fn find_step(&self, id: &str) -> Option<&Step> {
        fn within<'s>(step: &'s Step, id: &str, depth: usize) -> Option<&'s Step> {
            if step.id == id {
                return Some(step);
            }
            if depth > 8 {
                return None;
            }
            step.predefined_routes()
                .iter()
                .find_map(|r| within(&r.sub_agent_step, id, depth + 1))
        }
        self.step(id)
            .or_else(|| self.all_steps().find_map(|s| within(s, id, 0)))
    }
}

/// One step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// Unique among all steps of the plan.
    pub id: String,
    /// A short label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The charter of the step (the system-level instruction of a sequence).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Workspace-relative paths the step reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_dependencies: Option<Vec<String>>,
    /// The output file names of the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_output: Option<ContextOutput>,
    /// The step's final acceptance contract.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_schema: Option<ValidationSchema>,
    /// The step to run next; `end` ends the run. The original's `""` reads as absent: the
    /// next step in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_step_id: Option<String>,
    /// Keys of the original every step type may carry.
    #[serde(flatten)]
    pub compat: StepCompat,
    /// The type and its own fields.
    #[serde(flatten)]
    pub kind: StepKind,
}

/// Keys of the original a step may carry beside Trellis's own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StepCompat {
    /// What the step must achieve; given to its agent with its charter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_criteria: Option<String>,
    /// For an orphan step: the `todo_task` steps whose routes may name it in
    /// `orphan_step_ref` (`{"orchestrator_ids": [...]}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_with: Option<SharedWith>,
}

/// `shared_with` of an orphan step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SharedWith {
    /// Ids of `todo_task` steps of the plan.
    pub orchestrator_ids: Vec<String>,
}

impl Step {
    /// The step type as written in the plan.
    pub fn type_name(&self) -> &'static str {
        self.kind.name()
    }

    /// The items the step runs as: a sequence's own items; for a `regular` step the single
    /// `execute-and-verify` user message built from its description; for a legacy `todo_task`
    /// (the original's orchestrator) one `orchestrate` turn whose task is its description
    /// followed by its text messages, or its messages as sequence items when any is an item.
    pub fn effective_items(&self) -> Vec<Item> {
        match &self.kind {
            StepKind::MessageSequence(s) => s.items.clone(),
            StepKind::Regular => vec![Item {
                id: REGULAR_ITEM_ID.into(),
                title: self.title.clone(),
                kind: None,
                body: ItemBody::UserMessage {
                    message: self.description.clone().unwrap_or_default(),
                    write_access: None,
                },
            }],
            StepKind::TodoTask(t)
                if !t.messages.iter().any(|m| matches!(m, TodoMessage::Item(_))) =>
            {
                let mut task = self.description.clone().unwrap_or_default();
                for m in &t.messages {
                    if let TodoMessage::Text(text) = m {
                        if !task.is_empty() {
                            task.push_str("\n\n");
                        }
                        task.push_str(text);
                    }
                }
                vec![Item {
                    id: TODO_TASK_ITEM_ID.into(),
                    title: self.title.clone(),
                    kind: None,
                    body: ItemBody::UserMessage {
                        message: task,
                        write_access: None,
                    },
                }]
            }
            StepKind::TodoTask(t) => t
                .messages
                .iter()
                .enumerate()
                .map(|(i, m)| match m {
                    TodoMessage::Item(item) => item.clone(),
                    TodoMessage::Text(text) => Item {
                        id: format!("message-{}", i + 1),
                        title: None,
                        kind: None,
                        body: ItemBody::UserMessage {
                            message: text.clone(),
                            write_access: None,
                        },
                    },
                })
                .collect(),
            StepKind::Routing(_) | StepKind::HumanInput(_) => Vec::new(),
        }
    }

    /// The sub-agent routes a sequence (or legacy todo task) declares.
    pub fn predefined_routes(&self) -> &[PredefinedRoute] {
        match &self.kind {
            StepKind::MessageSequence(s) => &s.predefined_routes,
            StepKind::TodoTask(t) => &t.predefined_routes,
            _ => &[],
        }
    }

    /// The output file names, whichever form `context_output` was written in: one name, a
    /// list, or (as the original writes several) one string of comma-separated names.
    pub fn outputs(&self) -> Vec<String> {
        match &self.context_output {
            None => Vec::new(),
            Some(ContextOutput::One(s)) => s
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect(),
            Some(ContextOutput::Many(v)) => v.clone(),
        }
    }
}

/// The most `context_dependencies` entries, and the most `context_output` names, of a step.
pub const MAX_STEP_PATHS: usize = 1_000;

/// `context_output`: one name or a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ContextOutput {
    /// A single file name.
    One(String),
    /// Several file names.
    Many(Vec<String>),
}

/// A step's type with the fields that belong to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StepKind {
    /// The canonical agent step (spec section 4).
    MessageSequence(MessageSequence),
    /// A one-turn agent step, or a scripted step when its config says so.
    Regular,
    /// A deterministic switch.
    Routing(Routing),
    /// A question for a person.
    HumanInput(HumanInput),
    /// Legacy orchestrator step, run as a message sequence with routes.
    TodoTask(TodoTask),
}

impl StepKind {
    /// The type name used in plans.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageSequence(_) => "message_sequence",
            Self::Regular => "regular",
            Self::Routing(_) => "routing",
            Self::HumanInput(_) => "human_input",
            Self::TodoTask(_) => "todo_task",
        }
    }
}

/// The fields of a `message_sequence` step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageSequence {
    /// The turns, in order.
    pub items: Vec<Item>,
    /// Specialists the agent may delegate to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub predefined_routes: Vec<PredefinedRoute>,
}

/// The fields of a legacy `todo_task` step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TodoTask {
    /// Specialists, as in a message sequence.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub predefined_routes: Vec<PredefinedRoute>,
    /// The messages, run as the items of a sequence.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<TodoMessage>,
}

/// A message of a legacy todo task: plain text or a sequence item.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TodoMessage {
    /// A user message given as text.
    Text(String),
    /// A full item.
    Item(Item),
}

const STEP_TYPES: &[(&str, &str)] = &[
    ("message_sequence", "message_sequence"),
    ("regular", "regular"),
    ("routing", "routing"),
    ("human_input", "human_input"),
    ("todo_task", "todo_task"),
];

/// Keys each step type owns, so a key of another type gets a precise message instead of
/// "unknown key".
const TYPE_KEYS: &[(&str, &[&str])] = &[
    ("message_sequence", &["items", "predefined_routes"]),
    (
        "routing",
        &[
            "routes",
            "default_route_id",
            "route_source_file",
            "routing_question",
        ],
    ),
    (
        "human_input",
        &[
            "question",
            "variable_name",
            "response_type",
            "options",
            "if_yes_next_step_id",
            "if_no_next_step_id",
            "option_routes",
        ],
    ),
    ("todo_task", &["predefined_routes", "messages"]),
    (
        "regular",
        &[
            "has_loop",
            "loop_condition",
            "max_iterations",
            "loop_description",
        ],
    ),
];

/// Reads a plan from its text. `file` names it in diagnostics (normally `planning/plan.json`).
pub fn parse_plan(text: &str, file: &str) -> Parsed<Plan> {
    parse_plan_gated(text, file, Default::default())
}

/// [`parse_plan`] knowing which steps have a `validation_schema` in the step config: their
/// `prevalidation` items may go without a schema of their own, as that one replaces the
/// plan's in a run.
pub fn parse_plan_gated(text: &str, file: &str, gated: BTreeSet<String>) -> Parsed<Plan> {
    let mut diags = Diagnostics::new();
    let plan = parse_json(text, file, &mut diags).and_then(|v| {
        let mut ctx = Ctx::new(file, &mut diags).with_gated(gated);
        plan_from_value(&mut ctx, &v)
    });
    finish(plan, diags)
}

/// Reads a plan from a JSON value already parsed.
pub fn parse_plan_value(value: &Value, file: &str) -> Parsed<Plan> {
    let mut diags = Diagnostics::new();
    let plan = {
        let mut ctx = Ctx::new(file, &mut diags);
        plan_from_value(&mut ctx, value)
    };
    finish(plan, diags)
}

fn plan_from_value(ctx: &mut Ctx, value: &Value) -> Option<Plan> {
    let mut obj = Obj::new(ctx, value, JsonPath::root(), "a plan")?;
    let objective = obj.str(ctx, "objective");
    let success_criteria = obj.str(ctx, "success_criteria");
    let steps = if obj.has("steps") {
        obj.list(ctx, "steps", |ctx, v, p| {
            parse_step(ctx, v, p, Nesting::Top)
        })
    } else {
        obj.raw("steps");
        ctx.error(
            &JsonPath::root().key("steps"),
            "missing: expected an array of steps",
        );
        None
    };
    let orphan_steps = obj
        .list(ctx, "orphan_steps", |ctx, v, p| {
            parse_step(ctx, v, p, Nesting::Orphan)
        })
        .unwrap_or_default();
    obj.finish(ctx);
    let mut plan = Plan {
        objective,
        success_criteria,
        steps: steps.unwrap_or_default(),
        orphan_steps,
    };
    resolve_orphan_refs(ctx, value, &mut plan);
    check_references(ctx, value, &plan);
    check_sharing(ctx, &plan);
    Some(plan)
}

/// Where a step sits, for messages about legacy code items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nesting {
    Top,
    Orphan,
    Route,
}

/// The folders of `runs/<run>/execution/` that are not a step's output folder: no step id
/// may name one (in any case, for file systems that ignore it).
pub const RUN_FOLDER_NAMES: &[&str] = &["Downloads", "archived"];

fn parse_step(ctx: &mut Ctx, value: &Value, path: JsonPath, nesting: Nesting) -> Option<Step> {
    let mut obj = Obj::new(ctx, value, path, "a step")?;
    let id = obj.str(ctx, "id").filter(|s| !s.trim().is_empty());
    let outer = ctx.set_step(id.clone());
    if let Some(id) = &id {
        super::diagnostics::check_plain_id(ctx, &obj.path().key("id"), "step id", id);
        if let Some(folder) = RUN_FOLDER_NAMES
            .iter()
            .find(|name| name.eq_ignore_ascii_case(id))
        {
            ctx.error(
                &obj.path().key("id"),
                format!(
                    "step id {id:?} is the name of a folder every run has \
                     (runs/<run>/execution/{folder}/), where the step's output folder would \
                     go: choose another id"
                ),
            );
        }
    }
    let step = parse_step_body(ctx, &mut obj, id, nesting);
    obj.finish(ctx);
    ctx.set_step(outer);
    step
}

fn parse_step_body(
    ctx: &mut Ctx,
    obj: &mut Obj,
    id: Option<String>,
    nesting: Nesting,
) -> Option<Step> {
    if id.is_none() {
        ctx.error(
            &obj.path().key("id"),
            "missing: expected a string (the step id, unique in the plan)",
        );
    }
    let type_name = if obj.has("type") {
        obj.str(ctx, "type")
    } else {
        obj.raw("type");
        ctx.error(
            &obj.path().key("type"),
            "missing: expected one of \"message_sequence\", \"regular\", \"routing\", \"human_input\", \"todo_task\"",
        );
        None
    };
    let type_name =
        type_name.and_then(|t| enum_value(ctx, &obj.path().key("type"), &t, STEP_TYPES));
    if type_name.is_none() {
        // Without a known type the other keys cannot be judged: report the type alone.
        for (_, keys) in TYPE_KEYS {
            obj.accept(keys);
        }
    }
    let sequence = type_name == Some("message_sequence");
    let title = if sequence {
        obj.req_str(ctx, "title", "the step title")
    } else {
        obj.str(ctx, "title")
    };
    let description = if sequence {
        obj.req_str(ctx, "description", "the step charter shared by every turn")
    } else {
        obj.str(ctx, "description")
    };
    let context_dependencies = obj.str_list(ctx, "context_dependencies");
    if let Some(deps) = &context_dependencies {
        if deps.len() > MAX_STEP_PATHS {
            ctx.error(
                &obj.path().key("context_dependencies"),
                format!(
                    "{} entries, more than the {MAX_STEP_PATHS} a step may depend on",
                    deps.len()
                ),
            );
        }
        for (i, d) in deps.iter().enumerate().take(MAX_STEP_PATHS + 1) {
            if let Err(why) = trellis_sandbox::store::check_relative(d) {
                ctx.error(&obj.path().key("context_dependencies").index(i), why);
            }
        }
    }
    let context_output = match obj.raw("context_output") {
        None => None,
        // The original writes `""` for a step with no output file.
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(ContextOutput::One(s.clone())),
        Some(Value::Array(_)) => obj.str_list(ctx, "context_output").map(ContextOutput::Many),
        Some(other) => {
            ctx.error(
                &obj.path().key("context_output"),
                format!(
                    "expected a file name or an array of file names, found {}",
                    kind_of(other)
                ),
            );
            None
        }
    };
    if let Some(ContextOutput::Many(list)) = &context_output
        && list.len() > MAX_STEP_PATHS
    {
        ctx.error(
            &obj.path().key("context_output"),
            format!(
                "{} entries, more than the {MAX_STEP_PATHS} output files a step may name",
                list.len()
            ),
        );
    }
    check_db_outputs(ctx, obj, &context_output);
    let validation_schema = obj
        .raw("validation_schema")
        .and_then(|v| parse_schema(ctx, v, obj.path().key("validation_schema")));
    // The original writes `""` for "no explicit successor": the next step in order.
    let next_step_id = obj.str(ctx, "next_step_id").filter(|s| !s.is_empty());
    let compat = parse_compat(ctx, obj);

    // Keys of other step types: name the type they belong to rather than "unknown key".
    let own: &[&str] = type_name
        .and_then(|t| TYPE_KEYS.iter().find(|(n, _)| *n == t))
        .map(|(_, k)| *k)
        .unwrap_or(&[]);
    if let Some(t) = type_name {
        for (other, keys) in TYPE_KEYS {
            for key in keys.iter().filter(|k| !own.contains(k)) {
                if obj.has(key) {
                    obj.accept(&[key]);
                    ctx.error(
                        &obj.path().key(key),
                        format!("applies to {other} steps, not to a {t} step"),
                    );
                }
            }
        }
    }

    let kind = match type_name? {
        "message_sequence" => {
            let gated = id.as_deref().is_some_and(|i| ctx.gated(i));
            let items = parse_items(ctx, obj, validation_schema.is_some() || gated, nesting);
            let predefined_routes = parse_routes(ctx, obj);
            StepKind::MessageSequence(MessageSequence {
                items: items?,
                predefined_routes,
            })
        }
        "regular" => {
            retired_loop_keys(ctx, obj);
            StepKind::Regular
        }
        "routing" => StepKind::Routing(parse_routing(ctx, obj)?),
        "human_input" => {
            check_answer_file(ctx, obj, &context_output);
            StepKind::HumanInput(parse_human_input(ctx, obj)?)
        }
        _ => {
            let predefined_routes = parse_routes(ctx, obj);
            let has_schema =
                validation_schema.is_some() || id.as_deref().is_some_and(|i| ctx.gated(i));
            let messages = obj
                .list(ctx, "messages", |ctx, v, p| match v {
                    Value::String(s) => Some(TodoMessage::Text(s.clone())),
                    // The original's orchestrator takes `message` for `user_message`.
                    Value::Object(m)
                        if m.get("type").and_then(Value::as_str) == Some("message") =>
                    {
                        let mut item = m.clone();
                        item.insert("type".into(), Value::from("user_message"));
                        parse_item(ctx, &Value::Object(item), p, has_schema, nesting)
                            .map(TodoMessage::Item)
                    }
                    _ => parse_item(ctx, v, p, has_schema, nesting).map(TodoMessage::Item),
                })
                .unwrap_or_default();
            StepKind::TodoTask(TodoTask {
                predefined_routes,
                messages,
            })
        }
    };
    Some(Step {
        id: id?,
        title,
        description,
        context_dependencies,
        context_output,
        validation_schema,
        next_step_id,
        compat,
        kind,
    })
}

/// Whether `name`, joined to a folder, names a file in it: relative, no `.` or `..` (joined,
/// an absolute path or `.` would replace the folder or be it).
pub fn names_a_file_in_folder(name: &str) -> bool {
    !name.is_empty()
        && std::path::Path::new(name)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// A human_input step's answer file, its first output, is a file in its output folder (a
/// relative name without `.` or `..`): the run refuses any other when the step is reached. A
/// name with a placeholder is checked once it is filled in.
fn check_answer_file(ctx: &mut Ctx, obj: &Obj, output: &Option<ContextOutput>) {
    let first = match output {
        Some(ContextOutput::One(s)) => s.split(',').map(str::trim).find(|n| !n.is_empty()),
        Some(ContextOutput::Many(v)) => v.first().map(String::as_str),
        None => None,
    };
    let Some(name) = first.filter(|n| !n.contains("{{")) else {
        return;
    };
    if !names_a_file_in_folder(name) {
        let path = match output {
            Some(ContextOutput::Many(_)) => obj.path().key("context_output").index(0),
            _ => obj.path().key("context_output"),
        };
        ctx.error(
            &path,
            format!(
                "the answer file {name:?} does not name a file in the step's output folder; \
                 expected a name such as \"answer.json\""
            ),
        );
    }
}

/// An output named under `db/` must be under `db/assets/`: `db/` holds the database and
/// the durable files of `db/assets/`, nothing else (as in the original).
fn check_db_outputs(ctx: &mut Ctx, obj: &Obj, output: &Option<ContextOutput>) {
    let names: Vec<(JsonPath, String)> = match output {
        None => Vec::new(),
        Some(ContextOutput::One(s)) => s
            .split(',')
            .map(|n| (obj.path().key("context_output"), n.trim().to_string()))
            .collect(),
        Some(ContextOutput::Many(v)) => v
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    obj.path().key("context_output").index(i),
                    n.trim().to_string(),
                )
            })
            .collect(),
    };
    for (path, name) in names {
        let name = name.trim_start_matches("./");
        if (name == "db" || name.starts_with("db/")) && !name.starts_with("db/assets/") {
            ctx.error(
                &path,
                format!(
                    "output {} is under db/, which holds only db/db.sqlite (reached with the \
                     database tools) and durable files under db/assets/: name the file \
                     db/assets/<name>, or give a name in the step's output folder",
                    quote(name)
                ),
            );
        }
    }
}

/// `success_criteria` and `shared_with`, on any step.
fn parse_compat(ctx: &mut Ctx, obj: &mut Obj) -> StepCompat {
    let success_criteria = obj
        .str(ctx, "success_criteria")
        .filter(|s| !s.trim().is_empty());
    let shared_with = obj.raw("shared_with").and_then(|v| {
        let mut o = Obj::new(ctx, v, obj.path().key("shared_with"), "sharing rules")?;
        let ids = o.str_list(ctx, "orchestrator_ids").unwrap_or_default();
        o.finish(ctx);
        Some(SharedWith {
            orchestrator_ids: ids,
        })
    });
    StepCompat {
        success_criteria,
        shared_with,
    }
}

/// The original's retired loop keys of a regular step (`has_loop`, what its v1.0.10 migration
/// writes too, and the `loop_*` keys): accepted, dropped when the file is saved; a loop they
/// ask for is ignored, with a warning (the original ignores it too).
fn retired_loop_keys(ctx: &mut Ctx, obj: &mut Obj) {
    let has_loop = obj.bool(ctx, "has_loop");
    let mut asked = Vec::new();
    if has_loop == Some(true) {
        asked.push("has_loop");
    }
    for key in ["loop_condition", "loop_description"] {
        if obj.str(ctx, key).is_some_and(|s| !s.is_empty()) {
            asked.push(key);
        }
    }
    if obj.u64(ctx, "max_iterations").is_some_and(|n| n > 0) {
        asked.push("max_iterations");
    }
    if let Some(first) = asked.first() {
        ctx.warning(
            &obj.path().key(first),
            format!(
                "retired: step loops are gone (in the original too): {} ignored and dropped \
                 when the file is saved",
                asked.join(", ")
            ),
        );
    }
}

/// Whether a plan value still holds legacy `code` items anywhere (used by the migration and
/// by the contract check before a run).
pub fn has_code_items(plan: &Value) -> bool {
    fn step_has(step: &Value) -> bool {
        let items = step
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(
                step.get("messages")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten(),
            );
        for item in items {
            if item.get("type").and_then(Value::as_str) == Some("code") {
                return true;
            }
        }
        step.get("predefined_routes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| r.get("sub_agent_step"))
            .any(step_has)
    }
    ["steps", "orphan_steps"].iter().any(|list| {
        plan.get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(step_has)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_field() {
        let text = r#"{
  "objective": "o",
  "success_criteria": "c",
  "steps": [
    {"id": "a", "type": "message_sequence", "title": "A", "description": "d",
     "context_dependencies": ["db/db.sqlite"], "context_output": "out.json",
     "items": [
       {"id": "m", "type": "user_message", "message": "hi", "kind": "db", "title": "t", "write_access": {"db": true}},
       {"id": "f", "type": "foreach", "source_sql": "SELECT 1 AS id", "message": "{{.id}}", "max_iterations": 5},
       {"id": "g", "type": "prevalidation", "prevalidation": {"files": [{"file_name": "out.json", "must_exist": true}]}}
     ],
     "predefined_routes": [{"route_id": "c", "route_name": "C", "condition": "x",
        "sub_agent_step": {"id": "c", "type": "message_sequence", "title": "C", "description": "d",
          "items": [{"id": "v", "type": "user_message", "message": "m"}]}}]},
    {"id": "r", "type": "routing", "routes": [{"route_id": "x", "route_name": "X", "condition": "c", "next_step_id": "end"}],
     "default_route_id": "x", "route_source_file": "choice.json", "routing_question": "?"},
    {"id": "h", "type": "human_input", "question": "q", "variable_name": "v", "response_type": "multiple_choice",
     "options": ["a", "b"], "option_routes": {"a": "t"}, "next_step_id": "t"},
    {"id": "t", "type": "todo_task", "messages": ["one", {"id": "two", "type": "user_message", "message": "2"}]}
  ],
  "orphan_steps": [{"id": "u", "type": "regular", "title": "U", "description": "d", "next_step_id": "end"}]
}"#;
        let (plan, warnings) = parse_plan(text, PLAN_FILE).unwrap();
        assert!(warnings.is_empty(), "{warnings}");
        let back = serde_json::to_value(&plan).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(text).unwrap());
        assert_eq!(
            plan.step("u").unwrap().effective_items()[0].id,
            REGULAR_ITEM_ID
        );
        assert_eq!(plan.step("t").unwrap().effective_items().len(), 2);
    }

    #[test]
    fn code_items_name_the_migration() {
        let text = r#"{"steps":[{"id":"s","type":"message_sequence","title":"S","description":"d",
            "items":[{"id":"c","type":"code","script_path":"x.py","output_files":["o"]}]}]}"#;
        let err = parse_plan(text, PLAN_FILE).unwrap_err();
        assert_eq!(
            err.lines(),
            [
                "planning/plan.json: steps[0].items[0].type (step \"s\"): legacy \"code\" item \"c\" is not supported since contract v1.0.10: run the migration migrate_message_sequence_code_items (`trellis migrate WORKSPACE`) to turn it into a scripted regular step"
            ]
        );
        assert!(has_code_items(&serde_json::from_str(text).unwrap()));
    }
}
