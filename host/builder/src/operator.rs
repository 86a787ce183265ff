//! The builder's read tools for a front end without a session: the server's endpoints for
//! costs, run artifacts and turn logs, workspace files and the database read the workspace
//! exactly as the builder's model does, with the same refusals (links, special and secret
//! files, writes in SQL) and the same budgets.

use std::path::Path;

use serde_json::Value;

use trellis_sandbox::Limits;
use trellis_sandbox::capabilities::DbWriteBudget;
use trellis_sandbox::plugins::PluginRegistry;

use crate::modes::{DB_READ_TOOLS, INSPECT_TOOLS, READ_TOOLS};
use crate::{BuilderObserver, Mode, ToolContext, ToolFailure, ToolResult};

/// Whether `name` is a tool that only reads (and so may be called by [`read`]).
pub fn is_read_tool(name: &str) -> bool {
    READ_TOOLS.contains(&name) || INSPECT_TOOLS.contains(&name) || DB_READ_TOOLS.contains(&name)
}

/// Calls the read tool `name` with `args` on the workspace `root`, as the model of a session
/// in builder mode would; any other tool is refused.
pub async fn read(
    root: &Path,
    registry: &PluginRegistry,
    limits: &Limits,
    name: &str,
    args: &Value,
) -> ToolResult {
    if !is_read_tool(name) {
        return Err(ToolFailure::new(format!("{name:?} is not a read tool")));
    }
    // A read tool writes nothing; its budget of writes is empty.
    let writes = DbWriteBudget::new(trellis_sandbox::capabilities::FsLimits {
        write_bytes: 0,
        ..limits.fs
    });
    let work = crate::call_work();
    let observer = BuilderObserver::none();
    let ctx = ToolContext {
        root,
        mode: Mode::Builder,
        registry,
        limits,
        turn_writes: &writes,
        session_id: "operator",
        observer: &observer,
        work: &work,
    };
    if READ_TOOLS.contains(&name) {
        crate::reads::call(&ctx, name, args).await
    } else if INSPECT_TOOLS.contains(&name) {
        crate::inspect::call(&ctx, name, args).await
    } else {
        crate::db::call(&ctx, name, args).await
    }
}
