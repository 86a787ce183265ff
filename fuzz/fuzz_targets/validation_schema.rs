//! A step's `validation_schema` evaluated by the gate against a fuzzed output file.
//!
//! The input is the schema's JSON text, a NUL byte, then the contents of the step's output
//! file `output.json` (the seeds name it, so the fuzzer keeps the schema pointed at it).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use trellis_workflow::validation::{NoCustomValidators, run_gate_value, schema};

struct Workspace {
    _dir: tempfile::TempDir,
    root: PathBuf,
    output: PathBuf,
}

static WORKSPACE: OnceLock<Workspace> = OnceLock::new();

fn workspace() -> &'static Workspace {
    WORKSPACE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let output = root.join("runs/iteration-0/execution/step");
        std::fs::create_dir_all(&output).unwrap();
        Workspace {
            _dir: dir,
            root,
            output,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let (schema_bytes, file) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(schema_bytes) else {
        return;
    };
    let _ = schema::parse_schema_text(text, "validation_schema").map(|(s, _)| s.is_empty());
    let Ok(schema) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    let ws = workspace();
    std::fs::write(ws.output.join("output.json"), file).unwrap();
    let gate = run_gate_value(&ws.root, &ws.output, &schema, &NoCustomValidators);
    if let Ok(report) = futures::executor::block_on(gate) {
        let _ = serde_json::to_string(&report);
    }
});
