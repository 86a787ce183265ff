//! `workflow.json` (and `variables/variables.json` merged into it) on arbitrary text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis_workflow::WORKFLOW_FILE;
use trellis_workflow::manifest::{self, parse_manifest};

fuzz_target!(|text: &str| {
    // Fuzzed text is the manifest; the same text is then merged as a variables file.
    match parse_manifest(text, WORKFLOW_FILE) {
        Ok((mut m, warnings)) => {
            let _ = warnings.to_string();
            let _ = (m.contract(), m.run_retention(), m.resolved_variables(None));
            let _ =
                manifest::merge_variables_file(text, manifest::VARIABLES_FILE, &mut m).to_string();
            let _ = m.resolved_variables(Some("g"));
        }
        Err(errors) => {
            let _ = errors.to_string();
        }
    }
    let _ = manifest::sanitize_folder_name(text);
    let _ = manifest::group_folder_name(Some(text), "g");
});
