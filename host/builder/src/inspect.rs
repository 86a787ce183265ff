//! The original system's read tools that Trellis had no tool of its own for, in every mode:
//! `get_workflow_config` (an alias of `read_workflow_config`), `get_llm_config` (the models
//! of the builder, the tiers and every step), `get_step_prompts` (what a step's agent is or
//! was told), `validate_plan_change` (the original's invariant check of a finished plan
//! change) and `review_step_code` (each scripted step's description beside its script).
//!
//! Nothing here writes a file. `get_step_prompts` of a step that has not run builds its
//! system prompt as the run would, which creates the step's empty run folders
//! (`runs/iteration-0/execution/<step>/`) as a run does; it reads everything else.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};

use trellis_sandbox::store::Kind;
use trellis_workflow::{StepKind, Workspace};

use super::executions::known_step;
use super::reads::{check_args, strict};
use super::{ToolContext, ToolFailure, ToolResult, ToolSpec};
use trellis_runner::llm_choice::step_models;
use trellis_runner::session::{logs_dir, turn_log_dirs};

/// Characters of a script `review_step_code` shows.
pub const SCRIPT_CHARS: usize = 12_000;
/// Characters of a prompt `get_step_prompts` shows.
pub const PROMPT_CHARS: usize = 40_000;
/// Occurrences of forbidden references one `validate_plan_change` counts at most.
const MAX_COUNTED_MATCHES: usize = 100_000;
/// Workspace files `validate_plan_change` searches for forbidden references.
const CHECKED_FILES: [&str; 4] = [
    "planning/plan.json",
    "planning/step_config.json",
    "workflow.json",
    "variables/variables.json",
];

/// The specs of the tools.
pub fn specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_workflow_config",
            description: "The same as read_workflow_config: workflow.json and the variables \
                          file as written, and the merged variables and groups.",
            parameters: strict(json!({}), &[]),
        },
        ToolSpec {
            name: "get_llm_config",
            description: "The models in force: workflow.json llm (the builder's and the \
                          steps' default), its tiers high, medium, low, and for each step the \
                          model it runs on and why (execution_llm, execution_tier or the \
                          default).",
            parameters: strict(json!({}), &[]),
        },
        ToolSpec {
            name: "get_step_prompts",
            description: "What a step's agent is told: from its turn logs when it has run \
                          (the system prompt and first user message of the turn given, else of \
                          the latest), else as the next run would tell it (system prompt and \
                          items).",
            parameters: strict(
                json!({
                    "step_id": {"type": "string", "description": "The step (id or 1-based position)."},
                    "route_id": {"type": "string", "description": "With a todo_task or sequence step: the step of this route."},
                    "attempt": {"type": "integer", "minimum": 1},
                    "iteration": {"type": "integer", "minimum": 0}
                }),
                &["step_id"],
            ),
        },
        ToolSpec {
            name: "validate_plan_change",
            description: "Checks a finished plan change, writing nothing: no \
                          forbidden_references (removed step ids, old paths, retired fields) \
                          left in the plan, the step configs, workflow.json or the variables; \
                          each step of expected_context_dependencies has exactly those. \
                          Answers passed and the failures.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "forbidden_references": {"type": "array", "maxItems": 256,
                        "items": {"type": "string", "minLength": 1, "maxLength": 1024}},
                    "expected_context_dependencies": {"type": "object", "maxProperties": 256,
                        "additionalProperties": {"type": "array", "maxItems": 10000,
                            "items": {"type": "string", "maxLength": 1024}}}
                },
                "anyOf": [{"required": ["forbidden_references"]},
                          {"required": ["expected_context_dependencies"]}],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "review_step_code",
            description: "For each scripted step (or the one given): its description and \
                          outputs beside its code/<step>/main.py, to check the script still \
                          does what the description says. Read-only; focus is echoed back.",
            parameters: strict(
                json!({
                    "step_id": {"type": "string"},
                    "focus": {"type": "string"}
                }),
                &[],
            ),
        },
    ]
}

