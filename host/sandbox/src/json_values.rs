//! How many JSON values a text holds, counted before anything parses it: parsed, a text of
//! many small values costs far more memory than its bytes (`[1,1,...]` of 64 MiB is some
//! 33 million values, over a gigabyte as `serde_json::Value`). Whatever the host parses of
//! untrusted JSON larger than a few megabytes (request bodies, cassettes, logs a workspace
//! holds) is counted first and refused over its budget.

use anyhow::{Result, bail};

/// The JSON values a file the host parses whole may hold (a cassette, a log `runs show`
/// reads): about 100 MB parsed at most.
pub const MAX_FILE_VALUES: usize = 1_000_000;

/// About how many JSON values `text` holds, counted without parsing: each `,` and `:` outside
/// strings, plus each `[` and `{`, plus one. Exact for well-formed JSON up to the keys of
/// objects (counted as values), which is the cost that matters: what a parse would allocate.
pub fn json_values(text: &[u8]) -> usize {
    let mut counter = ValueCounter::default();
    counter.feed(text);
    counter.values()
}

/// [`json_values`] of a message that arrives in pieces.
#[derive(Debug, Default)]
pub struct ValueCounter {
    separators: usize,
    in_string: bool,
    escaped: bool,
    /// Arrays and objects open now, and the most open at once so far.
    depth: usize,
    deepest: usize,
}

impl ValueCounter {
    /// Counts the next piece of the message.
    pub fn feed(&mut self, piece: &[u8]) {
        for &b in piece {
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b'[' | b'{' => {
                        self.separators += 1;
                        self.depth += 1;
                        self.deepest = self.deepest.max(self.depth);
                    }
                    b']' | b'}' => self.depth = self.depth.saturating_sub(1),
                    b',' | b':' => self.separators += 1,
                    _ => {}
                }
            }
        }
    }

    /// The values counted so far.
    pub fn values(&self) -> usize {
        self.separators.saturating_add(1)
    }

    /// The most arrays and objects open at once so far: how deep the message nests.
    pub fn deepest(&self) -> usize {
        self.deepest
    }
}

/// Refuses `text`, the JSON of `what`, when it holds more than `budget` values
/// ([`json_values`]): the error names it, the count and the budget. Returns the count.
pub fn check_values(what: &str, text: &[u8], budget: usize) -> Result<usize> {
    let values = json_values(text);
    if values > budget {
        bail!(
            "{what}: holds about {values} JSON values, more than the {budget} Trellis parses \
             of one file"
        );
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_are_counted_without_parsing() {
        assert_eq!(json_values(b"1"), 1);
        assert_eq!(json_values(b"[1,2,3]"), 4);
        assert_eq!(json_values(br#"{"a":1,"b":[true,null]}"#), 7);
        // Commas and colons inside strings, escaped quotes included, are not values.
        assert_eq!(json_values(br#"{"a,b:c\",d":"x,y"}"#), 3);
    }

    #[test]
    fn nesting_is_measured_outside_strings() {
        let mut counter = ValueCounter::default();
        counter.feed(br#"{"a":[[1],{"b":"[[[{"}],"c":[]}"#);
        assert_eq!(counter.deepest(), 3);
        let mut counter = ValueCounter::default();
        counter.feed(&[b'['; 500]);
        assert_eq!(counter.deepest(), 500);
    }

    #[test]
    fn a_message_in_pieces_counts_as_a_whole() {
        let whole = br#"{"a":"x\",y","b":[1,2]}"#;
        for cut in 0..whole.len() {
            let mut counter = ValueCounter::default();
            counter.feed(&whole[..cut]);
            counter.feed(&whole[cut..]);
            assert_eq!(counter.values(), json_values(whole), "cut at {cut}");
        }
    }
}
