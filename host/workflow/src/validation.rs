//! The validation gate: runs a step's `validation_schema` against its outputs (spec section 5).
//!
//! [`run_gate`] checks files in the step output folder (bare names) or in the workspace
//! (`db/...`, `knowledgebase/...`), JSON content with RFC 9535 JSONPath, and the workflow
//! database with read-only SQL. Every file is opened through a cap-std directory handle, so no
//! name in a schema reaches outside the workspace. File rules with a `validation_type` other
//! than `json` go to a [`CustomValidator`] (the host implements it with validator plugins).
//!
//! A gate either runs and produces a [`Report`] (passed or not), or cannot run at all and
//! returns a [`GateError`], which fails the step at once (spec section 4).

pub mod db;
pub mod json_checks;
mod plugins;
pub mod report;
pub mod schema;

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use serde_json::Value;

pub use plugins::PluginValidators;
pub use report::{CheckResult, Report, write_report};
pub use schema::{FileRule, JsonCheck, ValidationSchema};
pub use trellis_sandbox::plugins::{CustomOutcome, ValidatorError};

use json_checks::{Sink, run_check};
use schema::{MAX_CHECKS_PER_FILE, MAX_FILES, MAX_JSON_BYTES};
use trellis_sandbox::json_values::MAX_FILE_VALUES;

/// Why a gate could not run.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The schema cannot be applied: over a limit, an unparsable JSONPath, a writing SQL
    /// statement, a path outside the workspace, a JSON file over 10 MB.
    #[error("the validation schema cannot be used: {}", .0.join("; "))]
    Schema(Vec<String>),
    /// A file rule names a `validation_type` no validator handles.
    #[error(
        "no validator handles validation_type {validation_type:?} (file {file:?}): install the validator plugin that provides it, or use \"json\""
    )]
    UnknownValidationType {
        /// The type asked for.
        validation_type: String,
        /// The file rule's `file_name`.
        file: String,
    },
    /// A custom validator could not apply its rule (its own error, or a plugin failure).
    #[error("validator for {validation_type:?} failed on {file:?}: {error}")]
    Validator {
        /// The type of the rule.
        validation_type: String,
        /// The file rule's `file_name`.
        file: String,
        /// Why.
        error: ValidatorError,
    },
    /// The workflow database cannot be opened or read.
    #[error("{0}")]
    Db(String),
    /// A file could not be read for a reason other than not existing.
    #[error("{path}: {source}")]
    Io {
        /// The file, as named in the schema.
        path: String,
        /// The cause.
        source: io::Error,
    },
}

/// The future of one [`CustomValidator::validate`] call.
pub type ValidateFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CustomOutcome, ValidatorError>> + Send + 'a>>;

/// Validators for `validation_type` values other than `json`. The host implements this with
/// validator plugins (WIT `validator` interface); tests implement it directly.
pub trait CustomValidator: Sync {
    /// Whether some validator handles `validation_type`.
    fn supports(&self, validation_type: &str) -> bool;

    /// Validates `file` (a host path to an existing file inside the workspace) against `rule`,
    /// the whole file rule as JSON (so the validator reads its own options). `Err` means the
    /// rule could not be applied at all; it fails the gate with that error.
    fn validate<'a>(
        &'a self,
        validation_type: &'a str,
        file: &'a Path,
        rule: &'a Value,
    ) -> ValidateFuture<'a>;
}

/// No custom validators: any `validation_type` other than `json` fails the gate.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCustomValidators;

impl CustomValidator for NoCustomValidators {
    fn supports(&self, _: &str) -> bool {
        false
    }

    fn validate<'a>(
        &'a self,
        validation_type: &'a str,
        _: &'a Path,
        _: &'a Value,
    ) -> ValidateFuture<'a> {
        Box::pin(std::future::ready(Err(ValidatorError::Unknown(
            validation_type.to_string(),
        ))))
    }
}

/// Where a file rule's name resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Workspace,
    Output,
}

fn base_of(name: &str) -> Base {
    let first = name
        .trim_start_matches("./")
        .split('/')
        .next()
        .unwrap_or_default();
    if matches!(first, "db" | "knowledgebase") {
        Base::Workspace
    } else {
        Base::Output
    }
}

