//! Tests of the validation gate on real files and a real SQLite database in temp workspaces.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;

struct Ws {
    dir: tempfile::TempDir,
}

impl Ws {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("runs/iteration-0/execution/s")).unwrap();
        Self { dir }
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn out(&self) -> PathBuf {
        self.root().join("runs/iteration-0/execution/s")
    }
    fn output(&self, name: &str, text: &str) {
        let p = self.out().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    fn db(&self, sql: &str) {
        std::fs::create_dir_all(self.root().join("db")).unwrap();
        let c = rusqlite::Connection::open(self.root().join("db/db.sqlite")).unwrap();
        c.execute_batch(sql).unwrap();
    }
    fn gate(&self, schema: Value) -> Result<Report, GateError> {
        gate_value(self.root(), &self.out(), &schema, &NoCustomValidators)
    }
}

/// [`run_gate_value`] driven to completion here: these validators never wait.
fn gate_value(
    root: &Path,
    out: &Path,
    schema: &Value,
    custom: &dyn CustomValidator,
) -> Result<Report, GateError> {
    futures::executor::block_on(run_gate_value(root, out, schema, custom))
}

fn failed(report: &Report) -> Vec<(String, String, String)> {
    report
        .failures()
        .map(|c| (c.path.clone(), c.kind.clone(), c.message.clone()))
        .collect()
}

#[test]
fn the_spec_example_passes_on_good_outputs() {
    let ws = Ws::new();
    ws.output("report.json", r#"{"items": [1, 2]}"#);
    ws.db("CREATE TABLE findings (id INTEGER); INSERT INTO findings VALUES (1), (2);");
    let report = ws
        .gate(json!({ "files": [ { "file_name": "report.json", "must_exist": true,
               "json_checks": [ { "path": "$.items", "must_exist": true, "value_type": "array", "min_length": 1 } ] } ],
  "db": [ { "name": "rows written", "sql": "SELECT count(*) AS n FROM findings", "min_rows": 1,
            "checks": [ { "path": "$.n", "min_value": 1 } ] } ] }))
        .unwrap();
    assert!(report.passed, "{report:#?}");
    let kinds: Vec<&str> = report.checks.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "must_exist",
            "must_exist",
            "value_type",
            "min_length",
            "min_rows",
            "min_value"
        ]
    );
    assert_eq!(report.checks[5].file, "db/db.sqlite");
    assert_eq!(report.checks[5].actual, "2");
}

#[test]
fn every_json_check_kind_reports_expected_and_actual() {
    let ws = Ws::new();
    ws.output(
        "r.json",
        r#"{"name": "abc", "tags": ["a","b","c"], "score": 5, "total": 3, "count": 2,
            "status": "done", "allowed": ["open", "closed"], "copy": 4, "n": 3}"#,
    );
    let report = ws
        .gate(json!({"files": [{"file_name": "r.json", "json_checks": [
            {"path": "$.name", "value_type": "number"},
            {"path": "$.name", "min_length": 4},
            {"path": "$.tags", "max_length": 2},
            {"path": "$.score", "min_value": 6},
            {"path": "$.score", "max_value": 4},
            {"path": "$.name", "pattern": "^x"},
            {"path": "$.copy", "consistency_check": {"type": "equals", "compare_with_path": "$.score"}},
            {"path": "$.total", "consistency_check": {"type": "greater_than", "compare_with_path": "$.score"}},
            {"path": "$.score", "consistency_check": {"type": "less_than", "compare_with_path": "$.total"}},
            {"path": "$.tags", "consistency_check": {"type": "array_length", "compare_with_path": "$.count"}},
            {"path": "$.status", "consistency_check": {"type": "in_array", "compare_with_path": "$.allowed"}},
            {"path": "$.missing", "value_type": "string"},
            {"path": "$.tags", "consistency_check": {"type": "array_length", "compare_with_path": "$.n"}},
            {"path": "$.status", "pattern": "^do"}
        ]}]}))
        .unwrap();
    assert!(!report.passed);
    assert_eq!(
        failed(&report),
        [
            ("$.name".into(), "value_type".into(), "r.json: $.name must be of type number, found a string".into()),
            ("$.name".into(), "min_length".into(), "r.json: $.name must have length >= 4, found length 3".into()),
            ("$.tags".into(), "max_length".into(), "r.json: $.tags must have length <= 2, found length 3".into()),
            ("$.score".into(), "min_value".into(), "r.json: $.score must be a number >= 6, found 5".into()),
            ("$.score".into(), "max_value".into(), "r.json: $.score must be a number <= 4, found 5".into()),
            ("$.name".into(), "pattern".into(), "r.json: $.name must match /^x/, found \"abc\"".into()),
            ("$.copy".into(), "equals".into(), "r.json: $.copy must be equal to 5 (equals at $.score), found 4".into()),
            ("$.total".into(), "greater_than".into(), "r.json: $.total must be a number greater than 5 (greater_than at $.score), found 3".into()),
            ("$.score".into(), "less_than".into(), "r.json: $.score must be a number less than 3 (less_than at $.total), found 5".into()),
            ("$.tags".into(), "array_length".into(), "r.json: $.tags must be an array of 2 item(s) (array_length at $.count), found an array of 3 item(s)".into()),
            ("$.status".into(), "in_array".into(), "r.json: $.status must be an element of $.allowed (in_array at $.allowed), found \"done\"".into()),
            ("$.missing".into(), "must_exist".into(), "r.json: $.missing is missing: add it".into()),
        ]
    );
    let c = report.failures().next().unwrap();
    assert_eq!(
        (c.expected.as_str(), c.actual.as_str()),
        ("number", "a string")
    );
    // The two checks that hold are recorded as passed.
    assert_eq!(report.checks.iter().filter(|c| c.passed).count(), 2);
}

