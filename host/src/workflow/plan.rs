//! `planning/plan.json`: the structure of a workflow (spec section 2).
//!
//! [`parse_plan`] walks the JSON and reports every problem at once; the typed [`Plan`] it
//! returns has no unknown keys (they are errors) and serializes back to the keys it was read
//! from, so a plan written by Trellis reads the same in the original tools.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use serde_json::Value;

use super::diagnostics::{
    Ctx, Diagnostics, JsonPath, Obj, Parsed, did_you_mean, enum_value, finish, kind_of, parse_json,
    quote,
};
use crate::validation::schema::{ValidationSchema, parse_schema};

/// Where the plan lives in a workspace.
pub const PLAN_FILE: &str = "planning/plan.json";

/// The `next_step_id` value that ends a run.
pub const END: &str = "end";

/// The id of the single item a `regular` step runs as.
pub const REGULAR_ITEM_ID: &str = "execute-and-verify";

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
    /// The step to run next; `end` ends the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_step_id: Option<String>,
    /// The type and its own fields.
    #[serde(flatten)]
    pub kind: StepKind,
}

impl Step {
    /// The step type as written in the plan.
    pub fn type_name(&self) -> &'static str {
        self.kind.name()
    }

    /// The items the step runs as: a sequence's own items; for a `regular` step the single
    /// `execute-and-verify` user message built from its description; for a legacy `todo_task`
    /// its messages.
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

    /// The output file names, whichever form `context_output` was written in.
    pub fn outputs(&self) -> Vec<String> {
        match &self.context_output {
            None => Vec::new(),
            Some(ContextOutput::One(s)) => vec![s.clone()],
            Some(ContextOutput::Many(v)) => v.clone(),
        }
    }
}

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

/// A sub-agent route of a sequence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PredefinedRoute {
    /// Equals `sub_agent_step.id`.
    pub route_id: String,
    /// A label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_name: Option<String>,
    /// When the agent should use it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// The child sequence.
    pub sub_agent_step: Box<Step>,
}

/// The fields of a `routing` step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Routing {
    /// The choices.
    pub routes: Vec<Route>,
    /// The route taken when no selection file exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_route_id: Option<String>,
    /// The prior step's file holding `{"select_route": "<route_id>"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_source_file: Option<String>,
    /// Accepted and ignored (older plans asked an LLM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing_question: Option<String>,
}

/// A choice of a routing step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    /// The value of `select_route` that picks this route.
    pub route_id: String,
    /// A label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_name: Option<String>,
    /// A description of when it applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// Where the run goes.
    pub next_step_id: String,
}

/// How a person answers a `human_input` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseType {
    /// Free text.
    Text,
    /// Yes or no; routes with `if_yes_next_step_id` / `if_no_next_step_id`.
    Yesno,
    /// One of `options`; routes with `option_routes`.
    MultipleChoice,
}

/// The fields of a `human_input` step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HumanInput {
    /// What to ask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// The workflow variable that receives the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variable_name: Option<String>,
    /// The kind of answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_type: Option<ResponseType>,
    /// The choices of a multiple-choice question.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// Where a yes goes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub if_yes_next_step_id: Option<String>,
    /// Where a no goes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub if_no_next_step_id: Option<String>,
    /// Option -> next step id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub option_routes: Option<BTreeMap<String, String>>,
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

/// What a turn is for; narrows its write access (spec section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// Normal work (the default).
    Execution,
    /// Writes learnings.
    Learning,
    /// Writes knowledgebase notes.
    Knowledgebase,
    /// Writes the database.
    Db,
}

/// One item of a message sequence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Item {
    /// Unique within the step.
    pub id: String,
    /// An optional label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the turn is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<ItemKind>,
    /// The type and its own fields.
    #[serde(flatten)]
    pub body: ItemBody,
}

