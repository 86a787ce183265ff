//! Gate results: one record per check, and where they are written.
//!
//! A report is what the repair turn quotes to the agent (file, JSON path, expected, actual)
//! and what `logs/<step-id>/pre_validation*.json` keep for people and for Pulse.

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use trellis_sandbox::plugins::CheckResult;

/// Everything one gate run found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Every check failed nothing (true also when skipped).
    pub passed: bool,
    /// The schema had no rule: nothing ran.
    pub skipped: bool,
    /// Every check, passed or not, in the order run.
    pub checks: Vec<CheckResult>,
    /// Problems with the schema that do not fail the gate (an invalid regex, say).
    pub warnings: Vec<String>,
}

impl Report {
    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| !c.passed)
    }
}

/// The record written to the logs: the report plus which step, gate and attempt it belongs to.
#[derive(Debug, Serialize)]
struct Record<'a> {
    step_id: &'a str,
    label: &'a str,
    attempt: u32,
    #[serde(flatten)]
    report: &'a Report,
}

/// Makes a label safe as part of a file name: letters, digits, `-` and `_` stay, the rest
/// becomes `_`.
fn file_safe(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() { "_".into() } else { out }
}

/// Writes `report` to `<run_dir>/logs/<step-id>/pre_validation.json` (the latest) and to
/// `<run_dir>/logs/<step-id>/pre_validation_<label>_attempt_<attempt>.json`, both atomically.
/// `run_dir` is the run folder (`runs/iteration-0` or `runs/iteration-0/<group>`); `label`
/// names the gate (the item id, or `final`). Returns the two paths.
pub fn write_report(
    fs: &trellis_sandbox::store::WorkspaceFs,
    run_dir: &Path,
    step_id: &str,
    label: &str,
    attempt: u32,
    report: &Report,
) -> io::Result<(PathBuf, PathBuf)> {
    if step_id.is_empty() || step_id.contains(['/', '\\']) || step_id == "." || step_id == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("step id {step_id:?} cannot name a log folder"),
        ));
    }
    let dir = run_dir.join("logs").join(step_id);
    let record = Record {
        step_id,
        label,
        attempt,
        report,
    };
    let latest = dir.join("pre_validation.json");
    let per_attempt = dir.join(format!(
        "pre_validation_{}_attempt_{attempt}.json",
        file_safe(label)
    ));
    fs.write_json_atomic(&per_attempt, &record)?;
    fs.write_json_atomic(&latest, &record)?;
    Ok((latest, per_attempt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_is_written_twice_with_safe_names() {
        let dir = tempfile::tempdir().unwrap();
        let report = Report {
            passed: false,
            skipped: false,
            checks: vec![CheckResult {
                file: "a.json".into(),
                path: "$.x".into(),
                kind: "must_exist".into(),
                passed: false,
                expected: "a value".into(),
                actual: "nothing".into(),
                message: "m".into(),
            }],
            warnings: vec![],
        };
        let (latest, attempt) = write_report(
            &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
            dir.path(),
            "s",
            "gate/1",
            2,
            &report,
        )
        .unwrap();
        assert!(latest.ends_with("logs/s/pre_validation.json"));
        assert!(attempt.ends_with("logs/s/pre_validation_gate_1_attempt_2.json"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&latest).unwrap()).unwrap();
        assert_eq!(v["checks"][0]["kind"], "must_exist");
        assert_eq!(v["attempt"], 2);
        assert!(
            write_report(
                &trellis_sandbox::store::WorkspaceFs::open(dir.path()).unwrap(),
                dir.path(),
                "../x",
                "l",
                1,
                &report
            )
            .is_err()
        );
    }
}
