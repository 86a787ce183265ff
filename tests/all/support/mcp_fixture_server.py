"""An MCP server for the tests of external MCP servers (the `mcp` package from PyPI).

    python mcp_fixture_server.py [--started FILE] [--http PORT] [--stderr-flood BYTES] [--stderr-newlines N]

Serves over stdio, or streamable HTTP at http://127.0.0.1:PORT/mcp with --http. With
--started it writes FILE first, so a test can tell whether the server was ever started.
With --stderr-flood it first writes BYTES bytes to stderr in one line (no newline); with
--stderr-newlines N, N empty lines.
"""

import argparse
import json
import os

from mcp.server.mcpserver import Context, MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("--started")
parser.add_argument("--http", type=int)
parser.add_argument("--stderr-flood", type=int, default=0)
parser.add_argument("--stderr-newlines", type=int, default=0)
parser.add_argument("--linger", type=float, default=0)
opts = parser.parse_args()
if opts.stderr_flood:
    chunk = b"x" * (1 << 20)
    left = opts.stderr_flood
    while left > 0:
        os.write(2, chunk[: min(left, len(chunk))])
        left -= len(chunk)
if opts.stderr_newlines:
    os.write(2, b"\n" * opts.stderr_newlines)
if opts.started:
    with open(opts.started, "w") as f:
        f.write(str(os.getpid()))

server = MCPServer("fixture")


@server.tool(description="Echoes the text back, prefixed with `echo:`.")
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(description="The names of the environment variables the server was started with.")
def env_names() -> str:
    return json.dumps(sorted(os.environ))


@server.tool(description="The value of one request header (HTTP only).")
def header(name: str, ctx: Context) -> str:
    headers = ctx.headers or {}
    return headers.get(name, "")


@server.tool(description="Always fails.")
def fail() -> str:
    raise ValueError("the fixture tool failed on purpose")


@server.tool(description="A result of `size` bytes.")
def huge(size: int) -> str:
    return "x" * size


@server.tool(description="A result of `count` zeros: many small JSON values.")
def many(count: int) -> list[int]:
    return [0] * count


@server.tool(description="Fails with an error message of `size` bytes.")
def huge_error(size: int) -> str:
    from mcp.server.mcpserver.exceptions import ToolError

    raise ToolError("x" * size)


@server.tool(description="Asks the client for its roots `count` times during the call.")
async def roots_flood(count: int, ctx: Context) -> str:
    for _ in range(count):
        await ctx.session.list_roots()
    return "asked"


@server.tool(description="Answers after `seconds` seconds.")
async def hang(seconds: float) -> str:
    import anyio

    await anyio.sleep(seconds)
    return "woke"


@server.tool(description="Exits the server in the middle of the call.")
def die() -> str:
    os._exit(3)


try:
    if opts.http:
        server.run("streamable-http", host="127.0.0.1", port=opts.http)
    else:
        server.run()
finally:
    # A server slow to go: it stays this long after its input closed, however it ended
    # (only a kill ends it sooner).
    if opts.linger:
        import time

        time.sleep(opts.linger)
