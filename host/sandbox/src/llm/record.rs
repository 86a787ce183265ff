//! Cassettes: recorded LLM interactions that the `replay` provider answers from.
//!
//! A cassette is `{"interactions": [{"request": {...}, "response": {...}}, ...]}`
//! (a bare list of interactions is read too). Requests keep the model, the
//! messages, the tools offered (name, description and argument schema; older
//! cassettes hold names alone) and the request options; responses are
//! [`Response`]s. The `replay` provider consumes the interactions in order and
//! reports the first difference when a request does not match.
//!
//! A [`Recorder`] wraps provider calls and appends each answered one to its
//! cassette in place, one interaction a line ([`RECORDING_HEADER`], the lines, then
//! [`RECORDING_FOOTER`]): each interaction costs the bytes of its own line, not a rewrite
//! of the whole file. A run killed half way leaves a cassette whose last line may be cut
//! short; the reader replays its whole interactions and drops that cut line. A recording
//! stops at its cap ([`RECORD_CAP`] by default), leaving the cassette whole.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{Endpoint, LlmCallError, Message, Options, Request, Response, Secret, ToolDefinition};
use crate::PluginRegistry;
use crate::capabilities::Limits;

/// A recorded conversation with a model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cassette {
    /// The interactions, in the order the calls were made.
    pub interactions: Vec<Interaction>,
}

/// One call: what was asked and what came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interaction {
    /// The request as the replay provider compares it.
    pub request: RecordedRequest,
    /// The answer to give.
    pub response: Response,
    /// The pieces the answer arrived in, when it streamed: the `replay` provider reports
    /// them in order to a caller that streams ([`super::stream`]). Absent for a whole
    /// answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<super::Delta>,
}

/// The parts of a request a replay compares: model, messages, tools and options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// The model asked for.
    pub model: String,
    /// The conversation sent.
    pub messages: Vec<Message>,
    /// The tools offered, in order; compared only when present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<RecordedTool>,
    /// The request options; absent means none (the provider's defaults).
    #[serde(default, skip_serializing_if = "is_default")]
    pub options: Options,
}

fn is_default(options: &Options) -> bool {
    *options == Options::default()
}

/// A tool of a recorded request: its whole definition (name, description and argument
/// schema, all compared), or its name alone (compared by name; older cassettes, and the
/// cassettes tests write by hand).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RecordedTool {
    /// The name alone.
    Name(String),
    /// The whole definition.
    Definition(ToolDefinition),
}

impl RecordedTool {
    /// The tool's full name.
    pub fn name(&self) -> &str {
        match self {
            RecordedTool::Name(name) => name,
            RecordedTool::Definition(d) => &d.name,
        }
    }
}

impl From<&Request> for RecordedRequest {
    fn from(request: &Request) -> Self {
        RecordedRequest {
            model: request.model.clone(),
            messages: request.messages.clone(),
            tools: request
                .tools
                .iter()
                .cloned()
                .map(RecordedTool::Definition)
                .collect(),
            options: request.options.clone(),
        }
    }
}

impl RecordedRequest {
    /// The same request as a cassette holding names alone records it: tools by name, no
    /// options (to compare a recording with a hand-written cassette).
    pub fn names_only(&self) -> RecordedRequest {
        RecordedRequest {
            model: self.model.clone(),
            messages: self.messages.clone(),
            tools: self
                .tools
                .iter()
                .map(|t| RecordedTool::Name(t.name().to_string()))
                .collect(),
            options: Options::default(),
        }
    }
}

impl Cassette {
    /// Reads a cassette file (a recording cut short too: its whole interactions).
    pub fn load(path: &Path) -> Result<Cassette> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cassette {}: cannot read", path.display()))?;
        let name = path.display().to_string();
        let list = interactions(&name, &bytes)?;
        let interactions = serde_json::from_value(serde_json::Value::Array(list))
            .with_context(|| format!("cassette {name}"))?;
        Ok(Cassette { interactions })
    }

    /// Writes the cassette atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::store::write_named_file_atomic(path, &crate::store::json_bytes(self)?)
            .with_context(|| format!("writing cassette {}", path.display()))
    }
}

/// Where `replay` cassettes live in a workspace: `cassettes/<model_id>.json`.
pub const CASSETTES_DIR: &str = "cassettes";

