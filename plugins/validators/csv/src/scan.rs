//! One streaming pass over a CSV file that produces every check of a [`Rule`].
//!
//! Memory stays bounded: rows are read one at a time into a reused record, a
//! single record may not grow past [`Limits::max_record_bytes`] (an unclosed quote
//! would otherwise swallow the whole file), each check keeps at most
//! [`Limits::examples`] examples, and uniqueness keeps a 128-bit hash per distinct
//! value instead of the value itself.

use std::cell::Cell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{DefaultHasher, Hasher};
use std::io::{self, Read};
use std::rc::Rc;

use csv::{ByteRecord, ReaderBuilder};
use regex::Regex;
use trellis_plugin_sdk::validator::Check;

use crate::rule::Rule;

/// How much the scan may hold and report.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest record, in bytes, before reading stops with a `parse` failure.
    pub max_record_bytes: u64,
    /// Most examples (rows, values) quoted in one check.
    pub examples: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_record_bytes: 8 << 20,
            examples: 5,
        }
    }
}

/// Longest value quoted in a message, in characters.
const SHOWN_CHARS: usize = 40;

const QUOTING_HELP: &str = "A field that contains the delimiter, a double quote or a line break \
                            must be wrapped in double quotes, with each inner quote doubled (\"\").";

/// Runs every check of `rule` on the CSV text in `input`; `file` names it in
/// the checks. The order is `parse`, `header`, `row_count`, then per column
/// `pattern`, `unique` and `non_empty`.
pub fn check_csv(file: &str, input: impl Read, rule: &Rule, limits: Limits) -> Vec<Check> {
    let delimiter = char::from(rule.delimiter);
    let stop_at = Rc::new(Cell::new(limits.max_record_bytes));
    let input = Capped {
        inner: input,
        read: 0,
        stop_at: Rc::clone(&stop_at),
    };
    let mut reader = ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(rule.delimiter)
        .from_reader(input);
    let mut record = ByteRecord::new();

    match reader.read_byte_record(&mut record) {
        Ok(true) => {}
        Ok(false) => {
            let expected = if rule.columns.is_empty() {
                "a header line".to_string()
            } else {
                format!("a header line `{}`", join(&rule.columns, delimiter))
            };
            return vec![
                Check::new(file, "header", false)
                    .expected(expected.clone())
                    .actual("the file is empty")
                    .message(format!(
                        "Write {expected} as the first line, then one line per data row."
                    )),
            ];
        }
        Err(e) => return vec![stopped(file, 1, &e, limits)],
    }
    let mut header = Vec::with_capacity(record.len());
    for (i, field) in record.iter().enumerate() {
        match std::str::from_utf8(field) {
            Ok(name) => header.push(name.to_string()),
            Err(_) => {
                return vec![
                    Check::new(file, "parse", false)
                        .expected("a UTF-8 header line")
                        .actual(format!(
                            "header field {} on line 1 is not valid UTF-8",
                            i + 1
                        ))
                        .message("Save the file as UTF-8 text; no other column was checked."),
                ];
            }
        }
    }

    let mut checks = Vec::new();
    if !rule.columns.is_empty() {
        checks.push(header_check(file, &header, rule));
    }

    let column = |name: &str| header.iter().position(|h| h == name);
    let mut patterns: Vec<PatternScan> = rule
        .column_patterns
        .iter()
        .map(|(name, regex)| PatternScan::new(name, column(name), regex))
        .collect();
    let mut uniques: Vec<UniqueScan> = rule
        .unique_columns
        .iter()
        .map(|name| UniqueScan::new(name, column(name)))
        .collect();
    let mut non_empties: Vec<NonEmptyScan> = rule
        .non_empty_columns
        .iter()
        .map(|name| NonEmptyScan::new(name, column(name)))
        .collect();

    let mut rows = 0u64;
    let mut ragged = Examples::default();
    let mut not_utf8 = Examples::default();
    let mut fatal = None;
    loop {
        let start = reader.position().clone();
        stop_at.set(start.byte().saturating_add(limits.max_record_bytes));
        match reader.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                fatal = Some(stopped(file, start.line(), &e, limits));
                break;
            }
        }
        rows += 1;
        let at = Row {
            row: rows,
            line: record.position().map_or(start.line(), |p| p.line()),
        };
        if record.len() != header.len() {
            ragged.add(
                limits,
                format!(
                    "line {} has {}",
                    at.line,
                    count(record.len() as u64, "field")
                ),
            );
            continue;
        }
        let mut fields = Vec::with_capacity(header.len());
        for (i, field) in record.iter().enumerate() {
            match std::str::from_utf8(field) {
                Ok(value) => fields.push(value),
                Err(_) => {
                    not_utf8.add(
                        limits,
                        format!("line {} in column `{}`", at.line, header[i]),
                    );
                    break;
                }
            }
        }
        if fields.len() != header.len() {
            continue;
        }
        for scan in &mut patterns {
            scan.row(&fields, at, limits);
        }
        for scan in &mut uniques {
            scan.row(&fields, at, limits);
        }
        for scan in &mut non_empties {
            scan.row(&fields, at, limits);
        }
    }

    let stopped_early = fatal.is_some();
    let parse =
        fatal.unwrap_or_else(|| parse_check(file, &header, delimiter, rows, &ragged, &not_utf8));
    checks.insert(0, parse);
    if stopped_early {
        // The row-level checks would describe only part of the file.
        return checks;
    }
    if rule.min_rows.is_some() || rule.max_rows.is_some() {
        checks.push(row_count_check(file, rule, rows));
    }
    checks.extend(patterns.into_iter().map(|s| s.check(file)));
    checks.extend(uniques.into_iter().map(|s| s.check(file)));
    checks.extend(non_empties.into_iter().map(|s| s.check(file)));
    checks
}