#[test]
fn a_path_selecting_many_values_checks_each_with_its_location() {
    let ws = Ws::new();
    ws.output("r.json", r#"{"items": [{"n": 1}, {"n": -1}]}"#);
    let report = ws
        .gate(json!({"files": [{"file_name": "r.json", "json_checks": [{"path": "$.items[*].n", "min_value": 0}]}]}))
        .unwrap();
    assert_eq!(
        failed(&report),
        [(
            "$['items'][1]['n']".into(),
            "min_value".into(),
            "r.json: $['items'][1]['n'] must be a number >= 0, found -1".into()
        )]
    );
}

#[test]
fn doc_era_required_and_json_type_are_enforced() {
    let ws = Ws::new();
    ws.output("report.json", "{\"a\": 1,}");
    let report = ws
        .gate(json!({"files": [
            {"file_name": "report.json", "required": true, "validation_type": "json"},
            {"file_name": "report_proof.json", "required": true, "validation_type": "json"}
        ]}))
        .unwrap();
    assert_eq!(
        failed(&report),
        [
            ("".into(), "valid_json".into(), "report.json is not valid JSON (line 1, column 9: trailing comma): rewrite it as valid JSON".into()),
            ("".into(), "must_exist".into(), "report_proof.json does not exist in the step output folder: write it".into()),
        ]
    );
    ws.output("report.json", "{\"a\": 1}");
    ws.output("report_proof.json", "[]");
    assert!(
        ws.gate(json!({"files": [
            {"file_name": "report.json", "required": true, "validation_type": "json"},
            {"file_name": "report_proof.json", "required": true, "validation_type": "json"}]}))
            .unwrap()
            .passed
    );
}

#[test]
fn optional_missing_files_pass_and_folders_are_not_files() {
    let ws = Ws::new();
    std::fs::create_dir_all(ws.out().join("dir.json")).unwrap();
    let report = ws
        .gate(json!({"files": [
            {"file_name": "maybe.json", "json_checks": [{"path": "$.a", "must_exist": true}]},
            {"file_name": "dir.json", "must_exist": true}
        ]}))
        .unwrap();
    assert!(report.checks[0].passed);
    assert_eq!(report.checks[0].actual, "missing");
    assert_eq!(
        failed(&report),
        [(
            "".into(),
            "must_exist".into(),
            "dir.json does not exist in the step output folder: write it".into()
        )]
    );
}

#[test]
fn workspace_prefixes_resolve_from_the_root() {
    let ws = Ws::new();
    std::fs::create_dir_all(ws.root().join("knowledgebase/notes")).unwrap();
    std::fs::write(
        ws.root().join("knowledgebase/notes/a.json"),
        r#"{"ok": true}"#,
    )
    .unwrap();
    // The same name in the output folder must not be what is read.
    ws.output("knowledgebase/notes/a.json", r#"{"ok": false}"#);
    let report = ws
        .gate(json!({"files": [{"file_name": "knowledgebase/notes/a.json", "must_exist": true,
            "json_checks": [{"path": "$.ok", "consistency_check": {"type": "equals", "compare_with_path": "$.ok"}},
                            {"path": "$.ok", "value_type": "boolean"}]}]}))
        .unwrap();
    assert!(report.passed);
    assert_eq!(
        resolve_file(ws.root(), &ws.out(), "db/x.json"),
        Some(ws.root().join("db/x.json"))
    );
    assert_eq!(
        resolve_file(ws.root(), &ws.out(), "r.json"),
        Some(ws.out().join("r.json"))
    );
    assert_eq!(resolve_file(ws.root(), &ws.out(), "../r.json"), None);
}

#[test]
fn nothing_resolves_outside_the_workspace() {
    let ws = Ws::new();
    for name in [
        "../../../../etc/passwd",
        "/etc/passwd",
        "db/../../secret.json",
    ] {
        let err = ws
            .gate(json!({"files": [{"file_name": name, "must_exist": true}]}))
            .unwrap_err();
        assert!(matches!(err, GateError::Schema(_)), "{name}: {err}");
    }
    // A symlink out of the output folder is not followed: the file does not exist for the gate.
    let secret = ws.root().join("secret.json");
    std::fs::write(&secret, "{}").unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("../../../../secret.json", ws.out().join("link.json")).unwrap();
        let report = ws
            .gate(json!({"files": [{"file_name": "link.json", "must_exist": true, "validation_type": "json"}]}))
            .unwrap();
        assert_eq!(failed(&report)[0].1, "must_exist");
        assert!(
            failed(&report)[0].2.contains("link.json in the step output folder is a symbolic link, which the gate does not follow"),
            "{:?}",
            failed(&report)
        );
    }
}

#[test]
fn writing_sql_is_refused_and_changes_nothing() {
    let ws = Ws::new();
    ws.db("CREATE TABLE findings (id INTEGER); INSERT INTO findings VALUES (1);");
    for sql in [
        "DELETE FROM findings",
        "INSERT INTO findings VALUES (2)",
        "DROP TABLE findings",
        "UPDATE findings SET id = 5",
    ] {
        let err = ws
            .gate(json!({"db": [{"name": "w", "sql": sql}]}))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("would write to the database")
                || msg.contains("readonly")
                || msg.contains("read-only"),
            "{sql}: {msg}"
        );
    }
    let c = rusqlite::Connection::open(ws.root().join("db/db.sqlite")).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM findings", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    let err = ws
        .gate(json!({"db": [{"name": "w", "sql": "SELECT 1; DELETE FROM findings"}]}))
        .unwrap_err();
    assert!(matches!(err, GateError::Schema(_)), "{err}");
}

