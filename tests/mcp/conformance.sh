#!/usr/bin/env bash
# Runs the MCP conformance suite (server mode) against `trellis mcp serve --http`, with
# tests/mcp/conformance-baseline.yml listing the scenarios a server of tools alone does not
# pass (resources, prompts, sampling, the fixed tools of the suite's reference server...).
# The suite fails on a scenario that fails and is not listed, and on one that is listed but
# passes, so the baseline stays exact.
#
# Node 22 and the suite are installed (pinned) in $MCP_CONFORMANCE_DIR, outside the clone;
# the trellis binary is $TRELLIS_BIN (default: $CARGO_TARGET_DIR/debug/trellis).
set -euo pipefail
cd "$(dirname "$0")/../.."

CONFORMANCE_VERSION=0.1.16
NODE_VERSION=22
target="${CARGO_TARGET_DIR:-target}"
dir="${MCP_CONFORMANCE_DIR:-$target/mcp-conformance}"
trellis="${TRELLIS_BIN:-$target/debug/trellis}"

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# The suite's `conformance` runs on the first `node` of PATH: this Node 22.
export PATH="$dir/node_modules/.bin:$PATH"
if [ "$(conformance --version 2>/dev/null)" != "$CONFORMANCE_VERSION" ] ||
  ! node --version 2>/dev/null | grep -q "^v$NODE_VERSION\."; then
  (cd "$dir" && { [ -f package.json ] || npm init -y >/dev/null; } &&
    npm install --no-audit --no-fund --silent "node@$NODE_VERSION" \
      "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION")
fi

work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/root/shared"
echo "conformance" > "$work/root/shared/notes.md"
# The log exists before the server starts: the loop below may read it before the
# background process has opened it.
: > "$work/server.log"
"$trellis" mcp serve --http 127.0.0.1:0 --root "$work/root" --read shared \
  2> "$work/server.log" &
server_pid=$!
url=
for _ in $(seq 1 600); do
  url=$(sed -n 's/^trellis: serving MCP at //p' "$work/server.log")
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "the server did not start"; cat "$work/server.log"; exit 1; }
echo "serving at $url"

baseline="$PWD/tests/mcp/conformance-baseline.yml"
cd "$work"
timeout 600 conformance server --url "$url" --expected-failures "$baseline"