/// Calls tool `name`.
pub async fn call(ctx: &ToolContext<'_>, name: &str, args: &Value) -> ToolResult {
    let spec = specs()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ToolFailure::new(format!("{name:?} is not an inspection tool")))?;
    check_args(&spec, args)?;
    match name {
        "get_workflow_config" => super::reads::call(ctx, "read_workflow_config", &json!({})).await,
        "get_llm_config" => llm_config(ctx.root),
        "get_step_prompts" => step_prompts(ctx, args),
        "validate_plan_change" => validate_plan_change(ctx, args),
        "review_step_code" => review_step_code(ctx, args),
        _ => Err(ToolFailure::new(format!(
            "{name:?} is not an inspection tool"
        ))),
    }
}

fn open(root: &Path) -> Result<Workspace, ToolFailure> {
    Workspace::open(root).map_err(|d| ToolFailure::new(format!("the workspace has errors:\n{d}")))
}

fn llm_config(root: &Path) -> ToolResult {
    let ws = open(root)?;
    let steps: Vec<Value> = ws
        .plan
        .all_steps()
        .map(|step| {
            let configs = ws.agent_configs(&step.id);
            match step_models(&ws, &step.id, None) {
                Ok(Some(m)) => json!({
                    "step_id": step.id,
                    "source": m.source.to_string(),
                    "models": m.models.iter().map(|l| format!("{}:{}", l.provider, l.model_id)).collect::<Vec<_>>(),
                    "execution_tier": configs.execution_tier.map(|t| format!("{t:?}").to_ascii_lowercase()),
                }),
                Ok(None) => json!({"step_id": step.id, "models": [], "source": "none"}),
                Err(e) => json!({"step_id": step.id, "error": format!("{e:#}")}),
            }
        })
        .collect();
    Ok(json!({
        "llm": ws.manifest.llm,
        "builder_llm": ws.manifest.llm,
        "tiers": ws.manifest.tiers,
        "steps": steps,
    }))
}

/// The first 100 of `items`, and how many more there are.
fn listed(items: &[&str]) -> Value {
    const SHOWN: usize = 100;
    if items.len() <= SHOWN {
        return json!(items);
    }
    json!({"first": &items[..SHOWN], "more": items.len() - SHOWN})
}

fn cut(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_string();
    }
    let mut out: String = text.chars().take(chars).collect();
    out.push_str("\n[... cut]");
    out
}

fn step_prompts(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let root = ctx.root;
    let ws = open(root)?;
    let step = known_step(&ws, args["step_id"].as_str().unwrap_or_default())?;
    let step = match args.get("route_id").and_then(Value::as_str) {
        None => step,
        Some(route) => {
            let routes = step.predefined_routes();
            match routes.iter().find(|r| r.route_id == route) {
                Some(r) => &r.sub_agent_step,
                None => {
                    let ids: Vec<&str> = routes.iter().map(|r| r.route_id.as_str()).collect();
                    return Err(ToolFailure::new(format!(
                        "step {:?} has no route {route:?} (its routes: {})",
                        step.id,
                        if ids.is_empty() {
                            "none".to_string()
                        } else {
                            ids.join(", ")
                        }
                    )));
                }
            }
        }
    };
    let items: Vec<Value> = step
        .effective_items()
        .iter()
        .map(|i| serde_json::to_value(i).unwrap_or(Value::Null))
        .collect();
    if let Some(logged) = logged_prompts(ctx, &step.id, args)? {
        let mut answer = logged;
        answer["step_id"] = json!(step.id);
        answer["items"] = json!(items);
        return Ok(answer);
    }
    let system = trellis_runner::driver::step_system_prompt(&ws, &step.id)
        .map(|s| cut(&s, PROMPT_CHARS))
        .unwrap_or_else(|e| format!("(not built here: {e:#})"));
    Ok(json!({
        "step_id": step.id,
        "source": "as the next run tells it (no turn logged yet)",
        "system_prompt": system,
        "items": items,
    }))
}

