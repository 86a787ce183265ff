//! Cassettes on arbitrary bytes: the `replay` provider's reading of the interactions, and the
//! typed [`Cassette`] the recorder and `trellis cassette` commands load.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis_sandbox::llm::record::{Cassette, interactions};

fuzz_target!(|data: &[u8]| {
    let Ok(list) = interactions("fuzz.json", data) else {
        return;
    };
    let typed = serde_json::from_value::<Cassette>(serde_json::json!({ "interactions": list }));
    if let Ok(cassette) = typed {
        for i in &cassette.interactions {
            let _ = i.request.names_only();
            let _ = i
                .request
                .tools
                .iter()
                .map(|t| t.name().len())
                .sum::<usize>();
        }
        // What is read back is what was written.
        let again: Cassette =
            serde_json::from_slice(&serde_json::to_vec(&cassette).unwrap()).unwrap();
        assert_eq!(again, cassette);
    }
});
