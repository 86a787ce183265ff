//! Parsing `step_config.json` entries: the file's two formats, each step's settings and
//! `agent_configs`, and the checks on their fields.

use std::collections::BTreeMap;

use serde_json::Value;

use super::super::diagnostics::{Ctx, JsonPath, Obj, enum_value, kind_of, quote};
use super::*;

pub(super) fn file_from_value(ctx: &mut Ctx, value: &Value) -> Option<StepConfigFile> {
    let mut legacy_format = false;
    let (entries, base) = match value {
        Value::Array(entries) => {
            legacy_format = true;
            ctx.warning(
                &JsonPath::root(),
                "legacy format: a root-level array is read, but the file should be {\"steps\": [...]} (it is written that way on the next save)",
            );
            (entries, JsonPath::root())
        }
        Value::Object(_) => {
            let mut obj = Obj::new(ctx, value, JsonPath::root(), "a step config file")?;
            let steps = obj.raw("steps");
            obj.finish(ctx);
            match steps {
                Some(Value::Array(entries)) => (entries, JsonPath::root().key("steps")),
                Some(other) => {
                    ctx.error(
                        &JsonPath::root().key("steps"),
                        format!(
                            "expected an array of step configs, found {}",
                            kind_of(other)
                        ),
                    );
                    return None;
                }
                None => {
                    ctx.error(
                        &JsonPath::root().key("steps"),
                        "missing: expected an array of step configs (it may be empty)",
                    );
                    return None;
                }
            }
        }
        other => {
            ctx.error(
                &JsonPath::root(),
                format!(
                    "expected {{\"steps\": [...]}} (an object), found {}",
                    kind_of(other)
                ),
            );
            return None;
        }
    };
    let mut steps = Vec::with_capacity(entries.len());
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let path = base.index(i);
        let Some(config) = parse_entry(ctx, entry, path.clone()) else {
            continue;
        };
        let id = entry.get("id").and_then(Value::as_str).unwrap_or_default();
        if !seen.insert(id) {
            let outer = ctx.set_step(Some(id.to_string()));
            ctx.error(
                &path.key("id"),
                format!(
                    "duplicate step config id {}: each step has one entry",
                    quote(id)
                ),
            );
            ctx.set_step(outer);
        }
        steps.push(config);
    }
    Some(StepConfigFile {
        steps,
        legacy_format,
    })
}

