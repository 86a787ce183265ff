//! The bundled `csv` validator plugin.
//!
//! The host sends it the file rules of a `validation_schema` whose
//! `validation_type` is `"csv"`. The options are keys of the rule itself
//! (`columns`, `exact_columns`, `min_rows`, `max_rows`, `delimiter`,
//! `column_patterns`, `unique_columns`, `non_empty_columns`; see the plugins
//! README). [`rule`] parses them, rejecting a malformed rule with a message that
//! names the option; [`scan`] reads the file once, row by row, and reports every
//! check, passed or failed, with a message the agent can act on.

mod rule;
mod scan;

use std::fs::File;

use trellis_plugin_sdk::export_validator_plugin;
use trellis_plugin_sdk::validator::{Report, Request, ValidatorPlugin};

use crate::rule::Rule;
use crate::scan::{Limits, check_csv, unreadable};

struct CsvValidator;

impl ValidatorPlugin for CsvValidator {
    fn validate(request: Request) -> Result<Report, String> {
        let rule = Rule::parse(&request.rule)?;
        let checks = match File::open(&request.file) {
            Ok(file) => check_csv(&request.file, file, &rule, Limits::default()),
            Err(e) => vec![unreadable(&request.file, &e.to_string())],
        };
        Ok(Report::from_checks(checks))
    }
}

export_validator_plugin!(CsvValidator);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(file: &str, rule: serde_json::Value) -> Request {
        Request {
            validation_type: "csv".to_string(),
            file: file.to_string(),
            rule,
        }
    }

    #[test]
    fn validates_a_file_on_disk() {
        let path = std::env::temp_dir().join(format!("csv-validator-{}.csv", std::process::id()));
        std::fs::write(&path, "id,title\nT-1,a\nT-1,b\n").unwrap();
        let file = path.to_str().unwrap();
        let report = CsvValidator::validate(request(
            file,
            json!({"file_name": "t.csv", "validation_type": "csv", "columns": ["id"], "unique_columns": ["id"]}),
        ))
        .unwrap();
        std::fs::remove_file(&path).unwrap();
        let kinds: Vec<(&str, bool)> = report
            .checks
            .iter()
            .map(|c| (c.kind.as_str(), c.passed))
            .collect();
        assert_eq!(
            kinds,
            [("parse", true), ("header", true), ("unique", false)]
        );
        assert!(report.checks.iter().all(|c| c.file == file));
        assert!(report.warnings.is_empty());
    }

    #[test]
    fn a_missing_file_is_a_failed_check_and_a_bad_rule_an_error() {
        let report = CsvValidator::validate(request("/no/such/dir/t.csv", json!({}))).unwrap();
        assert_eq!(report.checks.len(), 1);
        assert_eq!(report.checks[0].kind, "parse");
        assert!(!report.checks[0].passed);
        let err = CsvValidator::validate(request("/no/such/dir/t.csv", json!({"colums": ["id"]})))
            .unwrap_err();
        assert!(err.contains("did you mean `columns`?"), "{err}");
    }
}
