//! The scan on in-memory files: every option, broken files and the limits.

use serde_json::{Value, json};
use trellis_plugin_sdk::validator::Check;

use super::{Limits, check_csv};
use crate::rule::Rule;

const FILE: &str = "/input/tickets.csv";

fn run_with(text: &[u8], rule: Value, limits: Limits) -> Vec<Check> {
    let rule = Rule::parse(&rule).expect("valid rule");
    check_csv(FILE, text, &rule, limits)
}

fn run(text: &str, rule: Value) -> Vec<Check> {
    run_with(text.as_bytes(), rule, Limits::default())
}

fn find<'c>(checks: &'c [Check], kind: &str, path: &str) -> &'c Check {
    checks
        .iter()
        .find(|c| c.kind == kind && c.path == path)
        .unwrap_or_else(|| panic!("no `{kind}` check at `{path}` in {checks:#?}"))
}

fn kinds(checks: &[Check]) -> Vec<(&str, &str, bool)> {
    checks
        .iter()
        .map(|c| (c.kind.as_str(), c.path.as_str(), c.passed))
        .collect()
}

const TICKETS: &str = "id,title,status\nT-1,Login fails,open\nT-2,Slow search,closed\n";

#[test]
fn a_good_file_reports_every_check_as_passed() {
    let checks = run(
        TICKETS,
        json!({
            "file_name": "tickets.csv", "must_exist": true, "validation_type": "csv",
            "columns": ["id", "title"], "min_rows": 1, "max_rows": 10,
            "column_patterns": {"id": "^T-[0-9]+$"}, "unique_columns": ["id"],
            "non_empty_columns": ["title"]
        }),
    );
    assert_eq!(
        kinds(&checks),
        [
            ("parse", "", true),
            ("header", "", true),
            ("row_count", "", true),
            ("pattern", "id", true),
            ("unique", "id", true),
            ("non_empty", "title", true),
        ]
    );
    assert!(
        checks
            .iter()
            .all(|c| c.file == FILE && !c.message.is_empty())
    );
    assert_eq!(find(&checks, "row_count", "").actual, "2 data rows");
}

#[test]
fn header_lists_every_missing_column_with_a_rename_hint() {
    let checks = run(
        "ID,title\n1,a\n",
        json!({"columns": ["id", "title", "status", "owner"]}),
    );
    let header = find(&checks, "header", "");
    assert!(!header.passed);
    assert_eq!(header.actual, "header line `ID,title`");
    assert!(header.expected.contains("`id`, `title`, `status`, `owner`"));
    assert!(
        header
            .message
            .starts_with("Add the missing columns `id`, `status`, `owner` to the header"),
        "{}",
        header.message
    );
    assert!(
        header
            .message
            .contains("`ID` differs from `id` only in case")
    );
}

#[test]
fn exact_columns_requires_the_same_names_in_order() {
    let rule = json!({"columns": ["id", "title", "status"], "exact_columns": true});
    assert!(find(&run(TICKETS, rule.clone()), "header", "").passed);

    let reordered = run("title,id,status\na,1,open\n", rule.clone());
    let header = find(&reordered, "header", "");
    assert!(!header.passed);
    assert_eq!(header.expected, "header line exactly `id,title,status`");
    assert!(header.message.contains("put the columns in this order"));

    let other = run("id,title,extra\n1,a,x\n", rule);
    let header = find(&other, "header", "");
    assert!(!header.passed);
    assert!(
        header.message.contains("add `status`"),
        "{}",
        header.message
    );
    assert!(
        header.message.contains("remove `extra`"),
        "{}",
        header.message
    );

    // Without exact_columns extra columns and any order are fine.
    let loose = run(
        "title,id,extra\na,1,x\n",
        json!({"columns": ["id", "title"]}),
    );
    assert!(find(&loose, "header", "").passed);
}

#[test]
fn row_count_excludes_the_header() {
    let few = run("id\n", json!({"min_rows": 1}));
    let check = find(&few, "row_count", "");
    assert!(!check.passed);
    assert_eq!(check.actual, "0 data rows");
    assert_eq!(check.expected, "at least 1 data row (header excluded)");
    assert!(check.message.starts_with("Add 1 more data row "));

    let many = run(TICKETS, json!({"max_rows": 1}));
    let check = find(&many, "row_count", "");
    assert!(!check.passed);
    assert!(check.message.starts_with("Remove 1 data row "));

    let exact = run(TICKETS, json!({"min_rows": 2, "max_rows": 2}));
    assert!(find(&exact, "row_count", "").passed);
    // No bounds, no row_count check.
    assert!(
        run(TICKETS, json!({}))
            .iter()
            .all(|c| c.kind != "row_count")
    );
}

