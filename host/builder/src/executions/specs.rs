//! The execution tools as the model is told about them: one strict JSON Schema each, and the
//! check of a call's arguments against it before anything is done.

use serde_json::{Value, json};

use super::super::ToolSpec;

/// A strict object schema: these properties, these required, nothing else.
fn object(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn string_map(description: &str) -> Value {
    json!({
        "type": "object",
        "description": description,
        "additionalProperties": {"type": "string"},
    })
}

const GROUP: &str = "Run in this group only (id or name from workflow.json groups); without \
                     it, every group.";
const EXECUTION_ID: &str = "The execution's id (exec-<step>-<n> or workflow-full-<n>).";

/// Every execution tool of this family.
pub(super) fn specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "execute_step",
            description: "Start one step in the background, in the run folder iteration-0, and \
                          return at once {execution_id, status: running}. The step may be on \
                          the main path, an orphan step, or a route's sub-agent step (run \
                          alone). If the step is already running, returns that execution \
                          instead of starting another. End your turn after starting: you get a \
                          message when it finishes.",
            parameters: object(
                json!({
                    "step_id": string(
                        "The step to run: its id, or its 1-based position on the main path \
                         (\"1\", \"step-1\")."
                    ),
                    "group_name": string(GROUP),
                    "instructions": string(
                        "Extra instructions for the step's agent, read with its first \
                         message (agent steps only)."
                    ),
                    "human_input": string(
                        "The answer of a human_input step; for any other step, high-priority \
                         context for its agent."
                    ),
                    "tier": {
                        "type": "string",
                        "enum": ["high", "medium", "low"],
                        "description": "Run the step on the model of this tier in \
                                        workflow.json tiers (the operator's --llm still wins).",
                    },
                }),
                &["step_id"],
            ),
        },
        ToolSpec {
            name: "query_step",
            description: "Status of an execution (running, done, failed, cancelled): current \
                          item and turn, tool calls so far (arguments cut to 200 characters), \
                          result or error when finished. With tool_call_id: that call in full.",
            parameters: object(
                json!({
                    "execution_id": string(EXECUTION_ID),
                    "step_id": string(
                        "Instead of execution_id: the latest execution of this step."
                    ),
                    "tool_call_id": string("Show this tool call in full."),
                }),
                &[],
            ),
        },
        ToolSpec {
            name: "send_step_message",
            description: "Send a message to a running step's agent: added to its conversation \
                          before its next LLM call. Never starts or resumes work. Answers \
                          {delivery_status: queued_for_injection | not_running | \
                          no_active_agent | unsupported, phase}.",
            parameters: object(
                json!({
                    "execution_id": string(EXECUTION_ID),
                    "message": string("The message."),
                }),
                &["execution_id", "message"],
            ),
        },
        ToolSpec {
            name: "stop_step",
            description: "Stop an execution at its next boundary; it ends as cancelled.",
            parameters: object(
                json!({"execution_id": string(EXECUTION_ID)}),
                &["execution_id"],
            ),
        },
        ToolSpec {
            name: "stop_all_executions",
            description: "Stop every running execution of this session.",
            parameters: object(json!({}), &[]),
        },
        ToolSpec {
            name: "list_executions",
            description: "The executions of this session: id, step (or workflow), status, \
                          summary when finished.",
            parameters: object(
                json!({
                    "status": {
                        "type": "string",
                        "enum": ["running", "done", "failed", "cancelled"],
                        "description": "Only executions with this status.",
                    },
                    "status_filter": {
                        "type": "string",
                        "enum": ["running", "done", "failed", "cancelled"],
                        "description": "The same as status.",
                    },
                }),
                &[],
            ),
        },
        ToolSpec {
            name: "run_full_workflow",
            description: "Run the whole workflow in the background (a fresh iteration-0; the \
                          previous one is archived) and return {execution_id: \
                          workflow-full-<n>}. Every human_input step needs its answer up front: \
                          a missing one refuses the call, listing them, before anything starts.",
            parameters: object(
                json!({
                    "group_name": string(GROUP),
                    "human_inputs": string_map(
                        "Keyed by step id: the answer of a human_input step, or high-priority \
                         context for the agent of any other step (only that step sees it)."
                    ),
                    "route_selections": string_map(
                        "Routes chosen up front: routing step id -> route id (or the step \
                         the route goes to, when only one route goes there)."
                    ),
                    "disable_eval": {
                        "type": "boolean",
                        "description": "Accepted for the original system's calls: no \
                                        evaluation pass follows a run here.",
                    },
                }),
                &[],
            ),
        },
        ToolSpec {
            name: "debug_step",
            description: "What to look at when a step goes wrong: its learnings, its latest \
                          validation reports with the failing checks, its failed items, the \
                          error of its last execution in this session, and the paths of its \
                          logs.",
            parameters: object(
                json!({"step_id": string("The step."), "group_name": string(GROUP)}),
                &["step_id"],
            ),
        },
    ]
}
