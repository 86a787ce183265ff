//! `planning/step_config.json` on arbitrary text: the parser, then the whole-workspace check
//! with the text as the step config beside a small valid plan (in memory, over an empty folder).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use trellis_workflow::{Candidate, PLAN_FILE, STEP_CONFIG_FILE, step_config, validate_candidate};

static WORKSPACE: OnceLock<tempfile::TempDir> = OnceLock::new();

const PLAN: &str = r#"{"steps": [
  {"id": "fetch", "type": "regular", "description": "Fetch", "items": [{"id": "i1", "description": "Fetch it"}]},
  {"id": "sum", "type": "regular", "description": "Sum", "items": [{"id": "i1", "description": "Sum it"}]}
]}"#;

fuzz_target!(|text: &str| {
    match step_config::parse_step_config(text, STEP_CONFIG_FILE) {
        Ok((configs, warnings)) => {
            let _ = warnings.to_string();
            for entry in &configs.steps {
                let _ = configs.get(&entry.id);
                if let Some(c) = &entry.agent_configs {
                    let _ = (c.is_scripted(), c.effective_learnings_access());
                    let _ = (
                        c.effective_knowledgebase_access(),
                        c.effective_learning_detail_level(),
                    );
                }
            }
        }
        Err(errors) => {
            let _ = errors.to_string();
        }
    }
    let root = WORKSPACE.get_or_init(|| tempfile::tempdir().unwrap());
    let mut candidate = Candidate::new();
    candidate.set(PLAN_FILE, PLAN.as_bytes().to_vec());
    candidate.set(STEP_CONFIG_FILE, text.as_bytes().to_vec());
    let _ = validate_candidate(root.path(), &candidate).to_string();
});