#[test]
fn row_bounds_missing_tables_and_missing_db() {
    let ws = Ws::new();
    assert!(matches!(
        ws.gate(json!({"db": [{"sql": "SELECT 1"}]})).unwrap_err(),
        GateError::Db(_)
    ));
    ws.db("CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('a'), ('b'), ('c');");
    let report = ws
        .gate(json!({"db": [
            {"name": "few", "sql": "SELECT v FROM t", "min_rows": 4},
            {"name": "many", "sql": "SELECT v FROM t", "max_rows": 2},
            {"name": "absent", "sql": "SELECT * FROM nope"},
            {"name": "empty", "sql": "SELECT v FROM t WHERE v = 'z'", "checks": [{"path": "$.v", "must_exist": true}]},
            {"name": "first", "sql": "SELECT v FROM t ORDER BY v", "max_rows": 3, "checks": [{"path": "$.v", "pattern": "^a$"}]}
        ]}))
        .unwrap();
    assert_eq!(
        failed(&report),
        [
            (
                "".into(),
                "min_rows".into(),
                "db rule \"few\": expected at least 4 row(s), the query returned 3 row(s)".into()
            ),
            (
                "".into(),
                "max_rows".into(),
                "db rule \"many\": expected at most 2 row(s), the query returned at least 3 row(s)"
                    .into()
            ),
            (
                "".into(),
                "sql".into(),
                "db rule \"absent\": the query failed: no such table: nope".into()
            ),
            (
                "".into(),
                "row".into(),
                "db rule \"empty\": the query returned no row, so its checks cannot hold".into()
            ),
        ]
    );
    assert!(matches!(
        ws.gate(json!({"db": [{"sql": "SELEC 1"}]})).unwrap_err(),
        GateError::Schema(_)
    ));
}

