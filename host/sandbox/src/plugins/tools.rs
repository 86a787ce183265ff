//! Tool descriptions, tool names and the errors of a tool call.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

/// A tool as offered by a loaded plugin, with its argument schema compiled.
#[derive(Debug)]
pub struct ToolSpec {
    /// Name within the plugin, as the plugin lists it.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: serde_json::Value,
    /// The tool only reads.
    pub read_only: bool,
    /// The tool may delete or overwrite.
    pub destructive: bool,
    /// Repeating a call has the effect of one call.
    pub idempotent: bool,
    pub(crate) validator: Arc<jsonschema::Validator>,
    /// The schema has no `$ref`: a finite tree within the load-time bounds, so checking
    /// small arguments against it is quick enough to do on the caller's thread.
    pub(crate) inline_check: bool,
}

/// Arguments of at most this many JSON values are checked on the caller's thread against a
/// schema without `$ref` (the schema's own bounds then cap the work well under a
/// millisecond per value).
const INLINE_CHECK_VALUES: usize = 1_000;

/// Whether `value` holds at most `max` JSON values (itself included).
fn at_most_values(value: &serde_json::Value, max: usize) -> bool {
    let mut left = max;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        if left == 0 {
            return false;
        }
        left -= 1;
        match v {
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(fields) => stack.extend(fields.values()),
            _ => {}
        }
    }
    true
}

impl ToolSpec {
    /// A tool as a plugin lists it, without hints: `input_schema` (JSON text) must be a JSON
    /// Schema of `"type": "object"` within the bounds of [`super::schema::check_bounds`];
    /// it is compiled once here. The error names the tool.
    pub fn new(name: String, description: String, input_schema: &str) -> Result<ToolSpec, String> {
        let schema: serde_json::Value = serde_json::from_str(input_schema)
            .map_err(|e| format!("tool `{name}`: input-schema is not JSON: {e}"))?;
        if schema.get("type").and_then(|t| t.as_str()) != Some("object") {
            return Err(format!(
                "tool `{name}`: input-schema must have \"type\": \"object\""
            ));
        }
        super::schema::check_bounds(input_schema, &schema)
            .map_err(|e| format!("tool `{name}`: {e}"))?;
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| format!("tool `{name}`: invalid input-schema: {e}"))?;
        Ok(ToolSpec {
            name,
            description,
            input_schema: schema,
            read_only: false,
            destructive: false,
            idempotent: false,
            inline_check: !input_schema.contains("\"$ref\"")
                && !input_schema.contains("\"$dynamicRef\""),
            validator: Arc::new(validator),
        })
    }

    /// Checks `args` against the schema; every violation is listed, each with its JSON pointer.
    pub fn check_arguments(&self, args: &serde_json::Value) -> Result<(), String> {
        check_arguments(&self.validator, args)
    }

    /// [`ToolSpec::check_arguments`] on a checker thread, given up after `deadline`: the
    /// schema's bounds keep the check small, and this keeps a check that is slow all the
    /// same (deeply nested arguments under a recursive schema) inside the call's deadline.
    pub async fn check_arguments_within(
        &self,
        args: &serde_json::Value,
        deadline: Duration,
    ) -> Result<(), String> {
        // Handing the check to another thread costs more than the check itself in the common
        // case: a small argument object against a schema without references.
        if self.inline_check && at_most_values(args, INLINE_CHECK_VALUES) {
            return check_arguments(&self.validator, args);
        }
        let validator = self.validator.clone();
        let args = args.clone();
        let (send, receive) = tokio::sync::oneshot::channel();
        let worker = checkers::take().map_err(|e| format!("starting the argument check: {e}"))?;
        worker.run(Box::new(move || {
            let _ = send.send(check_arguments(&validator, &args));
        }));
        match tokio::time::timeout(deadline, receive).await {
            Ok(Ok(result)) => {
                checkers::give_back(worker);
                result
            }
            Ok(Err(_)) => Err("the argument check failed".into()),
            // The worker stays busy with the abandoned check and is not given back.
            Err(_) => Err(format!(
                "checking them against the tool's schema did not finish within the call's deadline of {deadline:?}"
            )),
        }
    }
}

/// Threads that check arguments, kept between calls (starting a thread per call cost more
/// than the check). A worker whose check ran past its deadline is dropped: it finishes that
/// check on its own and ends, so an abandoned check never holds up another call or the
/// process (a runtime's blocking pool would make the runtime wait for it at shutdown).
mod checkers {
    use std::sync::Mutex;
    use std::sync::mpsc::{Sender, channel};

    type Job = Box<dyn FnOnce() + Send>;

    /// Idle workers kept at most.
    const KEPT: usize = 4;

    static IDLE: Mutex<Vec<Worker>> = Mutex::new(Vec::new());

    /// One checker thread; dropping it lets the thread end after its current job.
    pub(super) struct Worker {
        jobs: Sender<Job>,
    }