/// A failed `parse` check for a file that could not be opened or read at all.
pub fn unreadable(file: &str, error: &str) -> Check {
    Check::new(file, "parse", false)
        .expected("a readable CSV file")
        .actual(format!("could not read the file: {error}"))
        .message("Write the file as UTF-8 CSV text at this path.")
}

/// Reading stopped at the record starting on `line`.
fn stopped(file: &str, line: u64, error: &csv::Error, limits: Limits) -> Check {
    let too_long =
        matches!(error.kind(), csv::ErrorKind::Io(e) if e.kind() == io::ErrorKind::FileTooLarge);
    let check = Check::new(file, "parse", false).expected(format!(
        "records shorter than {}",
        bytes(limits.max_record_bytes)
    ));
    if too_long {
        check
            .actual(format!(
                "reading stopped at line {line}: the record starting there is longer than {}",
                bytes(limits.max_record_bytes)
            ))
            .message(format!(
                "A double quote opened on line {line} is probably never closed, so the rest of the \
                 file reads as one field. Close it, or double the quotes inside a quoted field. \
                 {QUOTING_HELP} The rows after line {line} were not checked."
            ))
    } else {
        check
            .actual(format!("reading stopped at line {line}: {error}"))
            .message(format!(
                "Rewrite the file as UTF-8 CSV text; the rows after line {line} were not checked."
            ))
    }
}