#[test]
fn an_invalid_regex_is_a_warning_not_a_failure() {
    let ws = Ws::new();
    ws.output("r.json", r#"{"a": "x"}"#);
    let report = ws
        .gate(json!({"files": [{"file_name": "r.json", "json_checks": [{"path": "$.a", "pattern": "(", "value_type": "string"}]}]}))
        .unwrap();
    assert!(report.passed);
    assert_eq!(report.checks.len(), 1);
    assert_eq!(
        report.warnings,
        [
            "r.json: $.a: invalid regular expression \"(\", pattern check skipped: unclosed group",
            "validation_schema: files[0].json_checks[0].pattern: invalid regular expression, the pattern check will be skipped: unclosed group"
        ]
    );
}

#[test]
fn limits_are_schema_errors() {
    let ws = Ws::new();
    let files: Vec<Value> = (0..21)
        .map(|i| json!({"file_name": format!("f{i}.json")}))
        .collect();
    assert!(matches!(
        ws.gate(json!({"files": files})).unwrap_err(),
        GateError::Schema(_)
    ));
    let checks: Vec<Value> = (0..101).map(|_| json!({"path": "$"})).collect();
    assert!(matches!(
        ws.gate(json!({"files": [{"file_name": "a.json", "json_checks": checks}]}))
            .unwrap_err(),
        GateError::Schema(_)
    ));
    let big = vec![b' '; (MAX_JSON_BYTES + 1) as usize];
    std::fs::write(ws.out().join("big.json"), big).unwrap();
    let err = ws
        .gate(json!({"files": [{"file_name": "big.json", "validation_type": "json"}]}))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the validation schema cannot be used: big.json is 10485761 bytes, over the 10485760-byte limit for JSON checks"
    );
    // Under the bytes, over the values: refused before it is parsed.
    let many = format!(
        "[{}0]",
        "0,".repeat(trellis_sandbox::json_values::MAX_FILE_VALUES)
    );
    std::fs::write(ws.out().join("many.json"), many).unwrap();
    let err = ws
        .gate(json!({"files": [{"file_name": "many.json", "validation_type": "json"}]}))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the validation schema cannot be used: many.json holds about 1000002 JSON values, over the 1000000 a JSON check parses"
    );
}

#[test]
fn no_schema_or_no_rules_is_skipped_and_passes() {
    let ws = Ws::new();
    let report = ws.gate(json!({})).unwrap();
    assert!(report.passed && report.skipped && report.checks.is_empty());
}

struct Csv;

impl CustomValidator for Csv {
    fn supports(&self, t: &str) -> bool {
        t == "csv" || t == "broken"
    }
    fn validate<'a>(&'a self, t: &'a str, file: &'a Path, rule: &'a Value) -> ValidateFuture<'a> {
        Box::pin(async move { Csv::check(t, file, rule) })
    }
}

impl Csv {
    fn check(t: &str, file: &Path, rule: &Value) -> Result<CustomOutcome, ValidatorError> {
        let failed = |message: String| ValidatorError::Rule {
            validator: t.to_string(),
            message,
        };
        if t == "broken" {
            return Err(failed("the plugin trapped".into()));
        }
        let text = std::fs::read_to_string(file).map_err(|e| failed(e.to_string()))?;
        let header = text.lines().next().unwrap_or_default();
        let want = rule["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect::<Vec<_>>()
            .join(",");
        Ok(CustomOutcome {
            checks: vec![CheckResult {
                file: rule["file_name"].as_str().unwrap().into(),
                path: "header".into(),
                kind: "header".into(),
                passed: header == want,
                expected: want,
                actual: header.into(),
                message: "header".into(),
            }],
            warnings: vec!["csv: note".into()],
        })
    }
}

#[test]
fn custom_validation_types_are_dispatched() {
    let ws = Ws::new();
    ws.output("a.csv", "id,name\n1,x\n");
    let schema = json!({"files": [{"file_name": "a.csv", "must_exist": true, "validation_type": "csv", "columns": ["id", "name"]}]});
    let report = gate_value(ws.root(), &ws.out(), &schema, &Csv).unwrap();
    assert!(report.passed);
    assert_eq!(report.checks[1].kind, "header");
    assert_eq!(report.warnings, ["csv: note"]);

    let err = gate_value(ws.root(), &ws.out(), &schema, &NoCustomValidators).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no validator handles validation_type \"csv\" (file \"a.csv\"): install the validator plugin that provides it, or use \"json\""
    );
    let broken = json!({"files": [{"file_name": "a.csv", "validation_type": "broken"}]});
    let err = gate_value(ws.root(), &ws.out(), &broken, &Csv).unwrap_err();
    assert_eq!(
        err.to_string(),
        "validator for \"broken\" failed on \"a.csv\": validator `broken`: the plugin trapped"
    );
}

