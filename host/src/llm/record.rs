//! Cassettes: recorded LLM interactions that the `replay` provider answers from.
//!
//! A cassette is `{"interactions": [{"request": {...}, "response": {...}}, ...]}`
//! (a bare list of interactions is read too). Requests keep the model, the
//! messages and the names of the tools offered; responses are
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

use super::{Endpoint, LlmCallError, Message, Request, Response, Secret};
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

/// The parts of a request a replay compares: model, messages, tool names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// The model asked for.
    pub model: String,
    /// The conversation sent.
    pub messages: Vec<Message>,
    /// Names of the tools offered, in order; compared only when present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

impl From<&Request> for RecordedRequest {
    fn from(request: &Request) -> Self {
        RecordedRequest {
            model: request.model.clone(),
            messages: request.messages.clone(),
            tools: request.tools.iter().map(|t| t.name.clone()).collect(),
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

/// The position in a cassette across the calls of a run. Every provider call is
/// a fresh instance, so the host keeps the count and passes it in the endpoint.
/// Clones share the position: the steps of a run that replay the same cassette
/// consume its interactions in turn.
#[derive(Debug, Clone)]
pub struct ReplayCursor {
    cassette: PathBuf,
    next: Arc<AtomicUsize>,
}

impl ReplayCursor {
    /// A cursor at the first interaction of `cassette`.
    pub fn new(cassette: impl Into<PathBuf>) -> Self {
        ReplayCursor {
            cassette: cassette.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The endpoint of the next call, which consumes one interaction.
    pub fn next_endpoint(&self) -> Result<Endpoint> {
        Endpoint::replay(&self.cassette, self.next.fetch_add(1, Ordering::SeqCst))
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
