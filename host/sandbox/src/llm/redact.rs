//! Hiding secrets in text the host passes on: what a provider or script returns, logs and
//! prints may echo a key, whole or cut.
//!
//! Any run of [`MIN_SECRET_CHARS`] or more bytes of a secret is hidden, not only the whole
//! secret: a provider's error excerpt that ends inside the key, or a log line cut at a
//! limit, still shows no piece that long. A secret shorter than that is not redacted at all
//! (`OPENAI_API_KEY=x`, as local servers' docs suggest, would otherwise turn every `x` of
//! an answer into the marker and break its tool calls); it is too short to be a secret.

use std::collections::HashSet;

/// What stands in for a piece of a secret.
pub const REDACTED: &str = "[REDACTED]";

/// The shortest secret redacted, and the shortest piece of one hidden, in bytes.
pub const MIN_SECRET_CHARS: usize = 8;

const W: usize = MIN_SECRET_CHARS;

/// `text` with every run of [`MIN_SECRET_CHARS`] or more bytes that appears in one of
/// `secrets` replaced by [`REDACTED`] (one marker per run). Secrets shorter than
/// [`MIN_SECRET_CHARS`] are ignored.
pub fn redact_secrets<S: AsRef<str>>(text: &str, secrets: &[S]) -> String {
    // Every window of W bytes of every secret; a run of the text is a piece of a secret
    // when each of its windows is one of them.
    let grams: HashSet<[u8; W]> = secrets
        .iter()
        .map(|s| s.as_ref().as_bytes())
        .filter(|s| s.len() >= W)
        .flat_map(|s| s.windows(W))
        .filter_map(|w| w.try_into().ok())
        .collect();
    let bytes = text.as_bytes();
    if grams.is_empty() || bytes.len() < W {
        return text.to_string();
    }
    // Bytes that start a window: most positions are passed over without hashing.
    let mut starts = [false; 256];
    for gram in &grams {
        starts[usize::from(gram[0])] = true;
    }
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for i in 0..=bytes.len() - W {
        if !starts[usize::from(bytes[i])] {
            continue;
        }
        let Ok(window) = <[u8; W]>::try_from(&bytes[i..i + W]) else {
            continue;
        };
        if !grams.contains(&window) {
            continue;
        }
        match spans.last_mut() {
            Some((_, end)) if i <= *end => *end = i + W,
            _ => spans.push((i, i + W)),
        }
    }
    if spans.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (mut start, mut end) in spans {
        // A secret that is not ASCII may match from inside a character: hide it whole.
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let start = start.max(at);
        out.push_str(&text[at..start]);
        if end > start {
            out.push_str(REDACTED);
        }
        at = at.max(end);
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGH";

    #[test]
    fn a_whole_key_and_every_piece_of_eight_or_more_bytes_are_hidden() {
        assert_eq!(
            redact_secrets(&format!("Bearer {KEY}!"), &[KEY]),
            "Bearer [REDACTED]!"
        );
        // An excerpt that ends inside the key: 50 of its 51 bytes.
        let cut = &KEY[..KEY.len() - 1];
        assert_eq!(
            redact_secrets(&format!("error: invalid key {cut}"), &[KEY]),
            "error: invalid key [REDACTED]"
        );
        // One that starts inside it, and a piece in the middle.
        assert_eq!(
            redact_secrets(&format!("{}…", &KEY[30..]), &[KEY]),
            "[REDACTED]…"
        );
        assert_eq!(
            redact_secrets(&format!("a{}b", &KEY[10..18]), &[KEY]),
            "a[REDACTED]b"
        );
        // Seven bytes of it are not a piece worth hiding.
        let seven = &KEY[10..17];
        assert_eq!(
            redact_secrets(&format!("a{seven}b"), &[KEY]),
            format!("a{seven}b")
        );
        // Two pieces apart are two runs.
        assert_eq!(
            redact_secrets(&format!("{} and {}", &KEY[..9], &KEY[20..40]), &[KEY]),
            "[REDACTED] and [REDACTED]"
        );
    }

    #[test]
    fn a_secret_shorter_than_eight_bytes_is_not_redacted() {
        let answer = r#"{"path": "x.txt", "text": "xx"}"#;
        assert_eq!(redact_secrets(answer, &["x"]), answer);
        assert_eq!(redact_secrets("1234567", &["1234567"]), "1234567");
        assert_eq!(redact_secrets("12345678", &["12345678"]), REDACTED);
        assert_eq!(redact_secrets("text", &[] as &[&str]), "text");
    }

    #[test]
    fn every_secret_is_hidden_and_text_that_is_not_ascii_stays_whole() {
        let other = "another-secret-value";
        assert_eq!(
            redact_secrets(&format!("{KEY} é {other}"), &[KEY, other]),
            "[REDACTED] é [REDACTED]"
        );
        let wide = "ключ-секрет-длинный";
        let text = format!("«{}»", &wide[..wide.len() - 2]);
        let hidden = redact_secrets(&text, &[wide]);
        assert_eq!(hidden, "«[REDACTED]»");
    }
}