#[test]
fn delimiter_option_splits_fields() {
    let rule = json!({"delimiter": ";", "columns": ["id", "note"], "non_empty_columns": ["note"]});
    let checks = run("id;note\n1;a,b\n2;c\n", rule);
    assert_eq!(
        kinds(&checks),
        [
            ("parse", "", true),
            ("header", "", true),
            ("non_empty", "note", true)
        ]
    );
    let tabs = run(
        "id\tnote\n1\tx\n",
        json!({"delimiter": "\t", "columns": ["note"]}),
    );
    assert!(find(&tabs, "header", "").passed);
    // With the default delimiter the same file has one column named "id;note".
    let wrong = run("id;note\n1;a\n", json!({"columns": ["id"]}));
    assert!(!find(&wrong, "header", "").passed);
}

#[test]
fn pattern_reports_count_rows_and_values_capped() {
    let mut text = String::from("id,title\n");
    for i in 1..=8 {
        text.push_str(&format!("X{i},t\n"));
    }
    text.push_str("T-9,t\n,t\n");
    let checks = run(&text, json!({"column_patterns": {"id": "^T-[0-9]+$"}}));
    let check = find(&checks, "pattern", "id");
    assert!(!check.passed);
    assert_eq!(check.expected, "every value of `id` matches `^T-[0-9]+$`");
    assert_eq!(
        check.actual,
        "9 of 10 values do not match: row 1 (line 2) \"X1\", row 2 (line 3) \"X2\", \
         row 3 (line 4) \"X3\", row 4 (line 5) \"X4\", row 5 (line 6) \"X5\" and 4 more"
    );
    assert!(check.message.contains("whole value matches `^T-[0-9]+$`"));
}

#[test]
fn pattern_is_applied_as_written_so_anchors_matter() {
    let text = "id\nxT-1y\n";
    assert!(
        find(
            &run(text, json!({"column_patterns": {"id": "T-[0-9]"}})),
            "pattern",
            "id"
        )
        .passed
    );
    assert!(
        !find(
            &run(text, json!({"column_patterns": {"id": "^T-[0-9]$"}})),
            "pattern",
            "id"
        )
        .passed
    );
}

#[test]
fn long_values_are_shortened_in_messages() {
    let long = "x".repeat(500);
    let checks = run(
        &format!("id\n{long}\n"),
        json!({"column_patterns": {"id": "^y$"}}),
    );
    let actual = &find(&checks, "pattern", "id").actual;
    assert!(actual.len() < 120, "{actual}");
    assert!(actual.ends_with('…'));
}

#[test]
fn unique_reports_repeats_and_ignores_empty_values() {
    let text = "id,n\nA,1\nB,2\nA,3\n,4\n,5\nB,6\nA,7\n";
    let checks = run(text, json!({"unique_columns": ["id", "n"]}));
    let id = find(&checks, "unique", "id");
    assert!(!id.passed);
    assert_eq!(
        id.actual,
        "3 rows repeat an earlier value: row 3 (line 4) repeats row 1: \"A\", \
         row 6 (line 7) repeats row 2: \"B\", row 7 (line 8) repeats row 1: \"A\""
    );
    assert!(id.message.starts_with("Make every `id` value unique"));
    let n = find(&checks, "unique", "n");
    assert!(n.passed);
    assert_eq!(n.actual, "7 distinct values, no repeats");
}

#[test]
fn non_empty_counts_blank_values_as_empty() {
    let checks = run(
        "id,title\n1,a\n2,\n3,  \n4,\"\"\n",
        json!({"non_empty_columns": ["title", "id"]}),
    );
    let title = find(&checks, "non_empty", "title");
    assert!(!title.passed);
    assert_eq!(
        title.actual,
        "3 of 4 rows are empty or blank: row 2 (line 3), row 3 (line 4), row 4 (line 5)"
    );
    assert_eq!(title.message, "Fill in `title` in each row listed.");
    assert!(find(&checks, "non_empty", "id").passed);
}

#[test]
fn a_column_missing_from_the_file_fails_each_option_naming_it() {
    let checks = run(
        "id\n1\n",
        json!({"column_patterns": {"owner": "^.+$"}, "unique_columns": ["owner"],
               "non_empty_columns": ["owner"]}),
    );
    for kind in ["pattern", "unique", "non_empty"] {
        let check = find(&checks, kind, "owner");
        assert!(!check.passed);
        assert_eq!(check.actual, "column `owner` is not in the header");
        assert!(
            check
                .message
                .starts_with("Add column `owner` to the header")
        );
    }
}

