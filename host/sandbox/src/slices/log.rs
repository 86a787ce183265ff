//! The log slice: `trellis:plugin/host` (the guest's log) and `trellis:plugin/types`.
//!
//! Per call it keeps who is logging and how many lines it has logged: a guest cannot flood
//! the host's log.

use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker};

use crate::plugins::bindings::tool::trellis::plugin::{host, types};
use crate::state::{CallState, truncate};

/// Log lines longer than this are cut.
const LOG_LINE_BYTES: usize = 4 << 10;
/// Log lines per call after which the rest are dropped.
const LOG_LINES_PER_CALL: u32 = 1000;

/// Links `host` and `types`, once: at 0.1.0 (every world) and at 0.3.0 (the streaming
/// provider's).
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> anyhow::Result<()> {
    host::add_to_linker::<CallState, HasSelf<LogState>>(linker, |s| &mut s.log)?;
    types::add_to_linker::<CallState, HasSelf<LogState>>(linker, |s| &mut s.log)?;
    v3::host::add_to_linker::<CallState, HasSelf<LogState>>(linker, |s| &mut s.log)?;
    v3::types::add_to_linker::<CallState, HasSelf<LogState>>(linker, |s| &mut s.log)?;
    Ok(())
}

use crate::plugins::bindings::llm3::trellis::plugin as v3;

impl v3::types::Host for LogState {}

/// The 0.3.0 interface: the same log.
impl v3::host::Host for LogState {
    fn log(&mut self, level: v3::host::LogLevel, message: String) {
        let level = match level {
            v3::host::LogLevel::Trace => host::LogLevel::Trace,
            v3::host::LogLevel::Debug => host::LogLevel::Debug,
            v3::host::LogLevel::Info => host::LogLevel::Info,
            v3::host::LogLevel::Warn => host::LogLevel::Warn,
            v3::host::LogLevel::Error => host::LogLevel::Error,
        };
        host::Host::log(self, level, message);
    }
}

/// The log of one call.
pub(crate) struct LogState {
    /// Who logs: a plugin id, `script:<step>`.
    pub(crate) label: Arc<str>,
    lines: u32,
    /// Values that never reach the log (the key of a provider call).
    secrets: Vec<String>,
}

impl LogState {
    pub(crate) fn new(label: Arc<str>, secrets: Vec<String>) -> Self {
        LogState {
            label,
            lines: 0,
            secrets,
        }
    }
}

impl types::Host for LogState {}

impl host::Host for LogState {
    fn log(&mut self, level: host::LogLevel, message: String) {
        self.lines += 1;
        if self.lines > LOG_LINES_PER_CALL {
            return;
        }
        // Hidden before the cut, so that no part of a key survives at the cut either.
        let message = crate::llm::redact_secrets(&message, &self.secrets);
        let message = truncate(&message, LOG_LINE_BYTES);
        let plugin = &*self.label;
        match level {
            host::LogLevel::Trace => tracing::trace!(plugin, "{message}"),
            host::LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            host::LogLevel::Info => tracing::info!(plugin, "{message}"),
            host::LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            host::LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }
}
