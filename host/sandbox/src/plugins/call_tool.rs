//! Calling a tool plugin: argument checks against the tool's schema, the call in a fresh
//! instance under the call's grant, and the tool's own errors.

use super::validate::cap_text;
use super::*;

impl PluginRegistry {
    /// Calls tool `full_name` (`server:tool`) with `args` under `grant` and `limits`.
    ///
    /// The arguments are checked against the tool's schema first; the call runs
    /// in a fresh instance that sees only the grant's folders.
    #[tracing::instrument(skip(self, args, grant, limits), fields(tool = full_name))]
    pub async fn call_tool(
        &self,
        full_name: &str,
        args: &serde_json::Value,
        grant: &Grant,
        limits: &Limits,
    ) -> Result<serde_json::Value, ToolCallError> {
        self.call_tool_inner(full_name, args, grant, limits, None)
            .await
    }

    /// [`PluginRegistry::call_tool`] that `cancel` stops: the guest is interrupted within a
    /// few milliseconds of the cancellation, and the call ends with
    /// [`ToolCallError::Cancelled`].
    #[tracing::instrument(skip(self, args, grant, limits, cancel), fields(tool = full_name))]
    pub async fn call_tool_cancellable(
        &self,
        full_name: &str,
        args: &serde_json::Value,
        grant: &Grant,
        limits: &Limits,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<serde_json::Value, ToolCallError> {
        self.call_tool_inner(full_name, args, grant, limits, Some(cancel))
            .await
    }

    async fn call_tool_inner(
        &self,
        full_name: &str,
        args: &serde_json::Value,
        grant: &Grant,
        limits: &Limits,
        cancel: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<serde_json::Value, ToolCallError> {
        let (plugin, spec) = self.resolve_tool(full_name)?;
        let tool = format!("{}:{}", plugin.manifest.id, spec.name);
        spec.check_arguments_within(args, limits.timeout)
            .await
            .map_err(|details| ToolCallError::InvalidArguments {
                tool: tool.clone(),
                details,
            })?;
        let outcome = run_call_with_http(
            &self.engine,
            plugin,
            grant,
            limits,
            None,
            cancel,
            |_, store| {
                let name = spec.name.clone();
                let args = args.to_string();
                let tool_pre = plugin.tool_pre();
                Box::pin(async move {
                    let bindings = tool_pre?.instantiate_async(&mut *store).await?;
                    bindings
                        .trellis_plugin_tool()
                        .call_call_tool(store, &name, &args)
                        .await
                })
            },
        )
        .await;
        let text = match outcome {
            Ok(Ok(text)) => text,
            Ok(Err(err)) => {
                let (kind, message) = tool_error(err);
                // The message goes to the agent's next turn: cut like a validator's.
                return Err(ToolCallError::Tool {
                    tool,
                    kind,
                    message: cap_text(message),
                });
            }
            Err(failure) => return Err(call_error(failure, tool)),
        };
        if text.len() > limits.output_bytes {
            return Err(ToolCallError::OutputTooLarge {
                tool,
                size: text.len(),
                limit: limits.output_bytes,
            });
        }
        serde_json::from_str(&text).map_err(|e| ToolCallError::InvalidOutput {
            tool,
            error: e.to_string(),
        })
    }
}

pub(super) fn tool_error(
    err: bindings::tool::exports::trellis::plugin::tool::ToolError,
) -> (ToolErrorKind, String) {
    use bindings::tool::exports::trellis::plugin::tool::ToolError as E;
    match err {
        E::InvalidArguments(m) => (ToolErrorKind::InvalidArguments, m),
        E::UnknownTool(m) => (ToolErrorKind::UnknownTool, m),
        E::NotFound(m) => (ToolErrorKind::NotFound, m),
        E::Denied(m) => (ToolErrorKind::Denied, m),
        E::Failed(m) => (ToolErrorKind::Failed, m),
    }
}
