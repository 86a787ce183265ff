//! Linear-time versions of SQLite built-ins that are quadratic in their arguments.
//!
//! A statement is stopped at its deadline by a progress handler that runs between virtual
//! machine steps; one call of a built-in is one step. SQLite's `instr`, `replace` and
//! `trim`/`ltrim`/`rtrim` compare every position of one argument with the other, so a
//! single call on values well under the length limit runs for minutes past any deadline.
//! The versions here give the same answers in linear time and replace the built-ins on every
//! fenced connection.
//!
//! Where exact emulation would need SQLite's own conversions (a number as an argument: its
//! text form is SQLite's to make), the call goes to the built-in on a private in-memory
//! connection: a number's text is short, so the built-in's work is small. A `trim` whose
//! characters are not valid UTF-8 goes there too, within a bound on its work.

use std::cell::RefCell;

use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, ToSql};

/// Character comparisons a delegated `trim` may cost (its arguments' sizes multiplied).
const DELEGATED_WORK: usize = 1 << 26;

/// Replaces the quadratic built-ins of `conn` with the linear ones of this module.
pub(super) fn register(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function("instr", 2, flags, |ctx| instr(ctx))?;
    conn.create_scalar_function("replace", 3, flags, |ctx| replace(ctx))?;
    for (name, side) in [
        ("trim", Side::Both),
        ("ltrim", Side::Left),
        ("rtrim", Side::Right),
    ] {
        for args in [1, 2] {
            conn.create_scalar_function(name, args, flags, move |ctx| trim(ctx, name, side))?;
        }
    }
    Ok(())
}

/// What a function returns: SQLite's own value types, text possibly not UTF-8.
#[derive(Debug)]
enum Out {
    Null,
    Integer(i64),
    Text(Vec<u8>),
    Value(Value),
}

impl ToSql for Out {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Out::Null => ToSqlOutput::Owned(Value::Null),
            Out::Integer(n) => ToSqlOutput::Owned(Value::Integer(*n)),
            Out::Text(bytes) => ToSqlOutput::Borrowed(ValueRef::Text(bytes)),
            Out::Value(value) => ToSqlOutput::Borrowed(value.into()),
        })
    }
}

