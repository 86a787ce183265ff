//! How many JSON values a request body holds, counted before anything parses it: parsed, a
//! body of many small values costs far more memory than its bytes.

/// The JSON values a request body may hold (arrays, objects and scalars together).
pub const MAX_BODY_VALUES: usize = 100_000;

/// About how many JSON values `body` holds, counted without parsing: each `,` and `:` outside
/// strings, plus each `[` and `{`, plus one. Exact for well-formed JSON up to the keys of
/// objects (counted as values), which is the cost that matters: what a parse would allocate.
pub(super) fn json_values(body: &[u8]) -> usize {
    let (mut count, mut in_string, mut escaped) = (1usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b',' | b':' | b'[' | b'{' => count += 1,
                _ => {}
            }
        }
    }
    count
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
}
