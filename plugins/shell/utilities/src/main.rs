//! The commands of Trellis's sandboxed shell, one `wasi:cli` command: the first argument
//! names the utility, as in a multicall binary. The host runs it as a fresh instance for
//! every command, with the calling tool call's folders, so a utility sees exactly what the
//! shell sees, and nothing of one command outlives it.
//!
//! The file utilities are uutils coreutils' (and uutils sed), built for WASI; `grep`, `find`, `jq` (on jaq)
//! and `diff` (on similar) are this crate's own, on maintained crates.

mod diff;
mod find;
mod grep;
mod jq;

use std::ffi::OsString;

/// The arguments after the utility's name, as text (a byte that is not UTF-8 becomes
/// U+FFFD).
pub(crate) fn arguments(args: &[OsString]) -> Vec<String> {
    args.iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// An I/O error's message without Rust's ` (os error N)` suffix.
pub(crate) fn io_msg(e: &std::io::Error) -> String {
    let s = e.to_string();
    s.find(" (os error")
        .map_or(s.clone(), |i| s[..i].to_string())
}

/// Runs the utility `args[0]` with `args`; its exit status.
fn run(args: Vec<OsString>) -> i32 {
    let name = args
        .first()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // uutils' messages are Fluent resources embedded in the binary; without them a utility
    // prints message keys.
    let localized = |util: &str| {
        let _ = uucore::locale::setup_localization(util);
    };
    match name.as_str() {
        "diff" => diff::main(args),
        "find" => find::main(args),
        "grep" => grep::main(args),
        "jq" => jq::main(args),
        "sed" => {
            localized("sed");
            sed::sed::uumain(args.into_iter())
        }
        "base64" => {
            localized("base64");
            uu_base64::uumain(args.into_iter())
        }
        "basename" => {
            localized("basename");
            uu_basename::uumain(args.into_iter())
        }
        "cat" => {
            localized("cat");
            uu_cat::uumain(args.into_iter())
        }
        "comm" => {
            localized("comm");
            uu_comm::uumain(args.into_iter())
        }
        "cp" => {
            localized("cp");
            uu_cp::uumain(args.into_iter())
        }
        "cut" => {
            localized("cut");
            uu_cut::uumain(args.into_iter())
        }
        "date" => {
            localized("date");
            uu_date::uumain(args.into_iter())
        }
        "dirname" => {
            localized("dirname");
            uu_dirname::uumain(args.into_iter())
        }
        "expand" => {
            localized("expand");
            uu_expand::uumain(args.into_iter())
        }
        "fold" => {
            localized("fold");
            uu_fold::uumain(args.into_iter())
        }
        "head" => {
            localized("head");
            uu_head::uumain(args.into_iter())
        }
        "join" => {
            localized("join");
            uu_join::uumain(args.into_iter())
        }
        "ln" => {
            localized("ln");
            uu_ln::uumain(args.into_iter())
        }
        "ls" => {
            localized("ls");
            uu_ls::uumain(args.into_iter())
        }
        "md5sum" => {
            localized("md5sum");
            uu_md5sum::uumain(args.into_iter())
        }
        "mkdir" => {
            localized("mkdir");
            uu_mkdir::uumain(args.into_iter())
        }
        "mv" => {
            localized("mv");
            uu_mv::uumain(args.into_iter())
        }
        "nl" => {
            localized("nl");
            uu_nl::uumain(args.into_iter())
        }
        "od" => {
            localized("od");
            uu_od::uumain(args.into_iter())
        }
        "paste" => {
            localized("paste");
            uu_paste::uumain(args.into_iter())
        }
        "readlink" => {
            localized("readlink");
            uu_readlink::uumain(args.into_iter())
        }
        "realpath" => {
            localized("realpath");
            uu_realpath::uumain(args.into_iter())
        }
        "rm" => {
            localized("rm");
            uu_rm::uumain(args.into_iter())
        }
        "rmdir" => {
            localized("rmdir");
            uu_rmdir::uumain(args.into_iter())
        }
        "seq" => {
            localized("seq");
            uu_seq::uumain(args.into_iter())
        }
        "sha256sum" => {
            localized("sha256sum");
            uu_sha256sum::uumain(args.into_iter())
        }
        "shuf" => {
            localized("shuf");
            uu_shuf::uumain(args.into_iter())
        }
        "sleep" => {
            localized("sleep");
            uu_sleep::uumain(args.into_iter())
        }
        "sort" => {
            localized("sort");
            uu_sort::uumain(args.into_iter())
        }
        "split" => {
            localized("split");
            uu_split::uumain(args.into_iter())
        }
        "tac" => {
            localized("tac");
            uu_tac::uumain(args.into_iter())
        }
        "tail" => {
            localized("tail");
            uu_tail::uumain(args.into_iter())
        }
        "tee" => {
            localized("tee");
            uu_tee::uumain(args.into_iter())
        }
        "touch" => {
            localized("touch");
            uu_touch::uumain(args.into_iter())
        }
        "tr" => {
            localized("tr");
            uu_tr::uumain(args.into_iter())
        }
        "truncate" => {
            localized("truncate");
            uu_truncate::uumain(args.into_iter())
        }
        "uniq" => {
            localized("uniq");
            uu_uniq::uumain(args.into_iter())
        }
        "wc" => {
            localized("wc");
            uu_wc::uumain(args.into_iter())
        }
        "yes" => {
            localized("yes");
            uu_yes::uumain(args.into_iter())
        }
        other => {
            eprintln!("command not found: {other}");
            127
        }
    }
}

fn main() {
    // The shell's working folder: the host passes it as `PWD` (WASI has no working folder
    // of its own; wasi-libc keeps one, `/` until changed).
    if let Ok(cwd) = std::env::var("PWD")
        && cwd != "/"
        && let Err(err) = std::env::set_current_dir(&cwd)
    {
        eprintln!("cannot enter the working folder {cwd}: {err}");
        std::process::exit(126);
    }
    let status = run(std::env::args_os().collect());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(status);
}
