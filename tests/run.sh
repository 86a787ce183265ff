#!/usr/bin/env bash
# The whole test suite: the host workspace (unit, sandbox, plugin and CLI tests,
# with every guest component built from source by the build script) and the
# guest crates' own unit tests, which run natively.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
cargo test --manifest-path plugins/Cargo.toml --workspace --locked
