//! What `trellis run` shows while it runs: on a terminal one status line updated in place
//! (step, item, turn, tool calls, tokens, time) under the lasting lines; elsewhere (pipes,
//! CI) one plain line per event of interest; with `--quiet` nothing until the summary.
//!
//! Fed by the run's [`RunEvent`]s (the run's own and those inside each step); it keeps the
//! totals the final summary prints.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Instant;

use trellis_runner::events::RunEvent;
use trellis_sandbox::llm::ReplyEvent;

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

/// The current item of one agent: the step's own, or a route's sub-agent.
#[derive(Debug, Default, Clone)]
struct Agent {
    item: Option<String>,
    item_type: String,
    iteration: u32,
    turn: u64,
    /// The last line of the reply arriving, for the status line (a streaming provider).
    said: String,
}

/// Characters of the reply arriving that the status line shows, its latest.
const SAID_CHARS: usize = 60;

impl Agent {
    /// Adds text of the reply arriving: only its last line is kept, and of that only the
    /// latest [`SAID_CHARS`] characters.
    fn hear(&mut self, text: &str) {
        match text.rsplit_once('\n') {
            Some((_, last)) => self.said = last.to_string(),
            None => self.said.push_str(text),
        }
        let extra = self.said.chars().count().saturating_sub(SAID_CHARS);
        if extra > 0 {
            let at = self.said.char_indices().nth(extra).map_or(0, |(i, _)| i);
            self.said.drain(..at);
        }
    }
}

#[derive(Debug)]
struct State {
    step: Option<String>,
    /// By event step id: `<step>`, or `<step>/<route>` for a sub-agent.
    agents: BTreeMap<String, Agent>,
    step_tools: u64,
    /// Turns of the running step's sub-agents (their event step ids are `<step>/<route>`).
    step_sub_turns: u64,
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
                agents: BTreeMap::new(),
                step_tools: 0,
                step_sub_turns: 0,
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