/// The system prompt and first user message of a logged turn of `step`: the one `args`
/// names, else the latest; `None` when it has none.
fn logged_prompts(
    ctx: &ToolContext<'_>,
    step: &str,
    args: &Value,
) -> Result<Option<Value>, ToolFailure> {
    let root = ctx.root;
    let fs = ctx.fs()?;
    let logs = logs_dir(&root.join("runs").join(super::reads::ACTIVE_RUN), step);
    let want = (
        args.get("attempt").and_then(Value::as_u64),
        args.get("iteration").and_then(Value::as_u64),
    );
    let mut best: Option<((u64, u64), std::path::PathBuf)> = None;
    for dir in turn_log_dirs(&logs) {
        if fs.kind(&dir).ok().flatten() != Some(Kind::Dir) {
            continue;
        }
        for (name, kind) in fs.list(&dir).map_err(|e| ToolFailure::new(e.to_string()))? {
            let Some(rest) = name
                .strip_prefix("execution-attempt-")
                .and_then(|r| r.strip_suffix("-conversation.json"))
            else {
                continue;
            };
            let Some((a, i)) = rest.split_once("-iteration-") else {
                continue;
            };
            let (Ok(a), Ok(i)) = (a.parse::<u64>(), i.parse::<u64>()) else {
                continue;
            };
            if kind != Kind::File
                || want.0.is_some_and(|w| w != a)
                || want.1.is_some_and(|w| w != i)
            {
                continue;
            }
            if best.as_ref().is_none_or(|(k, _)| (a, i) > *k) {
                best = Some(((a, i), dir.join(&name)));
            }
        }
    }
    let Some(((attempt, iteration), path)) = best else {
        return Ok(None);
    };
    let conv = fs
        .read_json_value(&path)
        .map_err(|e| ToolFailure::new(format!("reading a turn log: {e}")))?;
    let messages = conv["messages"].as_array().cloned().unwrap_or_default();
    let text_of = |role: &str| {
        messages
            .iter()
            .find(|m| m["role"] == role)
            .and_then(|m| m["content"].as_str())
            .map(|t| cut(t, PROMPT_CHARS))
    };
    Ok(Some(json!({
        "source": "turn log",
        "log": path.strip_prefix(root).unwrap_or(&path).to_string_lossy(),
        "attempt": attempt,
        "iteration": iteration,
        "system_prompt": text_of("system"),
        "user_message": text_of("user"),
    })))
}