#[test]
fn ragged_rows_fail_parse_with_line_numbers_and_skip_column_checks() {
    let text = "id,title\n1,a\n2,b,extra\n3\n4,d\n";
    let checks = run(text, json!({"min_rows": 4, "non_empty_columns": ["title"]}));
    let parse = find(&checks, "parse", "");
    assert!(!parse.passed);
    assert_eq!(
        parse.actual,
        "2 rows have a different number of fields: line 3 has 3 fields, line 4 has 1 field"
    );
    assert!(parse.message.contains("Give every row 2 fields"));
    assert!(parse.message.contains("wrapped in double quotes"));
    // Every row counts, only well-formed ones are checked per column.
    assert!(find(&checks, "row_count", "").passed);
    assert_eq!(
        find(&checks, "non_empty", "title").actual,
        "all 2 rows have a value"
    );
}

#[test]
fn a_byte_order_mark_is_not_part_of_the_first_column() {
    let text = "\u{feff}id,title\n1,a\n";
    let checks = run(
        text,
        json!({"columns": ["id", "title"], "exact_columns": true, "unique_columns": ["id"]}),
    );
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
    // Also before a quoted first field.
    let quoted = run("\u{feff}\"id\",title\n1,a\n", json!({"columns": ["id"]}));
    assert!(find(&quoted, "header", "").passed);
}

#[test]
fn quoted_fields_keep_delimiters_quotes_and_newlines() {
    let text = "id,note\n1,\"a, b\"\n2,\"two\nlines and \"\"quotes\"\"\"\n3,x\n";
    let checks = run(
        text,
        json!({"min_rows": 3, "max_rows": 3,
               "column_patterns": {"note": "^(a, b|two\\nlines and \"quotes\")$"}}),
    );
    assert!(find(&checks, "parse", "").passed);
    assert!(find(&checks, "row_count", "").passed);
    let pattern = find(&checks, "pattern", "note");
    assert!(!pattern.passed);
    // Row 3 starts on line 5 because row 2 spans two lines.
    assert_eq!(
        pattern.actual,
        "1 of 3 values do not match: row 3 (line 5) \"x\""
    );
}

#[test]
fn crlf_line_endings_and_trailing_blank_lines_are_fine() {
    let checks = run(
        "id,title\r\n1,a\r\n2,b\r\n\r\n",
        json!({"min_rows": 2, "max_rows": 2, "columns": ["title"]}),
    );
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
}

#[test]
fn invalid_utf8_is_a_parse_failure_with_the_line() {
    let text = b"id,title\n1,ok\n2,caf\xe9\n3,ok\n";
    let checks = run_with(
        text,
        json!({"non_empty_columns": ["title"]}),
        Limits::default(),
    );
    let parse = find(&checks, "parse", "");
    assert!(!parse.passed);
    assert_eq!(
        parse.actual,
        "1 row is not valid UTF-8: line 3 in column `title`"
    );
    assert!(parse.message.contains("Save the file as UTF-8"));
    assert_eq!(
        find(&checks, "non_empty", "title").actual,
        "all 2 rows have a value"
    );

    let header = run_with(
        b"i\xffd\n1\n",
        json!({"columns": ["id"]}),
        Limits::default(),
    );
    assert_eq!(kinds(&header), [("parse", "", false)]);
    assert!(header[0].actual.contains("line 1"));
}

#[test]
fn an_unclosed_quote_stops_reading_at_the_record_limit() {
    let mut text = String::from("id,note\n1,ok\n2,\"never closed\n");
    for i in 0..2000 {
        text.push_str(&format!("{i},filler text\n"));
    }
    let limits = Limits {
        max_record_bytes: 1024,
        examples: 5,
    };
    let checks = run_with(
        text.as_bytes(),
        json!({"columns": ["id"], "min_rows": 1, "unique_columns": ["id"]}),
        limits,
    );
    // Header is checked, row-level checks are left out because they would be partial.
    assert_eq!(kinds(&checks), [("parse", "", false), ("header", "", true)]);
    assert_eq!(
        checks[0].actual,
        "reading stopped at line 3: the record starting there is longer than 1024 bytes"
    );
    assert!(
        checks[0]
            .message
            .contains("opened on line 3 is probably never closed")
    );

    // The same limit does not trip on a long file of short records.
    let mut long = String::from("id\n");
    for i in 0..5000 {
        long.push_str(&format!("{i}\n"));
    }
    let checks = run_with(long.as_bytes(), json!({"unique_columns": ["id"]}), limits);
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
}

#[test]
fn an_empty_file_fails_the_header_check() {
    let checks = run("", json!({"columns": ["id", "title"], "min_rows": 1}));
    assert_eq!(kinds(&checks), [("header", "", false)]);
    assert_eq!(checks[0].actual, "the file is empty");
    assert!(
        checks[0]
            .message
            .starts_with("Write a header line `id,title` as the first line")
    );
}
