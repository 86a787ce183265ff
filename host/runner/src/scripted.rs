//! Scripted steps (spec section 7): a `regular` step with `declared_execution_mode:
//! "scripted"` runs `code/<step-id>/main.py` (or `main.wasm`) first. A script that succeeds
//! and passes the step's gate ends the step with no LLM call at all. A script that fails, or
//! whose outputs fail the gate, is handed to the agent with the error, unless the step sets
//! `lock_code`; the agent's turn may rewrite the script (its folder is writable for that
//! turn only), and the repaired script runs again, at most
//! [`MAX_SCRIPT_REPAIRS`](crate::scripted::MAX_SCRIPT_REPAIRS) times.
//!
//! The loop itself lives in the agent loop ([`crate::driver`]), which owns turns
//! and the session; this module holds its texts and names.

use trellis_sandbox::script::{ScriptKind, ScriptOutcome};

/// The item type of a script run in `session.json`.
pub const SCRIPT_ITEM_TYPE: &str = "script";
/// The item id of the turn that writes a missing script.
pub const WRITE_ITEM_ID: &str = "script-write";
/// The item id of the entry saying a locked script's step runs agentically.
pub const FALLBACK_ITEM_ID: &str = "script-agentic-fallback";
/// Repairs a failing script gets before the step fails.
pub const MAX_SCRIPT_REPAIRS: u32 = 3;
/// Largest script source put into a repair message, in bytes; longer ones are named, and
/// the agent reads them with its tools.
const MAX_SOURCE_IN_MESSAGE: usize = 32 << 10;

/// The entry and item id of the `attempt`-th run of a step's script (`script-1`, ...).
pub fn script_item_id(attempt: u32) -> String {
    format!("script-{attempt}")
}

/// The item id of the repair turn after the `attempt`-th run (`script-repair-1`, ...).
pub fn repair_item_id(attempt: u32) -> String {
    format!("script-repair-{attempt}")
}

/// The one-line summary of a script run that succeeded (and passed its gate).
pub fn success_summary(outcome: &ScriptOutcome) -> String {
    let last = outcome
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        // A summary is kept with the step (its session entry, the run's report): a line of
        // megabytes would be kept as often.
        .map(|l| {
            format!(
                "; last line of stdout: {}",
                trellis_sandbox::cut::marked(l.trim(), SUMMARY_LINE_BYTES)
            )
        })
        .unwrap_or_default();
    format!(
        "{} succeeded in {} ms{last}",
        outcome.script,
        outcome.duration.as_millis()
    )
}

/// The bytes of the script's last line of stdout its success summary keeps.
pub const SUMMARY_LINE_BYTES: usize = 512;

/// The message of a repair turn: what failed, the script's source and what to do.
pub fn repair_message(
    step_id: &str,
    script: &str,
    kind: ScriptKind,
    source: Option<&str>,
    problem: &str,
    outputs: &[String],
) -> String {
    let mut text = format!(
        "The script {script} of step {step_id} runs before any agent turn, and it failed:\n\n\
         {problem}\n\n"
    );
    match (kind, source) {
        (ScriptKind::Python, Some(src)) if src.len() <= MAX_SOURCE_IN_MESSAGE => {
            text.push_str(&format!("Its source:\n```python\n{src}\n```\n\n"));
        }
        (ScriptKind::Python, _) => {
            text.push_str(&format!(
                "Its source is long: read {script} with your tools.\n\n"
            ));
        }
        (ScriptKind::Wasm, _) => {}
    }
    if !outputs.is_empty() {
        text.push_str(&format!(
            "The script must write {} into its output folder (STEP_OUTPUT_DIR).\n",
            outputs.join(", ")
        ));
    }
    text.push_str(&format!(
        "Fix the script: rewrite {script} with your tools (its folder is writable during this \
         turn only), keeping it deterministic. Do not write the outputs yourself: the script \
         runs again after your reply and its outputs are checked. Reply briefly with what you \
         changed, or with `STATUS: FAILED <reason>` if it cannot be fixed."
    ));
    text
}

/// The message of the turn that writes a scripted step's missing script.
pub fn write_message(
    step_id: &str,
    description: &str,
    outputs: &[String],
    dependencies: &[String],
) -> String {
    let script = format!("code/{step_id}/main.py");
    let mut text = format!(
        "Step {step_id} is a scripted step and has no script yet. Write {script}: a \
         deterministic Python script that does the step:\n\n{description}\n\n"
    );
    if !outputs.is_empty() {
        text.push_str(&format!(
            "It must write {} into its output folder (the environment variable \
             STEP_OUTPUT_DIR).\n",
            outputs.join(", ")
        ));
    }
    if !dependencies.is_empty() {
        text.push_str(&format!(
            "Its inputs are passed as arguments (sys.argv[1:]): {}.\n",
            dependencies.join(", ")
        ));
    }
    text.push_str(
        "The database is reached with `import sqlite3; sqlite3.connect(os.environ[\"DB_PATH\"])` \
         or `import trellis_db`; HTTP(S), to the step's allowed_hosts only, with \
         `import trellis_http`. Write only the script with your tools (its folder is writable \
         during this turn only); it runs after your reply and its outputs are checked. Reply \
         briefly with what it does.",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repair_message_holds_the_error_the_source_and_the_outputs() {
        let text = repair_message(
            "fetch",
            "code/fetch/main.py",
            ScriptKind::Python,
            Some("import json\nraise KeyError('id')"),
            "code/fetch/main.py raised KeyError: 'id' (code/fetch/main.py, line 2)",
            &["rows.json".to_string()],
        );
        assert!(text.contains("raised KeyError: 'id'"), "{text}");
        assert!(text.contains("```python\nimport json\nraise KeyError('id')\n```"));
        assert!(text.contains("rows.json"));
        assert!(text.contains("rewrite code/fetch/main.py"));
        let long = "#\n".repeat(MAX_SOURCE_IN_MESSAGE);
        let text = repair_message(
            "f",
            "code/f/main.py",
            ScriptKind::Python,
            Some(&long),
            "x",
            &[],
        );
        assert!(
            !text.contains("```python"),
            "a long source is named, not pasted"
        );
    }
}