pub(super) fn parse_entry(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<StepConfig> {
    let mut obj = Obj::new(ctx, value, path, "a step config")?;
    let id = obj.req_str(ctx, "id", "the id of the plan step");
    let outer = ctx.set_step(id.clone());
    let title = obj.str(ctx, "title");
    let agent_configs = obj
        .raw("agent_configs")
        .and_then(|v| parse_agent_configs(ctx, v, obj.path().key("agent_configs")));
    let validation_schema = obj
        .raw("validation_schema")
        .and_then(|v| parse_schema(ctx, v, obj.path().key("validation_schema")));
    obj.finish(ctx);
    ctx.set_step(outer);
    Some(StepConfig {
        id: id?,
        title,
        agent_configs,
        validation_schema,
    })
}

/// Like [`Obj::one_of`], but the original wrote `""` for "unset": treat it as absent.
pub(super) fn opt_enum<T: Copy>(
    ctx: &mut Ctx,
    obj: &mut Obj,
    key: &'static str,
    allowed: &[(&'static str, T)],
) -> Option<T> {
    let s = obj.str(ctx, key)?;
    if s.is_empty() {
        return None;
    }
    enum_value(ctx, &obj.path().key(key), &s, allowed)
}

/// A `replay` model id names a cassette file of the workspace: one plain name.
fn check_replay_id(ctx: &mut Ctx, obj: &Obj, provider: Option<&str>, model_id: Option<&str>) {
    if provider == Some("replay")
        && let Some(id) = model_id
        && let Err(problem) = trellis_sandbox::llm::record::check_replay_model_id(id)
    {
        ctx.error(&obj.path().key("model_id"), problem);
    }
}

pub(crate) fn parse_llm_ref(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<LlmRef> {
    let mut obj = Obj::new(ctx, value, path, "a model choice")?;
    let provider = obj.req_str(ctx, "provider", "the LLM provider id");
    let model_id = obj.req_str(ctx, "model_id", "the provider's model id");
    check_replay_id(ctx, &obj, provider.as_deref(), model_id.as_deref());
    let options = obj.object(ctx, "options");
    let published_llm_id = obj.str(ctx, "published_llm_id");
    obj.finish(ctx);
    Some(LlmRef {
        provider: provider?,
        model_id: model_id?,
        options,
        published_llm_id,
    })
}

pub(super) fn parse_execution_llm(
    ctx: &mut Ctx,
    value: &Value,
    path: JsonPath,
) -> Option<ExecutionLlm> {
    let mut obj = Obj::new(ctx, value, path, "a model choice")?;
    let published_llm_id = obj.str(ctx, "published_llm_id");
    let (provider, model_id) = if published_llm_id.is_some() {
        (obj.str(ctx, "provider"), obj.str(ctx, "model_id"))
    } else {
        (
            obj.req_str(ctx, "provider", "the LLM provider id"),
            obj.req_str(ctx, "model_id", "the provider's model id"),
        )
    };
    check_replay_id(ctx, &obj, provider.as_deref(), model_id.as_deref());
    let options = obj.object(ctx, "options");
    let fallbacks = obj
        .list(ctx, "fallbacks", parse_llm_ref)
        .unwrap_or_default();
    obj.finish(ctx);
    Some(ExecutionLlm {
        provider,
        model_id,
        options,
        fallbacks,
        published_llm_id,
    })
}

/// Tool categories of the original that Trellis does not have, and what it offers instead.
pub(crate) const ORIGINAL_TOOL_CATEGORIES: &[(&str, &str)] = &[
    (
        "workspace_browser",
        "Trellis has no browser tools: use the tools of an MCP server (selected_servers), or \
         fetch pages in a scripted step with trellis_http (allowed_hosts)",
    ),
    (
        "human_tools",
        "a Trellis turn cannot ask a person: put the question in a human_input step (answered \
         with --input NAME=VALUE)",
    ),
];

/// A warning for each entry of a tool list (`category:tool`, `category:*` or a bare
/// category) naming a category of the original that Trellis does not have.
pub(crate) fn original_tool_categories(ctx: &mut Ctx, path: &JsonPath, entries: &[String]) {
    for (i, entry) in entries.iter().enumerate() {
        let category = entry.split(':').next().unwrap_or_default().trim();
        if let Some((name, instead)) = ORIGINAL_TOOL_CATEGORIES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(category))
        {
            ctx.warning(
                &path.index(i),
                format!("the original's tool category \"{name}\" is not offered: {instead}"),
            );
        }
    }
}

/// The `server:tool` / `category:tool` form of tool filters.
pub(super) fn check_tool_names(
    ctx: &mut Ctx,
    obj: &Obj,
    key: &str,
    names: &Option<Vec<String>>,
    what: &str,
) {
    for (i, n) in names.iter().flatten().enumerate() {
        let ok = n
            .split_once(':')
            .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty());
        if !ok {
            ctx.error(
                &obj.path().key(key).index(i),
                format!(
                    "expected \"{what}:tool\" or \"{what}:*\", found {}",
                    quote(n)
                ),
            );
        }
    }
}

pub(super) fn parse_agent_configs(
    ctx: &mut Ctx,
    value: &Value,
    path: JsonPath,
) -> Option<AgentConfigs> {
    let mut obj = Obj::new(ctx, value, path, "agent configs")?;
    let mut c = AgentConfigs {
        selected_servers: obj.str_list(ctx, "selected_servers"),
        selected_tools: obj.str_list(ctx, "selected_tools"),
        enabled_custom_tools: obj.str_list(ctx, "enabled_custom_tools"),
        enabled_custom_tool_categories: obj.str_list(ctx, "enabled_custom_tool_categories"),
        execution_llm: obj
            .raw("execution_llm")
            .and_then(|v| parse_execution_llm(ctx, v, obj.path().key("execution_llm"))),
        execution_llm_reason: obj.str(ctx, "execution_llm_reason"),
        execution_tier: opt_enum(
            ctx,
            &mut obj,
            "execution_tier",
            &[
                ("high", ExecutionTier::High),
                ("medium", ExecutionTier::Medium),
                ("low", ExecutionTier::Low),
            ],
        ),
        execution_tier_reason: obj.str(ctx, "execution_tier_reason"),
        use_code_execution_mode: obj.bool(ctx, "use_code_execution_mode"),
        declared_execution_mode: opt_enum(
            ctx,
            &mut obj,
            "declared_execution_mode",
            &[
                ("scripted", ExecutionMode::Scripted),
                ("agentic", ExecutionMode::Agentic),
            ],
        ),
        learnings_access: opt_enum(
            ctx,
            &mut obj,
            "learnings_access",
            &[
                ("read", LearningsAccess::Read),
                ("read-write", LearningsAccess::ReadWrite),
                ("none", LearningsAccess::None),
            ],
        ),
        learning_objective: obj.str(ctx, "learning_objective"),
        learning_detail_level: opt_enum(
            ctx,
            &mut obj,
            "learning_detail_level",
            &[
                ("exact", LearningDetailLevel::Exact),
                ("general", LearningDetailLevel::General),
                ("none", LearningDetailLevel::None),
            ],
        ),
        knowledgebase_access: opt_enum(
            ctx,
            &mut obj,
            "knowledgebase_access",
            &[
                ("read", KnowledgebaseAccess::Read),
                ("write", KnowledgebaseAccess::Write),
                ("read-write", KnowledgebaseAccess::ReadWrite),
                ("none", KnowledgebaseAccess::None),
            ],
        ),
        knowledgebase_contribution: obj.str(ctx, "knowledgebase_contribution"),
        additional_read_paths: obj.str_list(ctx, "additional_read_paths"),
        allowed_hosts: obj.str_list(ctx, "allowed_hosts"),
        disable_parallel_tool_execution: obj.bool(ctx, "disable_parallel_tool_execution"),
        disable_validation: obj.bool(ctx, "disable_validation"),
        llm_validation_mode: opt_enum(
            ctx,
            &mut obj,
            "llm_validation_mode",
            &[
                ("skip", LlmValidationMode::Skip),
                ("auto", LlmValidationMode::Auto),
                ("always", LlmValidationMode::Always),
            ],
        ),
        enable_prerequisite_detection: obj.bool(ctx, "enable_prerequisite_detection"),
        prerequisite_rules: obj.list(ctx, "prerequisite_rules", |ctx, v, p| {
            let mut r = Obj::new(ctx, v, p, "a prerequisite rule")?;
            let depends_on_step =
                r.req_str(ctx, "depends_on_step", "the step the run goes back to");
            let description = r.str(ctx, "description");
            r.finish(ctx);
            Some(PrerequisiteRule {
                depends_on_step: depends_on_step?,
                description,
            })
        }),
        enable_context_offloading: obj.bool(ctx, "enable_context_offloading"),
        lock_code: obj.bool(ctx, "lock_code"),
        lock_learnings: obj.bool(ctx, "lock_learnings"),
        lock_learnings_reason: obj.str(ctx, "lock_learnings_reason"),
        disable_learning: obj.bool(ctx, "disable_learning"),
        enabled_skills: obj.str_list(ctx, "enabled_skills"),
        bookkeeping: BTreeMap::new(),
    };
    check_tool_names(ctx, &obj, "selected_tools", &c.selected_tools, "server");
    check_tool_names(
        ctx,
        &obj,
        "enabled_custom_tools",
        &c.enabled_custom_tools,
        "category",
    );
    for (key, list) in [
        ("enabled_custom_tools", &c.enabled_custom_tools),
        (
            "enabled_custom_tool_categories",
            &c.enabled_custom_tool_categories,
        ),
    ] {
        original_tool_categories(
            ctx,
            &obj.path().key(key),
            list.as_deref().unwrap_or_default(),
        );
    }
    for (i, p) in c.enabled_skills.iter().flatten().enumerate() {
        if let Err(why) = trellis_sandbox::store::check_relative(p) {
            ctx.error(&obj.path().key("enabled_skills").index(i), why);
        }
    }
    for (i, p) in c.additional_read_paths.iter().flatten().enumerate() {
        if let Err(why) = trellis_sandbox::store::check_relative(p) {
            ctx.error(&obj.path().key("additional_read_paths").index(i), why);
        }
    }
    for (i, host) in c.allowed_hosts.iter().flatten().enumerate() {
        if let Err(why) = check_host(host) {
            ctx.error(&obj.path().key("allowed_hosts").index(i), why);
        }
    }
    if obj.has("execution_max_turns") {
        ctx.warning(
            &obj.path().key("execution_max_turns"),
            "retired: ignored (one runtime turn limit applies) and dropped when the file is saved",
        );
    }
    if obj.has("db_access") {
        ctx.warning(
            &obj.path().key("db_access"),
            "ignored, as the original ignores it: every turn may query and modify the \
             database unless an item's write_access narrows it",
        );
    }
    obj.accept(&["execution_max_turns"]);
    for key in BOOKKEEPING_KEYS {
        if let Some(v) = obj.raw(key) {
            c.bookkeeping.insert((*key).to_string(), v.clone());
        }
    }
    obj.finish(ctx);
    Some(c)
}

/// An `allowed_hosts` entry: a host name or IP address, optionally with `:port`.
fn check_host(entry: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "expected a host name or IP address, optionally with :port (such as \
             \"api.example.com\"), found {entry:?}: no scheme, path or user name"
        )
    };
    let entry = entry.trim();
    if entry.is_empty() || entry.contains(['/', '@', '?', '#', ' ', '*']) {
        return Err(bad());
    }
    let (host, port) = match entry.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => return Err(bad()),
        },
        None => match entry.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (entry, None),
        },
    };
    if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err(bad());
    }
    Ok(())
}
