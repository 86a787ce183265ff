//! Cassettes for the bundled `replay` provider, written by the tests as their conversations
//! go. The replay provider compares every request exactly, so a cassette is built from the
//! system prompts the driver sends and from tool results obtained by making the same call
//! under the same grant in a twin workspace ([`Twin`]); a cassette that plays through shows
//! that the conversations were what the test says.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use trellis_runner::driver::StepRunner;
use trellis_runner::grants::AgentFolders;
use trellis_sandbox::llm::{
    Cassette, Endpoint, Interaction, Message, RecordedRequest, RecordedTool, ReplayCursor,
    Response, Secret, StopReason, Target, ToolCall, ToolDefinition, Usage,
};
use trellis_sandbox::{Grant, Limits, PluginRegistry};
use trellis_workflow::Workspace;

use super::grants::{item_grant, reflection_grant, sub_agent_grant};

/// One cassette shared by every agent of a run: their calls interleaved in the order they
/// happen, each asking for `model` and answering with the same usage.
pub struct Tape {
    model: String,
    usage: Usage,
    interactions: Vec<Interaction>,
}

impl Tape {
    /// An empty cassette whose requests name `model`.
    pub fn new(model: &str) -> Tape {
        Tape {
            model: model.to_string(),
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                total_tokens: 15,
            },
            interactions: Vec::new(),
        }
    }

    /// The usage every response reports.
    pub fn with_usage(mut self, usage: Usage) -> Tape {
        self.usage = usage;
        self
    }

    /// The cassette recorded so far.
    pub fn cassette(&self) -> Cassette {
        Cassette {
            interactions: self.interactions.clone(),
        }
    }

    /// Saves the cassette at `path`.
    pub fn save(&self, path: &Path) {
        self.cassette().save(path).unwrap();
    }

    /// Saves the cassette as `cassette.json` in `dir` and returns its path.
    pub fn save_in(&self, dir: &Path) -> PathBuf {
        let path = dir.join("cassette.json");
        self.save(&path);
        path
    }
}

/// One agent's conversation as the cassette expects it.
pub struct Conv {
    pub messages: Vec<Message>,
    tools: Vec<RecordedTool>,
}

impl Conv {
    pub fn new(system: String) -> Conv {
        Conv {
            messages: vec![Message::system(system)],
            tools: Vec::new(),
        }
    }

    /// Also checks the names of the tools offered in every request of this agent.
    pub fn offering(mut self, tools: &[&str]) -> Conv {
        self.tools = tools
            .iter()
            .map(|t| RecordedTool::Name(t.to_string()))
            .collect();
        self
    }

    /// Also checks the tools offered in every request of this agent, in this order: each
    /// whole (name, description and argument schema) where a definition is given, by name
    /// where a name is.
    pub fn offering_tools(mut self, tools: Vec<RecordedTool>) -> Conv {
        self.tools = tools;
        self
    }

    /// Replaces the system prompt (a sub-agent's names the folder of its current call).
    pub fn system(&mut self, text: String) -> &mut Self {
        self.messages[0] = Message::system(text);
        self
    }

    pub fn user(&mut self, text: &str) -> &mut Self {
        self.messages.push(Message::user(text));
        self
    }

    pub fn tool(&mut self, id: &str, text: &str) -> &mut Self {
        self.messages.push(Message::tool_result(id, text));
        self
    }

    /// Records the request of this conversation so far on `tape` with the model answering
    /// `text` and asking for `calls` (id, tool name, arguments), then goes on with the answer.
    pub fn reply(
        &mut self,
        tape: &mut Tape,
        text: &str,
        calls: &[(&str, &str, Value)],
    ) -> &mut Self {
        let response = response(text, calls, tape.usage);
        tape.interactions.push(Interaction {
            request: RecordedRequest {
                model: tape.model.clone(),
                messages: self.messages.clone(),
                tools: self.tools.clone(),
                options: Default::default(),
            },
            response: response.clone(),
            chunks: Vec::new(),
        });
        self.messages.push(Message::assistant(&response));
        self
    }
}