    impl Worker {
        pub(super) fn run(&self, job: Job) {
            // A worker whose thread ended (it cannot, but) simply never answers: the caller's
            // deadline covers that.
            let _ = self.jobs.send(job);
        }
    }

    /// An idle worker, or a new one.
    pub(super) fn take() -> std::io::Result<Worker> {
        if let Some(worker) = IDLE.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(worker);
        }
        let (jobs, receive) = channel::<Job>();
        std::thread::Builder::new()
            .name("trellis-argument-check".into())
            .spawn(move || {
                while let Ok(job) = receive.recv() {
                    job();
                }
            })?;
        Ok(Worker { jobs })
    }

    /// Keeps `worker` for the next check (up to [`KEPT`]).
    pub(super) fn give_back(worker: Worker) {
        let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < KEPT {
            idle.push(worker);
        }
    }
}

/// Violations listed in an error at most; the rest are counted.
const MAX_LISTED_PROBLEMS: usize = 20;

/// Nesting past which the problems of invalid arguments are not listed: listing them builds
/// every failed branch of every `anyOf`/`oneOf` on the way, which grows exponentially with
/// the depth (gigabytes for a 28-deep tree under a two-branch recursive schema).
const MAX_LISTED_DEPTH: usize = 12;

fn depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            serde_json::Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            serde_json::Value::Object(fields) => stack.extend(fields.values().map(|f| (f, d + 1))),
            _ => {}
        }
    }
    deepest
}

fn check_arguments(
    validator: &jsonschema::Validator,
    args: &serde_json::Value,
) -> Result<(), String> {
    // The yes/no check allocates nothing per branch; only invalid arguments are explained.
    if validator.is_valid(args) {
        return Ok(());
    }
    let nesting = depth(args);
    if nesting > MAX_LISTED_DEPTH {
        return Err(format!(
            "they do not match the tool's schema (they nest {nesting} levels deep; the \
             problems are listed only for arguments up to {MAX_LISTED_DEPTH} levels)"
        ));
    }
    let mut problems = Vec::new();
    let mut more = 0;
    for err in validator.iter_errors(args) {
        if problems.len() == MAX_LISTED_PROBLEMS {
            more += 1;
            continue;
        }
        let at = err.instance_path().to_string();
        let at = if at.is_empty() { "/".to_string() } else { at };
        problems.push(format!("at {at}: {err}"));
    }
    if more > 0 {
        problems.push(format!("and {more} more"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// JSON shape of a tool for listings (`trellis plugins inspect`).
#[derive(Debug, Serialize)]
pub struct ToolListing<'a> {
    /// Full name, `server:tool`.
    pub name: String,
    /// What it does.
    pub description: &'a str,
    /// Argument schema.
    pub input_schema: &'a serde_json::Value,
    /// Behaviour hints.
    pub read_only: bool,
    /// Behaviour hints.
    pub destructive: bool,
    /// Behaviour hints.
    pub idempotent: bool,
}

/// Tool names are compared normalized: lowercase, `-` as `_`, CamelCase as snake_case.
pub fn normalize_tool_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut prev_lower_or_digit = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            if prev_lower_or_digit {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            prev_lower_or_digit = false;
        } else if c == '-' {
            out.push('_');
            prev_lower_or_digit = false;
        } else {
            out.push(c);
            prev_lower_or_digit = c.is_ascii_lowercase() || c.is_ascii_digit();
        }
    }
    out
}

/// What kind of error a plugin reported for a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolErrorKind {
    /// The arguments were not usable.
    InvalidArguments,
    /// The plugin has no such tool.
    UnknownTool,
    /// The path or record does not exist.
    NotFound,
    /// The grant does not allow it.
    Denied,
    /// Anything else.
    Failed,
}

impl std::fmt::Display for ToolErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToolErrorKind::InvalidArguments => "invalid arguments",
            ToolErrorKind::UnknownTool => "unknown tool",
            ToolErrorKind::NotFound => "not found",
            ToolErrorKind::Denied => "denied",
            ToolErrorKind::Failed => "failed",
        })
    }
}

