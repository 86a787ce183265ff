//! Capability slices. Each links its interfaces once and builds its per-call state from
//! the grant; a world's linker is the list of its slices ([`linker`]). Adding a capability
//! touches one file here.
//!
//! | world     | slices                    |
//! |-----------|---------------------------|
//! | tool      | fs, db, log               |
//! | shell     | fs, db, log, commands     |
//! | validator | fs, log                   |
//! | provider  | fs, http, log, reply      |
//! | script    | fs (+ cli), db, http, log |
//!
//! Every world gets WASI through the fs slice, since a guest's standard library imports it;
//! a provider's WASI sees only the (empty) grant of its endpoint. The script's `cli` part
//! (environment, arguments, working directory) is added to the fs slice's context per call.

pub(crate) mod commands;
pub(crate) mod db;
pub(crate) mod fs;
pub(crate) mod http;
pub(crate) mod log;
pub(crate) mod reply;

use wasmtime::component::Linker;

use super::state::CallState;
use crate::engine::Engine;

/// One capability a world may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slice {
    /// WASI with the fenced filesystem.
    Fs,
    /// `trellis:plugin/workflow-db`.
    Db,
    /// `wasi:http`, gated by the call's policy.
    Http,
    /// `trellis:plugin/host` and `types`.
    Log,
    /// `trellis:plugin/reply` (0.3.0).
    Reply,
    /// `trellis:shell/commands`: the bundled shell's.
    Commands,
}

/// A tool plugin's slices.
pub(crate) const TOOL: &[Slice] = &[Slice::Fs, Slice::Db, Slice::Log];
/// The bundled shell's slices: a tool plugin's, and the commands it runs.
pub(crate) const SHELL: &[Slice] = &[Slice::Fs, Slice::Db, Slice::Log, Slice::Commands];
/// A validator plugin's slices.
pub(crate) const VALIDATOR: &[Slice] = &[Slice::Fs, Slice::Log];
/// An LLM provider's slices.
pub(crate) const PROVIDER: &[Slice] = &[Slice::Fs, Slice::Http, Slice::Log, Slice::Reply];
/// A step script's slices: its requests go only to its step's `allowed_hosts`, none without.
pub(crate) const SCRIPT: &[Slice] = &[Slice::Fs, Slice::Db, Slice::Http, Slice::Log];

/// The linker of a world given `slices`.
pub(crate) fn linker(engine: &Engine, slices: &[Slice]) -> anyhow::Result<Linker<CallState>> {
    let mut linker = Linker::new(engine.wasmtime());
    for slice in slices {
        match slice {
            Slice::Fs => fs::add_to_linker(&mut linker)?,
            Slice::Db => db::add_to_linker(&mut linker)?,
            Slice::Http => http::add_to_linker(&mut linker)?,
            Slice::Log => log::add_to_linker(&mut linker)?,
            Slice::Reply => reply::add_to_linker(&mut linker)?,
            Slice::Commands => commands::add_to_linker(&mut linker)?,
        }
    }
    Ok(linker)
}
