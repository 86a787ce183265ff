//! What a script run produced: the outcome, why it failed, where an exception was raised,
//! and the record written to `script-result.json`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::capabilities::FsLimitExceeded;

use super::{STDERR_LOG, STDOUT_LOG, ScriptKind};

/// Where an uncaught Python exception was raised: the innermost frame in the script's
/// folder (so an error inside the standard library points at the script's line that
/// called it), else the innermost frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptLocation {
    /// Workspace-relative file, e.g. `code/fetch/main.py`; a standard-library file keeps
    /// the path the runner gave it.
    pub file: String,
    /// 1-based line number.
    pub line: u32,
}

/// Why a script did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptFailure {
    /// The Python script raised an exception it did not handle (a syntax error included).
    Exception {
        /// The exception as Python prints it last, e.g. `KeyError: 'id'`.
        exception: String,
        /// Where it was raised.
        location: ScriptLocation,
        /// The whole traceback.
        traceback: String,
    },
    /// The script exited with a non-zero status (`sys.exit(3)`, `std::process::exit(3)`).
    Exit {
        /// The status.
        code: i32,
    },
    /// The script did not finish before its deadline and was stopped.
    Timeout {
        /// The deadline.
        after: Duration,
    },
    /// The script asked for more memory than its limit.
    MemoryLimit {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The script went over a filesystem limit of its call (bytes written, files created,
    /// files open at once).
    FsLimit {
        /// Which limit.
        exceeded: FsLimitExceeded,
    },
    /// The script's instance trapped (a Rust panic, a stack overflow, a bad component).
    Crashed {
        /// What happened.
        message: String,
    },
}

impl ScriptFailure {
    /// One sentence naming the script (`code/<step-id>/main.py`), for errors and logs.
    pub fn describe(&self, script: &str) -> String {
        match self {
            ScriptFailure::Exception {
                exception,
                location,
                ..
            } => {
                let first = exception.lines().next().unwrap_or_default();
                format!(
                    "{script} raised {first} ({}, line {})",
                    location.file, location.line
                )
            }
            ScriptFailure::Exit { code } => format!("{script} exited with status {code}"),
            ScriptFailure::Timeout { after } => format!(
                "{script} did not finish within {} and was stopped (timeout)",
                humantime::format_duration(*after)
            ),
            ScriptFailure::MemoryLimit { limit } => format!(
                "{script} was stopped: it exceeded its memory limit of {} MiB",
                limit >> 20
            ),
            ScriptFailure::FsLimit { exceeded } => format!("{script} was stopped: it {exceeded}"),
            ScriptFailure::Crashed { message } => format!("{script} crashed: {message}"),
        }
    }

    pub(super) fn status(&self) -> &'static str {
        match self {
            ScriptFailure::Exception { .. } => "exception",
            ScriptFailure::Exit { .. } => "exit",
            ScriptFailure::Timeout { .. } => "timeout",
            ScriptFailure::MemoryLimit { .. } => "memory_limit",
            ScriptFailure::FsLimit { .. } => "fs_limit",
            ScriptFailure::Crashed { .. } => "crashed",
        }
    }
}

/// What one script run did.
#[derive(Debug, Clone)]
pub struct ScriptOutcome {
    /// The step.
    pub step_id: String,
    /// Python or WebAssembly.
    pub kind: ScriptKind,
    /// The script, workspace-relative: `code/<step-id>/main.py`.
    pub script: String,
    /// The exit status, when the script exited (0 on success); `None` when it was stopped.
    pub exit_code: Option<i32>,
    /// Why it did not succeed; `None` when it did.
    pub failure: Option<ScriptFailure>,
    /// What it printed on stdout, capped (head and tail, with a note of what was dropped).
    pub stdout: String,
    /// What it printed on stderr, capped likewise.
    pub stderr: String,
    /// Wall-clock time of the run, instantiation included.
    pub duration: Duration,
    /// When it started, RFC 3339.
    pub started_at: String,
    /// The folder the logs were written to (`runs/<run>/logs/<step-id>`), when they were.
    pub log_dir: Option<PathBuf>,
    /// Said about where the script was found (a script under `learnings/`).
    pub warning: Option<String>,
}

impl ScriptOutcome {
    /// Whether the script exited with status 0.
    pub fn succeeded(&self) -> bool {
        self.failure.is_none()
    }

    /// The error to show a user or hand to an agent repairing the script: the sentence of
    /// [`ScriptFailure::describe`], then the traceback or the end of stderr.
    pub fn error_message(&self) -> Option<String> {
        let failure = self.failure.as_ref()?;
        let mut message = failure.describe(&self.script);
        let detail = match failure {
            ScriptFailure::Exception { traceback, .. } => traceback.as_str(),
            ScriptFailure::Exit { .. } | ScriptFailure::Crashed { .. } => self.stderr.trim(),
            ScriptFailure::Timeout { .. }
            | ScriptFailure::MemoryLimit { .. }
            | ScriptFailure::FsLimit { .. } => "",
        };
        if !detail.is_empty() {
            message.push_str("\n\n");
            message.push_str(tail(detail, 4 << 10));
        }
        if let ScriptFailure::Exception { exception, .. } = failure
            && let Some(module) = network_module(exception)
        {
            message.push_str(&format!(
                "\n\nPython steps have no network modules ({module:?} is not there): fetch \
                 with `import trellis_http` (get, post, get_json, post_json, request), to the \
                 hosts listed in the step's `allowed_hosts`."
            ));
        }
        Some(message)
    }

    pub(super) fn record(&self, completed_at: &str) -> serde_json::Value {
        let (exception, location) = match &self.failure {
            Some(ScriptFailure::Exception {
                exception,
                location,
                ..
            }) => (
                Some(exception.as_str()),
                Some(json!({"file": location.file, "line": location.line})),
            ),
            _ => (None, None),
        };
        json!({
            "step_id": self.step_id,
            "script": self.script,
            "kind": self.kind.label(),
            "status": self.failure.as_ref().map_or("succeeded", ScriptFailure::status),
            "exit_code": self.exit_code,
            "error": self.failure.as_ref().map(|f| f.describe(&self.script)),
            "exception": exception,
            "location": location,
            "stdout_file": STDOUT_LOG,
            "stderr_file": STDERR_LOG,
            "started_at": self.started_at,
            "completed_at": completed_at,
            "duration_ms": self.duration.as_millis() as u64,
            "warning": self.warning,
        })
    }
}

/// The last `max` bytes of `text`, on a character boundary.
pub(super) fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Modules a script might use for the network, absent in the sandbox (its HTTP goes through
/// `trellis_http`).
const NETWORK_MODULES: &[&str] = &[
    "socket",
    "ssl",
    "_ssl",
    "urllib.request",
    "http.client",
    "requests",
    "urllib3",
    "httpx",
    "aiohttp",
];

/// The network module an exception says is missing (`ModuleNotFoundError: No module named
/// 'requests'`), if it is one.
pub(super) fn network_module(exception: &str) -> Option<&str> {
    let rest = exception.lines().find_map(|l| {
        l.trim()
            .strip_prefix("ModuleNotFoundError: No module named ")
    })?;
    let name = rest.trim().trim_matches(['\'', '"']);
    NETWORK_MODULES
        .iter()
        .find(|m| name == **m || name.starts_with(&format!("{m}.")))
        .map(|_| name)
}
