//! The types of `routing` and `human_input` steps and of a sequence's predefined
//! (sub-agent) routes, and their parsing.

use super::*;

/// A sub-agent route of a sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct PredefinedRoute {
    /// Equals `sub_agent_step.id` for an inline step.
    pub route_id: String,
    /// A label.
    pub route_name: Option<String>,
    /// When the agent should use it.
    pub condition: Option<String>,
    /// The child step: a `message_sequence`, or a `regular` step (a scripted boundary when
    /// its step config says scripted, else one agent turn). For an `orphan_step_ref` route,
    /// a copy of the orphan step, filled in once the whole plan is read.
    pub sub_agent_step: Box<Step>,
    /// The orphan step the route runs, instead of an inline `sub_agent_step`.
    pub orphan_step_ref: Option<String>,
}

impl Serialize for PredefinedRoute {
    /// The keys it was read from: `orphan_step_ref` instead of the copied step.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("route_id", &self.route_id)?;
        if let Some(n) = &self.route_name {
            map.serialize_entry("route_name", n)?;
        }
        if let Some(c) = &self.condition {
            map.serialize_entry("condition", c)?;
        }
        match &self.orphan_step_ref {
            Some(r) => map.serialize_entry("orphan_step_ref", r)?,
            None => map.serialize_entry("sub_agent_step", &self.sub_agent_step)?,
        }
        map.end()
    }
}

/// A placeholder for the orphan step an `orphan_step_ref` names, until the plan is read.
fn orphan_placeholder(id: &str) -> Step {
    Step {
        id: id.to_string(),
        title: None,
        description: None,
        context_dependencies: None,
        context_output: None,
        validation_schema: None,
        next_step_id: None,
        compat: Default::default(),
        kind: StepKind::Regular,
    }
}

/// Fills every `orphan_step_ref` route (at any depth) with a copy of the orphan step it
/// names; a name that is no orphan step, or an orphan that is not a sub-agent kind, is an
/// error at the route's path.
pub(super) fn resolve_orphan_refs(ctx: &mut Ctx, value: &Value, plan: &mut Plan) {
    let orphans = plan.orphan_steps.clone();
    fn walk(
        ctx: &mut Ctx,
        raw: &Value,
        path: JsonPath,
        step: &mut Step,
        orphans: &[Step],
        depth: usize,
    ) {
        let step_id = step.id.clone();
        let todo_task = matches!(step.kind, StepKind::TodoTask(_));
        let routes = match &mut step.kind {
            StepKind::MessageSequence(s) => &mut s.predefined_routes,
            StepKind::TodoTask(t) => &mut t.predefined_routes,
            _ => return,
        };
        for (i, route) in routes.iter_mut().enumerate() {
            let rpath = path.key("predefined_routes").index(i);
            let rraw = raw
                .get("predefined_routes")
                .and_then(|r| r.get(i))
                .unwrap_or(&Value::Null);
            if let Some(name) = route.orphan_step_ref.clone() {
                match orphans.iter().find(|o| o.id == name) {
                    Some(o) if matches!(o.kind, StepKind::MessageSequence(_) | StepKind::Regular) => {
                        // As the original: an orphan step that says whom it is shared with
                        // serves those todo_task steps only.
                        if let Some(shared) = &o.compat.shared_with
                            && todo_task
                            && !shared.orchestrator_ids.contains(&step_id)
                        {
                            ctx.error(
                                &rpath.key("orphan_step_ref"),
                                format!(
                                    "names the orphan step {}, which is not shared with this \
                                     todo_task step: add {} to its shared_with.orchestrator_ids",
                                    quote(&name),
                                    quote(&step_id)
                                ),
                            );
                        }
                        *route.sub_agent_step = o.clone();
                    }
                    Some(o) => ctx.error(
                        &rpath.key("orphan_step_ref"),
                        format!(
                            "names the orphan step {} of type {}: a sub-agent step must be a message_sequence or a regular step",
                            quote(&name),
                            quote(o.type_name())
                        ),
                    ),
                    None => {
                        let hint = did_you_mean(&name, orphans.iter().map(|o| o.id.as_str()))
                            .map(|c| format!(" (did you mean \"{c}\"?)"))
                            .unwrap_or_default();
                        ctx.error(
                            &rpath.key("orphan_step_ref"),
                            format!("names no orphan step of the plan: {}{hint}", quote(&name)),
                        );
                    }
                }
            } else if depth < 8 {
                let sraw = rraw.get("sub_agent_step").unwrap_or(&Value::Null);
                walk(
                    ctx,
                    sraw,
                    rpath.key("sub_agent_step"),
                    &mut route.sub_agent_step,
                    orphans,
                    depth + 1,
                );
            }
        }
    }
    for (list, steps) in [
        ("steps", &mut plan.steps),
        ("orphan_steps", &mut plan.orphan_steps),
    ] {
        for (i, step) in steps.iter_mut().enumerate() {
            let raw = value
                .get(list)
                .and_then(|l| l.get(i))
                .unwrap_or(&Value::Null);
            let outer = ctx.set_step(Some(step.id.clone()));
            walk(
                ctx,
                raw,
                JsonPath::root().key(list).index(i),
                step,
                &orphans,
                0,
            );
            ctx.set_step(outer);
        }
    }
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

impl ResponseType {
    /// The name used in plans.
    pub fn name(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Yesno => "yesno",
            Self::MultipleChoice => "multiple_choice",
        }
    }
}

