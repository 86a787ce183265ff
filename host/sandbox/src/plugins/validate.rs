//! Calling a validator plugin on a file, what it returns, and the caps on that report.

use serde::Serialize;

use super::*;

/// Checks one validator call may report; more means a broken validator.
pub(super) const MAX_VALIDATOR_CHECKS: usize = 10_000;
/// Warnings one validator call may report; the rest are dropped, and counted.
pub(super) const MAX_VALIDATOR_WARNINGS: usize = 100;
/// Longest message, expected or actual text of a check, and longest warning; longer
/// ones are cut and marked.
pub(super) const MAX_VALIDATOR_FIELD_BYTES: usize = 4 << 10;

/// A failed call as the error of validator `validator`.
pub(super) fn validator_error(failure: CallFailure, validator: String) -> ValidatorError {
    match failure {
        CallFailure::Timeout(after) => ValidatorError::Timeout { validator, after },
        CallFailure::Memory { limit } => ValidatorError::MemoryLimit { validator, limit },
        CallFailure::StackOverflow => ValidatorError::StackOverflow { validator },
        CallFailure::FsLimit(exceeded) => ValidatorError::FsLimit {
            validator,
            exceeded,
        },
        CallFailure::Exit {
            message, stderr, ..
        }
        | CallFailure::Trap { message, stderr } => ValidatorError::Crashed {
            validator,
            message,
            stderr,
        },
        CallFailure::Host(error) => ValidatorError::Host { validator, error },
        CallFailure::Cancelled => ValidatorError::Host {
            validator,
            error: anyhow::anyhow!("the call was cancelled"),
        },
    }
}

impl PluginRegistry {
    /// Runs validator plugin `id` on `file` (a host path) with `rule`, the whole file
    /// rule of the schema. The plugin sees the file's folder read-only, at `/input`.
    #[tracing::instrument(skip(self, rule, limits), fields(validator = id))]
    pub async fn validate_file(
        &self,
        id: &str,
        validation_type: &str,
        file: &Path,
        rule: &serde_json::Value,
        limits: &Limits,
    ) -> Result<CustomOutcome, ValidatorError> {
        let plugin = self
            .plugins
            .get(id)
            .filter(|p| p.manifest.kind == PluginKind::Validator)
            .ok_or_else(|| ValidatorError::Unknown(id.to_string()))?;
        let (Some(folder), Some(name)) = (file.parent(), file.file_name()) else {
            return Err(ValidatorError::NotAFile(file.to_path_buf()));
        };
        let grant = Grant::none()
            .read(folder, "/input")
            .map_err(ValidatorError::Grant)?;
        let request = bindings::validator::exports::trellis::plugin::validator::ValidateRequest {
            validation_type: validation_type.to_string(),
            file: format!("/input/{}", name.to_string_lossy()),
            rule: rule.to_string(),
        };
        let outcome = run_call(&self.engine, plugin, &grant, limits, |pre, store| {
            Box::pin(async move {
                let bindings = bindings::validator::ValidatorPluginPre::new(pre.clone())?
                    .instantiate_async(&mut *store)
                    .await?;
                bindings
                    .trellis_plugin_validator()
                    .call_validate(store, &request)
                    .await
            })
        })
        .await;
        let validator = id.to_string();
        let report = match outcome {
            Ok(Ok(report)) if report.checks.len() > MAX_VALIDATOR_CHECKS => {
                return Err(ValidatorError::TooManyChecks {
                    validator,
                    count: report.checks.len(),
                    limit: MAX_VALIDATOR_CHECKS,
                });
            }
            Ok(Ok(report)) => report,
            Ok(Err(message)) => {
                return Err(ValidatorError::Rule {
                    validator,
                    message: cap_text(message),
                });
            }
            Err(failure) => return Err(validator_error(failure, validator)),
        };
        let size: usize = report
            .checks
            .iter()
            .map(|c| {
                c.file.len()
                    + c.path.len()
                    + c.kind.len()
                    + c.expected.len()
                    + c.actual.len()
                    + c.message.len()
            })
            .chain(report.warnings.iter().map(String::len))
            .sum();
        if size > limits.output_bytes {
            return Err(ValidatorError::ReportTooLarge {
                validator,
                size,
                limit: limits.output_bytes,
            });
        }
        Ok(capped_outcome(report))
    }
}

/// `text` cut to [`MAX_VALIDATOR_FIELD_BYTES`] (validator fields, tool error messages), the
/// cut marked.
pub(super) fn cap_text(text: String) -> String {
    crate::cut::marked(&text, MAX_VALIDATOR_FIELD_BYTES)
}