fn parse_check(
    file: &str,
    header: &[String],
    delimiter: char,
    rows: u64,
    ragged: &Examples,
    not_utf8: &Examples,
) -> Check {
    let width = header.len();
    let check =
        Check::new(file, "parse", ragged.count == 0 && not_utf8.count == 0).expected(format!(
            "UTF-8 CSV with {width} fields on every row like the header (delimiter {delimiter:?})"
        ));
    if check.passed {
        return check
            .actual(format!(
                "{}, all with {width} fields",
                count(rows, "data row")
            ))
            .message("The file parses as CSV.");
    }
    let mut actual = Vec::new();
    let mut message = Vec::new();
    if ragged.count > 0 {
        actual.push(format!(
            "{} {} a different number of fields: {}",
            count(ragged.count, "row"),
            if ragged.count == 1 { "has" } else { "have" },
            ragged.list()
        ));
        message.push(format!(
            "Give every row {width} fields, like the header on line 1. {QUOTING_HELP}"
        ));
    }
    if not_utf8.count > 0 {
        actual.push(format!(
            "{} {} not valid UTF-8: {}",
            count(not_utf8.count, "row"),
            if not_utf8.count == 1 { "is" } else { "are" },
            not_utf8.list()
        ));
        message.push("Save the file as UTF-8 text.".to_string());
    }
    message.push("Rows that do not parse were left out of the column checks.".to_string());
    check.actual(actual.join("; ")).message(message.join(" "))
}

fn header_check(file: &str, header: &[String], rule: &Rule) -> Check {
    let delimiter = char::from(rule.delimiter);
    let missing: Vec<&String> = rule
        .columns
        .iter()
        .filter(|c| !header.contains(c))
        .collect();
    let actual = format!("header line `{}`", join(header, delimiter));
    let hints: Vec<String> = missing
        .iter()
        .filter_map(|want| {
            let near = header
                .iter()
                .find(|h| h.trim().eq_ignore_ascii_case(want.trim()))?;
            Some(format!(
                "`{near}` differs from `{want}` only in case or spaces: rename it."
            ))
        })
        .collect();

    if rule.exact_columns {
        let wanted = join(&rule.columns, delimiter);
        let check = Check::new(file, "header", header == rule.columns.as_slice())
            .expected(format!("header line exactly `{wanted}`"))
            .actual(actual);
        if check.passed {
            return check.message("The header is exactly as required.");
        }
        let extra: Vec<&String> = header
            .iter()
            .filter(|h| !rule.columns.contains(h))
            .collect();
        let mut fixes = Vec::new();
        if !missing.is_empty() {
            fixes.push(format!("add {}", names(&missing)));
        }
        if !extra.is_empty() {
            fixes.push(format!("remove {} (and their values)", names(&extra)));
        }
        if missing.is_empty() && extra.is_empty() {
            fixes.push("put the columns in this order, removing repeated ones".to_string());
        }
        let mut message = format!(
            "Make line 1 exactly `{wanted}`: {}, moving each row's values with its column.",
            fixes.join("; ")
        );
        for hint in hints {
            message.push(' ');
            message.push_str(&hint);
        }
        return check.message(message);
    }

    let check = Check::new(file, "header", missing.is_empty())
        .expected(format!(
            "header with columns {} (any order, others allowed)",
            names(&rule.columns.iter().collect::<Vec<_>>())
        ))
        .actual(actual);
    if check.passed {
        return check.message("Every required column is in the header.");
    }
    let mut message = format!(
        "Add the missing column{} {} to the header on line 1 and a value for {} in every row.",
        if missing.len() == 1 { "" } else { "s" },
        names(&missing),
        if missing.len() == 1 { "it" } else { "them" },
    );
    for hint in hints {
        message.push(' ');
        message.push_str(&hint);
    }
    check.message(message)
}

fn row_count_check(file: &str, rule: &Rule, rows: u64) -> Check {
    let expected = match (rule.min_rows, rule.max_rows) {
        (Some(min), Some(max)) => format!("{min} to {max} data rows (header excluded)"),
        (Some(min), None) => format!("at least {} (header excluded)", count(min, "data row")),
        (None, Some(max)) => format!("at most {} (header excluded)", count(max, "data row")),
        (None, None) => unreachable!("only called with a bound"),
    };
    let too_few = rule.min_rows.filter(|&min| rows < min);
    let too_many = rule.max_rows.filter(|&max| rows > max);
    let check = Check::new(file, "row_count", too_few.is_none() && too_many.is_none())
        .expected(expected)
        .actual(count(rows, "data row"));
    let message = match (too_few, too_many) {
        (Some(min), _) => format!(
            "Add {} more data row{} below the header (at least {min} are required).",
            min - rows,
            if min - rows == 1 { "" } else { "s" }
        ),
        (_, Some(max)) => format!(
            "Remove {} data row{} (at most {max} are allowed), e.g. merge or drop the least useful ones.",
            rows - max,
            if rows - max == 1 { "" } else { "s" }
        ),
        _ => "The number of data rows is within bounds.".to_string(),
    };
    check.message(message)
}