fn validate_plan_change(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let root = ctx.root;
    let fs = ctx.fs()?;
    let mut failures = Vec::new();
    let forbidden: Vec<&str> = args["forbidden_references"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut files: Vec<String> = CHECKED_FILES.iter().map(|f| f.to_string()).collect();
    // The run folders' own step configs win in their runs: they are artifacts of the plan too.
    if let Ok(entries) = fs.list("runs") {
        for (run, kind) in entries {
            if kind == Kind::Dir {
                files.push(format!("runs/{run}/planning/step_config.json"));
            }
        }
    }
    if !forbidden.is_empty() {
        // One pass over each file finds every reference; the call's reads and deadline
        // bound the files, and MAX_COUNTED_MATCHES the counting.
        let searcher = aho_corasick::AhoCorasick::new(&forbidden)
            .map_err(|e| ToolFailure::new(format!("forbidden_references: {e}")))?;
        let mut counted = 0usize;
        for file in &files {
            if fs.kind(file).ok().flatten() != Some(Kind::File) {
                continue;
            }
            let text = match fs.read(file) {
                Ok(text) => text,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::QuotaExceeded | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    failures.push(json!({"check": "not_checked", "file": file,
                                         "error": e.to_string()}));
                    break;
                }
                Err(_) => continue,
            };
            let mut counts = vec![0usize; forbidden.len()];
            for found in searcher.find_overlapping_iter(&text) {
                counts[found.pattern().as_usize()] += 1;
                counted += 1;
                if counted >= MAX_COUNTED_MATCHES {
                    break;
                }
            }
            for (reference, count) in forbidden.iter().zip(counts) {
                if count > 0 {
                    failures.push(
                        json!({"check": "forbidden_reference", "reference": reference,
                                         "file": file, "occurrences": count}),
                    );
                }
            }
            if counted >= MAX_COUNTED_MATCHES {
                failures.push(
                    json!({"check": "not_checked", "file": file, "error": format!(
                    "{MAX_COUNTED_MATCHES} occurrences counted: the rest of this file and the \
                     files after it are not searched")}),
                );
                break;
            }
        }
    }
    if let Some(expected) = args["expected_context_dependencies"].as_object() {
        let ws = open(root)?;
        for (step_id, want) in expected {
            let want: Vec<&str> = want
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let Some(step) = ws.plan.find_step(step_id) else {
                failures.push(json!({"check": "context_dependencies", "step_id": step_id,
                                     "error": "no such step in the plan"}));
                continue;
            };
            ctx.check_time()?;
            let have: Vec<&str> = step
                .context_dependencies
                .iter()
                .flatten()
                .map(String::as_str)
                .collect();
            if have != want {
                // Sets: a step of 150,000 dependencies compared pairwise took 262 s.
                let (have_set, want_set): (BTreeSet<&str>, BTreeSet<&str>) = (
                    have.iter().copied().collect(),
                    want.iter().copied().collect(),
                );
                let missing: Vec<&str> = want_set.difference(&have_set).copied().collect();
                let extra: Vec<&str> = have_set.difference(&want_set).copied().collect();
                // The lists themselves are the model's and the plan's: the answer names how
                // many, and the differences (cut).
                failures.push(json!({"check": "context_dependencies", "step_id": step_id,
                                     "expected_count": want.len(), "actual_count": have.len(),
                                     "missing": listed(&missing), "extra": listed(&extra),
                                     "same_set": missing.is_empty() && extra.is_empty()}));
            }
        }
    }
    Ok(json!({"passed": failures.is_empty(), "failures": failures, "files_checked": files}))
}

fn review_step_code(ctx: &ToolContext<'_>, args: &Value) -> ToolResult {
    let ws = open(ctx.root)?;
    let only = args.get("step_id").and_then(Value::as_str);
    let steps: Vec<&trellis_workflow::Step> = match only {
        Some(id) => vec![known_step(&ws, id)?],
        None => ws
            .plan
            .all_steps()
            .filter(|s| {
                matches!(s.kind, StepKind::Regular) && ws.agent_configs(&s.id).is_scripted()
            })
            .collect(),
    };
    let fs = ctx.fs()?;
    let reviewed: Vec<Value> = steps
        .iter()
        .map(|step| {
            let rel = format!("code/{}/main.py", step.id);
            let script = match fs.kind(&rel).ok().flatten() {
                // A script longer than what is shown is read only as far as it is shown.
                Some(Kind::File) => fs
                    .read_head(&rel, SCRIPT_CHARS as u64 * 4)
                    .map(|(head, len)| {
                        let text = String::from_utf8_lossy(&head);
                        let shown = cut(&text, SCRIPT_CHARS);
                        if (head.len() as u64) < len && shown.len() == text.len() {
                            json!(format!("{shown}\n[... cut]"))
                        } else {
                            json!(shown)
                        }
                    })
                    .unwrap_or_else(|e| json!(format!("(cannot be read: {e})"))),
                Some(_) => json!("(not a regular file: not read)"),
                None => Value::Null,
            };
            json!({
                "step_id": step.id,
                "title": step.title,
                "description": step.description,
                "context_output": step.context_output,
                "validation_schema": step.validation_schema,
                "scripted": ws.agent_configs(&step.id).is_scripted(),
                "script_path": rel,
                "script": script,
            })
        })
        .collect();
    let mut answer = json!({"steps": reviewed});
    if let Some(focus) = args.get("focus").and_then(Value::as_str) {
        answer["focus"] = json!(focus);
    }
    if steps.is_empty() {
        answer["note"] = json!("no scripted step in the plan");
    }
    Ok(answer)
}