/// An item's type with the fields that belong to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ItemBody {
    /// One turn.
    UserMessage {
        /// The user message.
        message: String,
        /// Narrows the step's write access for this turn.
        #[serde(skip_serializing_if = "Option::is_none")]
        write_access: Option<WriteAccess>,
    },
    /// One turn per row of a read-only query.
    Foreach {
        /// Read-only SQL against `db/db.sqlite`.
        source_sql: String,
        /// A Go `text/template` with the row bound to `.`.
        message: String,
        /// Caps the rows (capping is logged).
        #[serde(skip_serializing_if = "Option::is_none")]
        max_iterations: Option<u64>,
        /// Narrows the step's write access for these turns.
        #[serde(skip_serializing_if = "Option::is_none")]
        write_access: Option<WriteAccess>,
    },
    /// A validation gate with repair turns.
    Prevalidation {
        /// The gate's schema.
        #[serde(skip_serializing_if = "Option::is_none")]
        validation_schema: Option<ValidationSchema>,
        /// Older spelling of `validation_schema`.
        #[serde(skip_serializing_if = "Option::is_none")]
        prevalidation: Option<ValidationSchema>,
    },
}

impl ItemBody {
    /// The type name used in plans.
    pub fn name(&self) -> &'static str {
        match self {
            Self::UserMessage { .. } => "user_message",
            Self::Foreach { .. } => "foreach",
            Self::Prevalidation { .. } => "prevalidation",
        }
    }

    /// The schema a prevalidation item declares itself, whichever key it used.
    pub fn own_schema(&self) -> Option<&ValidationSchema> {
        match self {
            Self::Prevalidation {
                validation_schema,
                prevalidation,
            } => validation_schema.as_ref().or(prevalidation.as_ref()),
            _ => None,
        }
    }

    /// The item's write access override, if any.
    pub fn write_access(&self) -> Option<&WriteAccess> {
        match self {
            Self::UserMessage { write_access, .. } | Self::Foreach { write_access, .. } => {
                write_access.as_ref()
            }
            Self::Prevalidation { .. } => None,
        }
    }
}

/// Per-folder write access of a turn (spec section 6). Absent means "as the step".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WriteAccess {
    /// Database mutations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db: Option<bool>,
    /// Writes to `knowledgebase/notes/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knowledgebase: Option<bool>,
    /// Writes to `learnings/_global/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learnings: Option<bool>,
}

const STEP_TYPES: &[(&str, &str)] = &[
    ("message_sequence", "message_sequence"),
    ("regular", "regular"),
    ("routing", "routing"),
    ("human_input", "human_input"),
    ("todo_task", "todo_task"),
];

const ITEM_TYPES: &[(&str, &str)] = &[
    ("user_message", "user_message"),
    ("foreach", "foreach"),
    ("prevalidation", "prevalidation"),
];

const ITEM_KINDS: &[(&str, ItemKind)] = &[
    ("execution", ItemKind::Execution),
    ("learning", ItemKind::Learning),
    ("knowledgebase", ItemKind::Knowledgebase),
    ("db", ItemKind::Db),
];

const RESPONSE_TYPES: &[(&str, ResponseType)] = &[
    ("text", ResponseType::Text),
    ("yesno", ResponseType::Yesno),
    ("multiple_choice", ResponseType::MultipleChoice),
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
];

const ITEM_TYPE_KEYS: &[(&str, &[&str])] = &[
    ("user_message", &["message", "write_access"]),
    (
        "foreach",
        &["message", "source_sql", "max_iterations", "write_access"],
    ),
    ("prevalidation", &["validation_schema", "prevalidation"]),
];

