//! The interpreter's side of input and output: bounded byte sinks standing for file
//! descriptors, the input a command reads, and the [`System`] that does everything the
//! interpreter cannot do itself.

use std::cell::RefCell;
use std::rc::Rc;

/// A command the shell does not run itself.
#[derive(Debug)]
pub struct Command<'a> {
    /// The command's name, then its arguments.
    pub argv: &'a [String],
    /// The working folder, absolute.
    pub cwd: &'a str,
    /// The exported variables.
    pub env: Vec<(String, String)>,
    /// Everything the command may read on its standard input.
    pub stdin: Vec<u8>,
    /// The most bytes of stdout (and of stderr) the shell keeps.
    pub output_bytes: usize,
}

/// What a command the shell did not run itself gave.
#[derive(Debug, Default)]
pub struct Output {
    /// The exit status: 0 for success, 127 for a command not found.
    pub status: i32,
    /// What the command wrote on its standard output.
    pub stdout: Vec<u8>,
    /// What the command wrote on its standard error.
    pub stderr: Vec<u8>,
}

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A folder.
    Dir,
    /// A link, a FIFO, a device: something the shell's file tests report as there but
    /// neither a file nor a folder.
    Other,
}

/// Everything the interpreter cannot do itself. Paths are absolute and lexically normal
/// (no `.` or `..`); the file operations default to `std::fs`, which inside the sandbox
/// reaches exactly the granted folders.
pub trait System {
    /// Runs a command that is neither a builtin nor a function. An unknown command answers
    /// status 127 and says so on stderr.
    fn run(&mut self, command: Command<'_>) -> Output;

    /// Reads a whole file, at most `limit` bytes of it (an error past that).
    fn read_file(&mut self, path: &str, limit: usize) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let file = std::fs::File::open(path)?;
        let mut data = Vec::new();
        file.take(limit as u64 + 1).read_to_end(&mut data)?;
        if data.len() > limit {
            return Err(std::io::Error::other(format!(
                "the file is more than the {limit} bytes the shell reads of one"
            )));
        }
        Ok(data)
    }

    /// Writes `data` to a file, replacing it or appending to it; creates it when missing.
    fn write_file(&mut self, path: &str, data: &[u8], append: bool) -> std::io::Result<()> {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.create(true);
        if append {
            options.append(true);
        } else {
            options.write(true).truncate(true);
        }
        options.open(path)?.write_all(data)
    }

    /// The names in a folder, in no order.
    fn read_dir(&mut self, path: &str) -> std::io::Result<Vec<String>> {
        std::fs::read_dir(path)?
            .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    /// The size of the file at `path`, not following a link.
    fn len(&mut self, path: &str) -> Option<u64> {
        std::fs::symlink_metadata(path).ok().map(|m| m.len())
    }

    /// What `path` names, not following a link; `None` when nothing is there.
    fn kind(&mut self, path: &str) -> Option<FileKind> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        Some(if meta.is_file() {
            FileKind::File
        } else if meta.is_dir() {
            FileKind::Dir
        } else {
            FileKind::Other
        })
    }
}

/// `path` made absolute against `cwd`, with `.` and `..` resolved by name (`..` at the root
/// stays at the root, as in every shell).
pub fn normalize(cwd: &str, path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{cwd}/{path}")
    };
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// A bounded buffer standing for an output file descriptor. Clones share the buffer, so
/// `2>&1` makes stderr's writes land among stdout's, in order.
#[derive(Clone, Debug)]
pub(crate) struct Sink(Rc<RefCell<Buffer>>);

#[derive(Debug)]
struct Buffer {
    data: Vec<u8>,
    cap: usize,
    dropped: u64,
    /// `/dev/null`: every write is taken and thrown away.
    discard: bool,
}

impl Sink {
    pub(crate) fn new(cap: usize) -> Sink {
        Sink(Rc::new(RefCell::new(Buffer {
            data: Vec::new(),
            cap,
            dropped: 0,
            discard: false,
        })))
    }

    /// `/dev/null`: takes up to `cap` bytes a write (what a command may give at once) and
    /// keeps none, so a command writing there succeeds as in bash.
    pub(crate) fn null(cap: usize) -> Sink {
        let sink = Sink::new(cap);
        sink.0.borrow_mut().discard = true;
        sink
    }

    /// Writes what fits; answers whether everything did.
    pub(crate) fn write(&self, bytes: &[u8]) -> bool {
        let mut buffer = self.0.borrow_mut();
        if buffer.discard {
            return true;
        }
        let room = buffer.cap.saturating_sub(buffer.data.len());
        let kept = room.min(bytes.len());
        buffer.data.extend_from_slice(&bytes[..kept]);
        buffer.dropped += (bytes.len() - kept) as u64;
        kept == bytes.len()
    }

    pub(crate) fn write_str(&self, text: &str) -> bool {
        self.write(text.as_bytes())
    }

    /// The most bytes one more write may bring.
    pub(crate) fn room(&self) -> usize {
        let buffer = self.0.borrow();
        if buffer.discard {
            return buffer.cap;
        }
        buffer.cap.saturating_sub(buffer.data.len())
    }

    /// The bytes written, and how many were dropped; the sink is empty after.
    pub(crate) fn take(&self) -> (Vec<u8>, u64) {
        let mut buffer = self.0.borrow_mut();
        let dropped = std::mem::take(&mut buffer.dropped);
        (std::mem::take(&mut buffer.data), dropped)
    }
}

/// The input of a command: bytes and how far they were read. Clones share the position, so
/// the commands of a `while read` loop read one input in turn.
#[derive(Clone, Debug)]
pub(crate) struct Input(Rc<RefCell<(Vec<u8>, usize)>>);

impl Input {
    pub(crate) fn new(data: Vec<u8>) -> Input {
        Input(Rc::new(RefCell::new((data, 0))))
    }

    pub(crate) fn empty() -> Input {
        Input::new(Vec::new())
    }

    /// The next line, without its newline; `None` at the end. The second value says
    /// whether the line ended with a newline.
    pub(crate) fn read_line(&self) -> Option<(String, bool)> {
        let mut input = self.0.borrow_mut();
        let (data, pos) = &mut *input;
        if *pos >= data.len() {
            return None;
        }
        let rest = &data[*pos..];
        let (line, advance, ended) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], i + 1, true),
            None => (rest, rest.len(), false),
        };
        let line = String::from_utf8_lossy(line).into_owned();
        *pos += advance;
        Some((line, ended))
    }

    /// Everything not read yet; the input is at its end after.
    pub(crate) fn read_rest(&self) -> Vec<u8> {
        let mut input = self.0.borrow_mut();
        let (data, pos) = &mut *input;
        let rest = data.get(*pos..).unwrap_or_default().to_vec();
        *pos = data.len();
        rest
    }
}

/// The three descriptors of a command.
#[derive(Clone, Debug)]
pub(crate) struct Streams {
    pub(crate) stdin: Input,
    pub(crate) out: Sink,
    pub(crate) err: Sink,
}
