//! What `trellis run` shows while it runs: on a terminal one status line updated in place
//! (step, item, turn, tool calls, tokens, time) under the lasting lines; elsewhere (pipes,
//! CI) one plain line per event of interest; with `--quiet` nothing until the summary.
//!
//! Fed by the run's [`RunEvent`]s (inside a step) and the runner's step lines; it keeps the
//! totals the final summary prints.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Instant;

use trellis_host::sequence::events::RunEvent;
use trellis_host::sequence::workflow_run::status_name;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A status line redrawn in place (stdout is a terminal).
    Live,
    /// One line per event.
    Plain,
    /// Only the final summary.
    Quiet,
}

impl Mode {
    /// Live on a terminal (unless `TERM=dumb`), else plain; quiet when asked.
    pub fn detect(quiet: bool) -> Mode {
        if quiet {
            Mode::Quiet
        } else if std::io::stdout().is_terminal()
            && std::env::var("TERM").map_or(true, |t| t != "dumb")
        {
            Mode::Live
        } else {
            Mode::Plain
        }
    }
}

/// Totals over the whole run, for the summary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    /// Turns started.
    pub turns: u64,
    /// LLM calls made.
    pub llm_calls: u64,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Tool calls that failed.
    pub tool_errors: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

#[derive(Debug)]
struct State {
    step: Option<String>,
    item: Option<String>,
    item_type: String,
    iteration: u32,
    turn: u64,
    step_tools: u64,
    step_prompt: u64,
    step_completion: u64,
    step_started: Instant,
    totals: Totals,
    shown: bool,
}

/// The progress display of one run.
#[derive(Debug)]
pub struct Progress {
    mode: Mode,
    started: Instant,
    state: Mutex<State>,
}

impl Progress {
    /// A display in `mode`.
    pub fn new(mode: Mode) -> Progress {
        Progress {
            mode,
            started: Instant::now(),
            state: Mutex::new(State {
                step: None,
                item: None,
                item_type: String::new(),
                iteration: 1,
                turn: 0,
                step_tools: 0,
                step_prompt: 0,
                step_completion: 0,
                step_started: Instant::now(),
                totals: Totals::default(),
                shown: false,
            }),
        }
    }

    /// The display mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The totals so far.
    pub fn totals(&self) -> Totals {
        self.lock().totals
    }

    /// A lasting line from the runner (step started or ended, run folder rotated, ...).
    pub fn line(&self, text: &str) {
        let mut state = self.lock();
        let step_line = text
            .strip_prefix("step ")
            .and_then(|rest| rest.split_once([' ', ':']))
            .map(|(id, _)| id.to_string());
        if let Some(id) = step_line.clone().filter(|_| text.ends_with(": started")) {
            state.step = Some(id);
            state.item = None;
            state.turn = 0;
            state.step_tools = 0;
            state.step_prompt = 0;
            state.step_completion = 0;
            state.step_started = Instant::now();
        } else if step_line.is_some() {
            // The step ended: no status line until the next one starts.
            state.step = None;
        }
        self.print(&mut state, text);
    }

