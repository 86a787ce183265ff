//! Server-sent events (the `text/event-stream` format of the HTML standard), as streaming
//! model APIs send them: `event:` and `data:` fields, events ended by a blank line, lines
//! ended by `\n`, `\r\n` or `\r`, comments (`:`) and other fields ignored.

/// One event: its type (`event:`, when given) and its data (the `data:` lines joined by
/// `\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, when given.
    pub event: Option<String>,
    /// The data.
    pub data: String,
}

/// Longest line kept; a longer one is an error, not a host OOM.
pub const MAX_LINE_BYTES: usize = 8 << 20;

/// Splits a byte stream into events, piece by piece as it arrives.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    /// A `\r` ended the last line: a `\n` right after it is the same line end.
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
}

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Parser::default()
    }

    /// Takes the next piece of the stream; the events it completed, in order. An error
    /// when a line is longer than [`MAX_LINE_BYTES`].
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        let mut events = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_ended(&line) {
                        events.push(event);
                    }
                }
                _ => {
                    if self.line.len() >= MAX_LINE_BYTES {
                        return Err(format!(
                            "an event-stream line is longer than {MAX_LINE_BYTES} bytes"
                        ));
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(events)
    }

    /// The stream ended: the event it did not end with a blank line, if any (the standard
    /// drops it; servers that close right after their last `data:` line are common, so it
    /// is given).
    pub fn finish(&mut self) -> Option<Event> {
        let line = std::mem::take(&mut self.line);
        if let Some(event) = self.line_ended(&line) {
            return Some(event);
        }
        self.line_ended(b"")
    }

    fn line_ended(&mut self, line: &[u8]) -> Option<Event> {
        if line.is_empty() {
            let data = self.data.take()?;
            return Some(Event {
                event: self.event.take(),
                data,
            });
        }
        if line[0] == b':' {
            return None;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "event" => self.event = Some(value.to_string()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream = b"event: a\r\ndata: {\"x\":\r\ndata: 1}\r\n\r\n: comment\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut parser = Parser::new();
            let mut events = parser.feed(&stream[..cut]).unwrap();
            events.extend(parser.feed(&stream[cut..]).unwrap());
            assert_eq!(
                events,
                vec![
                    Event {
                        event: Some("a".into()),
                        data: "{\"x\":\n1}".into()
                    },
                    Event {
                        event: None,
                        data: "[DONE]".into()
                    },
                ],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_last_event_without_its_blank_line_is_given_at_the_end() {
        let mut parser = Parser::new();
        assert!(parser.feed(b"data: last").unwrap().is_empty());
        assert_eq!(
            parser.finish(),
            Some(Event {
                event: None,
                data: "last".into()
            })
        );
        assert_eq!(parser.finish(), None);
    }

    #[test]
    fn a_line_past_the_limit_is_an_error() {
        let mut parser = Parser::new();
        let long = vec![b'a'; MAX_LINE_BYTES + 1];
        assert!(parser.feed(&long).is_err());
    }
}
