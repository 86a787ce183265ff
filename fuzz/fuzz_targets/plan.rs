//! `planning/plan.json` on arbitrary text: the parser, what the runner asks of a parsed plan,
//! and the whole-workspace check with the text as the plan (in memory, over an empty folder).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use trellis_workflow::{Candidate, PLAN_FILE, plan, validate_candidate};

static WORKSPACE: OnceLock<tempfile::TempDir> = OnceLock::new();

fuzz_target!(|text: &str| {
    match plan::parse_plan(text, PLAN_FILE) {
        Ok((plan, warnings)) => {
            let _ = warnings.to_string();
            for step in plan.all_steps() {
                let _ = (step.type_name(), step.effective_items(), step.outputs());
                let _ = step.predefined_routes();
                let _ = plan.find_step(&step.id);
            }
        }
        Err(errors) => {
            let _ = errors.to_string();
        }
    }
    let root = WORKSPACE.get_or_init(|| tempfile::tempdir().unwrap());
    let mut candidate = Candidate::new();
    candidate.set(PLAN_FILE, text.as_bytes().to_vec());
    let _ = validate_candidate(root.path(), &candidate).to_string();
});
