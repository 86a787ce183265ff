//! The `__ID__` validator plugin: file rules with `"validation_type": "__ID__"` come here.
//!
//! Build with `trellis plugin build .`; test with `cargo test`.

use trellis_plugin_sdk::export_validator_plugin;
use trellis_plugin_sdk::validator::{Check, Report, Request, ValidatorPlugin};

/// Checks that a file has at least `min_lines` non-blank lines (an option of the rule,
/// default 1).
struct MinLines;

impl ValidatorPlugin for MinLines {
    fn validate(request: Request) -> Result<Report, String> {
        let min = match request.rule.get("min_lines") {
            None => 1,
            Some(value) => value
                .as_u64()
                .ok_or_else(|| format!("min_lines: expected a whole number, found {value}"))?,
        };
        let text = std::fs::read_to_string(&request.file)
            .map_err(|e| format!("{}: {e}", request.file))?;
        Ok(Report::from_checks(vec![check(&request.file, &text, min)]))
    }
}

/// The check of `text`, kept apart from the file access so it can be tested anywhere.
fn check(file: &str, text: &str, min: u64) -> Check {
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count() as u64;
    Check::new(file, "min_lines", lines >= min)
        .expected(format!("at least {min} non-blank lines"))
        .actual(format!("{lines} non-blank lines"))
        .message("write more into the file")
}

export_validator_plugin!(MinLines);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_non_blank_lines() {
        assert!(check("a.md", "one\n\ntwo\n", 2).passed);
        assert!(!check("a.md", "one\n  \n", 2).passed);
    }
}
