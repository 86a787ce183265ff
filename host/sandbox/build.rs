//! Builds the guest plugins in `plugins/` for `wasm32-wasip2` so the bundled
//! ones can be embedded in the binary. (Test-only guests are built by the
//! trellis-test-programs crate in `tests/programs`, never by a production build.)
//!
//! The guests are a separate cargo workspace with its own target folder
//! (`<target>/wasm-plugins`), always built in release mode: they are small,
//! and an optimized guest keeps calls fast in every host profile.
//!
//! It also builds the Python script runner (`plugins/runners/python`, world
//! `script-runner` of `wit/trellis-plugin@0.2.0/script.wit`) with componentize-py, which it
//! installs at a pinned version into a virtual environment of its own
//! (`<target>/python-tools/venv`); see [`python_runner`].

#[path = "build/guests.rs"]
mod guests;

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use guests::{TARGET, build_workspace, ensure_target, target_dir};

/// Components embedded in the `trellis` binary.
const BUNDLED: &[&str] = &[
    "workspace",
    "shell",
    "shell_utilities",
    "csv_validator",
    "openai",
    "anthropic",
    "replay",
];
/// zstd level of the embedded Python script runner (the only level the pure-Rust encoder
/// implements besides none).
const ZSTD_LEVEL: ruzstd::encoding::CompressionLevel = ruzstd::encoding::CompressionLevel::Fastest;
/// The componentize-py release the Python script runner is built with.
const COMPONENTIZE_PY_VERSION: &str = "0.25.1";
/// The WIT package the Python script runner is built against (with its WASI WIT in `deps/`).
const WIT_PACKAGE: &str = "wit/trellis-plugin@0.2.0";
/// The world the Python script runner implements (`wit/trellis-plugin@0.2.0/script.wit`).
const SCRIPT_WORLD: &str = "script-runner";
/// The runner's Python module that implements the world.
const RUNNER_APP: &str = "trellis_runner";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    // host/sandbox -> the repository root.
    let root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let plugins = root.join("plugins");
    for watched in [
        "Cargo.toml",
        "Cargo.lock",
        "sdk",
        "workspace",
        "shell",
        "validators",
        "providers",
        "runners",
    ] {
        println!("cargo:rerun-if-changed={}", plugins.join(watched).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("wit").display());
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("build").display()
    );
    // The interpreter that creates the componentize-py virtual environment.
    println!("cargo:rerun-if-env-changed=PYTHON");

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    // `trellis plugin build` builds Python tool plugins with the same componentize-py, and
    // reuses this build's virtual environment for it when it is still there.
    println!("cargo:rustc-env=TRELLIS_COMPONENTIZE_PY_VERSION={COMPONENTIZE_PY_VERSION}");
    println!(
        "cargo:rustc-env=TRELLIS_BUILD_PYTHON_VENV={}",
        python_venv(&target_dir(&out_dir)).display()
    );

    // A fuzzing build (cargo-fuzz sets `--cfg fuzzing`; see fuzz/) runs parsers and never a
    // guest: it embeds empty components, so it needs neither the wasm target nor componentize-py.
    if env::var_os("CARGO_CFG_FUZZING").is_some() {
        let empty = |name: &str| {
            format!(
                "/// Empty in a fuzzing build.\npub static {}: &[u8] = &[];\n",
                name.to_uppercase()
            )
        };
        let components: String = BUNDLED.iter().map(|n| empty(n)).collect();
        std::fs::write(out_dir.join("components.rs"), components).unwrap();
        std::fs::write(
            out_dir.join("python_runner.rs"),
            empty("python_runner_zstd"),
        )
        .unwrap();
        return;
    }
    ensure_target();
    let wasm_target_dir = target_dir(&out_dir).join("wasm-plugins");
    build_workspace(&plugins, &wasm_target_dir);

    let release = wasm_target_dir.join(TARGET).join("release");
    let mut generated = String::new();
    for name in BUNDLED {
        let path = release.join(format!("{name}.wasm"));
        if !path.is_file() {
            panic!(
                "trellis build: expected {} after building plugins/",
                path.display()
            );
        }
    }
    for name in BUNDLED {
        let path = release.join(format!("{name}.wasm"));
        generated.push_str(&format!(
            "/// The `{name}` component, built from `plugins/`.\npub static {}: &[u8] = include_bytes!({:?});\n",
            name.to_uppercase(),
            path.display().to_string()
        ));
    }
    std::fs::write(out_dir.join("components.rs"), generated).unwrap();

    // A file of its own, included only by the script module.
    let runner = python_runner(&root, &target_dir(&out_dir));
    std::fs::write(
        out_dir.join("python_runner.rs"),
        format!(
            "/// The Python script runner (world `{SCRIPT_WORLD}`), built from `plugins/runners/python`, zstd-compressed.\npub static PYTHON_RUNNER_ZSTD: &[u8] = include_bytes!({:?});\n",
            runner.display().to_string()
        ),
    )
    .unwrap();
}

