//! Calling an LLM provider plugin for a completion, with HTTP limited to the endpoint's
//! origin and the secret added by the host.

use super::*;
use crate::slices::reply::ReplyState;

/// Time a provider call gets beyond its HTTP timeout, so that a slow server
/// ends as the provider's own `timeout` error rather than an interrupted call.
pub(super) const LLM_CALL_GRACE: Duration = Duration::from_secs(2);

/// What a tool call of an answer counts beyond its id, name and arguments: the host answers
/// each call (a `not run` error past the calls an answer runs) and records it, so an answer
/// of many empty calls is not an answer of no size.
const TOOL_CALL_OVERHEAD_BYTES: usize = 256;

/// The size of an answer against the call's `output_bytes`: every string the host keeps
/// (text, each tool call's id, name and arguments, the model reported) and
/// [`TOOL_CALL_OVERHEAD_BYTES`] a call.
fn answer_size(response: &llm::Response) -> usize {
    let calls = response.tool_calls.iter().fold(0usize, |n, c| {
        n.saturating_add(TOOL_CALL_OVERHEAD_BYTES)
            .saturating_add(c.id.len())
            .saturating_add(c.name.len())
            .saturating_add(c.arguments.len())
    });
    response
        .text
        .len()
        .saturating_add(response.model.as_ref().map_or(0, String::len))
        .saturating_add(calls)
}

impl PluginRegistry {
    /// Asks LLM provider `provider` for a completion of `request` at `endpoint`.
    ///
    /// The call runs in a fresh instance that sees only `endpoint.grant`'s
    /// folders and may send HTTP requests only to `endpoint.base_url`'s origin;
    /// the host adds the secret to them in the provider's key header
    /// ([`llm::ProviderDefaults::key_header`]: `Authorization: Bearer <secret>`, or
    /// `x-api-key` for `anthropic`), so the plugin never holds the key.
    /// `limits.timeout` bounds each HTTP exchange; the call as a whole gets a
    /// little more. No retries here: see [`llm::complete_with_retries`].
    pub async fn complete(
        &self,
        provider: &str,
        endpoint: &llm::Endpoint,
        secret: &llm::Secret,
        request: &llm::Request,
        limits: &Limits,
    ) -> Result<llm::Response, LlmCallError> {
        self.complete_streaming(provider, endpoint, secret, request, limits, None)
            .await
    }