/// A failed check for an option naming a column the header lacks.
fn missing_column(file: &str, kind: &str, column: &str, expected: String) -> Check {
    Check::new(file, kind, false)
        .at(column)
        .expected(expected)
        .actual(format!("column `{column}` is not in the header"))
        .message(format!(
            "Add column `{column}` to the header on line 1 and fill it in every row; its values \
             could not be checked."
        ))
}

/// Where a data row is: its number (1 = first row under the header) and the
/// line it starts on (quoted line breaks make the two drift apart).
#[derive(Debug, Clone, Copy)]
struct Row {
    row: u64,
    line: u64,
}

impl Row {
    fn describe(self) -> String {
        format!("row {} (line {})", self.row, self.line)
    }
}

/// A count of failures and the first few of them, described.
#[derive(Debug, Default)]
struct Examples {
    count: u64,
    shown: Vec<String>,
}

impl Examples {
    fn add(&mut self, limits: Limits, describe: impl Into<String>) {
        self.count += 1;
        if self.shown.len() < limits.examples {
            self.shown.push(describe.into());
        }
    }

    fn list(&self) -> String {
        let mut list = self.shown.join(", ");
        let more = self.count - self.shown.len() as u64;
        if more > 0 {
            list.push_str(&format!(" and {more} more"));
        }
        list
    }
}

#[derive(Debug)]
struct PatternScan<'r> {
    column: &'r str,
    index: Option<usize>,
    regex: &'r Regex,
    values: u64,
    failures: Examples,
}

impl<'r> PatternScan<'r> {
    fn new(column: &'r str, index: Option<usize>, regex: &'r Regex) -> Self {
        PatternScan {
            column,
            index,
            regex,
            values: 0,
            failures: Examples::default(),
        }
    }

    fn row(&mut self, fields: &[&str], at: Row, limits: Limits) {
        let Some(index) = self.index else { return };
        let value = fields[index];
        self.values += 1;
        if !self.regex.is_match(value) {
            self.failures
                .add(limits, format!("{} {}", at.describe(), show(value)));
        }
    }

    fn check(self, file: &str) -> Check {
        let expected = format!(
            "every value of `{}` matches `{}`",
            self.column,
            self.regex.as_str()
        );
        if self.index.is_none() {
            return missing_column(file, "pattern", self.column, expected);
        }
        let check = Check::new(file, "pattern", self.failures.count == 0)
            .at(self.column)
            .expected(expected);
        if check.passed {
            return check
                .actual(format!("all {} values match", self.values))
                .message(format!(
                    "Every value of `{}` has the required form.",
                    self.column
                ));
        }
        check
            .actual(format!(
                "{} of {} values do not match: {}",
                self.failures.count,
                self.values,
                self.failures.list()
            ))
            .message(format!(
                "Rewrite the `{}` value in each row listed so that the whole value matches `{}`.",
                self.column,
                self.regex.as_str()
            ))
    }
}

#[derive(Debug)]
struct UniqueScan<'r> {
    column: &'r str,
    index: Option<usize>,
    /// Hash of each distinct value and the row it first appeared in.
    seen: HashMap<u128, u64>,
    repeats: Examples,
}

impl<'r> UniqueScan<'r> {
    fn new(column: &'r str, index: Option<usize>) -> Self {
        UniqueScan {
            column,
            index,
            seen: HashMap::new(),
            repeats: Examples::default(),
        }
    }

