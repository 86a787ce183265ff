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
    // Every window of W bytes of every secret and of its encodings; a run of the text is a
    // piece of a secret when each of its windows is one of them.
    let grams: HashSet<[u8; W]> = secrets
        .iter()
        .map(|s| s.as_ref().as_bytes())
        .filter(|s| s.len() >= W)
        .flat_map(spellings)
        .flat_map(|s| {
            s.windows(W)
                .filter_map(|w| <[u8; W]>::try_from(w).ok())
                .collect::<Vec<_>>()
        })
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

/// `secret` and the ways it is commonly written out that do not show its bytes: in hex
/// (lower and upper case) and in base64 (standard and URL-safe), the latter at each of the
/// three places it may start within a longer encoded text (`Basic` credentials, a token
/// holding the key), each cut to the characters that come from the secret alone.
fn spellings(secret: &[u8]) -> Vec<Vec<u8>> {
    let hex = hex::encode(secret);
    let mut all = vec![
        secret.to_vec(),
        hex.to_ascii_uppercase().into_bytes(),
        hex.into_bytes(),
    ];
    for offset in 0..3 {
        let mut shifted = vec![0u8; offset];
        shifted.extend_from_slice(secret);
        let encoded = base64(&shifted);
        // Characters holding a bit of the bytes before the secret, or of those after it.
        let first = (offset * 8).div_ceil(6);
        let last = (shifted.len() * 8) / 6;
        let core = &encoded[first..last.max(first)];
        all.push(core.to_vec());
        all.push(
            core.iter()
                .map(|c| match c {
                    b'+' => b'-',
                    b'/' => b'_',
                    c => *c,
                })
                .collect(),
        );
    }
    all
}

/// `bytes` in standard base64, without padding.
fn base64(bytes: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]);
        }
    }
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

    #[test]
    fn a_secret_in_base64_or_hex_is_hidden_wherever_it_starts() {
        const KEY: &str = "sk-test-SECRETKEY1234567890abcdef";
        // The reference encodings, as `base64` and `xxd` print them.
        let whole = "c2stdGVzdC1TRUNSRVRLRVkxMjM0NTY3ODkwYWJjZGVm";
        let basic = "dXNlcjpzay10ZXN0LVNFQ1JFVEtFWTEyMzQ1Njc4OTBhYmNkZWY=";
        let shifted = "eHNrLXRlc3QtU0VDUkVUS0VZMTIzNDU2Nzg5MGFiY2RlZg==";
        for encoded in [whole, basic, shifted] {
            let hidden = redact_secrets(&format!("b64={encoded} end"), &[KEY]);
            assert!(hidden.contains(REDACTED), "{hidden}");
            let left = hidden.replace(REDACTED, "");
            assert!(left.len() < 12 + 8, "{hidden}");
        }
        let hex = "736b2d746573742d5345435245544b4559313233343536373839306162636465660a";
        assert_eq!(
            redact_secrets(&format!("x {hex}"), &[KEY]),
            format!("x {REDACTED}0a")
        );
        let upper = hex.to_ascii_uppercase();
        assert!(redact_secrets(&upper, &[KEY]).starts_with(REDACTED));
        // Plain text that is not an encoding of it stays.
        let plain = "hello in base64 is aGVsbG8= and in hex 68656c6c6f";
        assert_eq!(redact_secrets(plain, &[KEY]), plain);
    }
}
