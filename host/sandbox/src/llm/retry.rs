//! Retries with backoff, then fallbacks, with every attempt kept for the logs.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::stream::ReplyStream;
use super::{Endpoint, LlmCallError, LlmError, Options, Request, Response, Secret, Usage};
use crate::PluginRegistry;
use crate::capabilities::Limits;

/// One provider and model to try, with where to reach it.
#[derive(Debug, Clone)]
pub struct Target {
    /// Provider plugin id, e.g. `openai`.
    pub provider: String,
    /// Model name as the provider knows it; replaces the request's model.
    pub model: String,
    /// Base URL, settings and folders of the provider.
    pub endpoint: Endpoint,
    /// The API key the host adds to the provider's requests.
    pub secret: Secret,
    /// Whether its replies may stream (`false`: `stream: false` in workflow.json or the
    /// model's options, for a server that cannot).
    pub stream: bool,
}

/// How often and how patiently to retry one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries of one target after its first attempt.
    pub max_retries: u32,
    /// Wait before the first retry; doubled for each further one.
    pub base_delay: Duration,
    /// Largest wait computed by backoff.
    pub max_delay: Duration,
    /// Largest wait a server's `Retry-After` may impose.
    pub max_retry_after: Duration,
    /// Time one attempt's HTTP exchange gets (connect, first byte, between bytes, all of
    /// it); `None`: the call's `limits.timeout`. A server that stalls ends as a timeout,
    /// which is retried.
    pub attempt_timeout: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            attempt_timeout: None,
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (from 0) after `error`: the
    /// server's `Retry-After` when it gave one (bounded), else exponential backoff.
    pub fn delay(&self, retry: u32, error: &LlmCallError) -> Duration {
        if let Some(LlmError::RateLimited(Some(ms))) = error.llm_error() {
            return Duration::from_millis(*ms).min(self.max_retry_after);
        }
        let factor = 2u32.saturating_pow(retry);
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptStatus {
    /// The model answered.
    Ok,
    /// HTTP 429.
    RateLimited,
    /// A 5xx status.
    ServerError,
    /// No answer in time.
    Timeout,
    /// The provider refused the request as invalid.
    InvalidRequest,
    /// The answer could not be understood.
    MalformedResponse,
    /// Connection failure or a refused destination.
    Transport,
    /// The plugin crashed or hit a limit.
    Crashed,
    /// No such provider, or an unusable endpoint.
    NotConfigured,
}

impl AttemptStatus {
    fn of(error: &LlmCallError) -> Self {
        match error {
            LlmCallError::Provider { error, .. } => match error {
                LlmError::RateLimited(_) => AttemptStatus::RateLimited,
                LlmError::Server(_) => AttemptStatus::ServerError,
                LlmError::Timeout => AttemptStatus::Timeout,
                LlmError::InvalidRequest(_) => AttemptStatus::InvalidRequest,
                LlmError::MalformedResponse(_) => AttemptStatus::MalformedResponse,
                LlmError::Transport(_) => AttemptStatus::Transport,
            },
            LlmCallError::Crashed { .. } => AttemptStatus::Crashed,
            LlmCallError::UnknownProvider { .. } | LlmCallError::BadEndpoint { .. } => {
                AttemptStatus::NotConfigured
            }
        }
    }
}

/// One call to one provider, for the logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// Provider id.
    pub provider: String,
    /// Model asked for.
    pub model: String,
    /// How it ended.
    pub status: AttemptStatus,
    /// The error, for a person to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The server's `Retry-After`, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// How long the call took, in milliseconds.
    pub duration_ms: u64,
    /// The wait before the next attempt of the same target, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Tokens used, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The outcome of [`complete_with_retries`]: the answer or the last error, and
/// every attempt made on the way.
#[derive(Debug)]
pub struct Completion {
    /// The answer, or the error of the last attempt.
    pub result: Result<Response, LlmCallError>,
    /// Every attempt, in order.
    pub attempts: Vec<Attempt>,
}

impl Completion {
    /// The attempt that answered.
    pub fn answered_by(&self) -> Option<&Attempt> {
        self.attempts
            .iter()
            .rev()
            .find(|a| a.status == AttemptStatus::Ok)
    }
}

/// Sends `request` to each of `targets` in order (the configured provider
/// first, then the fallbacks): a target is retried while it fails with a rate
/// limit, a server error or a timeout, waiting per `policy`; any other error,
/// or running out of retries, moves on to the next target.
pub async fn complete_with_retries(
    registry: &PluginRegistry,
    targets: &[Target],
    request: &Request,
    policy: &RetryPolicy,
    limits: &Limits,
) -> Completion {
    complete_with_options(registry, targets, &[], request, policy, limits).await
}

/// [`complete_with_retries`] with the sampling options of each target, by position
/// (`execution_llm.options` of the primary, then of each fallback); a missing or `None`
/// entry keeps the request's own options.
pub async fn complete_with_options(
    registry: &PluginRegistry,
    targets: &[Target],
    options: &[Option<Options>],
    request: &Request,
    policy: &RetryPolicy,
    limits: &Limits,
) -> Completion {
    complete_with_reply(registry, targets, options, request, policy, limits, None).await
}

/// [`complete_with_options`], the pieces of each attempt's reply going to `reply` as they
/// arrive ([`PluginRegistry::complete_streaming`]). An attempt after one that showed pieces
/// first says so ([`ReplyEvent::Restarted`](super::stream::ReplyEvent::Restarted), with the
/// failed attempt's error): the pieces shown of it are void.
pub async fn complete_with_reply(
    registry: &PluginRegistry,
    targets: &[Target],
    options: &[Option<Options>],
    request: &Request,
    policy: &RetryPolicy,
    limits: &Limits,
    reply: Option<&ReplyStream>,
) -> Completion {
    let limits = &Limits {
        timeout: policy.attempt_timeout.unwrap_or(limits.timeout),
        ..*limits
    };
    let mut attempts = Vec::new();
    let mut last_error: Option<LlmCallError> = None;
    for (i, target) in targets.iter().enumerate() {
        let mut request = request.clone();
        request.model = target.model.clone();
        if let Some(Some(options)) = options.get(i) {
            request.options = options.clone();
        }
        let mut retry = 0;
        loop {
            if let (Some(reply), Some(error)) = (reply, &last_error) {
                reply.restart(&error.to_string());
            }
            let started = Instant::now();
            let result = registry
                .complete_streaming(
                    &target.provider,
                    &target.endpoint,
                    &target.secret,
                    &request,
                    limits,
                    reply.filter(|_| target.stream),
                )
                .await;
            let duration_ms = started.elapsed().as_millis() as u64;
            let mut attempt = Attempt {
                provider: target.provider.clone(),
                model: target.model.clone(),
                status: AttemptStatus::Ok,
                error: None,
                retry_after_ms: None,
                duration_ms,
                delay_ms: None,
                usage: None,
            };
            match result {
                Ok(response) => {
                    attempt.usage = Some(response.usage);
                    attempts.push(attempt);
                    return Completion {
                        result: Ok(response),
                        attempts,
                    };
                }
                Err(error) => {
                    attempt.status = AttemptStatus::of(&error);
                    attempt.error = Some(error.to_string());
                    if let Some(LlmError::RateLimited(ms)) = error.llm_error() {
                        attempt.retry_after_ms = *ms;
                    }
                    let again = error.is_retryable() && retry < policy.max_retries;
                    let delay = again.then(|| policy.delay(retry, &error));
                    attempt.delay_ms = delay.map(|d| d.as_millis() as u64);
                    tracing::warn!(
                        provider = %target.provider,
                        model = %target.model,
                        status = ?attempt.status,
                        "LLM call failed: {error}"
                    );
                    attempts.push(attempt);
                    last_error = Some(error);
                    match delay {
                        Some(delay) => {
                            tokio::time::sleep(delay).await;
                            retry += 1;
                        }
                        None => break,
                    }
                }
            }
        }
    }
    Completion {
        result: Err(last_error.unwrap_or_else(|| LlmCallError::UnknownProvider {
            provider: String::new(),
            loaded: "no provider configured".into(),
        })),
        attempts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider_error(error: LlmError) -> LlmCallError {
        LlmCallError::Provider {
            provider: "p".into(),
            error,
            stopped_by_host: false,
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_retry_after_wins() {
        let policy = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(350),
            max_retry_after: Duration::from_secs(2),
            attempt_timeout: None,
        };
        let server = provider_error(LlmError::Server("500".into()));
        let waits: Vec<u128> = (0..4)
            .map(|r| policy.delay(r, &server).as_millis())
            .collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        let limited = provider_error(LlmError::RateLimited(Some(1500)));
        assert_eq!(policy.delay(0, &limited), Duration::from_millis(1500));
        let long = provider_error(LlmError::RateLimited(Some(90_000)));
        assert_eq!(policy.delay(0, &long), Duration::from_secs(2));
        let unknown = provider_error(LlmError::RateLimited(None));
        assert_eq!(policy.delay(1, &unknown), Duration::from_millis(200));
    }
}