    fn row(&mut self, fields: &[&str], at: Row, limits: Limits) {
        let Some(index) = self.index else { return };
        let value = fields[index];
        if value.trim().is_empty() {
            return;
        }
        match self.seen.entry(hash128(value)) {
            Entry::Vacant(slot) => {
                slot.insert(at.row);
            }
            Entry::Occupied(first) => self.repeats.add(
                limits,
                format!(
                    "{} repeats row {}: {}",
                    at.describe(),
                    first.get(),
                    show(value)
                ),
            ),
        }
    }

    fn check(self, file: &str) -> Check {
        let expected = format!(
            "no value of `{}` appears twice (empty values ignored)",
            self.column
        );
        if self.index.is_none() {
            return missing_column(file, "unique", self.column, expected);
        }
        let check = Check::new(file, "unique", self.repeats.count == 0)
            .at(self.column)
            .expected(expected);
        if check.passed {
            return check
                .actual(format!("{} distinct values, no repeats", self.seen.len()))
                .message(format!("The values of `{}` are unique.", self.column));
        }
        check
            .actual(format!(
                "{} an earlier value: {}",
                if self.repeats.count == 1 {
                    "1 row repeats".to_string()
                } else {
                    format!("{} rows repeat", self.repeats.count)
                },
                self.repeats.list()
            ))
            .message(format!(
                "Make every `{}` value unique: change the value in each repeating row listed, or \
                 delete the row if it duplicates the earlier one.",
                self.column
            ))
    }
}

#[derive(Debug)]
struct NonEmptyScan<'r> {
    column: &'r str,
    index: Option<usize>,
    rows: u64,
    empty: Examples,
}

impl<'r> NonEmptyScan<'r> {
    fn new(column: &'r str, index: Option<usize>) -> Self {
        NonEmptyScan {
            column,
            index,
            rows: 0,
            empty: Examples::default(),
        }
    }

    fn row(&mut self, fields: &[&str], at: Row, limits: Limits) {
        let Some(index) = self.index else { return };
        self.rows += 1;
        if fields[index].trim().is_empty() {
            self.empty.add(limits, at.describe());
        }
    }

    fn check(self, file: &str) -> Check {
        let expected = format!("a value in `{}` on every row", self.column);
        if self.index.is_none() {
            return missing_column(file, "non_empty", self.column, expected);
        }
        let check = Check::new(file, "non_empty", self.empty.count == 0)
            .at(self.column)
            .expected(expected);
        if check.passed {
            return check
                .actual(format!("all {} rows have a value", self.rows))
                .message(format!("No `{}` value is empty.", self.column));
        }
        check
            .actual(format!(
                "{} of {} rows are empty or blank: {}",
                self.empty.count,
                self.rows,
                self.empty.list()
            ))
            .message(format!("Fill in `{}` in each row listed.", self.column))
    }
}

/// The input, refusing to read past the byte offset in `stop_at` so one record
/// cannot fill the memory. (A leading UTF-8 byte order mark is dropped by
/// `csv-core` itself.)
struct Capped<R> {
    inner: R,
    read: u64,
    stop_at: Rc<Cell<u64>>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read >= self.stop_at.get() {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "record too long",
            ));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Two independent 64-bit hashes; a false repeat among a billion distinct
/// values has a chance of about 10^-21.
fn hash128(value: &str) -> u128 {
    let mut low = DefaultHasher::new();
    low.write(value.as_bytes());
    let mut high = DefaultHasher::new();
    high.write_u8(0xa5);
    high.write(value.as_bytes());
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

/// A value as quoted in a message: escaped, and shortened when long.
fn show(value: &str) -> String {
    if value.chars().count() <= SHOWN_CHARS {
        return format!("{value:?}");
    }
    let head: String = value.chars().take(SHOWN_CHARS).collect();
    format!("{head:?}…")
}

fn names(list: &[&String]) -> String {
    list.iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn join(list: &[String], delimiter: char) -> String {
    list.join(&delimiter.to_string())
}

/// `n` and `noun`, plural unless `n` is 1.
fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests;
