//! Calling a validator plugin on a file, the caps on the report it returns, and the
//! registry's validators as the gate's [`CustomValidator`].

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
    if text.len() <= MAX_VALIDATOR_FIELD_BYTES {
        return text;
    }
    format!(
        "{}… [cut: {} bytes, limit {MAX_VALIDATOR_FIELD_BYTES}]",
        crate::sandbox::state::truncate(&text, MAX_VALIDATOR_FIELD_BYTES),
        text.len()
    )
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

/// The registry's validator plugins as the gate's [`CustomValidator`]: a file rule
/// whose `validation_type` is `csv` goes to the validator plugin with id `csv`.
#[derive(Debug)]
pub struct PluginValidators<'a> {
    registry: &'a PluginRegistry,
    limits: Limits,
}

impl<'a> PluginValidators<'a> {
    /// Validators of `registry`, each call bounded by `limits`.
    pub fn new(registry: &'a PluginRegistry, limits: Limits) -> Self {
        PluginValidators { registry, limits }
    }
}

impl CustomValidator for PluginValidators<'_> {
    fn supports(&self, validation_type: &str) -> bool {
        self.registry
            .get(validation_type)
            .is_some_and(|p| p.manifest.kind == PluginKind::Validator)
    }

    fn validate<'a>(
        &'a self,
        validation_type: &'a str,
        file: &'a Path,
        rule: &'a serde_json::Value,
    ) -> ValidateFuture<'a> {
        Box::pin(self.registry.validate_file(
            validation_type,
            validation_type,
            file,
            rule,
            &self.limits,
        ))
    }
}
