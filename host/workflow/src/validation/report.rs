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
    /// Passed checks past the [`MAX_KEPT_CHECKS`] a report keeps: counted, not recorded.
    #[serde(skip_serializing_if = "is_zero")]
    pub passed_left_out: usize,
    /// Failed checks past the [`MAX_KEPT_CHECKS`] a report keeps: counted, not recorded.
    #[serde(skip_serializing_if = "is_zero")]
    pub failures_left_out: usize,
}

/// Failed checks a report records, and passed checks likewise, at most: a schema of many
/// checks over a file of many values makes a record of each (200,000 of them made 200 MB of
/// reports from a 50 KB file). The rest are counted.
pub const MAX_KEPT_CHECKS: usize = 100;

/// The bytes of each text of a record (its path, what was expected and found, the message)
/// a report keeps; the rest is cut, the cut marked.
pub const RECORD_TEXT_BYTES: usize = 512;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Report {
    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// How many checks failed, those left out of the records included.
    pub fn failure_count(&self) -> usize {
        self.failures().count() + self.failures_left_out
    }
}

/// The checks of one gate run as they are recorded: at most [`MAX_KEPT_CHECKS`] failed and
/// as many passed, each text cut to [`RECORD_TEXT_BYTES`]; the rest counted.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    pub checks: Vec<CheckResult>,
    failed: usize,
    passed: usize,
    pub passed_left_out: usize,
    pub failures_left_out: usize,
    /// When the gate's checks of files must have ended ([`GATE_CHECKS_TIME`]).
    pub deadline: Option<std::time::Instant>,
}

/// How long the checks of one gate's files (their JSON checks) may take together: a
/// workspace's 2,000 `pattern` checks over a file of 10,000 values ran for hours.
pub const GATE_CHECKS_TIME: std::time::Duration = std::time::Duration::from_secs(30);

impl Kept {
    /// Records for a gate beginning now.
    pub fn starting_now() -> Self {
        Kept {
            deadline: Some(std::time::Instant::now() + GATE_CHECKS_TIME),
            ..Kept::default()
        }
    }

    /// Why no more checks are run: the gate's time is up.
    pub fn past_deadline(&self) -> Result<(), String> {
        match self.deadline {
            Some(at) if std::time::Instant::now() >= at => Err(format!(
                "the gate's checks ran past their {} s together; nothing more was checked \
                 (fewer checks, or narrower paths)",
                GATE_CHECKS_TIME.as_secs()
            )),
            _ => Ok(()),
        }
    }

    pub fn push(&mut self, mut check: CheckResult) {
        let (kept, left_out) = if check.passed {
            (&mut self.passed, &mut self.passed_left_out)
        } else {
            (&mut self.failed, &mut self.failures_left_out)
        };
        if *kept >= MAX_KEPT_CHECKS {
            *left_out += 1;
            return;
        }
        *kept += 1;
        for text in [
            &mut check.path,
            &mut check.expected,
            &mut check.actual,
            &mut check.message,
        ] {
            if text.len() > RECORD_TEXT_BYTES {
                *text = trellis_sandbox::cut::marked(text, RECORD_TEXT_BYTES);
            }
        }
        self.checks.push(check);
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
            ..Report::default()
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

    #[test]
    fn records_are_capped_and_checks_stop_at_the_gates_deadline() {
        let check = |passed: bool| CheckResult {
            file: "a.json".into(),
            path: "$.x".repeat(1000),
            kind: "pattern".into(),
            passed,
            expected: "e".into(),
            actual: "a".into(),
            message: "m".into(),
        };
        let mut kept = Kept::starting_now();
        assert!(kept.past_deadline().is_ok());
        for n in 0..(MAX_KEPT_CHECKS * 3) {
            kept.push(check(n % 3 == 0));
        }
        assert_eq!(kept.checks.len(), 2 * MAX_KEPT_CHECKS);
        // 100 passed and 200 failed: 100 of each recorded.
        assert_eq!(kept.passed_left_out, 0);
        assert_eq!(kept.failures_left_out, MAX_KEPT_CHECKS);
        assert!(
            kept.checks
                .iter()
                .all(|c| c.path.len() < RECORD_TEXT_BYTES + 64)
        );
        kept.deadline = Some(std::time::Instant::now());
        let why = kept.past_deadline().unwrap_err();
        assert!(why.contains("ran past their 30 s"), "{why}");
    }
}