    /// One event of a running step.
    pub fn event(&self, event: &RunEvent) {
        let mut state = self.lock();
        let line = match event {
            RunEvent::ItemStarted {
                item_id, item_type, ..
            } => {
                state.item = Some(item_id.clone());
                state.item_type = item_type.clone();
                state.iteration = 1;
                Some(format!("  item {item_id} ({item_type})"))
            }
            RunEvent::TurnStarted {
                item_id,
                iteration,
                turn,
                ..
            } => {
                state.turn = *turn;
                state.iteration = *iteration;
                state.totals.turns += 1;
                let row = if state.item_type == "foreach" && state.item.as_deref() == Some(item_id)
                {
                    format!(" row {iteration}")
                } else {
                    String::new()
                };
                Some(format!("  turn {turn}: {item_id}{row}"))
            }
            RunEvent::LlmCall {
                provider,
                model,
                prompt_tokens,
                completion_tokens,
                tool_calls,
                duration_ms,
                error,
                ..
            } => {
                state.totals.llm_calls += 1;
                state.totals.prompt_tokens += prompt_tokens;
                state.totals.completion_tokens += completion_tokens;
                state.step_prompt += prompt_tokens;
                state.step_completion += completion_tokens;
                Some(match error {
                    Some(e) => format!(
                        "    llm {provider}:{model} failed after {duration_ms} ms: {}",
                        first_line(e)
                    ),
                    None => format!(
                        "    llm {provider}:{model}: {prompt_tokens} + {completion_tokens} tokens, {tool_calls} tool call{}, {duration_ms} ms",
                        if *tool_calls == 1 { "" } else { "s" }
                    ),
                })
            }
            RunEvent::ToolCall {
                tool,
                error,
                duration_ms,
                ..
            } => {
                state.totals.tool_calls += 1;
                state.step_tools += 1;
                Some(match error {
                    Some(e) => {
                        state.totals.tool_errors += 1;
                        format!("    tool {tool}: error: {}", first_line(e))
                    }
                    None => format!("    tool {tool}: ok, {duration_ms} ms"),
                })
            }
            RunEvent::Gate {
                item_id,
                attempt,
                passed,
                failures,
                ..
            } => Some(if *passed {
                format!("  gate {item_id} attempt {attempt}: passed")
            } else {
                format!("  gate {item_id} attempt {attempt}: {failures} failing check(s)")
            }),
            RunEvent::ItemEnded {
                item_id, status, ..
            } => Some(format!("  item {item_id}: {}", status_name(*status))),
            #[allow(unreachable_patterns, reason = "RunEvent grows with the runtime")]
            _ => None,
        };
        let Some(line) = line else {
            return;
        };
        match self.mode {
            Mode::Plain => self.print(&mut state, &line),
            Mode::Live => {
                // On a terminal only what is worth keeping stays: failures and gates.
                let lasting = matches!(
                    event,
                    RunEvent::Gate { .. }
                        | RunEvent::ToolCall { error: Some(_), .. }
                        | RunEvent::LlmCall { error: Some(_), .. }
                );
                if lasting {
                    self.print(&mut state, &line);
                } else {
                    self.redraw(&mut state);
                }
            }
            Mode::Quiet => {}
        }
    }

    /// Redraws the status line (the time moves on while a model thinks).
    pub fn tick(&self) {
        if self.mode == Mode::Live {
            let mut state = self.lock();
            if state.step.is_some() {
                self.redraw(&mut state);
            }
        }
    }

    /// Clears the status line before the summary.
    pub fn finish(&self) {
        if self.mode == Mode::Live {
            let mut state = self.lock();
            let mut out = std::io::stdout().lock();
            if state.shown {
                let _ = write!(out, "\r\x1b[2K");
                state.shown = false;
            }
            let _ = out.flush();
        }
    }

    fn print(&self, state: &mut State, text: &str) {
        match self.mode {
            Mode::Quiet => {}
            Mode::Plain => println!("{text}"),
            Mode::Live => {
                let mut out = std::io::stdout().lock();
                let _ = write!(out, "\r\x1b[2K{text}\n");
                state.shown = false;
                drop(out);
                self.redraw(state);
            }
        }
    }

    fn redraw(&self, state: &mut State) {
        let Some(step) = &state.step else {
            return;
        };
        let mut status = format!("[{step}]");
        if let Some(item) = &state.item {
            status.push_str(&format!(" {item}"));
            if state.item_type == "foreach" {
                status.push_str(&format!(" row {}", state.iteration));
            }
        }
        if state.turn > 0 {
            status.push_str(&format!(" | turn {}", state.turn));
        }
        status.push_str(&format!(
            " | {} tool call{} | tokens {} in / {} out | {:.1}s (run {:.0}s)",
            state.step_tools,
            if state.step_tools == 1 { "" } else { "s" },
            state.step_prompt,
            state.step_completion,
            state.step_started.elapsed().as_secs_f64(),
            self.started.elapsed().as_secs_f64(),
        ));
        let width = terminal_width().saturating_sub(1).max(20);
        let shown: String = status.chars().take(width).collect();
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\r\x1b[2K{shown}");
        let _ = out.flush();
        state.shown = true;
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// Columns of the terminal on stdout; `$COLUMNS` or 100 when it cannot be asked.
fn terminal_width() -> usize {
    #[cfg(unix)]
    {
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one winsize into the pointer given, which is valid.
        let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
        if ok && size.ws_col > 0 {
            return size.ws_col as usize;
        }
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100)
}
