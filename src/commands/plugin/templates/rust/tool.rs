//! The `__ID__` tool plugin: its tools are `__ID__:<name>` to agents.
//!
//! Build with `trellis plugin build .`; test with `cargo test`.

use trellis_plugin_sdk::serde_json::{Value, json};
use trellis_plugin_sdk::tool::{Hints, ToolError, TypedTool};

/// The arguments of `count_words`; the doc comments become the schema's descriptions.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CountWordsArgs {
    /// A file inside the folders granted to the call, e.g. `notes/today.md`.
    path: String,
}

/// Counts the words and lines of a text file.
struct CountWords;

impl TypedTool for CountWords {
    const NAME: &str = "count_words";
    const DESCRIPTION: &str = "Counts the words and lines of a text file.";
    const HINTS: Hints = Hints::READ_ONLY;
    type Args = CountWordsArgs;

    fn run(args: CountWordsArgs) -> Result<Value, ToolError> {
        let text =
            std::fs::read_to_string(&args.path).map_err(|e| ToolError::from_io(&args.path, &e))?;
        Ok(counts(&text))
    }
}

/// The counts of `text`, kept apart from the file access so it can be tested anywhere.
fn counts(text: &str) -> Value {
    json!({ "words": text.split_whitespace().count(), "lines": text.lines().count() })
}

trellis_plugin_sdk::export_tools!(CountWords);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words_and_lines() {
        assert_eq!(
            counts("one two\nthree\n"),
            json!({ "words": 3, "lines": 2 })
        );
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let err = CountWords::run(CountWordsArgs {
            path: "no/such/file.txt".into(),
        })
        .unwrap_err();
        assert!(matches!(err, ToolError::NotFound(_) | ToolError::Denied(_)));
    }
}