/// A validator's report as the gate sees it, each text field cut to
/// [`MAX_VALIDATOR_FIELD_BYTES`] and the warnings to [`MAX_VALIDATOR_WARNINGS`], each
/// cut marked, so a validator cannot flood the run's report or the next LLM turn.
pub(super) fn capped_outcome(
    report: bindings::validator::exports::trellis::plugin::validator::Report,
) -> CustomOutcome {
    let cap = cap_text;
    let checks = report
        .checks
        .into_iter()
        .map(|c| CheckResult {
            file: cap(c.file),
            path: cap(c.path),
            kind: cap(c.kind),
            passed: c.passed,
            expected: cap(c.expected),
            actual: cap(c.actual),
            message: cap(c.message),
        })
        .collect();
    let dropped = report.warnings.len().saturating_sub(MAX_VALIDATOR_WARNINGS);
    let mut warnings: Vec<String> = report
        .warnings
        .into_iter()
        .take(MAX_VALIDATOR_WARNINGS)
        .map(cap)
        .collect();
    if dropped > 0 {
        warnings.push(format!(
            "[{dropped} more warnings dropped: limit {MAX_VALIDATOR_WARNINGS}]"
        ));
    }
    CustomOutcome { checks, warnings }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// The file checked, as named in the schema (`db/db.sqlite` for db rules).
    pub file: String,
    /// Where in the file: a JSONPath, a column; empty for the whole file.
    pub path: String,
    /// The kind of check: `must_exist`, `valid_json`, `value_type`, `min_length`, ...
    pub kind: String,
    /// Whether it held.
    pub passed: bool,
    /// What was expected, for a person to read.
    pub expected: String,
    /// What was found.
    pub actual: String,
    /// A sentence the agent can act on.
    pub message: String,
}

/// What a custom validator returns: its checks and warnings about the rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CustomOutcome {
    /// Every check run, passed or not.
    pub checks: Vec<CheckResult>,
    /// Problems with the rule that do not fail the gate.
    pub warnings: Vec<String>,
}

/// Why a custom validator could not apply its rule. Each names the validator; the
/// failures of a sandboxed call are worded as for a tool ([`crate::ToolCallError`]).
#[derive(Debug, thiserror::Error)]
pub enum ValidatorError {
    /// No validator plugin has this id.
    #[error("no validator plugin `{0}`")]
    Unknown(String),
    /// The path handed to the validator is not a file.
    #[error("{} is not a file", .0.display())]
    NotAFile(PathBuf),
    /// The file's folder could not be granted to the validator.
    #[error("{0:#}")]
    Grant(anyhow::Error),
    /// The validator's own error: it could not apply the rule (a bad option, say).
    #[error("validator `{validator}`: {message}")]
    Rule {
        /// The validator.
        validator: String,
        /// What it said, cut to 4 KiB.
        message: String,
    },
    /// The validator returned more checks than a report may hold.
    #[error("validator `{validator}`: returned {count} checks, over the limit of {limit}")]
    TooManyChecks {
        /// The validator.
        validator: String,
        /// Checks returned.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The validator's report is over the call's output limit.
    #[error(
        "validator `{validator}`: report of {size} bytes is over the {limit}-byte output limit"
    )]
    ReportTooLarge {
        /// The validator.
        validator: String,
        /// Size of the report's text.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The call ran past its deadline.
    #[error("validator `{validator}`: timed out after {after:?} and was stopped")]
    Timeout {
        /// The validator.
        validator: String,
        /// The deadline.
        after: std::time::Duration,
    },
    /// The instance went over its memory limit.
    #[error("validator `{validator}`: stopped: memory limit of {limit} bytes exceeded")]
    MemoryLimit {
        /// The validator.
        validator: String,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The guest overflowed its stack.
    #[error(
        "validator `{validator}`: stopped: the plugin exhausted its stack (recursion too deep)"
    )]
    StackOverflow {
        /// The validator.
        validator: String,
    },
    /// The call went over a filesystem limit.
    #[error("validator `{validator}`: stopped: the plugin {exceeded}")]
    FsLimit {
        /// The validator.
        validator: String,
        /// Which limit.
        exceeded: crate::capabilities::FsLimitExceeded,
    },
    /// The guest trapped or exited.
    #[error("validator `{validator}`: the plugin crashed: {message}{}", super::tools::stderr_suffix(.stderr))]
    Crashed {
        /// The validator.
        validator: String,
        /// What happened.
        message: String,
        /// What it wrote on stderr (head and tail).
        stderr: String,
    },
    /// The host could not set the call up.
    #[error("validator `{validator}`: {error:#}")]
    Host {
        /// The validator.
        validator: String,
        /// What went wrong.
        error: anyhow::Error,
    },
}