/// Reads a plan from its text. `file` names it in diagnostics (normally `planning/plan.json`).
pub fn parse_plan(text: &str, file: &str) -> Parsed<Plan> {
    let mut diags = Diagnostics::new();
    let plan = parse_json(text, file, &mut diags).and_then(|v| {
        let mut ctx = Ctx::new(file, &mut diags);
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
    let plan = Plan {
        objective,
        success_criteria,
        steps: steps.unwrap_or_default(),
        orphan_steps,
    };
    check_references(ctx, value, &plan);
    Some(plan)
}

/// Where a step sits, for messages about legacy code items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nesting {
    Top,
    Orphan,
    Route,
}

fn parse_step(ctx: &mut Ctx, value: &Value, path: JsonPath, nesting: Nesting) -> Option<Step> {
    let mut obj = Obj::new(ctx, value, path, "a step")?;
    let id = obj.str(ctx, "id").filter(|s| !s.trim().is_empty());
    let outer = ctx.set_step(id.clone());
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
        for (i, d) in deps.iter().enumerate() {
            if let Err(why) = crate::store::check_relative(d) {
                ctx.error(&obj.path().key("context_dependencies").index(i), why);
            }
        }
    }
    let context_output = match obj.raw("context_output") {
        None => None,
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
    let validation_schema = obj
        .raw("validation_schema")
        .and_then(|v| parse_schema(ctx, v, obj.path().key("validation_schema")));
    let next_step_id = obj.str(ctx, "next_step_id");

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
            let items = parse_items(ctx, obj, validation_schema.is_some(), nesting);
            let predefined_routes = parse_routes(ctx, obj);
            StepKind::MessageSequence(MessageSequence {
                items: items?,
                predefined_routes,
            })
        }
        "regular" => StepKind::Regular,
        "routing" => StepKind::Routing(parse_routing(ctx, obj)?),
        "human_input" => StepKind::HumanInput(parse_human_input(ctx, obj)?),
        _ => {
            let predefined_routes = parse_routes(ctx, obj);
            let has_schema = validation_schema.is_some();
            let messages = obj
                .list(ctx, "messages", |ctx, v, p| match v {
                    Value::String(s) => Some(TodoMessage::Text(s.clone())),
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
        kind,
    })
}

fn parse_items(
    ctx: &mut Ctx,
    obj: &mut Obj,
    step_has_schema: bool,
    nesting: Nesting,
) -> Option<Vec<Item>> {
    if !obj.has("items") {
        obj.raw("items");
        ctx.error(
            &obj.path().key("items"),
            "missing: expected a non-empty array of items",
        );
        return None;
    }
    let raw = obj.raw("items")?;
    if raw.as_array().is_some_and(Vec::is_empty) {
        ctx.error(
            &obj.path().key("items"),
            "must not be empty: a message sequence needs at least one item",
        );
        return None;
    }
    let before = ctx.error_count();
    let items = obj.list(ctx, "items", |ctx, v, p| {
        parse_item(ctx, v, p, step_has_schema, nesting)
    })?;
    let mut seen = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        if !seen.insert(item.id.as_str()) {
            ctx.error(
                &obj.path().key("items").index(i).key("id"),
                format!("duplicate item id {} in this step", quote(&item.id)),
            );
        }
    }
    (ctx.error_count() == before).then_some(items)
}

