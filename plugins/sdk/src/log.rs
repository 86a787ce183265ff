//! Log lines sent to the host's log, tagged there with the plugin id.
//!
//! Prefer these to `eprintln!`: stderr is captured and capped by the host, while
//! these lines keep their level and end up next to the run's other logs.

use crate::bindings::trellis::plugin::host;

/// How important a log line is.
pub use crate::bindings::trellis::plugin::host::LogLevel as Level;

/// Writes `message` at `level`. The host truncates long lines.
pub fn log(level: Level, message: &str) {
    host::log(level, message);
}

/// Writes a `trace` line: fine-grained detail, usually hidden.
pub fn trace(message: &str) {
    log(Level::Trace, message);
}

/// Writes a `debug` line: detail useful while developing a plugin.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Writes an `info` line: normal progress.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Writes a `warn` line: something unexpected that the plugin recovered from.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Writes an `error` line: something failed.
pub fn error(message: &str) {
    log(Level::Error, message);
}