/// Builds the Python script runner component and returns the path of its zstd-compressed
/// copy, `<target>/python-runner/script_runner.wasm.zst`.
///
/// componentize-py pre-initializes the component: the app's top level (which
/// imports the standard library modules scripts commonly use) runs at build
/// time and the interpreter's memory is snapshotted, so a script starts with
/// them loaded. The build is skipped when a stamp of its inputs (the app, the
/// WIT, the componentize-py version) matches the one beside the component.
///
/// The component (~26 MB, most of it the interpreter's memory snapshot) is embedded
/// compressed (~7 MB): the host decompresses it only to compile it, when the compiled
/// form is not in the component cache yet.
fn python_runner(root: &Path, target_dir: &Path) -> PathBuf {
    let app = root.join("plugins/runners/python");
    let wit = root.join(WIT_PACKAGE);
    let out_dir = target_dir.join("python-runner");
    let component = out_dir.join("script_runner.wasm");
    let compressed = out_dir.join("script_runner.wasm.zst");
    let stamp_file = out_dir.join("script_runner.stamp");
    let stamp = inputs_stamp(&[&app, &wit]);
    std::fs::create_dir_all(&out_dir)
        .unwrap_or_else(|e| panic!("trellis build: cannot create {}: {e}", out_dir.display()));
    // Two builds of the host (tests and clippy, say) may run at once: one builds, the other waits.
    let lock = std::fs::File::create(out_dir.join(".lock"))
        .and_then(|f| f.lock().map(|()| f))
        .unwrap_or_else(|e| panic!("trellis build: cannot lock {}: {e}", out_dir.display()));
    if component.is_file() && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        // A copy older than the component (or none) is made again.
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        if modified(&compressed).is_none_or(|c| Some(c) < modified(&component)) {
            compress(&component, &compressed);
        }
        return compressed;
    }
    let tool = componentize_py(target_dir);

    // componentize-py writes `__pycache__` next to the app's modules: build from a copy.
    let staging = out_dir.join("app");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).unwrap();
    for entry in std::fs::read_dir(&app).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, staging.join(entry.file_name())).unwrap();
        }
    }
    let partial = out_dir.join("script_runner.wasm.partial");
    let output = Command::new(&tool)
        .arg("-d")
        .arg(&wit)
        .args(["-w", SCRIPT_WORLD, "componentize", "-p"])
        .arg(&staging)
        .arg(RUNNER_APP)
        .arg("-o")
        .arg(&partial)
        // The app must not pick up packages of whatever virtual environment is active.
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONPATH")
        .output()
        .unwrap_or_else(|e| panic!("trellis build: cannot run {}: {e}", tool.display()));
    if !output.status.success() {
        panic!(
            "trellis build: componentize-py could not build the Python script runner from {}:\n{}{}",
            app.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&partial, &component).unwrap();
    compress(&component, &compressed);
    std::fs::write(&stamp_file, &stamp).unwrap();
    drop(lock);
    compressed
}

/// Writes `component` zstd-compressed to `compressed` (through a temporary file: a build
/// stopped half-way leaves no truncated copy).
fn compress(component: &Path, compressed: &Path) {
    let bytes = std::fs::read(component)
        .unwrap_or_else(|e| panic!("trellis build: cannot read {}: {e}", component.display()));
    let packed = ruzstd::encoding::compress_to_vec(bytes.as_slice(), ZSTD_LEVEL);
    let partial = compressed.with_extension("zst.partial");
    std::fs::write(&partial, packed).unwrap();
    std::fs::rename(&partial, compressed).unwrap();
}

/// A digest of every file under `dirs` (path and content) and of the tool version.
fn inputs_stamp(dirs: &[&Path]) -> String {
    use std::hash::{Hash, Hasher};
    let mut files = Vec::new();
    for dir in dirs {
        collect_files(dir, &mut files);
    }
    files.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    COMPONENTIZE_PY_VERSION.hash(&mut hasher);
    SCRIPT_WORLD.hash(&mut hasher);
    for file in files {
        // Only sources: a README edit or a stray `__pycache__` does not rebuild.
        if !file.extension().is_some_and(|e| e == "py" || e == "wit") {
            continue;
        }
        file.hash(&mut hasher);
        std::fs::read(&file).unwrap_or_default().hash(&mut hasher);
    }
    format!(
        "componentize-py {COMPONENTIZE_PY_VERSION} {:016x}\n",
        hasher.finish()
    )
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The virtual environment componentize-py is installed in.
fn python_venv(target_dir: &Path) -> PathBuf {
    target_dir.join("python-tools").join("venv")
}

/// The `componentize-py` of `<target>/python-tools/venv`, installed there at
/// [`COMPONENTIZE_PY_VERSION`] when missing, or a stop with one line saying what to run.
fn componentize_py(target_dir: &Path) -> PathBuf {
    let venv = python_venv(target_dir);
    let tool = venv.join("bin").join("componentize-py");
    let wanted = format!("componentize-py {COMPONENTIZE_PY_VERSION}");
    let installed = || {
        Command::new(&tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == wanted
            })
    };
    if installed() {
        return tool;
    }
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let quiet = |cmd: &mut Command| {
        cmd.output()
            .map(|o| {
                if !o.status.success() {
                    eprintln!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
                o.status.success()
            })
            .unwrap_or(false)
    };
    // Made afresh (`--clear`): a venv's scripts name the folder it was made in, so one that
    // was copied or moved with its target folder has tools that no longer start.
    let ok = quiet(
        Command::new(&python)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    ) && quiet(
        Command::new(venv.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(format!("componentize-py=={COMPONENTIZE_PY_VERSION}")),
    );
    if !ok || !installed() {
        panic!(
            "trellis build: componentize-py {COMPONENTIZE_PY_VERSION} (for the Python script runner) could not be installed; run `{python} -m venv {venv} && {venv}/bin/pip install componentize-py=={COMPONENTIZE_PY_VERSION}` (Python 3.10+ with venv and pip, and PyPI reachable; on Debian or Ubuntu: `apt-get install python3-venv`)",
            venv = venv.display()
        );
    }
    tool
}
