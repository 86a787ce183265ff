//! What a turn keeps of its tool calls: each result counted against the turn's result bytes
//! ([`ResultBytes`]) as its call ends, a large one offloaded to `tool-results/` with a short
//! reference in its place, and the arguments a run event keeps (a few KiB: the event log
//! lasts the whole execution; the turn log has them whole).

use serde_json::Value;

use super::budget::ResultBytes;
use super::prompts::offload_reference;
use super::{OFFLOAD_THRESHOLD, Run};
use crate::routes::TOOL_RESULTS_DIR;
use crate::session::ToolCallRecord;

/// The record of an ended call as the turn keeps it, with the content the model gets. A
/// result over the offload threshold goes to `tool-results/` (when the step offloads) and
/// the record keeps the reference in its place; a result that does not fit what is left of
/// the turn's result bytes is dropped, and the model told why.
pub(super) fn kept(
    run: &Run<'_>,
    mut record: ToolCallRecord,
    result_bytes: &ResultBytes,
) -> (ToolCallRecord, String) {
    if let Some(e) = &record.error {
        // An error is content the model gets too (an external MCP server's `isError`
        // result is as long as its results may be): it counts against the same bytes.
        let content = format!("error: {e}");
        if let Err(error) = result_bytes.take(content.len()) {
            record.error = Some(error.clone());
            return (record, format!("error: {error}"));
        }
        return (record, content);
    }
    let content = match &record.result {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    if let Err(error) = result_bytes.take(content.len()) {
        record.result = None;
        record.error = Some(error.clone());
        return (record, format!("error: {error}"));
    }
    if run.configs.enable_context_offloading != Some(false) && content.len() > OFFLOAD_THRESHOLD {
        let value = record.result.take().unwrap_or(Value::Null);
        match offload(run, &record.tool_call_id, &value, content.len()) {
            Some(reference) => {
                record.result = Some(Value::String(reference.clone()));
                return (record, reference);
            }
            None => record.result = Some(value),
        }
    }
    (record, content)
}

/// Writes a large tool result to `<output>/tool-results/<tool-call-id>.json` and returns the
/// short reference that replaces it in the conversation; `None` when the file cannot be
/// written (the result then stays in the conversation as it was).
fn offload(run: &Run<'_>, call_id: &str, value: &Value, len: usize) -> Option<String> {
    let name = offload_name(run, call_id);
    let path = run.output_dir.join(TOOL_RESULTS_DIR).join(&name);
    match run.ws.fs.write_json_atomic(&path, value) {
        Ok(()) => Some(offload_reference(
            &format!("{}/{TOOL_RESULTS_DIR}/{name}", run.folders.output),
            len,
        )),
        Err(e) => {
            tracing::warn!(
                "{}: offloading a tool result to {}: {e}",
                run.label,
                path.display()
            );
            None
        }
    }
}

/// The file under `tool-results/` for call `call_id`: `<id>.json`, or `<id>-N.json` when
/// this agent already wrote that name or a file is there (a model may give two calls one
/// id, and ids that differ may map to one file name), the id cut to [`MAX_ID_CHARS`].
fn offload_name(run: &Run<'_>, call_id: &str) -> String {
    const MAX_ID_CHARS: usize = 100;
    let base: String = file_safe(call_id).chars().take(MAX_ID_CHARS).collect();
    let mut taken = run.offloaded.lock().unwrap_or_else(|e| e.into_inner());
    let dir = run.output_dir.join(TOOL_RESULTS_DIR);
    let free = |name: &String| {
        // An error (a planted link on the way) is not a file there: the write fails on it.
        !taken.contains(name) && !matches!(run.ws.fs.kind(dir.join(name)), Ok(Some(_)))
    };
    let mut name = format!("{base}.json");
    let mut n = 2u64;
    while !free(&name) {
        name = format!("{base}-{n}.json");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// A tool call id as a file name: characters other than letters, digits, `-`, `_` and `.`
/// become `_`; an empty or dot-only id becomes `call`.
fn file_safe(id: &str) -> String {
    let name: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.trim_matches('.').is_empty() {
        "call".to_string()
    } else {
        name
    }
}

/// The arguments of a call as its run event keeps them: whole up to
/// [`trellis_sandbox::cut::EVENT_JSON_BYTES`] of JSON, else that much of their JSON text and
/// how much there was.
/// The event log lasts the whole execution; the turn log keeps the arguments whole.
pub(super) fn event_arguments(args: &Value) -> Value {
    trellis_sandbox::cut::json_value(args)
}