/// Why a tool call produced no result. Every variant is a value for the
/// caller (and, in a workflow, for the model); none brings the host down.
#[derive(Debug, thiserror::Error)]
pub enum ToolCallError {
    /// The name is not `server:tool`.
    #[error("{0:?} is not a tool name: expected `server:tool`, e.g. `workspace:read_file`")]
    BadName(String),
    /// No plugin with that id.
    #[error("no tool plugin `{server}` (loaded: {loaded})")]
    UnknownServer {
        /// The id asked for.
        server: String,
        /// Ids that exist.
        loaded: String,
    },
    /// The plugin has no tool of that name.
    #[error("plugin `{server}` has no tool `{tool}` (it has: {available})")]
    UnknownTool {
        /// Plugin id.
        server: String,
        /// Tool asked for.
        tool: String,
        /// Tools it has.
        available: String,
    },
    /// The arguments do not match the tool's schema; the plugin was not called.
    #[error("{tool}: invalid arguments: {details}")]
    InvalidArguments {
        /// Full tool name.
        tool: String,
        /// Every schema violation.
        details: String,
    },
    /// The plugin returned an error value.
    #[error("{tool}: {kind}: {message}")]
    Tool {
        /// Full tool name.
        tool: String,
        /// Kind of error.
        kind: ToolErrorKind,
        /// The plugin's message.
        message: String,
    },
    /// The call ran past its deadline and was stopped.
    #[error("{tool}: timed out after {after:?} and was stopped")]
    Timeout {
        /// Full tool name.
        tool: String,
        /// The deadline.
        after: Duration,
    },
    /// The caller cancelled the call, which was stopped.
    #[error("{tool}: cancelled and stopped")]
    Cancelled {
        /// Full tool name.
        tool: String,
    },
    /// The guest asked for more memory than its limit.
    #[error("{tool}: stopped: memory limit of {limit} bytes exceeded")]
    MemoryLimit {
        /// Full tool name.
        tool: String,
        /// The limit.
        limit: usize,
    },
    /// The guest overflowed its stack.
    #[error("{tool}: stopped: the plugin exhausted its stack (recursion too deep)")]
    StackOverflow {
        /// Full tool name.
        tool: String,
    },
    /// The guest went over a filesystem limit of the call.
    #[error("{tool}: stopped: the plugin {exceeded}")]
    FsLimit {
        /// Full tool name.
        tool: String,
        /// Which limit.
        exceeded: crate::capabilities::FsLimitExceeded,
    },
    /// The result was bigger than the output cap.
    #[error("{tool}: result of {size} bytes is over the {limit}-byte output limit")]
    OutputTooLarge {
        /// Full tool name.
        tool: String,
        /// Size of the result.
        size: usize,
        /// The cap.
        limit: usize,
    },
    /// The result was not JSON.
    #[error("{tool}: the plugin returned invalid JSON: {error}")]
    InvalidOutput {
        /// Full tool name.
        tool: String,
        /// Parser message.
        error: String,
    },
    /// The guest trapped (a panic, an `unreachable`, a bug).
    #[error("{tool}: the plugin crashed: {message}{}", stderr_suffix(.stderr))]
    Crashed {
        /// Full tool name.
        tool: String,
        /// The trap.
        message: String,
        /// What the guest wrote to stderr (a panic message, usually).
        stderr: String,
    },
    /// The grant could not be set up (a granted folder is missing, say).
    #[error("{tool}: {error:#}")]
    Host {
        /// Full tool name.
        tool: String,
        /// What went wrong.
        error: anyhow::Error,
    },
}

pub(crate) fn stderr_suffix(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        String::new()
    } else {
        format!("\nplugin stderr:\n{stderr}")
    }
}

impl ToolCallError {
    /// A short stable name of the error kind, for JSON output and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolCallError::BadName(_) => "bad-name",
            ToolCallError::UnknownServer { .. } => "unknown-server",
            ToolCallError::UnknownTool { .. } => "unknown-tool",
            ToolCallError::InvalidArguments { .. } => "invalid-arguments",
            ToolCallError::Tool { kind, .. } => match kind {
                ToolErrorKind::InvalidArguments => "invalid-arguments",
                ToolErrorKind::UnknownTool => "unknown-tool",
                ToolErrorKind::NotFound => "not-found",
                ToolErrorKind::Denied => "denied",
                ToolErrorKind::Failed => "failed",
            },
            ToolCallError::Timeout { .. } => "timeout",
            ToolCallError::Cancelled { .. } => "cancelled",
            ToolCallError::MemoryLimit { .. } => "memory-limit",
            ToolCallError::StackOverflow { .. } => "stack-overflow",
            ToolCallError::FsLimit { .. } => "fs-limit",
            ToolCallError::OutputTooLarge { .. } => "output-too-large",
            ToolCallError::InvalidOutput { .. } => "invalid-output",
            ToolCallError::Crashed { .. } => "crashed",
            ToolCallError::Host { .. } => "host",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_arguments_are_told_from_large_ones() {
        let small = serde_json::json!({"path": "a", "items": [1, 2, 3]});
        assert!(at_most_values(&small, 6));
        assert!(!at_most_values(&small, 5));
        let large = serde_json::json!({"rows": vec![0; 2000]});
        assert!(!at_most_values(&large, INLINE_CHECK_VALUES));
    }

    #[test]
    fn names_normalize_as_the_spec_says() {
        assert_eq!(normalize_tool_name("read_file"), "read_file");
        assert_eq!(normalize_tool_name("read-file"), "read_file");
        assert_eq!(normalize_tool_name("ReadFile"), "read_file");
        assert_eq!(normalize_tool_name("readFile2X"), "read_file2_x");
        assert_eq!(normalize_tool_name("HTTPGet"), "httpget");
    }
}