pub(super) const RESPONSE_TYPES: &[(&str, ResponseType)] = &[
    ("text", ResponseType::Text),
    ("yesno", ResponseType::Yesno),
    ("multiple_choice", ResponseType::MultipleChoice),
];

pub(super) fn parse_routes(ctx: &mut Ctx, obj: &mut Obj) -> Vec<PredefinedRoute> {
    let routes = obj
        .list(ctx, "predefined_routes", |ctx, v, p| {
            let mut r = Obj::new(ctx, v, p, "a route")?;
            let route_id = r.req_str(ctx, "route_id", "the route id, equal to sub_agent_step.id");
            if let Some(id) = &route_id {
                crate::diagnostics::check_plain_id(
                    ctx,
                    &r.path().key("route_id"),
                    "route id",
                    id,
                );
            }
            let route_name = r.str(ctx, "route_name");
            let condition = r.str(ctx, "condition");
            let orphan_step_ref = r.str(ctx, "orphan_step_ref");
            let sub = if let Some(name) = &orphan_step_ref {
                if r.has("sub_agent_step") {
                    r.raw("sub_agent_step");
                    ctx.error(
                        &r.path().key("sub_agent_step"),
                        "a route names either an inline sub_agent_step or an orphan_step_ref, not both",
                    );
                }
                Some(orphan_placeholder(name))
            } else if r.has("sub_agent_step") {
                let raw = r.raw("sub_agent_step")?;
                parse_step(ctx, raw, r.path().key("sub_agent_step"), Nesting::Route)
            } else {
                r.raw("sub_agent_step");
                ctx.error(
                    &r.path().key("sub_agent_step"),
                    "missing: expected the step the route runs (a message_sequence or a regular step), or an orphan_step_ref",
                );
                None
            };
            if let Some(s) = &sub
                && orphan_step_ref.is_none()
                && !matches!(s.kind, StepKind::MessageSequence(_) | StepKind::Regular)
            {
                ctx.error(
                    &r.path().key("sub_agent_step").key("type"),
                    format!(
                        "a sub-agent step must be a message_sequence or a regular step, found {}",
                        quote(s.type_name())
                    ),
                );
            }
            if let (Some(rid), Some(s)) = (&route_id, &sub)
                && orphan_step_ref.is_none()
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
                orphan_step_ref,
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

pub(super) fn parse_routing(ctx: &mut Ctx, obj: &mut Obj) -> Option<Routing> {
    let routes = if obj.has("routes") {
        obj.list(ctx, "routes", |ctx, v, p| {
            let mut r = Obj::new(ctx, v, p, "a route")?;
            let route_id = r.req_str(ctx, "route_id", "the value of select_route that picks it");
            if let Some(id) = &route_id {
                crate::diagnostics::check_plain_id(ctx, &r.path().key("route_id"), "route id", id);
            }
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
    // The original writes `""` for unset optional fields.
    let default_route_id = obj.str(ctx, "default_route_id").filter(|s| !s.is_empty());
    let route_source_file = obj.str(ctx, "route_source_file").filter(|s| !s.is_empty());
    if let Some(f) = &route_source_file
        && let Err(why) = trellis_sandbox::store::check_relative(f)
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

pub(super) fn parse_human_input(ctx: &mut Ctx, obj: &mut Obj) -> Option<HumanInput> {
    let question = obj.str(ctx, "question");
    // The original writes `""` for unset fields: no variable, a text answer, and for a
    // target the next step in order (as an absent one).
    let variable_name = obj.str(ctx, "variable_name").filter(|s| !s.is_empty());
    if let Some(name) = &variable_name
        && name.len() > crate::manifest::MAX_VARIABLE_NAME
    {
        ctx.error(
            &obj.path().key("variable_name"),
            format!(
                "{} bytes, more than the {} a variable name may have",
                name.len(),
                crate::manifest::MAX_VARIABLE_NAME
            ),
        );
    }
    let response_type = if obj.map().get("response_type").and_then(Value::as_str) == Some("") {
        obj.accept(&["response_type"]);
        None
    } else {
        obj.one_of(ctx, "response_type", RESPONSE_TYPES)
    };
    let options = obj.str_list(ctx, "options");
    let if_yes_next_step_id = obj
        .str(ctx, "if_yes_next_step_id")
        .filter(|s| !s.is_empty());
    let if_no_next_step_id = obj.str(ctx, "if_no_next_step_id").filter(|s| !s.is_empty());
    let option_routes = match obj.raw("option_routes") {
        None => None,
        Some(Value::Object(m)) => {
            let mut out = BTreeMap::new();
            for (k, v) in m {
                match v {
                    // `""`: no route for this option; the answer goes to next_step_id, else
                    // the next step in order (as in the original).
                    Value::String(s) if s.is_empty() => {}
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    other => ctx.error(
                        &obj.path().key("option_routes").key(k),
                        format!("expected a step id (a string), found {}", kind_of(other)),
                    ),
                }
                // An option (any case) or its 0-based index, as the original accepts.
                if let Some(opts) = &options
                    && !opts.iter().any(|o| o.trim().eq_ignore_ascii_case(k.trim()))
                    && !k.parse::<usize>().is_ok_and(|i| i < opts.len())
                {
                    ctx.error(
                        &obj.path().key("option_routes").key(k),
                        format!(
                            "names no entry of \"options\": {} (use an option or its 0-based index)",
                            quote(k)
                        ),
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
