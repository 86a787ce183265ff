//! Showing a reply as it arrives (`trellis:plugin/reply`, new in 0.3.0).
//!
//! Ask the server for a streamed answer only when [`streaming`] is `true`; then report
//! the pieces as they are read with a [`Reporter`], and return the whole answer from
//! `complete` as always. The host shows the pieces early and keeps the answer.

pub use crate::bindings::llm_world::trellis::plugin::reply::{Delta, TokenUsage, ToolCallPiece};

use crate::bindings::llm_world::trellis::plugin::reply as host;

/// Whether the host wants this reply streamed.
pub fn streaming() -> bool {
    host::streaming()
}

/// Reports the pieces of one reply, stopping once the host takes no more.
#[derive(Debug)]
pub struct Reporter {
    open: bool,
}

impl Default for Reporter {
    fn default() -> Self {
        Reporter::new()
    }
}

impl Reporter {
    /// A reporter for a new reply.
    pub fn new() -> Self {
        Reporter { open: true }
    }

    /// Reports `deltas` (nothing when empty, or once the host said it takes no more).
    pub fn report(&mut self, deltas: &[Delta]) {
        if self.open && !deltas.is_empty() {
            self.open = host::report(deltas);
        }
    }

    /// Whether the host still takes pieces.
    pub fn is_open(&self) -> bool {
        self.open
    }
}