fn parse_item(
    ctx: &mut Ctx,
    value: &Value,
    path: JsonPath,
    step_has_schema: bool,
    nesting: Nesting,
) -> Option<Item> {
    let mut obj = Obj::new(ctx, value, path, "an item")?;
    let type_raw = obj.raw("type");
    if type_raw.and_then(Value::as_str) == Some("code") {
        // Do not list the code item's own keys as unknown: the one thing to do is migrate.
        let id = value.get("id").and_then(Value::as_str).unwrap_or("?");
        let how = match nesting {
            Nesting::Top => format!(
                "run the migration {CODE_ITEM_MIGRATION} (`trellis migrate WORKSPACE`) to turn it into a scripted regular step"
            ),
            Nesting::Orphan | Nesting::Route => format!(
                "{CODE_ITEM_MIGRATION} cannot convert code inside {}: move the script to a standalone regular step with declared_execution_mode \"scripted\"",
                if nesting == Nesting::Orphan {
                    "an orphan step"
                } else {
                    "a route's sub-agent step"
                }
            ),
        };
        ctx.error(
            &obj.path().key("type"),
            format!(
                "legacy \"code\" item {} is not supported since contract v1.0.10: {how}",
                quote(id)
            ),
        );
        return None;
    }
    let id = obj.req_str(ctx, "id", "the item id, unique within the step");
    let title = obj.str(ctx, "title");
    let kind = obj.one_of(ctx, "kind", ITEM_KINDS);
    let type_name = match type_raw {
        None => {
            ctx.error(
                &obj.path().key("type"),
                "missing: expected one of \"user_message\", \"foreach\", \"prevalidation\"",
            );
            None
        }
        Some(Value::String(t)) => enum_value(ctx, &obj.path().key("type"), t, ITEM_TYPES),
        Some(other) => {
            ctx.error(
                &obj.path().key("type"),
                format!("expected a string, found {}", kind_of(other)),
            );
            None
        }
    };
    if type_name.is_none() {
        for (_, keys) in ITEM_TYPE_KEYS {
            obj.accept(keys);
        }
    }
    if let Some(t) = type_name {
        let own = ITEM_TYPE_KEYS
            .iter()
            .find(|(n, _)| *n == t)
            .map(|(_, k)| *k)
            .unwrap_or(&[]);
        for (other, keys) in ITEM_TYPE_KEYS {
            for key in keys.iter().filter(|k| !own.contains(k)) {
                if obj.has(key) {
                    obj.accept(&[key]);
                    ctx.error(
                        &obj.path().key(key),
                        format!("applies to {other} items, not to a {t} item"),
                    );
                }
            }
        }
    }
    let body = match type_name {
        Some("user_message") => {
            let message = obj.req_str(ctx, "message", "the user message");
            let write_access = parse_write_access(ctx, &mut obj);
            message.map(|message| ItemBody::UserMessage {
                message,
                write_access,
            })
        }
        Some("foreach") => {
            let source_sql = obj.req_str(ctx, "source_sql", "read-only SQL against db/db.sqlite");
            let message = obj.req_str(ctx, "message", "the message template rendered per row");
            let max_iterations = obj.u64(ctx, "max_iterations");
            if max_iterations == Some(0) {
                ctx.error(
                    &obj.path().key("max_iterations"),
                    "must be greater than 0 (leave it out for no cap)",
                );
            }
            let write_access = parse_write_access(ctx, &mut obj);
            match (source_sql, message) {
                (Some(source_sql), Some(message)) => Some(ItemBody::Foreach {
                    source_sql,
                    message,
                    max_iterations,
                    write_access,
                }),
                _ => None,
            }
        }
        Some(_) => {
            let validation_schema = obj
                .raw("validation_schema")
                .and_then(|v| parse_schema(ctx, v, obj.path().key("validation_schema")));
            let prevalidation = obj
                .raw("prevalidation")
                .and_then(|v| parse_schema(ctx, v, obj.path().key("prevalidation")));
            if validation_schema.is_none() && prevalidation.is_none() && !step_has_schema {
                ctx.error(
                    obj.path(),
                    "a prevalidation item needs a schema: add \"validation_schema\" to the item or to its step",
                );
            }
            Some(ItemBody::Prevalidation {
                validation_schema,
                prevalidation,
            })
        }
        None => None,
    };
    obj.finish(ctx);
    Some(Item {
        id: id?,
        title,
        kind,
        body: body?,
    })
}

fn parse_write_access(ctx: &mut Ctx, obj: &mut Obj) -> Option<WriteAccess> {
    let v = obj.raw("write_access")?;
    let path = obj.path().key("write_access");
    let mut wa = Obj::new(ctx, v, path.clone(), "write access")?;
    for key in ["path", "paths", "file", "files"] {
        if wa.has(key) {
            wa.accept(&[key]);
            ctx.error(
                &path.key(key),
                "write access is per folder, never per file: remove it and use {\"db\", \"knowledgebase\", \"learnings\"} booleans",
            );
        }
    }
    let access = WriteAccess {
        db: wa.bool(ctx, "db"),
        knowledgebase: wa.bool(ctx, "knowledgebase"),
        learnings: wa.bool(ctx, "learnings"),
    };
    wa.finish(ctx);
    Some(access)
}