/// Checks that `model_id` of the `replay` provider is one plain name (letters, digits,
/// `.`, `_`, `-`; not `.` or `..`): it names the file `cassettes/<model_id>.json` of the
/// workspace and nothing else.
pub fn check_replay_model_id(model_id: &str) -> Result<(), String> {
    let plain = !model_id.is_empty()
        && model_id != "."
        && model_id != ".."
        && model_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if plain {
        Ok(())
    } else {
        Err(format!(
            "replay model id {model_id:?} is not one plain name (letters, digits, '.', '_', \
             '-'): it names the cassette {CASSETTES_DIR}/<model_id>.json of the workspace"
        ))
    }
}

/// The first line of a cassette a [`Recorder`] writes; one interaction a line follows
/// (the second and later ones led by a comma), then [`RECORDING_FOOTER`].
pub const RECORDING_HEADER: &str = "{\"interactions\": [\n";

/// The last line of a cassette a [`Recorder`] writes.
pub const RECORDING_FOOTER: &str = "]}\n";

/// Bytes one recording writes to its cassette by default: the most Trellis reads of a
/// workspace file, so that what is recorded can be replayed from a workspace.
pub const RECORD_CAP: u64 = crate::store::workspace_fs::READ_CAP;

/// The JSON values one cassette may hold, counted before it is parsed: about 100 MB parsed
/// at most, where a cassette of [`RECORD_CAP`] bytes of small values would take over a
/// gigabyte. A recording of the longest runs holds far fewer (some tens per interaction).
pub const MAX_CASSETTE_VALUES: usize = crate::json_values::MAX_FILE_VALUES;

/// The JSON values the cassettes one run replays may hold together: each is kept parsed for
/// the whole run, once per model.
pub const MAX_REPLAY_VALUES: usize = 4 * MAX_CASSETTE_VALUES;

/// The interactions of the cassette `name` (its JSON text `bytes`), as the `replay`
/// provider reads them: `{"interactions": [...]}` or a bare list. A recording cut short
/// (it starts with [`RECORDING_HEADER`], every whole line after it is one interaction,
/// and only its last line, with no end of line, is not) gives its whole interactions.
/// A cassette of more than [`MAX_CASSETTE_VALUES`] JSON values is refused unparsed.
pub fn interactions(name: &str, bytes: &[u8]) -> Result<Vec<serde_json::Value>> {
    counted_interactions(name, bytes).map(|(list, _)| list)
}

/// [`interactions`] and how many JSON values the cassette holds.
fn counted_interactions(name: &str, bytes: &[u8]) -> Result<(Vec<serde_json::Value>, usize)> {
    let values =
        crate::json_values::check_values(&format!("cassette {name}"), bytes, MAX_CASSETTE_VALUES)?;
    let list = parse_interactions(name, bytes)?;
    check_chunks(name, &list)?;
    Ok((list, values))
}

/// Pieces one recorded interaction may hold (`chunks`): a recording joins neighbouring
/// pieces past it, and a replay refuses a cassette with more, before anything runs.
pub const MAX_RECORDED_CHUNKS: usize = 4096;

/// Pieces a whole cassette may hold: each costs the host far more to replay than its
/// bytes in the file (a value parsed, held, handed to the provider and reported back).
pub const MAX_CASSETTE_CHUNKS: usize = 65_536;

/// Refuses `list` when an interaction holds more than [`MAX_RECORDED_CHUNKS`] pieces, or all
/// of them together more than [`MAX_CASSETTE_CHUNKS`].
fn check_chunks(name: &str, list: &[serde_json::Value]) -> Result<()> {
    let mut total = 0usize;
    for (i, interaction) in list.iter().enumerate() {
        let Some(chunks) = interaction.get("chunks") else {
            continue;
        };
        let Some(chunks) = chunks.as_array() else {
            anyhow::bail!("cassette {name}: interactions[{i}].chunks: expected a list of pieces");
        };
        if chunks.len() > MAX_RECORDED_CHUNKS {
            anyhow::bail!(
                "cassette {name}: interactions[{i}].chunks holds {} pieces, more than the \
                 {MAX_RECORDED_CHUNKS} one interaction may replay; join them, or remove \
                 `chunks` to replay the answer whole",
                chunks.len()
            );
        }
        total += chunks.len();
        if total > MAX_CASSETTE_CHUNKS {
            anyhow::bail!(
                "cassette {name}: its interactions hold more than {MAX_CASSETTE_CHUNKS} pieces \
                 (`chunks`) together, more than one cassette may replay"
            );
        }
    }
    Ok(())
}

