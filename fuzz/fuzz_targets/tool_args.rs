//! Tool arguments checked the way the host checks them before a tool call: a tool's
//! `input-schema` accepted (or refused) as at plugin load, then arguments checked against it.
//! The input is the schema's JSON text, a NUL byte, then the arguments' JSON text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis_sandbox::plugins::ToolSpec;

fuzz_target!(|data: &str| {
    let (schema, args) = data.split_once('\0').unwrap_or((data, "{}"));
    let Ok(tool) = ToolSpec::new("tool".into(), String::new(), schema) else {
        return;
    };
    let Ok(args) = serde_json::from_str::<serde_json::Value>(args) else {
        return;
    };
    let _ = tool.check_arguments(&args);
});
