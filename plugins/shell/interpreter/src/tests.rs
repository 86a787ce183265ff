//! The interpreter against expectations written by hand from bash's behaviour, on a real
//! temporary folder. The commands that are not builtins are three small ones of the test's
//! own (`upper`, `lines`, `args`, `yes`), so what is tested is the shell's plumbing.

use super::*;

struct TestSystem {
    ran: Vec<Vec<String>>,
}

impl System for TestSystem {
    fn run(&mut self, command: Command<'_>) -> Output {
        self.ran.push(command.argv.to_vec());
        let stdin = String::from_utf8_lossy(&command.stdin).into_owned();
        let (status, stdout) = match command.argv[0].as_str() {
            "upper" => (0, stdin.to_uppercase()),
            "lines" => (0, format!("{}\n", stdin.lines().count())),
            "args" => (
                0,
                command.argv[1..]
                    .iter()
                    .map(|a| format!("<{a}>\n"))
                    .collect(),
            ),
            "env" => (
                0,
                command
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}\n"))
                    .collect(),
            ),
            "where" => (0, format!("{}\n", command.cwd)),
            "yes" => {
                // Writes until the room it was given is full, as the host's runner does.
                let line = "y\n".repeat(command.output_bytes / 2 + 1);
                (141, line[..command.output_bytes].to_string())
            }
            other => {
                return Output {
                    status: 127,
                    stdout: Vec::new(),
                    stderr: format!("command not found: {other}\n").into_bytes(),
                };
            }
        };
        Output {
            status,
            stdout: stdout.into_bytes(),
            stderr: Vec::new(),
        }
    }
}

fn folder() -> (tempfile_like::Dir, String) {
    let dir = tempfile_like::Dir::new();
    let path = dir.path().to_string();
    (dir, path)
}