#[test]
fn a_missing_output_folder_means_missing_files() {
    let ws = Ws::new();
    let report = gate_value(
        ws.root(),
        &ws.root().join("runs/iteration-0/execution/never"),
        &json!({"files": [{"file_name": "a.json", "must_exist": true}]}),
        &NoCustomValidators,
    )
    .unwrap();
    assert!(!report.passed);
}

#[test]
fn a_gate_report_is_written_to_the_logs() {
    let ws = Ws::new();
    let report = ws
        .gate(json!({"files": [{"file_name": "a.json", "must_exist": true}]}))
        .unwrap();
    let run = ws.root().join("runs/iteration-0");
    let fs = trellis_sandbox::store::WorkspaceFs::open(ws.root()).unwrap();
    write_report(&fs, &run, "s", "check-output", 1, &report).unwrap();
    let latest: Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("logs/s/pre_validation.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(latest["passed"], false);
    assert_eq!(
        latest["checks"][0]["message"],
        "a.json does not exist in the step output folder: write it"
    );
    assert!(
        run.join("logs/s/pre_validation_check-output_attempt_1.json")
            .is_file()
    );
}

mod never_panics {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::*;
    use crate::tests::arb_json;

    const NAMES: &[&str] = &[
        "r.json",
        "db/x.json",
        "knowledgebase/k.json",
        "missing.json",
        "../r.json",
        "/r.json",
        "",
        "sub/r.json",
    ];
    const PATHS: &[&str] = &[
        "$",
        "$.a",
        "$.a[*]",
        "$..*",
        "$[0]",
        "$.a.b",
        "a",
        "$[",
        "$.a[?@ > 1]",
    ];
    const SQL: &[&str] = &[
        "SELECT 1 AS a",
        "SELECT * FROM t",
        "DELETE FROM t",
        "SELECT",
        "SELECT * FROM nope",
        "PRAGMA user_version",
        "SELECT 1; SELECT 2",
        "",
    ];

    fn arb_check() -> impl Strategy<Value = Value> {
        (prop::sample::select(PATHS), arb_json()).prop_map(|(p, extra)| {
            let mut m = extra.as_object().cloned().unwrap_or_default();
            m.insert("path".into(), json!(p));
            Value::Object(m)
        })
    }

    fn arb_schema() -> impl Strategy<Value = Value> {
        let file = (
            prop::sample::select(NAMES),
            prop::option::of(prop::sample::select(&["json", "csv"][..])),
            prop::collection::vec(arb_check(), 0..4),
            any::<bool>(),
        )
            .prop_map(|(n, t, checks, must)| {
                let mut r = json!({"file_name": n, "json_checks": checks, "must_exist": must});
                if let Some(t) = t {
                    r["validation_type"] = json!(t);
                }
                r
            });
        let db = (
            prop::sample::select(SQL),
            prop::collection::vec(arb_check(), 0..3),
            prop::option::of(0u64..4),
        )
            .prop_map(|(sql, checks, min)| {
                let mut r = json!({"sql": sql, "checks": checks});
                if let Some(m) = min {
                    r["min_rows"] = json!(m);
                }
                r
            });
        (
            prop::collection::vec(file, 0..4),
            prop::collection::vec(db, 0..3),
        )
            .prop_map(|(files, db)| json!({"files": files, "db": db}))
    }

    fn run(schema: &Value, doc: &Value) -> Result<Report, GateError> {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let out = root.join("runs/iteration-0/execution/s");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::create_dir_all(root.join("db")).unwrap();
        std::fs::create_dir_all(root.join("knowledgebase")).unwrap();
        let text = doc.to_string();
        for p in [
            out.join("r.json"),
            out.join("sub/r.json"),
            root.join("db/x.json"),
            root.join("knowledgebase/k.json"),
        ] {
            std::fs::write(p, &text).unwrap();
        }
        let c = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
        c.execute_batch(
            "CREATE TABLE t (a INTEGER, b TEXT); INSERT INTO t VALUES (1, 'x'), (2, NULL);",
        )
        .unwrap();
        drop(c);
        let r = super::gate_value(root, &out, schema, &NoCustomValidators);
        // Whatever the schema, the database is never changed.
        let c = rusqlite::Connection::open(root.join("db/db.sqlite")).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        r
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

        #[test]
        fn gate_never_panics_on_arbitrary_schemas(schema in arb_json(), doc in arb_json()) {
            let _ = run(&schema, &doc);
        }

        #[test]
        fn gate_never_panics_on_schema_shaped_input(schema in arb_schema(), doc in arb_json()) {
            if let Ok(report) = run(&schema, &doc) {
                prop_assert_eq!(report.passed, report.checks.iter().all(|c| c.passed));
            }
        }
    }
}
