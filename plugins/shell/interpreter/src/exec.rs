//! Running the syntax tree: lists, pipelines, compound commands, simple commands and
//! their redirections.

use brush_parser::ast;

use crate::io::{Command, Input, Sink, Streams, normalize};
use crate::{Shell, System};

/// Why a run stops before its end.
#[derive(Debug)]
pub(crate) enum Halt {
    /// `exit` (the status is the shell's).
    Exit,
    /// A bound reached or an unsupported construct: the run ends with status 2.
    Fatal(String),
}

pub(crate) type Step = Result<(), Halt>;

/// Where control goes after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Normal,
    Break(u32),
    Continue(u32),
    Return,
}

/// `set` options.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Options {
    pub(crate) errexit: bool,
    pub(crate) nounset: bool,
    pub(crate) pipefail: bool,
}

/// The parser's options: bash, without extended globs.
pub(crate) fn parser_options() -> brush_parser::ParserOptions {
    brush_parser::ParserOptions {
        enable_extended_globbing: false,
        ..Default::default()
    }
}

/// A function as defined: its body, and the nesting of the text it was defined in (what
/// running the body may take of the stack, at most).
#[derive(Debug)]
pub(crate) struct Function {
    pub(crate) body: ast::FunctionBody,
    pub(crate) nesting: usize,
}

impl<S: System> Shell<S> {
    /// Parses and runs `text` with the streams given.
    pub(crate) fn run_text(&mut self, text: &str, io: &Streams) -> Step {
        let nesting = crate::nesting(text);
        crate::refuse_nesting(nesting).map_err(Halt::Fatal)?;
        self.nested(nesting, |sh| {
            let outer = std::mem::replace(&mut sh.text_nesting, nesting);
            let result = sh.parse_and_run(text, io);
            sh.text_nesting = outer;
            result
        })
    }

    /// Runs `f` with `nesting` more of the stack's nesting in use; stops the run when the
    /// texts running inside each other would nest past [`crate::MAX_ACTIVE_NESTING`].
    pub(crate) fn nested<T>(
        &mut self,
        nesting: usize,
        f: impl FnOnce(&mut Self) -> Result<T, Halt>,
    ) -> Result<T, Halt> {
        let total = self.nesting_in_use + nesting;
        if total > crate::MAX_ACTIVE_NESTING {
            return Err(Halt::Fatal(format!(
                "stopped: texts run inside each other (eval, substitutions, function bodies, \
                 arithmetic) nest {total} deep together, more than the {} one command may",
                crate::MAX_ACTIVE_NESTING
            )));
        }
        self.nesting_in_use = total;
        let result = f(self);
        self.nesting_in_use -= nesting;
        result
    }

    fn parse_and_run(&mut self, text: &str, io: &Streams) -> Step {
        let mut parser = brush_parser::Parser::new(text.as_bytes(), &parser_options());
        let program = match parser.parse_program() {
            Ok(program) => program,
            Err(e) => {
                io.err.write_str(&format!("shell: syntax error: {e}\n"));
                self.status = 2;
                return Ok(());
            }
        };
        for command in &program.complete_commands {
            self.list(command, io)?;
            if self.flow != Flow::Normal {
                break;
            }
        }
        Ok(())
    }

    /// Counts one step against the run's bound.
    pub(crate) fn step(&mut self) -> Step {
        self.steps += 1;
        if self.steps > self.limits.steps {
            return Err(Halt::Fatal(format!(
                "stopped: the command ran {} steps (commands, loop rounds, calls), the most one command may",
                self.limits.steps
            )));
        }
        if let Some(time) = self.limits.time
            && self.started.elapsed() > time
        {
            return Err(Halt::Fatal(format!(
                "stopped: the command ran past its timeout of {} s",
                time.as_secs_f64()
            )));
        }
        Ok(())
    }

