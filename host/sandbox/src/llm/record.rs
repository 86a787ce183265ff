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
//! cassette, rewriting the file atomically after every interaction, so a run
//! killed half way leaves a whole cassette of what happened until then.

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
    /// Reads a cassette file.
    pub fn load(path: &Path) -> Result<Cassette> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cassette {}: cannot read", path.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("cassette {}: not JSON", path.display()))?;
        let parsed = if value.is_array() {
            serde_json::from_value(value).map(|interactions| Cassette { interactions })
        } else {
            serde_json::from_value(value)
        };
        parsed.with_context(|| format!("cassette {}", path.display()))
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

/// The interactions of the cassette `name` (its JSON text `bytes`), as the `replay`
/// provider reads them: `{"interactions": [...]}` or a bare list.
pub fn interactions(name: &str, bytes: &[u8]) -> Result<Vec<serde_json::Value>> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).with_context(|| format!("cassette {name}: not JSON"))?;
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

/// The position in a cassette across the calls of a run. Every provider call is
/// a fresh instance, so the host keeps the count and passes the interaction due in the
/// endpoint ([`Endpoint::replay_of`]). Clones share the position: the steps of a run that
/// replay the same cassette consume its interactions in turn.
#[derive(Debug, Clone)]
pub struct ReplayCursor {
    cassette: PathBuf,
    name: String,
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
        let interactions = interactions(&name, &bytes)?;
        Ok(ReplayCursor {
            cassette: shown,
            name,
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

    /// The cassette file.
    pub fn cassette(&self) -> &Path {
        &self.cassette
    }

    /// Interactions consumed so far.
    pub fn position(&self) -> usize {
        self.next.load(Ordering::SeqCst)
    }
}

/// Appends every answered call to a cassette file.
#[derive(Debug)]
pub struct Recorder {
    path: PathBuf,
    model: Option<String>,
    cassette: Mutex<Cassette>,
}

impl Recorder {
    /// Starts a new, empty cassette at `path` (written at once, replacing any file there).
    pub fn create(path: impl Into<PathBuf>) -> Result<Recorder> {
        let path = path.into();
        let cassette = Cassette::default();
        cassette.save(&path)?;
        Ok(Recorder {
            path,
            model: None,
            cassette: Mutex::new(cassette),
        })
    }

    /// Records every request under `model` instead of the model it asked for. The `replay`
    /// provider compares the model, and a run replays as `replay:<name>` whatever models
    /// answered the recorded run (each response keeps the model that answered).
    pub fn recording_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// The cassette file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many interactions are recorded.
    pub fn len(&self) -> usize {
        self.lock().interactions.len()
    }

    /// Whether nothing is recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cassette> {
        self.cassette.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one interaction and rewrites the file.
    pub fn record(&self, request: &Request, response: &Response) -> Result<()> {
        let mut recorded = RecordedRequest::from(request);
        if let Some(model) = &self.model {
            recorded.model = model.clone();
        }
        let mut cassette = self.lock();
        cassette.interactions.push(Interaction {
            request: recorded,
            response: response.clone(),
        });
        cassette.save(&self.path)
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