fn parse_interactions(name: &str, bytes: &[u8]) -> Result<Vec<serde_json::Value>> {
    let value: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(err) => {
            if let Some(list) = cut_recording(bytes) {
                tracing::warn!(
                    "cassette {name} ends part way through an interaction (a recording cut \
                     short): replaying its {} whole interaction(s)",
                    list.len()
                );
                return Ok(list);
            }
            return Err(anyhow::Error::new(err).context(format!("cassette {name}: not JSON")));
        }
    };
    match value {
        serde_json::Value::Array(list) => Ok(list),
        serde_json::Value::Object(mut map) => match map.remove("interactions") {
            Some(serde_json::Value::Array(list)) => Ok(list),
            _ => anyhow::bail!(
                "cassette {name}: expected {{\"interactions\": [...]}} or a list of interactions"
            ),
        },
        _ => anyhow::bail!(
            "cassette {name}: expected {{\"interactions\": [...]}} or a list of interactions"
        ),
    }
}

/// The whole interactions of a recording cut short: `None` unless `bytes` start with
/// [`RECORDING_HEADER`] and every whole line after it is one interaction (a comma before
/// it from the second on); the last line, not ended, is dropped.
fn cut_recording(bytes: &[u8]) -> Option<Vec<serde_json::Value>> {
    let rest = bytes.strip_prefix(RECORDING_HEADER.as_bytes())?;
    let whole = &rest[..rest.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)];
    let mut list = Vec::new();
    for line in whole.split_inclusive(|&b| b == b'\n') {
        let line = &line[..line.len() - 1];
        let item = if list.is_empty() {
            line
        } else {
            line.strip_prefix(b",")?
        };
        match serde_json::from_slice::<serde_json::Value>(item) {
            Ok(value @ serde_json::Value::Object(_)) => list.push(value),
            _ => return None,
        }
    }
    Some(list)
}

/// The position in a cassette across the calls of a run. Every provider call is
/// a fresh instance, so the host keeps the count and passes the interaction due in the
/// endpoint ([`Endpoint::replay_of`]). Clones share the position: the steps of a run that
/// replay the same cassette consume its interactions in turn.
#[derive(Debug, Clone)]
pub struct ReplayCursor {
    cassette: PathBuf,
    name: String,
    /// The JSON values of the cassette, once read (see [`MAX_REPLAY_VALUES`]).
    values: usize,
    loaded: Arc<Mutex<Option<Arc<Vec<serde_json::Value>>>>>,
    next: Arc<AtomicUsize>,
}

