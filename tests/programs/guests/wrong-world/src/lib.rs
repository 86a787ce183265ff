//! A validator plugin used only by host tests, in two roles:
//!
//! - loaded where a tool plugin is expected, it shows that the error names the
//!   wrong world instead of failing somewhere deeper;
//! - loaded as the validator it is, its rule option `behave` makes it misbehave
//!   (`spin`, `panic`, `flood`, `fail`, `fail_long`, `escape`, `huge_report`) so
//!   the host can show that a bad validator ends in a gate error naming the
//!   plugin, never a crash, or talks too much (`verbose`) and is cut.

use std::hint::black_box;

use trellis_plugin_sdk::export_validator_plugin;
use trellis_plugin_sdk::validator::{Check, Report, Request, ValidatorPlugin};

struct TestValidator;

impl ValidatorPlugin for TestValidator {
    fn validate(request: Request) -> Result<Report, String> {
        let behave = request.rule["behave"].as_str().unwrap_or("pass");
        match behave {
            "pass" => {
                let text = std::fs::read_to_string(&request.file).map_err(|e| e.to_string())?;
                let check = Check::new(&request.file, "not_empty", !text.is_empty())
                    .expected("some content")
                    .actual(format!("{} bytes", text.len()));
                Ok(Report::from_checks(vec![check]))
            }
            "spin" => {
                let mut n: u64 = 0;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            "panic" => panic!("validator gave up"),
            "flood" => {
                // More checks than any report may carry (the host's cap is 10,000), yet
                // small enough to build well within the call's memory and time.
                let checks = (0..20_000)
                    .map(|i| Check::new(&request.file, "flood", false).at(format!("row {i}")))
                    .collect();
                Ok(Report::from_checks(checks))
            }
            "verbose" => {
                // Long texts and many warnings, under the output limit in total.
                let long = "v".repeat(100 * 1024);
                let check = Check::new(&request.file, "verbose", false)
                    .expected(long.clone())
                    .actual(long.clone())
                    .message(long);
                let mut report = Report::from_checks(vec![check]);
                for i in 0..1000 {
                    report = report.warn(format!("warning {i}"));
                }
                Ok(report)
            }
            "huge_report" => {
                // 8 MiB of warnings: over the host's output limit.
                let chunk = "w".repeat(1024 * 1024);
                let mut report = Report::from_checks(Vec::new());
                for _ in 0..8 {
                    report = report.warn(chunk.clone());
                }
                Ok(report)
            }
            "fail" => Err("option `columns` must be a list of strings".into()),
            "fail_long" => Err(format!("option `columns`: {}", "e".repeat(1 << 20))),
            "escape" => match std::fs::read_to_string("/etc/passwd") {
                Ok(text) => Ok(Report::from_checks(vec![
                    Check::new("/etc/passwd", "escape", true).actual(text),
                ])),
                Err(err) => Err(format!("cannot read /etc/passwd: {err}")),
            },
            other => Err(format!("unknown behave {other:?}")),
        }
    }
}

export_validator_plugin!(TestValidator);