    /// Runs `f` one level deeper, within the bound of nesting.
    pub(crate) fn deeper<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Halt>,
    ) -> Result<T, Halt> {
        if self.depth >= self.limits.depth {
            return Err(Halt::Fatal(format!(
                "stopped: calls, subshells and substitutions nested {} deep, the most one command may",
                self.limits.depth
            )));
        }
        self.depth += 1;
        let result = f(self);
        self.depth -= 1;
        result
    }

    /// Runs `f` in a subshell: the variables, functions, options, positional parameters and
    /// working folder it changes are restored after; an `exit` in it ends only it.
    pub(crate) fn subshell(&mut self, f: impl FnOnce(&mut Self) -> Step) -> Step {
        let vars = self.vars.clone();
        let exported = self.exported.clone();
        let funcs = self.funcs.clone();
        let positional = self.positional.clone();
        let cwd = self.cwd.clone();
        let options = self.options;
        let locals = self.locals.len();
        let result = self.deeper(f);
        self.vars = vars;
        self.exported = exported;
        self.funcs = funcs;
        self.positional = positional;
        self.cwd = cwd;
        self.options = options;
        self.locals.truncate(locals);
        self.flow = Flow::Normal;
        match result {
            Err(Halt::Exit) => Ok(()),
            other => other,
        }
    }

    fn list(&mut self, list: &ast::CompoundList, io: &Streams) -> Step {
        for ast::CompoundListItem(and_or, _separator) in &list.0 {
            self.and_or(and_or, io)?;
            if self.flow != Flow::Normal {
                break;
            }
        }
        Ok(())
    }

    fn and_or(&mut self, list: &ast::AndOrList, io: &Streams) -> Step {
        let chained = !list.additional.is_empty();
        if chained {
            self.in_condition += 1;
        }
        let first = self.pipeline(&list.first, io);
        if chained {
            self.in_condition -= 1;
        }
        first?;
        for (i, next) in list.additional.iter().enumerate() {
            if self.flow != Flow::Normal {
                return Ok(());
            }
            let last = i + 1 == list.additional.len();
            let (run, pipeline) = match next {
                ast::AndOr::And(p) => (self.status == 0, p),
                ast::AndOr::Or(p) => (self.status != 0, p),
            };
            if run {
                if !last {
                    self.in_condition += 1;
                }
                let result = self.pipeline(pipeline, io);
                if !last {
                    self.in_condition -= 1;
                }
                result?;
            }
        }
        if self.options.errexit
            && self.in_condition == 0
            && self.status != 0
            && self.flow == Flow::Normal
        {
            return Err(Halt::Exit);
        }
        Ok(())
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline, io: &Streams) -> Step {
        if pipeline.bang {
            self.in_condition += 1;
        }
        let result = self.stages(&pipeline.seq, io);
        if pipeline.bang {
            self.in_condition -= 1;
            if result.is_ok() {
                self.status = i32::from(self.status == 0);
            }
        }
        result
    }

    fn stages(&mut self, seq: &[ast::Command], io: &Streams) -> Step {
        if let [only] = seq {
            return self.command(only, io);
        }
        let mut input = io.stdin.clone();
        let mut failed = 0;
        for (i, command) in seq.iter().enumerate() {
            let last = i + 1 == seq.len();
            let out = if last {
                io.out.clone()
            } else {
                Sink::new(self.limits.pipe_bytes)
            };
            let stage = Streams {
                stdin: input.clone(),
                out: out.clone(),
                err: io.err.clone(),
            };
            self.subshell(|sh| sh.command(command, &stage))?;
            if self.status != 0 {
                failed = self.status;
            }
            if !last {
                input = Input::new(out.take().0);
            }
        }
        if self.options.pipefail && self.status == 0 {
            self.status = failed;
        }
        Ok(())
    }

    pub(crate) fn command(&mut self, command: &ast::Command, io: &Streams) -> Step {
        match command {
            ast::Command::Simple(simple) => self.simple(simple, io),
            ast::Command::Compound(compound, redirects) => {
                let redirects = redirects.as_ref().map(|r| r.0.as_slice()).unwrap_or(&[]);
                self.redirected(redirects, io, |sh, io| sh.compound(compound, io))
            }
            ast::Command::Function(def) => {
                let function = Function {
                    body: def.body.clone(),
                    nesting: self.text_nesting,
                };
                self.funcs
                    .insert(def.fname.value.clone(), std::rc::Rc::new(function));
                self.status = 0;
                Ok(())
            }
            ast::Command::ExtendedTest(test, redirects) => {
                let redirects = redirects.as_ref().map(|r| r.0.as_slice()).unwrap_or(&[]);
                self.redirected(redirects, io, |sh, io| {
                    let ok = sh.extended_test(&test.expr, io)?;
                    sh.status = i32::from(!ok);
                    Ok(())
                })
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand, io: &Streams) -> Step {
        match compound {
            ast::CompoundCommand::BraceGroup(group) => self.list(&group.list, io),
            ast::CompoundCommand::Subshell(sub) => self.subshell(|sh| sh.list(&sub.list, io)),
            ast::CompoundCommand::IfClause(clause) => {
                if self.condition(&clause.condition, io)? {
                    return self.list(&clause.then, io);
                }
                for branch in clause.elses.iter().flatten() {
                    let taken = match &branch.condition {
                        Some(condition) => self.condition(condition, io)?,
                        None => true,
                    };
                    if taken {
                        return self.list(&branch.body, io);
                    }
                }
                self.status = 0;
                Ok(())
            }
            ast::CompoundCommand::WhileClause(ast::WhileOrUntilClauseCommand(cond, body, _))
            | ast::CompoundCommand::UntilClause(ast::WhileOrUntilClauseCommand(cond, body, _)) => {
                let until = matches!(compound, ast::CompoundCommand::UntilClause(_));
                let mut status = 0;
                loop {
                    self.step()?;
                    let holds = self.condition(cond, io)?;
                    if holds == until || self.flow != Flow::Normal {
                        break;
                    }
                    self.list(&body.list, io)?;
                    status = self.status;
                    if self.loop_flow() {
                        break;
                    }
                }
                if self.flow == Flow::Normal {
                    self.status = status;
                }
                Ok(())
            }
            ast::CompoundCommand::ForClause(clause) => {
                let values = match &clause.values {
                    Some(words) => {
                        let mut values = Vec::new();
                        for word in words {
                            values.extend(self.expand_fields(&word.value, io)?);
                        }
                        values
                    }
                    None => self.positional.clone(),
                };
                self.status = 0;
                for value in values {
                    self.step()?;
                    self.set_var(&clause.variable_name, value)?;
                    self.list(&clause.body.list, io)?;
                    if self.loop_flow() {
                        break;
                    }
                }
                Ok(())
            }
            ast::CompoundCommand::ArithmeticForClause(clause) => {
                if let Some(init) = &clause.initializer {
                    self.arithmetic(&init.value, io)?;
                }
                loop {
                    self.step()?;
                    if let Some(cond) = &clause.condition
                        && self.arithmetic(&cond.value, io)? == 0
                    {
                        break;
                    }
                    self.list(&clause.body.list, io)?;
                    if self.loop_flow() {
                        break;
                    }
                    if let Some(update) = &clause.updater {
                        self.arithmetic(&update.value, io)?;
                    }
                }
                if self.flow == Flow::Normal {
                    self.status = 0;
                }
                Ok(())
            }
            ast::CompoundCommand::CaseClause(clause) => {
                let value = self.expand_string(&clause.value.value, io)?;
                self.status = 0;
                let mut falling = false;
                for item in &clause.cases {
                    let mut matched = falling;
                    if !matched {
                        for pattern in &item.patterns {
                            self.step()?;
                            let pattern = self.expand_pattern(&pattern.value, io)?;
                            if crate::expand::pattern_matches(&pattern, &value)? {
                                matched = true;
                                break;
                            }
                        }
                    }
                    if !matched {
                        continue;
                    }
                    if let Some(body) = &item.cmd {
                        self.list(body, io)?;
                    }
                    match item.post_action {
                        ast::CaseItemPostAction::ExitCase => break,
                        ast::CaseItemPostAction::UnconditionallyExecuteNextCaseItem => {
                            falling = true
                        }
                        ast::CaseItemPostAction::ContinueEvaluatingCases => falling = false,
                    }
                }
                Ok(())
            }
            ast::CompoundCommand::Arithmetic(arith) => {
                let value = self.arithmetic(&arith.expr.value, io)?;
                self.status = i32::from(value == 0);
                Ok(())
            }
            ast::CompoundCommand::Coprocess(_) => {
                Err(Halt::Fatal("coprocesses are not supported".into()))
            }
        }
    }

    /// Consumes a `break` or `continue` aimed at this loop; answers whether the loop ends.
    fn loop_flow(&mut self) -> bool {
        match self.flow {
            Flow::Normal => false,
            Flow::Break(n) => {
                self.flow = if n > 1 {
                    Flow::Break(n - 1)
                } else {
                    Flow::Normal
                };
                true
            }
            Flow::Continue(n) => {
                if n > 1 {
                    self.flow = Flow::Continue(n - 1);
                    true
                } else {
                    self.flow = Flow::Normal;
                    false
                }
            }
            Flow::Return => true,
        }
    }

    /// Runs a condition list; `set -e` does not stop it.
    fn condition(&mut self, list: &ast::CompoundList, io: &Streams) -> Result<bool, Halt> {
        self.in_condition += 1;
        let result = self.list(list, io);
        self.in_condition -= 1;
        result?;
        Ok(self.status == 0)
    }

    fn simple(&mut self, command: &ast::SimpleCommand, io: &Streams) -> Step {
        let mut assignments = Vec::new();
        let mut redirects = Vec::new();
        let mut words: Vec<&str> = Vec::new();
        if let Some(name) = &command.word_or_name {
            words.push(&name.value);
        }
        let prefix = command
            .prefix
            .iter()
            .flat_map(|p| p.0.iter())
            .map(|item| (true, item));
        let suffix = command
            .suffix
            .iter()
            .flat_map(|s| s.0.iter())
            .map(|item| (false, item));
        for (in_prefix, item) in prefix.chain(suffix) {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(r) => redirects.push(r.clone()),
                ast::CommandPrefixOrSuffixItem::Word(w) => words.push(&w.value),
                // After the command's name, `x=1` is an argument (`export x=1`, `echo a=b`).
                ast::CommandPrefixOrSuffixItem::AssignmentWord(_, w) if !in_prefix => {
                    words.push(&w.value)
                }
                ast::CommandPrefixOrSuffixItem::AssignmentWord(a, _) => assignments.push(a),
                ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
                    return Err(Halt::Fatal("process substitution is not supported".into()));
                }
            }
        }
        // The command name comes first in the tree's order; the prefix's words are none.
        let mut argv = Vec::new();
        self.substituted = None;
        for word in &words {
            argv.extend(self.expand_fields(word, io)?);
        }
        let mut values = Vec::new();
        for assignment in assignments {
            let ast::AssignmentName::VariableName(name) = &assignment.name else {
                return Err(Halt::Fatal("arrays are not supported".into()));
            };
            let ast::AssignmentValue::Scalar(word) = &assignment.value else {
                return Err(Halt::Fatal("arrays are not supported".into()));
            };
            let mut value = self.expand_string(&word.value, io)?;
            if assignment.append {
                value = format!(
                    "{}{value}",
                    self.vars.get(name).cloned().unwrap_or_default()
                );
            }
            values.push((name.clone(), value));
        }
        if argv.is_empty() {
            let status = self.substituted.unwrap_or(0);
            for (name, value) in values {
                self.set_var(&name, value)?;
            }
            self.redirected(&redirects, io, |sh, _| {
                sh.status = status;
                Ok(())
            })?;
            return Ok(());
        }
        self.step()?;
        self.redirected(&redirects, io, |sh, io| sh.invoke(argv, values, io))
    }

    /// Runs a command by name: a function, a builtin, or the system's.
    pub(crate) fn invoke(
        &mut self,
        argv: Vec<String>,
        assigned: Vec<(String, String)>,
        io: &Streams,
    ) -> Step {
        if let Some(function) = self.funcs.get(&argv[0]).cloned() {
            return self.with_assigned(assigned, |sh| {
                sh.nested(function.nesting, |sh| {
                    sh.call_function(&function.body, &argv[1..], io)
                })
            });
        }
        if crate::builtins::is_builtin(&argv[0]) {
            return self.with_assigned(assigned, |sh| sh.builtin(&argv, io));
        }
        let mut env: Vec<(String, String)> = self
            .exported
            .iter()
            .filter_map(|name| Some((name.clone(), self.vars.get(name)?.clone())))
            .filter(|(name, _)| !assigned.iter().any(|(n, _)| n == name))
            .collect();
        env.extend(assigned);
        env.sort();
        let stdin = io.stdin.read_rest();
        let output = self.sys.run(Command {
            argv: &argv,
            cwd: &self.cwd,
            env,
            stdin,
            output_bytes: io.out.room().min(self.limits.pipe_bytes),
        });
        io.out.write(&output.stdout);
        io.err.write(&output.stderr);
        self.status = output.status;
        Ok(())
    }

    /// Runs `f` with the variables `assigned` (`NAME=value cmd`) set, and sets them back
    /// after, as they were.
    fn with_assigned(
        &mut self,
        assigned: Vec<(String, String)>,
        f: impl FnOnce(&mut Self) -> Step,
    ) -> Step {
        let saved: Vec<_> = assigned
            .iter()
            .map(|(name, _)| (name.clone(), self.vars.get(name).cloned()))
            .collect();
        let mut result = Ok(());
        for (name, value) in assigned {
            result = self.set_var(&name, value);
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = f(self);
        }
        for (name, value) in saved {
            match value {
                Some(value) => self.vars.insert(name, value),
                None => self.vars.remove(&name),
            };
        }
        result
    }

    fn call_function(&mut self, body: &ast::FunctionBody, args: &[String], io: &Streams) -> Step {
        self.deeper(|sh| {
            let positional = std::mem::replace(&mut sh.positional, args.to_vec());
            sh.locals.push(Vec::new());
            let redirects = body.1.as_ref().map(|r| r.0.as_slice()).unwrap_or(&[]);
            let result = sh.redirected(redirects, io, |sh, io| sh.compound(&body.0, io));
            for (name, value) in sh.locals.pop().unwrap_or_default().into_iter().rev() {
                match value {
                    Some(value) => sh.vars.insert(name, value),
                    None => sh.vars.remove(&name),
                };
            }
            sh.positional = positional;
            if sh.flow == Flow::Return {
                sh.flow = Flow::Normal;
            }
            result
        })
    }

    /// Runs `f` with the redirections applied: output to a file is collected and written
    /// when `f` ends (the file is emptied first, as the shell opens it before the command).
    fn redirected(
        &mut self,
        redirects: &[ast::IoRedirect],
        io: &Streams,
        f: impl FnOnce(&mut Self, &Streams) -> Step,
    ) -> Step {
        if redirects.is_empty() {
            return f(self, io);
        }
        let mut streams = io.clone();
        let mut files: Vec<(String, bool, Sink)> = Vec::new();
        for redirect in redirects {
            if let Err(message) = self.redirect(redirect, &mut streams, &mut files, io)? {
                io.err.write_str(&format!("shell: {message}\n"));
                self.status = 1;
                return Ok(());
            }
        }
        let result = f(self, &streams);
        for (path, append, sink) in files {
            let (data, dropped) = sink.take();
            let written = if dropped > 0 {
                Err(std::io::Error::other(format!(
                    "more than the {} bytes the shell writes to a file at once",
                    self.limits.pipe_bytes
                )))
            } else if data.is_empty() {
                Ok(())
            } else {
                // Emptied when the redirection was set up, so the output is appended.
                debug_assert!(append);
                self.sys.write_file(&path, &data, true)
            };
            if let Err(e) = written {
                io.err.write_str(&format!("shell: {path}: {e}\n"));
                self.status = 1;
            }
        }
        result
    }

    /// Applies one redirection; the inner error is the user's (a file that cannot be
    /// opened), said on stderr.
    fn redirect(
        &mut self,
        redirect: &ast::IoRedirect,
        streams: &mut Streams,
        files: &mut Vec<(String, bool, Sink)>,
        outer: &Streams,
    ) -> Result<Result<(), String>, Halt> {
        let mut to_file = |sh: &mut Self, path: &str, append: bool| -> Result<Sink, String> {
            let path = normalize(&sh.cwd, path);
            if path == "/dev/null" {
                return Ok(Sink::null(sh.limits.pipe_bytes));
            }
            if !append {
                sh.sys
                    .write_file(&path, b"", false)
                    .map_err(|e| format!("{path}: {e}"))?;
            }
            let sink = Sink::new(sh.limits.pipe_bytes);
            files.push((path, true, sink.clone()));
            Ok(sink)
        };
        match redirect {
            ast::IoRedirect::File(fd, kind, target) => {
                let fd = fd.unwrap_or(match kind {
                    ast::IoFileRedirectKind::Read
                    | ast::IoFileRedirectKind::DuplicateInput
                    | ast::IoFileRedirectKind::ReadAndWrite => 0,
                    _ => 1,
                });
                let target_fd = |sh: &mut Self,
                                 target: &ast::IoFileRedirectTarget|
                 -> Result<Option<i32>, Halt> {
                    Ok(match target {
                        ast::IoFileRedirectTarget::Fd(n) => Some(*n),
                        ast::IoFileRedirectTarget::Duplicate(word) => {
                            sh.expand_string(&word.value, outer)?.parse().ok()
                        }
                        _ => None,
                    })
                };
                match kind {
                    ast::IoFileRedirectKind::DuplicateOutput => {
                        let Some(to) = target_fd(self, target)? else {
                            return Ok(Err("a duplication needs a descriptor number".into()));
                        };
                        let sink = match to {
                            1 => streams.out.clone(),
                            2 => streams.err.clone(),
                            other => return Ok(Err(format!("{other}: bad file descriptor"))),
                        };
                        match fd {
                            1 => streams.out = sink,
                            2 => streams.err = sink,
                            other => return Ok(Err(format!("{other}: bad file descriptor"))),
                        }
                        Ok(Ok(()))
                    }
                    ast::IoFileRedirectKind::DuplicateInput => Ok(Ok(())),
                    ast::IoFileRedirectKind::Read | ast::IoFileRedirectKind::ReadAndWrite => {
                        let path = match target {
                            ast::IoFileRedirectTarget::Filename(word) => {
                                self.expand_string(&word.value, outer)?
                            }
                            _ => {
                                return Err(Halt::Fatal(
                                    "process substitution is not supported".into(),
                                ));
                            }
                        };
                        if fd != 0 {
                            return Ok(Err(format!(
                                "{fd}<: only standard input can be read from a file"
                            )));
                        }
                        let path = normalize(&self.cwd, &path);
                        if path == "/dev/null" {
                            streams.stdin = Input::empty();
                            return Ok(Ok(()));
                        }
                        if path == "/dev/stdin" || path == "/dev/fd/0" {
                            return Ok(Ok(()));
                        }
                        match self.sys.read_file(&path, self.limits.pipe_bytes) {
                            Ok(data) => {
                                streams.stdin = Input::new(data);
                                Ok(Ok(()))
                            }
                            Err(e) => Ok(Err(format!("{path}: {e}"))),
                        }
                    }
                    ast::IoFileRedirectKind::Write
                    | ast::IoFileRedirectKind::Clobber
                    | ast::IoFileRedirectKind::Append => {
                        let path = match target {
                            ast::IoFileRedirectTarget::Filename(word) => {
                                self.expand_string(&word.value, outer)?
                            }
                            ast::IoFileRedirectTarget::Fd(_)
                            | ast::IoFileRedirectTarget::Duplicate(_) => {
                                return Ok(Err("a file name is needed".into()));
                            }
                            ast::IoFileRedirectTarget::ProcessSubstitution(..) => {
                                return Err(Halt::Fatal(
                                    "process substitution is not supported".into(),
                                ));
                            }
                        };
                        let append = matches!(kind, ast::IoFileRedirectKind::Append);
                        // The streams named as files are the streams, as in bash.
                        let sink = match normalize(&self.cwd, &path).as_str() {
                            "/dev/stdout" | "/dev/fd/1" => streams.out.clone(),
                            "/dev/stderr" | "/dev/fd/2" => streams.err.clone(),
                            _ => match to_file(self, &path, append) {
                                Ok(sink) => sink,
                                Err(message) => return Ok(Err(message)),
                            },
                        };
                        match fd {
                            1 => streams.out = sink,
                            2 => streams.err = sink,
                            other => return Ok(Err(format!("{other}: bad file descriptor"))),
                        }
                        Ok(Ok(()))
                    }
                }
            }
            ast::IoRedirect::OutputAndError(word, append) => {
                let path = self.expand_string(&word.value, outer)?;
                let sink = match to_file(self, &path, *append) {
                    Ok(sink) => sink,
                    Err(message) => return Ok(Err(message)),
                };
                streams.out = sink.clone();
                streams.err = sink;
                Ok(Ok(()))
            }
            ast::IoRedirect::HereDocument(_, doc) => {
                let text = if doc.requires_expansion {
                    self.expand_heredoc(&doc.doc.value, outer)?
                } else {
                    doc.doc.value.clone()
                };
                let text = if doc.remove_tabs {
                    text.lines()
                        .map(|l| format!("{}\n", l.trim_start_matches('\t')))
                        .collect()
                } else {
                    text
                };
                streams.stdin = Input::new(text.into_bytes());
                Ok(Ok(()))
            }
            ast::IoRedirect::HereString(_, word) => {
                let mut text = self.expand_string(&word.value, outer)?;
                text.push('\n');
                streams.stdin = Input::new(text.into_bytes());
                Ok(Ok(()))
            }
        }
    }

    /// Sets a variable (a `local` one in the innermost function that made it local).
    pub(crate) fn set_var(&mut self, name: &str, value: String) -> Step {
        if value.len() > self.limits.pipe_bytes {
            return Err(Halt::Fatal(format!(
                "stopped: a value of {} bytes for {name}, more than the {} a variable may hold",
                value.len(),
                self.limits.pipe_bytes
            )));
        }
        if name == "PWD" {
            self.cwd = normalize(&self.cwd, &value);
        }
        self.vars.insert(name.to_string(), value);
        Ok(())
    }
}