    /// [`complete`](Self::complete), with the pieces of the reply going to `reply` as the
    /// provider reads them, when it is one that streams ([`Plugin::streams`]) and `reply`
    /// asks for streaming. The pieces one reply reports count against `limits.output_bytes`
    /// like the answer; past it the provider is told to report no more.
    #[tracing::instrument(skip_all, fields(provider = %provider, model = %request.model))]
    pub async fn complete_streaming(
        &self,
        provider: &str,
        endpoint: &llm::Endpoint,
        secret: &llm::Secret,
        request: &llm::Request,
        limits: &Limits,
        reply: Option<&llm::stream::ReplyStream>,
    ) -> Result<llm::Response, LlmCallError> {
        let plugin = self
            .plugins
            .get(provider)
            .filter(|p| p.manifest.kind == PluginKind::LlmProvider)
            .ok_or_else(|| LlmCallError::UnknownProvider {
                provider: provider.to_string(),
                loaded: self.ids_of(PluginKind::LlmProvider),
            })?;
        let defaults = llm::ProviderDefaults::of(provider);
        let policy = llm::http::HttpPolicy::for_endpoint(
            &endpoint.base_url,
            secret,
            defaults.key_header,
            limits.timeout,
        )
        .map_err(|message| LlmCallError::BadEndpoint {
            provider: provider.to_string(),
            message,
        })?;
        let refused = policy.refused();
        let limited = policy.limited();
        let allowed = policy.allowed().map(|o| o.to_string());
        let call_limits = Limits {
            timeout: limits.timeout + LLM_CALL_GRACE,
            ..*limits
        };
        let secrets = policy.secret_values();
        let reply_state = reply
            .map(|stream| ReplyState::new(stream.clone(), limits.output_bytes, secrets.clone()));
        // The records handed over, in the version of the world the provider was built for.
        let args = if plugin.streams {
            Err((
                llm::wit::v3::endpoint(endpoint),
                llm::wit::v3::request(request),
            ))
        } else {
            Ok((
                llm::wit::v1::endpoint(endpoint),
                llm::wit::v1::request(request),
            ))
        };
        let outcome = run_call_with_http(
            &self.engine,
            plugin,
            &endpoint.grant,
            &call_limits,
            Some(policy),
            None,
            |pre, store| {
                Box::pin(async move {
                    let (endpoint, request) = match args {
                        Ok((endpoint, request)) => {
                            let bindings = bindings::llm::LlmProviderPre::new(pre.clone())?
                                .instantiate_async(&mut *store)
                                .await?;
                            let answer = bindings
                                .trellis_plugin_llm()
                                .call_complete(store, &endpoint, &request)
                                .await?;
                            return Ok(answer
                                .map(llm::wit::v1::response)
                                .map_err(llm::wit::v1::error));
                        }
                        Err(v3) => v3,
                    };
                    if let Some(state) = reply_state {
                        store.data_mut().reply = state;
                    }
                    let bindings = bindings::llm3::LlmProviderPre::new(pre.clone())?
                        .instantiate_async(&mut *store)
                        .await?;
                    let answer = bindings
                        .trellis_plugin_llm()
                        .call_complete(&mut *store, &endpoint, &request)
                        .await?;
                    if answer.is_ok() {
                        store.data().reply.finish();
                    }
                    Ok(answer
                        .map(llm::wit::v3::response)
                        .map_err(llm::wit::v3::error))
                })
            },
        )
        .await;
        let provider_error = |error| LlmCallError::Provider {
            provider: provider.to_string(),
            error,
            stopped_by_host: false,
        };
        match outcome {
            Ok(Ok(response)) => {
                // A server may echo the credentials it got: nothing returned keeps them.
                let response = response.redacted(secret);
                let size = answer_size(&response);
                if size > limits.output_bytes {
                    return Err(provider_error(LlmError::MalformedResponse(format!(
                        "the answer is {size} bytes, over the limit of {}",
                        limits.output_bytes
                    ))));
                }
                Ok(response)
            }
            Ok(Err(error)) => {
                let mut error = error;
                let mut stopped_by_host = false;
                let refused = refused.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if !refused.is_empty() {
                    stopped_by_host = true;
                    // The plugin may word a refusal as it likes; the host says what happened.
                    let only =
                        allowed.map_or("no host at all".to_string(), |a| format!("only {a}"));
                    error = LlmError::Transport(format!(
                        "the host refused the request to {}: this provider may reach {only}",
                        refused.join(", ")
                    ));
                } else if let Some(limit) =
                    limited.lock().unwrap_or_else(|e| e.into_inner()).clone()
                {
                    stopped_by_host = true;
                    error = LlmError::Transport(format!("the host stopped the call: {limit}"));
                } else if let LlmError::Transport(message) = &error
                    && (message.starts_with("cannot resolve")
                        || message.starts_with("cannot reach"))
                {
                    // Say where the address came from, so the reader knows what to fix.
                    error = LlmError::Transport(format!(
                        "{message} ({}: set by workflow.json providers.{provider}.base_url, \
                         else {})",
                        endpoint.base_url, defaults.base_url_env
                    ));
                }
                Err(LlmCallError::Provider {
                    provider: provider.to_string(),
                    error: error.redacted(secret),
                    stopped_by_host,
                })
            }
            Err(CallFailure::Timeout(_)) => Err(provider_error(LlmError::Timeout)),
            Err(failure) => Err(LlmCallError::Crashed {
                provider: provider.to_string(),
                message: secret
                    .redact(&call_error(failure, format!("llm `{provider}`")).to_string()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answers_size_counts_ids_the_model_and_each_call() {
        let call = |id: &str| llm::ToolCall {
            id: id.to_string(),
            name: "a:b".to_string(),
            arguments: "{}".to_string(),
        };
        let response = llm::Response {
            text: "hi".to_string(),
            tool_calls: vec![call("1234"), call("")],
            stop_reason: llm::StopReason::ToolCalls,
            usage: Default::default(),
            model: Some("model".to_string()),
        };
        assert_eq!(
            answer_size(&response),
            2 + 5 + 2 * (TOOL_CALL_OVERHEAD_BYTES + 3 + 2) + 4
        );
    }
}