fn parse_routes(ctx: &mut Ctx, obj: &mut Obj) -> Vec<PredefinedRoute> {
    let routes = obj
        .list(ctx, "predefined_routes", |ctx, v, p| {
            let mut r = Obj::new(ctx, v, p, "a route")?;
            let route_id = r.req_str(ctx, "route_id", "the route id, equal to sub_agent_step.id");
            let route_name = r.str(ctx, "route_name");
            let condition = r.str(ctx, "condition");
            let sub = if r.has("sub_agent_step") {
                let raw = r.raw("sub_agent_step")?;
                parse_step(ctx, raw, r.path().key("sub_agent_step"), Nesting::Route)
            } else {
                r.raw("sub_agent_step");
                ctx.error(
                    &r.path().key("sub_agent_step"),
                    "missing: expected the message_sequence step the route runs",
                );
                None
            };
            if let Some(s) = &sub
                && !matches!(s.kind, StepKind::MessageSequence(_))
            {
                ctx.error(
                    &r.path().key("sub_agent_step").key("type"),
                    format!(
                        "a sub-agent step must be a message_sequence, found {}",
                        quote(s.type_name())
                    ),
                );
            }
            if let (Some(rid), Some(s)) = (&route_id, &sub)
                && *rid != s.id
            {
                ctx.error(
                    &r.path().key("route_id"),
                    format!(
                        "must equal sub_agent_step.id ({}), found {}",
                        quote(&s.id),
                        quote(rid)
                    ),
                );
            }
            r.finish(ctx);
            Some(PredefinedRoute {
                route_id: route_id?,
                route_name,
                condition,
                sub_agent_step: Box::new(sub?),
            })
        })
        .unwrap_or_default();
    let mut seen = HashSet::new();
    for (i, r) in routes.iter().enumerate() {
        if !seen.insert(r.route_id.clone()) {
            ctx.error(
                &obj.path().key("predefined_routes").index(i).key("route_id"),
                format!("duplicate route id {}", quote(&r.route_id)),
            );
        }
    }
    routes
}

fn parse_routing(ctx: &mut Ctx, obj: &mut Obj) -> Option<Routing> {
    let routes = if obj.has("routes") {
        obj.list(ctx, "routes", |ctx, v, p| {
            let mut r = Obj::new(ctx, v, p, "a route")?;
            let route_id = r.req_str(ctx, "route_id", "the value of select_route that picks it");
            let route_name = r.str(ctx, "route_name");
            let condition = r.str(ctx, "condition");
            let next = r.req_str(ctx, "next_step_id", "the step the route goes to");
            r.finish(ctx);
            Some(Route {
                route_id: route_id?,
                route_name,
                condition,
                next_step_id: next?,
            })
        })
    } else {
        obj.raw("routes");
        ctx.error(
            &obj.path().key("routes"),
            "missing: expected an array of routes {route_id, route_name, condition, next_step_id}",
        );
        None
    };
    let default_route_id = obj.str(ctx, "default_route_id");
    let route_source_file = obj.str(ctx, "route_source_file");
    if let Some(f) = &route_source_file
        && let Err(why) = crate::store::check_relative(f)
    {
        ctx.error(&obj.path().key("route_source_file"), why);
    }
    let routing_question = obj.str(ctx, "routing_question");
    let routes = routes?;
    let mut seen = HashSet::new();
    for (i, r) in routes.iter().enumerate() {
        if !seen.insert(r.route_id.as_str()) {
            ctx.error(
                &obj.path().key("routes").index(i).key("route_id"),
                format!("duplicate route id {}", quote(&r.route_id)),
            );
        }
    }
    if let Some(d) = &default_route_id
        && !routes.iter().any(|r| &r.route_id == d)
    {
        let hint = did_you_mean(d, routes.iter().map(|r| r.route_id.as_str()))
            .map(|c| format!(" (did you mean \"{c}\"?)"))
            .unwrap_or_default();
        ctx.error(
            &obj.path().key("default_route_id"),
            format!("names no route of this step: {}{hint}", quote(d)),
        );
    }
    Some(Routing {
        routes,
        default_route_id,
        route_source_file,
        routing_question,
    })
}