impl ReplayCursor {
    /// A cursor at the first interaction of the cassette file `cassette`, read on the
    /// first call (a path the caller trusts; see [`ReplayCursor::in_workspace`]).
    pub fn new(cassette: impl Into<PathBuf>) -> Self {
        let cassette = cassette.into();
        ReplayCursor {
            name: cassette.display().to_string(),
            cassette,
            values: 0,
            loaded: Arc::default(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A cursor at the first interaction of `cassettes/<model_id>.json` in the workspace
    /// at `root`, read now. `model_id` must be one plain name, and the file is read through
    /// [`crate::store::WorkspaceFs`]: a link anywhere on the way, anything but a regular
    /// file, or a file over its read cap is refused.
    pub fn in_workspace(root: &Path, model_id: &str) -> Result<Self> {
        check_replay_model_id(model_id).map_err(anyhow::Error::msg)?;
        let name = format!("{CASSETTES_DIR}/{model_id}.json");
        let shown = root.join(&name);
        // Through the workspace's file handling, like every other workspace file: no link
        // anywhere on the path (not even one that stays inside), regular files only (opened
        // without blocking), at most READ_CAP bytes (a huge sparse file is not read).
        let bytes = crate::store::WorkspaceFs::open(root)
            .and_then(|fs| fs.read(&name))
            .with_context(|| {
                format!(
                    "no cassette {} (it must be a regular file inside the workspace)",
                    shown.display()
                )
            })?;
        let (interactions, values) = counted_interactions(&name, &bytes)?;
        Ok(ReplayCursor {
            cassette: shown,
            name,
            values,
            loaded: Arc::new(Mutex::new(Some(Arc::new(interactions)))),
            next: Arc::new(AtomicUsize::new(0)),
        })
    }

    fn interactions(&self) -> Result<Arc<Vec<serde_json::Value>>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = &*loaded {
            return Ok(list.clone());
        }
        let bytes = std::fs::read(&self.cassette)
            .with_context(|| format!("cassette {}: cannot read", self.name))?;
        let list = Arc::new(interactions(&self.name, &bytes)?);
        *loaded = Some(list.clone());
        Ok(list)
    }

    /// The endpoint of the next call, which consumes one interaction.
    pub fn next_endpoint(&self) -> Result<Endpoint> {
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        self.endpoint_at(index)
    }

    /// The endpoint answering call `index` (from 0), consuming nothing.
    pub fn endpoint_at(&self, index: usize) -> Result<Endpoint> {
        Ok(Endpoint::replay_of(
            &self.name,
            &self.interactions()?,
            index,
        ))
    }

    /// The JSON values of the cassette, when [`ReplayCursor::in_workspace`] read it (0 for a
    /// cursor of [`ReplayCursor::new`], which reads on the first call).
    pub fn values(&self) -> usize {
        self.values
    }

    /// The cassette file.
    pub fn cassette(&self) -> &Path {
        &self.cassette
    }

    /// Interactions consumed so far.
    pub fn position(&self) -> usize {
        self.next.load(Ordering::SeqCst)
    }
}

/// Appends every answered call to a cassette file, in place, up to its cap.
#[derive(Debug)]
pub struct Recorder {
    path: PathBuf,
    model: Option<String>,
    cap: u64,
    state: Mutex<RecorderState>,
}

#[derive(Debug)]
struct RecorderState {
    file: std::fs::File,
    /// The file's length (ending with the footer).
    len: u64,
    /// Interactions recorded.
    count: usize,
    /// Bytes written to the file since it was created.
    written: u64,
    /// Set once an interaction did not fit under the cap: nothing more is recorded.
    stopped: bool,
}

impl Recorder {
    /// Starts a new, empty cassette at `path` (written at once, replacing any file there),
    /// capped at [`RECORD_CAP`] bytes.
    pub fn create(path: impl Into<PathBuf>) -> Result<Recorder> {
        let path = path.into();
        let empty = format!("{RECORDING_HEADER}{RECORDING_FOOTER}");
        let file = crate::store::create_named_file_atomic(&path, empty.as_bytes())
            .with_context(|| format!("writing cassette {}", path.display()))?;
        Ok(Recorder {
            path,
            model: None,
            cap: RECORD_CAP,
            state: Mutex::new(RecorderState {
                file,
                len: empty.len() as u64,
                count: 0,
                written: empty.len() as u64,
                stopped: false,
            }),
        })
    }

    /// Records every request under `model` instead of the model it asked for. The `replay`
    /// provider compares the model, and a run replays as `replay:<name>` whatever models
    /// answered the recorded run (each response keeps the model that answered).
    pub fn recording_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Caps the cassette at `bytes` (instead of [`RECORD_CAP`]): an interaction that would
    /// take it past them is not written, and the recording stops there.
    pub fn with_cap(mut self, bytes: u64) -> Self {
        self.cap = bytes;
        self
    }

    /// The cassette file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many interactions are recorded.
    pub fn len(&self) -> usize {
        self.lock().count
    }

    /// Whether nothing is recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes written to the cassette file since it was created (the empty cassette
    /// included).
    pub fn bytes_written(&self) -> u64 {
        self.lock().written
    }

    /// Whether the recording stopped at its cap.
    pub fn stopped(&self) -> bool {
        self.lock().stopped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecorderState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one interaction: its line and the footer are written over the old footer.
    /// Past the cap nothing is written, and the recording stops (an error says so once;
    /// later calls record nothing and return `Ok`).
    pub fn record(&self, request: &Request, response: &Response) -> Result<()> {
        self.record_streamed(request, response, Vec::new())
    }

    /// [`record`](Self::record) for an answer that arrived in `chunks`
    /// ([`ReplyStream::chunks_of`](super::ReplyStream::chunks_of)), kept with it.
    pub fn record_streamed(
        &self,
        request: &Request,
        response: &Response,
        chunks: Vec<super::Delta>,
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let mut recorded = RecordedRequest::from(request);
        if let Some(model) = &self.model {
            recorded.model = model.clone();
        }
        let interaction = Interaction {
            request: recorded,
            response: response.clone(),
            chunks,
        };
        let mut state = self.lock();
        if state.stopped {
            return Ok(());
        }
        let mut line = Vec::new();
        if state.count > 0 {
            line.push(b',');
        }
        serde_json::to_writer(&mut line, &interaction).with_context(|| {
            format!("cassette {}: encoding an interaction", self.path.display())
        })?;
        line.push(b'\n');
        line.extend_from_slice(RECORDING_FOOTER.as_bytes());
        let at = state.len - RECORDING_FOOTER.len() as u64;
        let new_len = at + line.len() as u64;
        if new_len > self.cap {
            state.stopped = true;
            anyhow::bail!(
                "cassette {}: recording stopped: interaction {} ({} bytes) would take the \
                 cassette past its cap of {} bytes (--record-max-mib); it holds the {} \
                 interaction(s) before, and the run goes on unrecorded",
                self.path.display(),
                state.count + 1,
                line.len() - RECORDING_FOOTER.len(),
                self.cap,
                state.count
            );
        }
        // Cut the footer first: a run killed between the two leaves whole lines alone.
        let written = state
            .file
            .set_len(at)
            .and_then(|()| state.file.write_all_at(&line, at));
        if let Err(err) = written {
            state.stopped = true;
            return Err(anyhow::Error::new(err).context(format!(
                "writing cassette {}: recording stopped",
                self.path.display()
            )));
        }
        state.len = new_len;
        state.written += line.len() as u64;
        state.count += 1;
        Ok(())
    }

    /// Makes the call through `registry` and records it when it answered. A
    /// failed recording is logged, not returned: the run goes on.
    pub async fn complete(
        &self,
        registry: &PluginRegistry,
        provider: &str,
        endpoint: &Endpoint,
        secret: &Secret,
        request: &Request,
        limits: &Limits,
    ) -> Result<Response, LlmCallError> {
        let response = registry
            .complete(provider, endpoint, secret, request, limits)
            .await?;
        if let Err(err) = self.record(request, &response) {
            tracing::error!("{err:#}");
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_model_ids_are_plain_names() {
        for good in ["demo", "triage-demo", "v1.2_x"] {
            check_replay_model_id(good).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/etc/passwd",
            "a\\b",
            "x y",
            "c:d",
        ] {
            let err = check_replay_model_id(bad).unwrap_err();
            assert!(err.contains("not one plain name"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_cassette_outside_the_workspace_is_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(CASSETTES_DIR)).unwrap();
        std::fs::write(dir.path().join("out.json"), "[]").unwrap();
        std::fs::write(ws.join("cassettes/in.json"), "[{}]").unwrap();
        std::os::unix::fs::symlink(dir.path().join("out.json"), ws.join("cassettes/out.json"))
            .unwrap();
        std::fs::create_dir(ws.join("cassettes/dir.json")).unwrap();
        let cursor = ReplayCursor::in_workspace(&ws, "in").unwrap();
        let endpoint = cursor.next_endpoint().unwrap();
        assert_eq!(endpoint.settings["interaction"], serde_json::json!({}));
        assert_eq!(endpoint.settings["cassette"], "cassettes/in.json");
        assert!(endpoint.grant.folders().is_empty());
        for bad in ["out", "dir", "missing", "../out"] {
            assert!(ReplayCursor::in_workspace(&ws, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_workspace_cassette_is_read_like_every_workspace_file() {
        // Links (even inside the workspace), FIFOs and files over READ_CAP are refused, as
        // WorkspaceFs refuses them everywhere else; before, a sparse file was read whole.
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::create_dir_all(ws.join(CASSETTES_DIR)).unwrap();
        std::fs::write(ws.join("cassettes/in.json"), "[{}]").unwrap();
        std::os::unix::fs::symlink("in.json", ws.join("cassettes/inner.json")).unwrap();
        let huge = std::fs::File::create(ws.join("cassettes/huge.json")).unwrap();
        huge.set_len(crate::store::workspace_fs::READ_CAP + 1)
            .unwrap();
        let fifo =
            std::ffi::CString::new(ws.join("cassettes/fifo.json").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let refusal = |id: &str| format!("{:#}", ReplayCursor::in_workspace(ws, id).unwrap_err());
        let err = refusal("inner");
        assert!(
            err.contains("cassettes/inner.json is a symbolic link; Trellis does not read or write through links"),
            "{err}"
        );
        let err = refusal("huge");
        assert!(
            err.contains(&format!(
                "cassettes/huge.json is {} bytes, more than the {} Trellis reads",
                crate::store::workspace_fs::READ_CAP + 1,
                crate::store::workspace_fs::READ_CAP
            )),
            "{err}"
        );
        let err = refusal("fifo");
        assert!(
            err.contains("cassettes/fifo.json is not a regular file"),
            "{err}"
        );
        assert!(ReplayCursor::in_workspace(ws, "in").is_ok());
    }
}