mod tempfile_like {
    //! A temporary folder, removed when dropped (the guest crates have no tempfile).
    pub struct Dir(String);
    impl Dir {
        pub fn new() -> Dir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "trellis-shell-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&path).unwrap();
            Dir(path.to_string_lossy().into_owned())
        }
        pub fn path(&self) -> &str {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn shell_in(cwd: &str, limits: Limits) -> Shell<TestSystem> {
    Shell::new(
        TestSystem { ran: Vec::new() },
        limits,
        cwd,
        &[("LANG".into(), "C".into())],
    )
}

/// Runs `script` in a fresh folder; answers (status, stdout, stderr).
fn run(script: &str) -> (i32, String, String) {
    let (_dir, path) = folder();
    run_in(&path, script)
}

fn run_in(path: &str, script: &str) -> (i32, String, String) {
    let done = shell_in(path, Limits::default()).run(script);
    (
        done.status,
        String::from_utf8(done.stdout).unwrap(),
        String::from_utf8(done.stderr).unwrap(),
    )
}

#[test]
fn quoting_variables_and_field_splitting() {
    let (status, out, err) = run(r#"x='a  b'; args $x "$x" '$x' "it's" a\ b "" ${x}c"#);
    assert_eq!(status, 0, "{err}");
    assert_eq!(
        out,
        "<a>\n<b>\n<a  b>\n<$x>\n<it's>\n<a b>\n<>\n<a>\n<bc>\n"
    );
}

#[test]
fn positional_parameters_and_quoted_at() {
    let (_, out, _) = run(r#"set -- 'one two' three; args "$@"; args $@; echo "$#:$1:$*""#);
    assert_eq!(
        out,
        "<one two>\n<three>\n<one>\n<two>\n<three>\n2:one two:one two three\n"
    );
}

#[test]
fn and_or_lists_and_exit_status() {
    let (status, out, _) =
        run("false && echo no || echo yes; true; echo $?; false; echo $?; ! false; echo $?");
    assert_eq!(out, "yes\n0\n1\n0\n");
    assert_eq!(status, 0);
    let (status, _, _) = run("exit 3; echo never");
    assert_eq!(status, 3);
}

#[test]
fn pipelines_feed_each_stage_the_last_ones_output() {
    let (status, out, _) = run("printf 'a\\nb\\nc\\n' | upper | lines");
    assert_eq!((status, out.as_str()), (0, "3\n"));
    let (_, out, _) = run("echo hello | upper");
    assert_eq!(out, "HELLO\n");
}

#[test]
fn a_pipeline_stage_is_a_subshell() {
    let (_, out, _) = run("x=1; x=2 | true; echo $x | upper; echo $x");
    assert_eq!(out, "1\n1\n");
}

#[test]
fn command_substitution_and_arithmetic() {
    let (_, out, _) = run(
        r#"n=$(echo 3); echo $((n * 4 + 1)) "$(echo a; echo b)" `echo c`; i=0; ((i++)); echo $i"#,
    );
    assert_eq!(out, "13 a\nb c\n1\n");
}

#[test]
fn parameter_expansions() {
    let script = r#"f=report.tar.gz; echo ${f%.*} ${f%%.*} ${f#*.} ${f##*.} ${#f} ${f:0:6} ${f/tar/zip} ${u:-dflt} ${f:+set} ${f^^}"#;
    let (_, out, err) = run(script);
    assert_eq!(
        out, "report.tar report tar.gz gz 13 report report.zip.gz dflt set REPORT.TAR.GZ\n",
        "{err}"
    );
}

#[test]
fn loops_functions_and_locals() {
    let script = r#"
greet() { local who=$1; echo "hi $who"; return 4; }
who=outer
for n in a b c; do greet $n; done
echo "$? $who"
i=0; while [ $i -lt 3 ]; do i=$((i+1)); [ $i -eq 2 ] && continue; echo i=$i; done
until [ $i -eq 0 ]; do i=$((i-1)); if [ $i -eq 1 ]; then break; fi; done; echo end=$i
for ((k=0; k<2; k++)); do echo k$k; done
"#;
    let (_, out, err) = run(script);
    assert_eq!(
        out, "hi a\nhi b\nhi c\n4 outer\ni=1\ni=3\nend=1\nk0\nk1\n",
        "{err}"
    );
}

#[test]
fn case_and_extended_tests() {
    let script = r#"
for f in notes.md data.json other; do
  case $f in
    *.md|*.txt) echo "$f text";;
    *.json) echo "$f json";;
    *) echo "$f ?";;
  esac
done
[[ data.json == *.json && ! -e nothing ]] && echo match
[[ abc =~ ^a.c$ ]] && echo regex
"#;
    let (_, out, err) = run(script);
    assert_eq!(
        out, "notes.md text\ndata.json json\nother ?\nmatch\nregex\n",
        "{err}"
    );
}

#[test]
fn redirections_write_append_read_and_duplicate() {
    let (dir, path) = folder();
    let script = r#"
echo one > out.txt
echo two >> out.txt
lines < out.txt
upper < out.txt > up.txt
nosuch 2> err.txt
nosuch > both.txt 2>&1
echo gone > /dev/null
cat_like() { while read -r line; do echo "[$line]"; done; }
cat_like < out.txt
upper <<EOF
x=$((1+1)) $HOME
EOF
upper <<< "here string"
"#;
    let (status, out, err) = run_in(&path, script);
    assert_eq!(status, 0, "{err}");
    assert_eq!(
        out,
        "2\n[one]\n[two]\n".to_string()
            + &format!("X=2 {}\n", path.to_uppercase())
            + "HERE STRING\n"
    );
    let read = |name: &str| std::fs::read_to_string(format!("{}/{name}", dir.path())).unwrap();
    assert_eq!(read("out.txt"), "one\ntwo\n");
    assert_eq!(read("up.txt"), "ONE\nTWO\n");
    assert_eq!(read("err.txt"), "command not found: nosuch\n");
    assert_eq!(read("both.txt"), "command not found: nosuch\n");
}

#[test]
fn globs_match_names_in_order_and_stay_literal_when_nothing_matches() {
    let (dir, path) = folder();
    for name in ["b.md", "a.md", "c.txt", ".hidden.md"] {
        std::fs::write(format!("{}/{name}", dir.path()), "x").unwrap();
    }
    std::fs::create_dir(format!("{}/sub", dir.path())).unwrap();
    std::fs::write(format!("{}/sub/d.md", dir.path()), "x").unwrap();
    let (_, out, _) = run_in(&path, "args *.md; args */*.md; args '*.md'; args *.none");
    assert_eq!(out, "<a.md>\n<b.md>\n<sub/d.md>\n<*.md>\n<*.none>\n");
}

#[test]
fn cd_changes_the_folder_commands_run_in() {
    let (dir, path) = folder();
    std::fs::create_dir(format!("{}/sub", dir.path())).unwrap();
    let (_, out, err) = run_in(
        &path,
        "cd sub && where && pwd; cd ..; where; cd nowhere; echo $?",
    );
    assert_eq!(out, format!("{path}/sub\n{path}/sub\n{path}\n1\n"), "{err}");
    assert!(
        err.contains("cd: nowhere: No such file or directory"),
        "{err}"
    );
}

#[test]
fn exported_variables_reach_commands_and_others_do_not() {
    let (_, out, _) = run("export A=1; B=2; C=3 env");
    assert!(
        out.contains("A=1\n") && out.contains("C=3\n") && !out.contains("B=2"),
        "{out}"
    );
}

#[test]
fn set_e_stops_at_a_failure_outside_conditions() {
    let (status, out, _) =
        run("set -e; if false; then :; fi; false || true; echo reached; false; echo never");
    assert_eq!((status, out.as_str()), (1, "reached\n"));
    let (status, out, _) = run("set -o pipefail; false | true; echo $?");
    assert_eq!((status, out.as_str()), (0, "1\n"));
}

#[test]
fn an_unknown_command_is_127_and_the_run_goes_on() {
    let (status, out, err) = run("frobnicate; echo $?");
    assert_eq!(
        (status, out.as_str(), err.as_str()),
        (0, "127\n", "command not found: frobnicate\n")
    );
}

#[test]
fn a_syntax_error_is_status_2_and_said() {
    let (status, _, err) = run("if then fi (");
    assert_eq!(status, 2);
    assert!(err.starts_with("shell: syntax error"), "{err}");
}

#[test]
fn an_endless_loop_stops_at_the_step_bound() {
    let (_dir, path) = folder();
    let limits = Limits {
        steps: 1000,
        ..Limits::default()
    };
    let done = shell_in(&path, limits).run("while true; do :; done; echo never");
    assert_eq!(done.status, 2);
    assert_eq!(
        String::from_utf8(done.stderr).unwrap(),
        "shell: stopped: the command ran 1000 steps (commands, loop rounds, calls), the most one command may\n"
    );
    assert!(done.stdout.is_empty());
}

#[test]
fn a_function_bomb_stops_at_the_depth_bound() {
    let (status, _, err) = run("bomb() { bomb | bomb; }; bomb");
    assert_eq!(status, 2);
    assert_eq!(
        err,
        "shell: stopped: calls, subshells and substitutions nested 64 deep, the most one command may\n"
    );
}

#[test]
fn endless_output_is_cut_at_the_bounds_and_said() {
    let (_dir, path) = folder();
    let limits = Limits {
        output_bytes: 100,
        pipe_bytes: 1000,
        ..Limits::default()
    };
    let mut shell = shell_in(&path, limits);
    // `yes` fills the pipe's room and no more; the last stage counts lines of it.
    let done = shell.run("yes | lines; yes");
    assert_eq!(String::from_utf8_lossy(&done.stdout[..4]), "500\n");
    assert_eq!(done.stdout.len(), 100);
    assert_eq!(done.stdout_dropped, 0, "yes was given only the room left");
    let done = shell.run("while true; do echo 0123456789; done");
    assert_eq!(done.stdout.len(), 100);
    assert!(done.stdout_dropped > 0);
}

#[test]
fn a_substitution_past_its_bound_stops_the_run() {
    let (_dir, path) = folder();
    let limits = Limits {
        pipe_bytes: 50,
        ..Limits::default()
    };
    let done = shell_in(&path, limits).run("x=$(printf '%0100d' 1); echo never");
    assert_eq!(done.status, 2);
    assert_eq!(
        String::from_utf8(done.stderr).unwrap(),
        "shell: stopped: a command substitution gave more than the 50 bytes one may\n"
    );
}

#[test]
fn escapes_of_ansi_c_quotes_echo_e_and_printf_b() {
    let (_, out, _) = run(
        r#"args $'a\tb\x41\101\'\q'; echo -e 'x\0101\ty\c never'; echo; printf '%b|' 'p\x42' 'q\c'"#,
    );
    assert_eq!(out, "<a\tbAA'\\q>\nxA\ty\npB|q");
}

#[test]
fn printf_formats() {
    let (_, out, _) =
        run(r#"printf '%s=%03d|%-4s|%x|%.2f|%%\n' a 7 b 255 3.14159; printf '%s,' x y z; echo"#);
    assert_eq!(out, "a=007|b   |ff|3.14|%\nx,y,z,\n");
}

#[test]
fn unsupported_constructs_are_refused_by_name() {
    let (status, _, err) = run("a=(1 2); echo ${a[0]}");
    assert_eq!(status, 2);
    assert_eq!(err, "shell: arrays are not supported\n");
}

#[test]
fn eval_and_source_run_text_in_this_shell() {
    let (dir, path) = folder();
    std::fs::write(format!("{}/lib.sh", dir.path()), "from_lib=yes\n").unwrap();
    let (_, out, err) = run_in(&path, "eval 'x=5; echo $x'; . ./lib.sh; echo $from_lib");
    assert_eq!(out, "5\nyes\n", "{err}");
}

/// A command writing to `/dev/null` is given room to write and keeps its status, as in bash
/// (`if grep -q ... > /dev/null`); what it wrote is thrown away.
#[test]
fn a_command_writing_to_dev_null_keeps_its_status() {
    let (_dir, path) = folder();
    let script = "if upper <<< 'hello' > /dev/null; then echo kept; fi\nargs a b > /dev/null 2>&1; echo $?\nyes > /dev/null; echo $?";
    let (status, out, err) = run_in(&path, script);
    assert_eq!(status, 0, "{err}");
    assert_eq!(out, "kept\n0\n141\n", "{err}");
}

/// `/dev/stdout`, `/dev/stderr` and `/dev/stdin` named in a redirection are the streams.
#[test]
fn the_streams_named_as_files_are_the_streams() {
    let (_dir, path) = folder();
    let script = "echo out > /dev/stdout; echo err >> /dev/stderr; upper < /dev/stdin <<< low; \
                  { echo both; } > /dev/fd/2";
    let (status, out, err) = run_in(&path, script);
    assert_eq!(status, 0, "{err}");
    assert_eq!((out.as_str(), err.as_str()), ("out\nLOW\n", "err\nboth\n"));
    assert!(
        !std::path::Path::new(&path).join("dev").exists(),
        "no file made for them"
    );
}

/// Nesting past what the parser's recursion can take is refused before parsing.
#[test]
fn deeply_nested_text_is_refused_before_it_is_parsed() {
    let n = 500;
    for script in [
        format!("[[ {} 1 ]]", "! ".repeat(1000)),
        format!("echo $(( {}1{} ))", "(".repeat(2000), ")".repeat(2000)),
        format!(
            "{} echo in; {}",
            "if true; then ".repeat(n),
            "fi; ".repeat(n)
        ),
        format!(
            "{} echo in; {}",
            "while false; do ".repeat(n),
            "done; ".repeat(n)
        ),
        format!(
            "{} echo in;; {} esac",
            "case x in x) ".repeat(n),
            "esac;; ".repeat(n - 1)
        ),
        format!("echo $(( {}1 ))", "- ".repeat(2000)),
        format!("echo $(( {}1{} ))", "1?".repeat(2000), ":0".repeat(2000)),
        // Texts parsed later are counted then: eval's, and a variable's in arithmetic.
        format!(
            "x='{} echo in; {}'; eval \"$x\"",
            "if true; then ".repeat(n),
            "fi; ".repeat(n)
        ),
        format!("x='{}1'; echo $((x)) $(( $x ))", "- ".repeat(2000)),
        format!("echo $(( 1{} ))", "**1".repeat(2000)),
        format!(
            "echo $(( {}1 ))",
            (1..5000).map(|i| format!("a{i}=")).collect::<String>()
        ),
        format!("x='1{}'; echo $((x))", "**1".repeat(2000)),
    ] {
        let (status, _, err) = run(&script);
        assert_eq!(status, 2);
        assert!(err.contains("more than the 200 a command may"), "{err}");
    }
    let (status, out, _) = run("[[ ! ! 1 ]] && echo ok; echo $(( ((1+2)) ))");
    assert_eq!((status, out.as_str()), (0, "ok\n3\n"));
    let (status, out, _) = run("echo $(( 2**3**2 )) $(( a = b = 4 )) $(( a == b ))");
    assert_eq!((status, out.as_str()), (0, "512 4 1\n"));
    // Prose is not nesting: the words and marks of a long text written by a here-document.
    let prose = "If you wait, then for a while: what? - done, in case! ~ -- ---\n".repeat(400);
    let (status, out, err) = run(&format!(
        "n=0; while read -r l; do n=$((n+1)); done <<'EOF'\n{prose}EOF\necho \"$n\" 'in case if'"
    ));
    assert_eq!((status, out.trim()), (0, "400 in case if"), "{err}");
    let (status, out, err) = run(&format!(
        "{} echo in; {}",
        "if true; then ".repeat(40),
        "fi; ".repeat(40)
    ));
    assert_eq!((status, out.as_str()), (0, "in\n"), "{err}");
}
