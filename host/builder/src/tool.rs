//! What every builder tool is: a name, a description and a JSON Schema for the model, and a
//! JSON answer or a failure the model can act on.

use serde_json::{Value, json};

use trellis_sandbox::llm::ToolDefinition;

/// A builder tool as the model is told about it.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// Its name (`add_scripted_step`).
    pub name: &'static str,
    /// What it does, for the model.
    pub description: &'static str,
    /// The JSON Schema of its arguments object.
    pub parameters: Value,
}

impl ToolSpec {
    /// The definition sent in an LLM request.
    pub fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.name.to_string(),
            description: self.description.to_string(),
            parameters: self.parameters.clone(),
        }
    }
}

/// A tool call that did not do what it was asked: the message the model reads, and details
/// (diagnostics, the valid step ids) when there are some.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFailure {
    /// What went wrong and what to do instead.
    pub message: String,
    /// Structured details: the diagnostics of a refused edit, say.
    pub details: Option<Value>,
}

impl ToolFailure {
    /// A failure with a message only.
    pub fn new(message: impl Into<String>) -> Self {
        ToolFailure {
            message: message.into(),
            details: None,
        }
    }

    /// A failure with details.
    pub fn with_details(message: impl Into<String>, details: Value) -> Self {
        ToolFailure {
            message: message.into(),
            details: Some(details),
        }
    }

    /// The failure as the JSON the model reads: `{"error": ..., "details": ...}`.
    pub fn to_json(&self) -> Value {
        match &self.details {
            Some(details) => json!({"error": self.message, "details": details}),
            None => json!({"error": self.message}),
        }
    }
}

impl std::fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a builder tool call returns.
pub type ToolResult = Result<Value, ToolFailure>;

/// The string argument `key` of `args`; a failure naming it when absent or not a string.
pub fn str_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, ToolFailure> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolFailure::new(format!("argument {key:?}: expected a string")))
}

/// The optional string argument `key` of `args`; a failure when present and not a string.
pub fn opt_str_arg<'a>(args: &'a Value, key: &str) -> Result<Option<&'a str>, ToolFailure> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ToolFailure::new(format!(
            "argument {key:?}: expected a string, found {other}"
        ))),
    }
}
