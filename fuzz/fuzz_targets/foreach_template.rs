//! Foreach messages: a Go template rendered with a row, both fuzzed. The input is the
//! template, a NUL byte, then the row as a JSON object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis_runner::template::MessageTemplate;

fuzz_target!(|data: &str| {
    let (source, row) = data.split_once('\0').unwrap_or((data, "{}"));
    let Ok(serde_json::Value::Object(row)) = serde_json::from_str(row) else {
        return;
    };
    if let Ok(template) = MessageTemplate::parse("item", source) {
        let _ = template.render(1, &row);
    }
});
