//! `trellis plugin new`: writes a plugin project from the templates beside this file.
//!
//! Every project has a `plugin.json` naming `<id>.wasm`, sources with one working example
//! (a tool, a validator rule, a provider), a test of it that runs on the build machine, a
//! README saying how to build, test and load it, and a `.gitignore`. Nothing is written
//! until every argument has been checked, and an existing non-empty folder is never
//! touched.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use trellis_sandbox::plugins::manifest::check_id;

use super::{Kind, Lang, NewArgs, python_build};

const CARGO_TOML: &str = include_str!("templates/rust/Cargo.toml");
const RUST_TOOL: &str = include_str!("templates/rust/tool.rs");
const RUST_VALIDATOR: &str = include_str!("templates/rust/validator.rs");
const RUST_LLM_PROVIDER: &str = include_str!("templates/rust/llm_provider.rs");
const PYTHON_TOOL: &str = include_str!("templates/python/plugin.py");
const PYTHON_TEST: &str = include_str!("templates/python/test_plugin.py");

/// The SDK of the checkout this binary was built from.
fn default_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/sdk")
}

/// Creates the project `args` describes.
pub fn create(args: &NewArgs) -> Result<()> {
    let dir = &args.dir;
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: expected a folder name", dir.display()))?;
    check_id(id).with_context(|| {
        format!(
            "{}: the folder name is the plugin id, and it is not one",
            dir.display()
        )
    })?;
    if args.lang == Lang::Python && args.kind != Kind::Tool {
        bail!(
            "--lang python offers --kind tool only: write {} plugins in Rust (--lang rust, the default)",
            args.kind.plugin_kind()
        );
    }
    if args.lang == Lang::Python && (args.sdk_path.is_some() || args.sdk_git.is_some()) {
        bail!("--sdk-path and --sdk-git are for Rust projects: a Python plugin needs no SDK crate");
    }
    if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!(
            "{}: the folder exists and is not empty; give a new folder",
            dir.display()
        );
    }
    let files = match args.lang {
        Lang::Rust => rust_files(id, args)?,
        Lang::Python => python_files(id),
    };
    let mut all = files;
    all.push((
        "plugin.json".into(),
        // Written by hand to keep the keys in the order docs/plugins.md gives them.
        format!(
            "{{\n  \"id\": {},\n  \"kind\": {},\n  \"version\": \"0.1.0\",\n  \"description\": {},\n  \"component\": {}\n}}\n",
            serde_json::Value::from(id),
            serde_json::Value::from(args.kind.plugin_kind().as_str()),
            serde_json::Value::from(description(args.kind)),
            serde_json::Value::from(format!("{id}.wasm")),
        ),
    ));
    all.push(("README.md".into(), readme(id, args)));
    for (rel, text) in &all {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!(
        "created the {} {} plugin `{id}` in {}",
        lang_name(args.lang),
        args.kind.plugin_kind(),
        dir.display()
    );
    println!(
        "build it: trellis plugin build {}   test it: {}",
        dir.display(),
        test_command(args.lang)
    );
    Ok(())
}

fn lang_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
    }
}

fn test_command(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "cargo test",
        Lang::Python => "python3 -m unittest",
    }
}

fn description(kind: Kind) -> &'static str {
    match kind {
        Kind::Tool => "Counts the words and lines of text files.",
        Kind::Validator => "Checks that a file has enough non-blank lines.",
        Kind::LlmProvider => "A language model behind an HTTP API.",
    }
}

/// The dependency line of the SDK: `{ path = ... }` or `{ git = ... }`.
fn sdk_dependency(args: &NewArgs) -> Result<String> {
    if let Some(url) = &args.sdk_git {
        return Ok(format!("{{ git = {} }}", toml_string(url)));
    }
    let path = match &args.sdk_path {
        Some(path) => path.clone(),
        None => default_sdk(),
    };
    let path = std::path::absolute(&path).unwrap_or(path);
    if !path.join("Cargo.toml").is_file() {
        bail!(
            "the plugin SDK is not at {} (no Cargo.toml): give --sdk-path DIR (a Trellis checkout's plugins/sdk) or --sdk-git URL",
            path.display()
        );
    }
    Ok(format!(
        "{{ path = {} }}",
        toml_string(&path.display().to_string())
    ))
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn rust_files(id: &str, args: &NewArgs) -> Result<Vec<(String, String)>> {
    let source = match args.kind {
        Kind::Tool => RUST_TOOL,
        Kind::Validator => RUST_VALIDATOR,
        Kind::LlmProvider => RUST_LLM_PROVIDER,
    };
    let manifest = CARGO_TOML
        .replace("__ID__", id)
        .replace("__SDK__", &sdk_dependency(args)?);
    Ok(vec![
        ("Cargo.toml".into(), manifest),
        ("src/lib.rs".into(), source.replace("__ID__", id)),
        (".gitignore".into(), "/target\n/dist\n".into()),
    ])
}

fn python_files(id: &str) -> Vec<(String, String)> {
    vec![
        (
            python_build::ENTRY_FILE.into(),
            PYTHON_TOOL.replace("__ID__", id),
        ),
        ("test_plugin.py".into(), PYTHON_TEST.replace("__ID__", id)),
        (
            python_build::SDK_FILE.into(),
            python_build::sdk_copy_for_tests(),
        ),
        (".gitignore".into(), "/dist\n__pycache__/\n".into()),
    ]
}

fn readme(id: &str, args: &NewArgs) -> String {
    let kind = args.kind.plugin_kind();
    let sources = match args.lang {
        Lang::Rust => "`src/lib.rs`",
        Lang::Python => "`plugin.py` (with the `trellis_plugin` module beside it)",
    };
    let try_it = match args.kind {
        Kind::Tool => format!(
            "trellis tool call {id}:count_words --plugins dist --read . --args '{{\"path\": \"README.md\"}}'"
        ),
        Kind::Validator => format!(
            "# a file rule of a validation_schema: {{\"file_name\": \"notes.md\", \"validation_type\": \"{id}\", \"min_lines\": 3}}"
        ),
        Kind::LlmProvider => format!(
            "trellis run WS --plugins dist --llm {id}:MODEL   # workflow.json: \"providers\": {{\"{id}\": {{\"base_url\": ...}}}}"
        ),
    };
    format!(
        "# {id}\n\nA Trellis {kind} plugin in {lang}: {sources}.\n\n```sh\n{test}                       # its tests, on this machine\ntrellis plugin build .           # dist/{id}.wasm and dist/plugin.json\ntrellis plugins list --plugins dist\n{try_it}\n```\n\nWriting and publishing plugins: docs/plugins.md of Trellis.\n",
        lang = lang_name(args.lang),
        test = test_command(args.lang),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_escape_quotes_backslashes_and_controls() {
        assert_eq!(toml_string(r#"C:\sdk "x""#), r#""C:\\sdk \"x\"""#);
        assert_eq!(toml_string("a\nb"), "\"a\\u000Ab\"");
    }
}