    /// One event of the run.
    pub fn event(&self, event: &RunEvent) {
        let mut state = self.lock();
        if let RunEvent::Reply { step_id, event } = event {
            return self.reply(&mut state, step_id, event);
        }
        match event {
            RunEvent::StepStarted { step_id, .. } => {
                state.step = Some(step_id.clone());
                state.agents.clear();
                state.step_tools = 0;
                state.step_sub_turns = 0;
                state.step_prompt = 0;
                state.step_completion = 0;
                state.step_started = Instant::now();
            }
            // No status line until the next step starts.
            RunEvent::StepEnded { .. } => state.step = None,
            RunEvent::TurnStarted { step_id, .. } if step_id.contains('/') => {
                state.step_sub_turns += 1;
            }
            _ => {}
        }
        // A step's end: its detail's first line, and the rest (a script's traceback) each on
        // a line of its own under it, marked as its continuation so none reads as a line of
        // the run's. The step's own turns, then its sub-agents': together they are what the
        // totals count.
        if let RunEvent::StepEnded {
            step_id,
            status,
            detail,
        } = event
        {
            let mut lines = detail.split('\n');
            let first = lines.next().unwrap_or_default();
            let more = match state.step_sub_turns {
                0 => String::new(),
                n => format!("; {n} more by its sub-agents"),
            };
            self.print(
                &mut state,
                &format!("step {step_id}: {status} ({first}{more})"),
            );
            for line in lines {
                let line = line.strip_suffix('\r').unwrap_or(line);
                self.print(
                    &mut state,
                    &format!("    |{}{line}", if line.is_empty() { "" } else { " " }),
                );
            }
            return;
        }
        // Events of the run as a whole are lasting lines in every mode but quiet.
        if let Some(line) = event.run_line() {
            return self.print(&mut state, &line);
        }
        let line = describe(&mut state, event);
        let Some(line) = line else {
            return;
        };
        match self.mode {
            Mode::Plain => self.print(&mut state, &line),
            Mode::Live => {
                // On a terminal only what is worth keeping stays: gates, sub-agent calls
                // and failures.
                let lasting = matches!(
                    event,
                    RunEvent::Gate { .. }
                        | RunEvent::SubAgentEnded { .. }
                        | RunEvent::ToolCall { error: Some(_), .. }
                        | RunEvent::ToolCallsRefused { .. }
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

    /// A piece of a reply arriving: on a terminal the status line shows its last words; a
    /// retry that voids what was shown is a lasting line in every mode but quiet.
    fn reply(&self, state: &mut State, step_id: &str, event: &ReplyEvent) {
        let agent = state.agents.entry(step_id.to_string()).or_default();
        match event {
            ReplyEvent::Text(text) => agent.hear(text),
            ReplyEvent::ToolCall { name, .. } => agent.said = format!("calling {name}"),
            ReplyEvent::Restarted { reason } => {
                agent.said.clear();
                let depth = step_id.matches('/').count();
                let line = format!(
                    "{}    model reply restarted (the retry starts over): {}",
                    "  ".repeat(depth),
                    first_line(reason)
                );
                return self.print(state, &line);
            }
        }
        if self.mode == Mode::Live {
            self.redraw(state);
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

    /// Prints a lasting line: one line whatever it holds (a tool or model name a model
    /// wrote, a worker's event), so a newline in it cannot print a line of its own.
    fn print(&self, state: &mut State, text: &str) {
        let text = crate::terminal::shown_name(text);
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
        let own = state.agents.get(step).cloned().unwrap_or_default();
        if let Some(item) = &own.item {
            status.push_str(&format!(" {item}"));
            if own.item_type == "foreach" {
                status.push_str(&format!(" row {}", own.iteration));
            }
        }
        if own.turn > 0 {
            status.push_str(&format!(" | turn {}", own.turn));
        }
        if !own.said.trim().is_empty() {
            status.push_str(&format!(" | > {}", own.said.trim()));
        }
        let busy: Vec<&str> = state
            .agents
            .iter()
            .filter(|(id, a)| id.contains('/') && a.item.is_some())
            .filter_map(|(id, _)| id.rsplit('/').next())
            .collect();
        if !busy.is_empty() {
            status.push_str(&format!(" | sub-agent {}", busy.join(", ")));
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
        let shown: String = crate::terminal::shown(&status)
            .chars()
            .take(width)
            .collect();
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\r\x1b[2K{shown}");
        let _ = out.flush();
        state.shown = true;
    }
}

/// Updates the state with `event` and returns its plain line, if it has one. Lines of a
/// sub-agent are indented one level per depth and name the route.
fn describe(state: &mut State, event: &RunEvent) -> Option<String> {
    let agent_of = |id: &str| {
        let depth = id.matches('/').count();
        let label = match id.rsplit_once('/') {
            Some((_, route)) => format!("[{route}] "),
            None => String::new(),
        };
        ("  ".repeat(depth), label)
    };
    let line = match event {
        RunEvent::ItemStarted {
            step_id,
            item_id,
            item_type,
        } => {
            let agent = state.agents.entry(step_id.clone()).or_default();
            agent.item = Some(item_id.clone());
            agent.item_type = item_type.clone();
            agent.iteration = 1;
            let (indent, label) = agent_of(step_id);
            format!("{indent}  {label}item {item_id} ({item_type})")
        }
        RunEvent::TurnStarted {
            step_id,
            item_id,
            iteration,
            turn,
        } => {
            state.totals.turns += 1;
            let agent = state.agents.entry(step_id.clone()).or_default();
            agent.turn = *turn;
            agent.said.clear();
            agent.iteration = *iteration;
            let row = if agent.item_type == "foreach" && agent.item.as_deref() == Some(item_id) {
                format!(" row {iteration}")
            } else {
                String::new()
            };
            let (indent, label) = agent_of(step_id);
            format!("{indent}  {label}turn {turn}: {item_id}{row}")
        }
        RunEvent::LlmCall {
            step_id,
            provider,
            model,
            prompt_tokens,
            completion_tokens,
            tool_calls,
            duration_ms,
            error,
        } => {
            state.totals.llm_calls += 1;
            if let Some(agent) = state.agents.get_mut(step_id) {
                agent.said.clear();
            }
            state.totals.prompt_tokens += prompt_tokens;
            state.totals.completion_tokens += completion_tokens;
            state.step_prompt += prompt_tokens;
            state.step_completion += completion_tokens;
            let (indent, label) = agent_of(step_id);
            match error {
                Some(e) => format!(
                    "{indent}    {label}llm {provider}:{model} failed after {duration_ms} ms: {}",
                    first_line(e)
                ),
                None => format!(
                    "{indent}    {label}llm {provider}:{model}: {prompt_tokens} + {completion_tokens} tokens, {tool_calls} tool call{}, {duration_ms} ms",
                    if *tool_calls == 1 { "" } else { "s" }
                ),
            }
        }
        RunEvent::ToolCall {
            step_id,
            tool,
            error,
            duration_ms,
            ..
        } => {
            state.totals.tool_calls += 1;
            state.step_tools += 1;
            let (indent, label) = agent_of(step_id);
            match error {
                Some(e) => {
                    state.totals.tool_errors += 1;
                    format!("{indent}    {label}tool {tool}: error: {}", first_line(e))
                }
                None => format!("{indent}    {label}tool {tool}: ok, {duration_ms} ms"),
            }
        }
        RunEvent::ToolCallsRefused {
            step_id,
            asked,
            refused,
            budget,
        } => {
            let (indent, label) = agent_of(step_id);
            format!(
                "{indent}    {label}tools: {refused} of the {asked} calls of one answer not run \
                 (at most {budget} run per answer, --max-calls-per-answer)"
            )
        }
        RunEvent::Gate {
            step_id,
            item_id,
            attempt,
            passed,
            failures,
        } => {
            let (indent, label) = agent_of(step_id);
            if *passed {
                format!("{indent}  {label}gate {item_id} attempt {attempt}: passed")
            } else {
                format!(
                    "{indent}  {label}gate {item_id} attempt {attempt}: {failures} failing check(s)"
                )
            }
        }
        RunEvent::SubAgentStarted {
            step_id,
            route_id,
            call_id,
            ..
        } => {
            let (indent, label) = agent_of(step_id);
            format!("{indent}    {label}sub-agent {route_id} {call_id}: started")
        }
        RunEvent::SubAgentEnded {
            step_id,
            route_id,
            call_id,
            status,
        } => {
            state.agents.remove(&format!("{step_id}/{route_id}"));
            let (indent, label) = agent_of(step_id);
            format!("{indent}    {label}sub-agent {route_id} {call_id}: {status}")
        }
        RunEvent::ItemEnded {
            step_id,
            item_id,
            status,
        } => {
            if let Some(agent) = state.agents.get_mut(step_id) {
                agent.item = None;
            }
            let (indent, label) = agent_of(step_id);
            format!("{indent}  {label}item {item_id}: {status}")
        }
        #[allow(unreachable_patterns, reason = "RunEvent grows with the runtime")]
        _ => return None,
    };
    Some(line)
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