fn parse_human_input(ctx: &mut Ctx, obj: &mut Obj) -> Option<HumanInput> {
    let question = obj.str(ctx, "question");
    let variable_name = obj.str(ctx, "variable_name");
    let response_type = obj.one_of(ctx, "response_type", RESPONSE_TYPES);
    let options = obj.str_list(ctx, "options");
    let if_yes_next_step_id = obj.str(ctx, "if_yes_next_step_id");
    let if_no_next_step_id = obj.str(ctx, "if_no_next_step_id");
    let option_routes = match obj.raw("option_routes") {
        None => None,
        Some(Value::Object(m)) => {
            let mut out = BTreeMap::new();
            for (k, v) in m {
                match v {
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    other => ctx.error(
                        &obj.path().key("option_routes").key(k),
                        format!("expected a step id (a string), found {}", kind_of(other)),
                    ),
                }
                if let Some(opts) = &options
                    && !opts.contains(k)
                {
                    ctx.error(
                        &obj.path().key("option_routes").key(k),
                        format!("names no entry of \"options\": {}", quote(k)),
                    );
                }
            }
            Some(out)
        }
        Some(other) => {
            ctx.error(
                &obj.path().key("option_routes"),
                format!(
                    "expected an object mapping each option to a step id, found {}",
                    kind_of(other)
                ),
            );
            None
        }
    };
    if response_type == Some(ResponseType::MultipleChoice)
        && options.as_ref().is_none_or(Vec::is_empty)
    {
        ctx.error(
            &obj.path().key("options"),
            "a multiple_choice question needs a non-empty array of options",
        );
    }
    Some(HumanInput {
        question,
        variable_name,
        response_type,
        options,
        if_yes_next_step_id,
        if_no_next_step_id,
        option_routes,
    })
}

/// Checks what can only be seen with the whole plan: unique step ids and step references.
fn check_references(ctx: &mut Ctx, value: &Value, plan: &Plan) {
    let mut ids: Vec<&str> = Vec::new();
    let lists = [("steps", &plan.steps), ("orphan_steps", &plan.orphan_steps)];
    for (list, steps) in lists {
        for s in steps.iter() {
            if ids.contains(&s.id.as_str()) {
                let i = index_of(value, list, &s.id).unwrap_or(0);
                let outer = ctx.set_step(Some(s.id.clone()));
                ctx.error(
                    &JsonPath::root().key(list).index(i).key("id"),
                    format!("duplicate step id {}", quote(&s.id)),
                );
                ctx.set_step(outer);
            }
            ids.push(&s.id);
        }
    }
    let raw_ids: Vec<&str> = ["steps", "orphan_steps"]
        .iter()
        .filter_map(|list| value.get(*list).and_then(Value::as_array))
        .flatten()
        .filter_map(|step| step.get("id").and_then(Value::as_str))
        .collect();
    for (list, steps) in lists {
        for (i, s) in steps.iter().enumerate() {
            let path = JsonPath::root().key(list).index(i);
            let outer = ctx.set_step(Some(s.id.clone()));
            let mut refs: Vec<(JsonPath, &str)> = Vec::new();
            if let Some(n) = &s.next_step_id {
                refs.push((path.key("next_step_id"), n));
            }
            match &s.kind {
                StepKind::Routing(r) => {
                    for (j, route) in r.routes.iter().enumerate() {
                        refs.push((
                            path.key("routes").index(j).key("next_step_id"),
                            &route.next_step_id,
                        ));
                    }
                }
                StepKind::HumanInput(h) => {
                    if let Some(n) = &h.if_yes_next_step_id {
                        refs.push((path.key("if_yes_next_step_id"), n));
                    }
                    if let Some(n) = &h.if_no_next_step_id {
                        refs.push((path.key("if_no_next_step_id"), n));
                    }
                    for (k, n) in h.option_routes.iter().flatten() {
                        refs.push((path.key("option_routes").key(k), n));
                    }
                }
                _ => {}
            }
            for (p, target) in refs {
                // A step that failed to parse still exists: its own errors are reported,
                // references to it are not errors on top of them.
                if target != END
                    && !target.is_empty()
                    && !ids.contains(&target)
                    && !raw_ids.contains(&target)
                {
                    let hint = did_you_mean(target, ids.iter().copied())
                        .map(|c| format!(" (did you mean \"{c}\"?)"))
                        .unwrap_or_default();
                    ctx.error(
                        &p,
                        format!(
                            "names no step of the plan: {}{hint}; use a step id or \"end\"",
                            quote(target)
                        ),
                    );
                }
            }
            ctx.set_step(outer);
        }
    }
}

/// The index of the last step with `id` in `value[list]` (the duplicate is the later one).
fn index_of(value: &Value, list: &str, id: &str) -> Option<usize> {
    value
        .get(list)?
        .as_array()?
        .iter()
        .rposition(|s| s.get("id").and_then(Value::as_str) == Some(id))
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