impl Conv {
    /// The model asks for one call `id` of `tool`; its result comes from making the call
    /// under `grant` (in a twin or a copy of the workspace) and goes on in the conversation.
    /// Returns the result, for the test to check.
    pub async fn call(
        &mut self,
        tape: &mut Tape,
        registry: &PluginRegistry,
        grant: &Grant,
        id: &str,
        tool: &str,
        args: Value,
    ) -> String {
        let text = tool_text(registry, tool, &args, grant).await;
        self.reply(tape, "", &[(id, tool, args)]).tool(id, &text);
        text
    }
}

/// A response answering `text` and asking for `calls` (id, tool name, arguments).
pub fn response(text: &str, calls: &[(&str, &str, Value)], usage: Usage) -> Response {
    Response {
        text: text.to_string(),
        tool_calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments: args.to_string(),
            })
            .collect(),
        stop_reason: if calls.is_empty() {
            StopReason::Stop
        } else {
            StopReason::ToolCalls
        },
        usage,
        model: None,
    }
}

/// `workspace:write_file` calls writing `content`, one per `(call id, path, whether the
/// grant allows it)`.
pub fn write_calls<'a>(
    writes: &[(&'a str, String, bool)],
    content: &str,
) -> Vec<(&'a str, &'static str, Value)> {
    writes
        .iter()
        .map(|(id, path, _)| {
            (
                *id,
                "workspace:write_file",
                json!({"path": path, "content": content}),
            )
        })
        .collect()
}

/// A step runner whose only target is the replay provider playing `cassette` as `model`.
pub fn replay_runner<'a>(
    registry: &'a PluginRegistry,
    model: &str,
    cassette: &Path,
) -> StepRunner<'a> {
    let target = Target {
        provider: "replay".into(),
        model: model.into(),
        endpoint: Endpoint::replay(cassette, 0).unwrap(),
        secret: Secret::none(),
        stream: true,
    };
    StepRunner::new(registry, vec![target], Limits::default())
        .with_replay(ReplayCursor::new(cassette))
}

/// What a tool call returns to the model: the result as text, or `error: ...`.
pub async fn tool_text(
    registry: &PluginRegistry,
    tool: &str,
    args: &Value,
    grant: &Grant,
) -> String {
    match registry
        .call_tool(tool, args, grant, &Limits::default())
        .await
    {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(e) => format!("error: {e}"),
    }
}

/// A twin of a test workspace where tools are called to learn what they answer. It is kept
/// for the whole test, so calls build on each other as they do in the run.
pub struct Twin {
    _dir: tempfile::TempDir,
    pub ws: Workspace,
}

impl Twin {
    /// A twin written by `build` in a temp folder.
    pub fn new(build: impl FnOnce(&Path) -> Workspace) -> Twin {
        let dir = tempfile::tempdir().unwrap();
        let ws = build(dir.path());
        Twin { _dir: dir, ws }
    }

    /// What `tool` answers the agent of step `step_id` in item `item_id`.
    pub async fn item(
        &self,
        registry: &PluginRegistry,
        step_id: &str,
        item_id: &str,
        tool: &str,
        args: &Value,
    ) -> String {
        let grant = item_grant(&self.ws, step_id, item_id);
        tool_text(registry, tool, args, &grant.grant).await
    }

    /// What `tool` answers the agent of step `step_id` in its reflection turn.
    pub async fn reflection(
        &self,
        registry: &PluginRegistry,
        step_id: &str,
        tool: &str,
        args: &Value,
    ) -> String {
        let grant = reflection_grant(&self.ws, step_id);
        tool_text(registry, tool, args, &grant.grant).await
    }

    /// What `tool` answers the sub-agent of `route_id` (a route of step `step_id`) in the
    /// call with these folders.
    pub async fn sub_agent(
        &self,
        registry: &PluginRegistry,
        step_id: &str,
        route_id: &str,
        folders: &AgentFolders,
        tool: &str,
        args: &Value,
    ) -> String {
        let grant = sub_agent_grant(&self.ws, step_id, route_id, folders);
        tool_text(registry, tool, args, &grant.grant).await
    }
}

/// The tool definitions of the golden file `rel` under `tests/data/` (a JSON list of
/// `{"name", "description", "parameters"}`), written once and reviewed.
pub fn golden_tools(rel: &str) -> Vec<ToolDefinition> {
    let path = super::golden::golden_path(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("golden file {} cannot be read: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "golden file {}: expected a list of tool definitions: {e}",
            path.display()
        )
    })
}
