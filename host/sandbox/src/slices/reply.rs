//! The reply slice: `trellis:plugin/reply` (0.3.0), the pieces of a reply a provider
//! reports while it reads it.
//!
//! Per call it holds the caller's [`ReplyStream`] (none: the provider is told not to
//! stream, and what it reports anyway goes nowhere), the bytes one reply may report (the
//! call's `output_bytes`) and the key to hide from what is shown.

use wasmtime::component::{HasSelf, Linker};

use crate::llm::Usage;
use crate::llm::stream::{Delta, ReplyStream, ToolCallPiece};
use crate::plugins::bindings::llm3::trellis::plugin::reply;
use crate::state::CallState;

/// Links `reply`, once.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> anyhow::Result<()> {
    reply::add_to_linker::<CallState, HasSelf<ReplyState>>(linker, |s| &mut s.reply)?;
    Ok(())
}

/// The reply of one call.
#[derive(Default)]
pub(crate) struct ReplyState {
    stream: Option<ReplyStream>,
    max_bytes: usize,
    secrets: Vec<String>,
}

impl ReplyState {
    /// Pieces go to `stream`, at most `max_bytes` of them, `secrets` hidden.
    pub(crate) fn new(stream: ReplyStream, max_bytes: usize, secrets: Vec<String>) -> Self {
        ReplyState {
            stream: Some(stream),
            max_bytes,
            secrets,
        }
    }

    /// The call ended with an answer: what the stream held back is shown.
    pub(crate) fn finish(&self) {
        if let Some(stream) = &self.stream {
            stream.finish(&self.secrets);
        }
    }
}

impl reply::Host for ReplyState {
    fn streaming(&mut self) -> bool {
        self.stream.as_ref().is_some_and(ReplyStream::streaming)
    }

    fn report(&mut self, deltas: Vec<reply::Delta>) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        let deltas = deltas.into_iter().map(delta).collect();
        stream.report(deltas, self.max_bytes, &self.secrets)
    }
}

fn delta(d: reply::Delta) -> Delta {
    match d {
        reply::Delta::Text(text) => Delta::Text(text),
        reply::Delta::ToolCall(p) => Delta::ToolCall(ToolCallPiece {
            index: p.index,
            id: p.id,
            name: p.name,
            arguments: p.arguments,
        }),
        reply::Delta::Usage(u) => Delta::Usage(Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens,
        }),
    }
}
