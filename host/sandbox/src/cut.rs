//! Text the host keeps or shows from untrusted input, cut to a budget with the cut marked:
//! tool error messages, a call's arguments in an event, schema refusals.

use serde_json::Value;

/// `text` cut to at most `max` bytes on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` whole up to `limit` bytes, else that much of it and `… [cut: N bytes, limit L]`,
/// `N` the length of the whole text.
pub fn marked(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    format!(
        "{}… [cut: {} bytes, limit {limit}]",
        truncate(text, limit),
        text.len()
    )
}

/// The bytes of JSON of a value an event keeps whole ([`json_value`]).
pub const EVENT_JSON_BYTES: usize = 4096;

/// `value` whole up to [`EVENT_JSON_BYTES`] of JSON, else a string of that much of its JSON
/// text, marked as by [`marked`]: what a long-lived event log keeps of a call's arguments.
pub fn json_value(value: &Value) -> Value {
    let text = value.to_string();
    if text.len() <= EVENT_JSON_BYTES {
        return value.clone();
    }
    Value::String(marked(&text, EVENT_JSON_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_on_a_character_boundary_and_the_cut_is_marked() {
        assert_eq!(marked("short", 10), "short");
        let cut = marked(&"é".repeat(10), 5);
        assert_eq!(cut, "éé… [cut: 20 bytes, limit 5]");
    }

    #[test]
    fn an_event_keeps_small_json_whole_and_cuts_big_json() {
        let small = serde_json::json!({"path": "notes.md"});
        assert_eq!(json_value(&small), small);
        // 4 MB of arguments (a hostile answer) leave 4 KiB in the event.
        let big = serde_json::json!({"path": "nope", "pad": "é".repeat(2_000_000)});
        let kept = json_value(&big);
        let text = kept.as_str().unwrap();
        assert!(text.starts_with(r#"{"pad":"ééé"#), "{:.40}", text);
        let total = big.to_string().len();
        let shown = text.find("… [cut: ").unwrap();
        assert!((EVENT_JSON_BYTES - 1..=EVENT_JSON_BYTES).contains(&shown));
        assert!(
            text.ends_with(&format!("… [cut: {total} bytes, limit {EVENT_JSON_BYTES}]")),
            "{}",
            &text[shown..]
        );
    }
}
