//! How many JSON values a request body holds, counted before anything parses it: parsed, a
//! body of many small values costs far more memory than its bytes.

/// The JSON values a request body may hold (arrays, objects and scalars together).
pub const MAX_BODY_VALUES: usize = 100_000;

/// About how many JSON values `body` holds, counted without parsing: each `,` and `:` outside
/// strings, plus each `[` and `{`, plus one. Exact for well-formed JSON up to the keys of
/// objects (counted as values), which is the cost that matters: what a parse would allocate.
pub(super) fn json_values(body: &[u8]) -> usize {
    let mut counter = ValueCounter::default();
    counter.feed(body);
    counter.values()
}

/// [`json_values`] of a message that arrives in pieces.
#[derive(Debug, Default)]
pub(super) struct ValueCounter {
    separators: usize,
    in_string: bool,
    escaped: bool,
}

impl ValueCounter {
    /// Counts the next piece of the message.
    pub(super) fn feed(&mut self, piece: &[u8]) {
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
                    b',' | b':' | b'[' | b'{' => self.separators += 1,
                    _ => {}
                }
            }
        }
    }

    /// The values counted so far.
    pub(super) fn values(&self) -> usize {
        self.separators.saturating_add(1)
    }
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
