//! No-panic property tests: arbitrary JSON shaped like the workflow files goes through every
//! parser, which must answer with diagnostics, never a panic.

use proptest::prelude::*;
use serde_json::Value;

use super::*;

const WORDS: &[&str] = &[
    "steps",
    "orphan_steps",
    "id",
    "type",
    "title",
    "description",
    "items",
    "message",
    "source_sql",
    "max_iterations",
    "validation_schema",
    "prevalidation",
    "write_access",
    "kind",
    "predefined_routes",
    "route_id",
    "sub_agent_step",
    "routes",
    "next_step_id",
    "default_route_id",
    "context_output",
    "context_dependencies",
    "files",
    "db",
    "file_name",
    "json_checks",
    "path",
    "must_exist",
    "value_type",
    "pattern",
    "consistency_check",
    "compare_with_path",
    "sql",
    "checks",
    "min_rows",
    "agent_configs",
    "execution_llm",
    "provider",
    "model_id",
    "fallbacks",
    "learnings_access",
    "prerequisite_rules",
    "depends_on_step",
    "variables",
    "groups",
    "contract_version",
    "version",
    "has_loop",
    "shared_with",
    "max_corrections",
    "capabilities",
    "llm_config",
    "tiered_config",
    "tier_1",
    "llm",
    "tiers",
    "providers",
    "options",
    "option_routes",
    "messages",
    "required",
    "validation_type",
    "min_length",
    "max_value",
    "paths",
    "response_type",
];
const STRINGS: &[&str] = &[
    "message_sequence",
    "regular",
    "routing",
    "human_input",
    "todo_task",
    "user_message",
    "foreach",
    "prevalidation",
    "code",
    "end",
    "a",
    "b",
    "$",
    "$.a",
    "$[",
    "$..*",
    "SELECT 1",
    "DELETE FROM t",
    "a.json",
    "../x",
    "/etc",
    "db/db.sqlite",
    "json",
    "csv",
    "equals",
    "in_array",
    "array_length",
    "(",
    "read-write",
    "scripted",
    "1.0.11",
    "1.0.9",
    "multiple_choice",
    "",
];

pub(crate) fn arb_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e9f64..1e9).prop_map(Value::from),
        prop::sample::select(STRINGS).prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::from),
    ];
    let key = prop_oneof![
        4 => prop::sample::select(WORDS).prop_map(String::from),
        1 => "[a-z_]{1,6}",
    ];
    leaf.prop_recursive(5, 96, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// A plan-shaped value: steps with real types and ids, other keys arbitrary.
fn arb_plan() -> impl Strategy<Value = Value> {
    let item = (
        prop::sample::select(STRINGS),
        prop::sample::select(&["a", "b", "c"][..]),
        arb_json(),
    )
        .prop_map(|(t, id, extra)| {
            let mut m = extra.as_object().cloned().unwrap_or_default();
            m.insert("type".into(), json!(t));
            m.insert("id".into(), json!(id));
            Value::Object(m)
        });
    let step = (
        prop::sample::select(STRINGS),
        prop::sample::select(&["a", "b", "end"][..]),
        prop::collection::vec(item, 0..4),
        arb_json(),
    )
        .prop_map(|(t, id, items, extra)| {
            let mut m = extra.as_object().cloned().unwrap_or_default();
            m.insert("type".into(), json!(t));
            m.insert("id".into(), json!(id));
            m.insert("items".into(), Value::Array(items));
            Value::Object(m)
        })
        .boxed();
    (
        prop::collection::vec(step.clone(), 0..4),
        prop::collection::vec(step, 0..2),
    )
        .prop_map(|(steps, orphans)| json!({"steps": steps, "orphan_steps": orphans}))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic_on_arbitrary_json(v in arb_json()) {
        let text = v.to_string();
        let _ = plan::parse_plan(&text, PLAN_FILE);
        let _ = step_config::parse_step_config(&text, STEP_CONFIG_FILE);
        let _ = manifest::parse_manifest(&text, WORKFLOW_FILE);
        let _ = crate::validation::schema::parse_schema_text(&text, "schema.json");
        // A result is either a model or at least one error, never an empty failure.
        if let Err(d) = plan::parse_plan(&text, PLAN_FILE) {
            prop_assert!(d.has_errors());
        }
    }

    #[test]
    fn plan_parser_never_panics_on_plan_shaped_json(v in arb_plan()) {
        match plan::parse_plan_value(&v, PLAN_FILE) {
            Ok((p, _)) => {
                // What parses serializes and parses again to the same model.
                let again = plan::parse_plan_value(&serde_json::to_value(&p).unwrap(), PLAN_FILE);
                prop_assert_eq!(again.map(|(p, _)| p).ok(), Some(p));
            }
            Err(d) => prop_assert!(d.has_errors()),
        }
    }

    #[test]
    fn parsers_never_panic_on_arbitrary_text(text in "\\PC{0,64}") {
        let _ = plan::parse_plan(&text, PLAN_FILE);
        let _ = step_config::parse_step_config(&text, STEP_CONFIG_FILE);
        let _ = manifest::parse_manifest(&text, WORKFLOW_FILE);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn migration_never_panics_and_blocks_without_writing(v in arb_plan()) {
        let tmp = tempfile::tempdir().unwrap();
        crate::test_files::write_json_atomic(&tmp.path().join(PLAN_FILE), &v).unwrap();
        let before = std::fs::read(tmp.path().join(PLAN_FILE)).unwrap();
        if migrate::migrate_message_sequence_code_items(tmp.path()).is_err() {
            prop_assert_eq!(std::fs::read(tmp.path().join(PLAN_FILE)).unwrap(), before);
            prop_assert!(!tmp.path().join(WORKFLOW_FILE).exists());
        }
    }
}