/// Checks the limits and paths of a schema that was built in code rather than parsed
/// (parsed schemas were checked at load, but a gate must never trust its input).
fn check_schema(schema: &ValidationSchema) -> Result<(), GateError> {
    let mut problems = Vec::new();
    if schema.files.len() > MAX_FILES {
        problems.push(format!(
            "{} file rules (at most {MAX_FILES})",
            schema.files.len()
        ));
    }
    for rule in &schema.files {
        if let Err(why) = trellis_sandbox::store::check_relative(&rule.file_name) {
            problems.push(format!("file_name {:?}: {why}", rule.file_name));
        }
        if rule.json_checks.len() > MAX_CHECKS_PER_FILE {
            problems.push(format!(
                "{:?} has {} checks (at most {MAX_CHECKS_PER_FILE})",
                rule.file_name,
                rule.json_checks.len()
            ));
        }
    }
    for rule in &schema.db {
        if rule.checks.len() > MAX_CHECKS_PER_FILE {
            problems.push(format!(
                "db rule {:?} has {} checks (at most {MAX_CHECKS_PER_FILE})",
                rule.label(),
                rule.checks.len()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(GateError::Schema(problems))
    }
}

/// Parses a schema given as JSON and runs it: what a caller holding raw JSON (a plugin, a test)
/// uses. A schema with errors is a [`GateError::Schema`] listing every diagnostic.
pub async fn run_gate_value(
    workspace_root: &Path,
    output_dir: &Path,
    schema: &Value,
    custom: &dyn CustomValidator,
) -> Result<Report, GateError> {
    use crate::diagnostics::{Ctx, Diagnostics, JsonPath};
    let mut diags = Diagnostics::new();
    let parsed = {
        let mut ctx = Ctx::new("validation_schema", &mut diags);
        schema::parse_schema(&mut ctx, schema, JsonPath::root())
    };
    match parsed {
        Some(s) if !diags.has_errors() => {
            let mut report = run_gate(workspace_root, output_dir, &s, custom).await?;
            // Warnings found while parsing (an invalid regex) belong in the report too; the
            // gate adds its own for the same pattern, so keep each message once.
            for w in diags.warnings() {
                let w = w.to_string();
                if !report.warnings.contains(&w) {
                    report.warnings.push(w);
                }
            }
            Ok(report)
        }
        _ => Err(GateError::Schema(
            diags.errors().map(ToString::to_string).collect(),
        )),
    }
}

/// Runs `schema` against the outputs of a step. `workspace_root` is the workspace folder,
/// `output_dir` the step output folder (`runs/<run>/execution/<step-id>/`); bare file names
/// resolve in `output_dir`, `db/...` and `knowledgebase/...` in `workspace_root`, and nothing
/// resolves outside them. A schema with no rule is skipped and passes.
pub async fn run_gate(
    workspace_root: &Path,
    output_dir: &Path,
    schema: &ValidationSchema,
    custom: &dyn CustomValidator,
) -> Result<Report, GateError> {
    check_schema(schema)?;
    if schema.is_empty() {
        return Ok(Report {
            passed: true,
            skipped: true,
            ..Report::default()
        });
    }
    let io_err = |path: &str, source: io::Error| GateError::Io {
        path: path.to_string(),
        source,
    };
    let workspace = trellis_sandbox::store::open_dir(workspace_root)
        .map_err(|e| io_err(&workspace_root.display().to_string(), e))?;
    // The output folder is reached without links (a run folder or step folder linked out of
    // the workspace is refused), then opened for the reads below.
    let fs = trellis_sandbox::store::WorkspaceFs::open(workspace_root)
        .map_err(|e| io_err(&workspace_root.display().to_string(), e))?;
    match fs.kind(output_dir) {
        Ok(None | Some(trellis_sandbox::store::Kind::Dir)) => {}
        Ok(Some(trellis_sandbox::store::Kind::Link)) => {
            let rel = fs
                .relative(output_dir)
                .map_err(|e| io_err(&output_dir.display().to_string(), e))?;
            return Err(io_err(
                &rel.display().to_string(),
                trellis_sandbox::store::workspace_fs::link_error(&rel),
            ));
        }
        Ok(Some(_)) => {
            return Err(io_err(
                &output_dir.display().to_string(),
                io::Error::new(io::ErrorKind::InvalidInput, "not a folder"),
            ));
        }
        Err(e) => return Err(io_err(&output_dir.display().to_string(), e)),
    }
    // A step that has written nothing yet may have no output folder: its files are missing.
    let output = match trellis_sandbox::store::open_dir(output_dir) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err(&output_dir.display().to_string(), e)),
    };
    let mut checks = report::Kept::starting_now();
    let mut warnings = Vec::new();

    for rule in &schema.files {
        let name = rule.file_name.as_str();
        let (dir, host_base, place) = match base_of(name) {
            Base::Workspace => (Some(&workspace), workspace_root, "the workspace"),
            Base::Output => (output.as_ref(), output_dir, "the step output folder"),
        };
        let meta = match dir.map(|d| d.metadata(name)) {
            None => None,
            Some(Ok(m)) => Some(m),
            Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => None,
            // cap-std refuses a path that escapes its folder (through a symlink, say): to the
            // gate such a file does not exist.
            Some(Err(e)) if e.kind() == io::ErrorKind::PermissionDenied => None,
            Some(Err(e)) => return Err(io_err(name, e)),
        };
        let mut sink = Sink {
            file: name,
            checks: &mut checks,
            warnings: &mut warnings,
        };
        let is_file = meta.as_ref().is_some_and(|m| m.is_file());
        // A link the gate does not follow is named as one, so its author knows why.
        let link = meta.is_none()
            && dir
                .and_then(|d| d.symlink_metadata(name).ok())
                .is_some_and(|m| m.file_type().is_symlink());
        if !is_file {
            let actual = if meta.is_some() {
                "a folder"
            } else if link {
                "a symbolic link, not followed"
            } else {
                "missing"
            };
            if rule.must_exist() || rule.needs_json() || rule.custom_type().is_some() {
                let required = rule.must_exist();
                sink.record(
                    "",
                    "must_exist",
                    !required,
                    if required {
                        "the file exists"
                    } else {
                        "optional"
                    }
                    .into(),
                    actual.into(),
                    if link {
                        format!(
                            "{name} in {place} is a symbolic link, which the gate does not \
                             follow: write the file itself there"
                        )
                    } else if required {
                        format!("{name} does not exist in {place}: write it")
                    } else {
                        format!("{name} is optional and absent; its checks were skipped")
                    },
                );
            }
            continue;
        }
        if rule.must_exist() {
            sink.record(
                "",
                "must_exist",
                true,
                "the file exists".into(),
                "exists".into(),
                format!("{name} exists"),
            );
        }
        if let Some(t) = rule.custom_type() {
            if !custom.supports(t) {
                return Err(GateError::UnknownValidationType {
                    validation_type: t.to_string(),
                    file: name.to_string(),
                });
            }
            let rule_json = serde_json::to_value(rule).unwrap_or(Value::Null);
            let file = host_base.join(name);
            let outcome = custom
                .validate(t, &file, &rule_json)
                .await
                .map_err(|error| GateError::Validator {
                    validation_type: t.to_string(),
                    file: name.to_string(),
                    error,
                })?;
            // A validator names the file by whatever path it was shown; the report
            // names it as the schema does.
            for mut check in outcome.checks {
                check.file = name.to_string();
                sink.checks.push(check);
            }
            sink.warnings.extend(outcome.warnings);
        }
        if !rule.needs_json() {
            continue;
        }
        let Some(dir) = dir else { continue };
        let bytes = match trellis_sandbox::store::read_capped(dir, name, MAX_JSON_BYTES)
            .map_err(|e| io_err(name, e))?
        {
            trellis_sandbox::store::Capped::Bytes(b) => b,
            trellis_sandbox::store::Capped::TooLarge(n) => {
                return Err(GateError::Schema(vec![format!(
                    "{name} is {n} bytes, over the {MAX_JSON_BYTES}-byte limit for JSON checks"
                )]));
            }
        };
        // Counted before it is parsed, as every JSON file the host parses whole.
        let values = trellis_sandbox::json_values::json_values(&bytes);
        if values > MAX_FILE_VALUES {
            return Err(GateError::Schema(vec![format!(
                "{name} holds about {values} JSON values, over the {MAX_FILE_VALUES} a JSON check \
                 parses"
            )]));
        }
        let doc = match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => v,
            Err(e) => {
                let full = e.to_string();
                let what = full
                    .rfind(" at line ")
                    .map_or(full.as_str(), |i| &full[..i])
                    .to_string();
                sink.record(
                    "",
                    "valid_json",
                    false,
                    "valid JSON".into(),
                    format!("invalid JSON at line {}, column {}: {what}", e.line(), e.column()),
                    format!(
                        "{name} is not valid JSON (line {}, column {}: {what}): rewrite it as valid JSON",
                        e.line(),
                        e.column()
                    ),
                );
                continue;
            }
        };
        if rule.validation_type.as_deref() == Some("json") {
            sink.record(
                "",
                "valid_json",
                true,
                "valid JSON".into(),
                "valid JSON".into(),
                format!("{name} is valid JSON"),
            );
        }
        for check in &rule.json_checks {
            run_check(&mut sink, &doc, check)
                .map_err(|e| GateError::Schema(vec![format!("{name}: {e}")]))?;
        }
    }

    if !schema.db.is_empty() {
        // The database must be a regular file inside the workspace, not a symlink elsewhere.
        match workspace.symlink_metadata(db::DB_FILE) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(GateError::Db(format!(
                    "{} is not a regular file",
                    db::DB_FILE
                )));
            }
            Err(e) => {
                return Err(GateError::Db(format!(
                    "{} cannot be opened: {e}",
                    db::DB_FILE
                )));
            }
        }
        let db = db::open_read_only(workspace_root)?;
        for rule in &schema.db {
            let mut sink = Sink {
                file: db::DB_FILE,
                checks: &mut checks,
                warnings: &mut warnings,
            };
            db::run_rule(&db, rule, &mut sink)?;
        }
    }

    Ok(Report {
        passed: checks.failures_left_out == 0 && checks.checks.iter().all(|c| c.passed),
        skipped: false,
        passed_left_out: checks.passed_left_out,
        failures_left_out: checks.failures_left_out,
        checks: checks.checks,
        warnings,
    })
}

/// The host path a file rule's name resolves to (for display and for custom validators).
pub fn resolve_file(workspace_root: &Path, output_dir: &Path, file_name: &str) -> Option<PathBuf> {
    trellis_sandbox::store::check_relative(file_name).ok()?;
    Some(match base_of(file_name) {
        Base::Workspace => workspace_root.join(file_name),
        Base::Output => output_dir.join(file_name),
    })
}

#[cfg(test)]
mod tests;