/// An argument as the built-ins see it.
enum Arg<'a> {
    Null,
    Text(&'a [u8]),
    Blob(&'a [u8]),
    /// A number: its text is SQLite's to make.
    Number,
}

fn arg<'a>(ctx: &'a Context<'_>, i: usize) -> Arg<'a> {
    match ctx.get_raw(i) {
        ValueRef::Null => Arg::Null,
        ValueRef::Text(t) => Arg::Text(t),
        ValueRef::Blob(b) => Arg::Blob(b),
        ValueRef::Integer(_) | ValueRef::Real(_) => Arg::Number,
    }
}

/// Calls the built-in `name` on a private connection with `ctx`'s arguments.
fn builtin(ctx: &Context<'_>, name: &str) -> rusqlite::Result<Out> {
    thread_local! {
        static PLAIN: RefCell<Option<Connection>> = const { RefCell::new(None) };
    }
    // Bound as they came, text bytes included: the built-in sees what the caller gave.
    let args: Vec<Out> = (0..ctx.len()).map(|i| owned(ctx.get_raw(i))).collect();
    let placeholders = (1..=args.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    PLAIN.with(|plain| {
        let mut plain = plain.borrow_mut();
        if plain.is_none() {
            *plain = Some(Connection::open_in_memory()?);
        }
        let conn = plain.as_ref().expect("opened above");
        conn.query_row(
            &format!("SELECT {name}({placeholders})"),
            rusqlite::params_from_iter(args.iter()),
            |row| row.get_ref(0).map(owned),
        )
    })
}

/// A value as this module returns it, text bytes kept as they are (not always UTF-8).
fn owned(value: ValueRef<'_>) -> Out {
    match value {
        ValueRef::Null => Out::Null,
        ValueRef::Integer(n) => Out::Integer(n),
        ValueRef::Real(f) => Out::Value(Value::Real(f)),
        ValueRef::Text(t) => Out::Text(t.to_vec()),
        ValueRef::Blob(b) => Out::Value(Value::Blob(b.to_vec())),
    }
}

fn is_continuation(byte: u8) -> bool {
    byte & 0xc0 == 0x80
}

/// `instr(X, Y)`: the 1-based position of the first `Y` in `X`, in characters (in bytes
/// when both are blobs), 0 when there is none.
fn instr(ctx: &Context<'_>) -> rusqlite::Result<Out> {
    let (haystack, needle, text) = match (arg(ctx, 0), arg(ctx, 1)) {
        (Arg::Null, _) | (_, Arg::Null) => return Ok(Out::Null),
        (Arg::Number, _) | (_, Arg::Number) => return builtin(ctx, "instr"),
        (Arg::Blob(h), Arg::Blob(n)) => (h, n, false),
        (Arg::Text(h) | Arg::Blob(h), Arg::Text(n) | Arg::Blob(n)) => (h, n, true),
    };
    Ok(Out::Integer(instr_position(haystack, needle, text)))
}

fn instr_position(haystack: &[u8], needle: &[u8], text: bool) -> i64 {
    if needle.is_empty() {
        return 1;
    }
    if !text {
        return memchr::memmem::find(haystack, needle).map_or(0, |p| p as i64 + 1);
    }
    // SQLite tries the first byte, then every character start. A needle that starts inside
    // a character can only match there at the very first byte.
    if is_continuation(needle[0]) {
        return i64::from(haystack.starts_with(needle));
    }
    match memchr::memmem::find(haystack, needle) {
        None => 0,
        Some(0) => 1,
        Some(p) => {
            let starts = haystack[1..p]
                .iter()
                .filter(|b| !is_continuation(**b))
                .count();
            starts as i64 + 2
        }
    }
}

/// `replace(X, Y, Z)`: every `Y` in `X` (left to right, not overlapping) replaced by `Z`.
fn replace(ctx: &Context<'_>) -> rusqlite::Result<Out> {
    let text = |a: Arg<'_>| match a {
        Arg::Text(t) | Arg::Blob(t) => Ok(Some(t.to_vec())),
        Arg::Null => Ok(None),
        Arg::Number => Err(()),
    };
    let (Ok(s), Ok(pattern), Ok(rep)) = (text(arg(ctx, 0)), text(arg(ctx, 1)), text(arg(ctx, 2)))
    else {
        return builtin(ctx, "replace");
    };
    let (Some(s), Some(pattern)) = (s, pattern) else {
        return Ok(Out::Null);
    };
    // A pattern that is empty (or starts with NUL, the end of a C string) replaces nothing.
    if pattern.first().is_none_or(|b| *b == 0) {
        return Ok(Out::Text(s));
    }
    let Some(rep) = rep else {
        return Ok(Out::Null);
    };
    let mut out = Vec::with_capacity(s.len());
    let mut last = 0;
    for at in memchr::memmem::find_iter(&s, &pattern) {
        out.extend_from_slice(&s[last..at]);
        out.extend_from_slice(&rep);
        last = at + pattern.len();
    }
    out.extend_from_slice(&s[last..]);
    Ok(Out::Text(out))
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Left,
    Right,
    Both,
}

/// `trim(X[, Y])`, `ltrim`, `rtrim`: `X` without the characters of `Y` (a space when there
/// is no `Y`) at its start, its end or both.
fn trim(ctx: &Context<'_>, name: &str, side: Side) -> rusqlite::Result<Out> {
    let input = match arg(ctx, 0) {
        Arg::Null => return Ok(Out::Null),
        Arg::Number => return builtin(ctx, name),
        Arg::Text(t) | Arg::Blob(t) => t,
    };
    let chars: &[u8] = if ctx.len() == 1 {
        b" "
    } else {
        match arg(ctx, 1) {
            Arg::Null => return Ok(Out::Null),
            Arg::Number => return builtin(ctx, name),
            // SQLite reads the characters as a C string: they end at the first NUL.
            Arg::Text(t) | Arg::Blob(t) => t.split(|b| *b == 0).next().unwrap_or_default(),
        }
    };
    // Valid UTF-8 characters are prefix- and suffix-free, so at most one of them matches at
    // either end, and a set lookup per length gives SQLite's answer. Anything else is left
    // to SQLite, within a bound on its work.
    let Ok(valid) = std::str::from_utf8(chars) else {
        let work = input.len().saturating_mul(chars.len());
        if work > DELEGATED_WORK {
            return Err(rusqlite::Error::UserFunctionError(
                format!(
                    "{name}: the characters to remove are not valid UTF-8 and the arguments \
                     are too large ({} × {} bytes)",
                    input.len(),
                    chars.len()
                )
                .into(),
            ));
        }
        return builtin(ctx, name);
    };
    let set: std::collections::HashSet<&[u8]> = valid
        .char_indices()
        .map(|(i, c)| &chars[i..i + c.len_utf8()])
        .collect();
    let (mut start, mut end) = (0, input.len());
    if matches!(side, Side::Left | Side::Both) {
        'left: while start < end {
            for len in 1..=4.min(end - start) {
                if set.contains(&input[start..start + len]) {
                    start += len;
                    continue 'left;
                }
            }
            break;
        }
    }
    if matches!(side, Side::Right | Side::Both) {
        'right: while start < end {
            for len in 1..=4.min(end - start) {
                if set.contains(&input[end - len..end]) {
                    end -= len;
                    continue 'right;
                }
            }
            break;
        }
    }
    Ok(Out::Text(input[start..end].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case is asked of SQLite's built-ins and of this module's, and both must agree.
    #[test]
    fn answers_are_sqlites() {
        let plain = Connection::open_in_memory().unwrap();
        let linear = Connection::open_in_memory().unwrap();
        register(&linear).unwrap();
        let cases = [
            "instr('hello world', 'o')",
            "instr('hello', '')",
            "instr('', 'a')",
            "instr('héllo wörld', 'w')",
            "instr('ééé', 'é')",
            "instr('aéb', x'a9')",
            "instr(x'00ff00ff', x'ff00')",
            "instr(x'41e9', 'é')",
            "instr('a1b', 1)",
            "instr(12.5, '.5')",
            "instr(NULL, 'a')",
            "instr('a', NULL)",
            "instr('aaab', 'aab')",
            "replace('a-b-c', '-', '+')",
            "replace('aaaa', 'aa', 'b')",
            "replace('abc', '', 'x')",
            "replace('abc', 'b', NULL)",
            "replace(NULL, 'b', 'x')",
            "replace('abc', NULL, 'x')",
            "replace(12345, 3, 'x')",
            "replace('héllo', 'é', 'e')",
            "replace(x'616263', 'b', 'x')",
            "trim('  a b  ')",
            "ltrim('  a b  ')",
            "rtrim('  a b  ')",
            "trim('xxaxx', 'x')",
            "trim('éaé', 'é')",
            "trim('abcba', 'ab')",
            "trim('abc', '')",
            "trim(NULL)",
            "trim('abc', NULL)",
            "trim(1.50, '0')",
            "trim(x'c3a961c3', x'c3')",
            "ltrim('aaa', 'a')",
            "rtrim('日本語本', '本')",
        ];
        for case in cases {
            let sql = format!("SELECT typeof({case}), hex({case})");
            let expected: (String, String) = plain
                .query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap();
            let got: (String, String) = linear
                .query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(got, expected, "{case}");
        }
    }

    proptest::proptest! {
        /// Random short strings over an alphabet with multi-byte characters: every function,
        /// text and blob, agrees with SQLite's.
        #[test]
        fn random_arguments_get_sqlites_answers(
            x in "[ab é日]{0,12}",
            y in "[ab é日]{0,4}",
            z in "[xé]{0,3}",
        ) {
            let plain = Connection::open_in_memory().unwrap();
            let linear = Connection::open_in_memory().unwrap();
            register(&linear).unwrap();
            for call in [
                "instr(?1, ?2)", "instr(CAST(?1 AS BLOB), CAST(?2 AS BLOB))",
                "instr(?1, CAST(?2 AS BLOB))", "replace(?1, ?2, ?3)",
                "trim(?1, ?2)", "ltrim(?1, ?2)", "rtrim(?1, ?2)", "trim(?1)",
            ] {
                let sql = format!("SELECT typeof({call}), hex({call}), ?3");
                let ask = |conn: &Connection| -> (String, String) {
                    conn.query_row(&sql, [&x, &y, &z], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
                };
                proptest::prop_assert_eq!(ask(&linear), ask(&plain), "{}", call);
            }
        }
    }

    #[test]
    fn positions_count_characters_in_text_and_bytes_in_blobs() {
        assert_eq!(instr_position("aéb".as_bytes(), b"b", true), 3);
        assert_eq!(instr_position("aéb".as_bytes(), b"b", false), 4);
        assert_eq!(instr_position(b"abc", b"d", true), 0);
    }
}
