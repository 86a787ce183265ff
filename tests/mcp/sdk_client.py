"""An independent MCP client for the tests of `trellis mcp serve`: the official Python SDK.

Reads a plan (JSON) on stdin, connects over stdio (spawning `command` with `env`) or
streamable HTTP (`url`, with `token` as a bearer token), lists the tools, makes each call
of `calls` in order, and prints what it saw as one JSON object on stdout:

    {"server": NAME, "tools": [{"name", "annotations"}...],
     "results": [{"is_error", "text", "structured"} or {"protocol_error"}...],
     "cancelled": [NAME...]}

A call with `"cancel_when_exists": PATH` is abandoned as soon as the file PATH exists (the
guest writes it once it has started), which makes the SDK send `notifications/cancelled`.
"""

import json
import os
import sys

import anyio
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def session_run(read, write, plan):
    out = {"tools": [], "results": [], "cancelled": []}
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        out["server"] = init.server_info.name
        listed = await session.list_tools()
        for tool in listed.tools:
            annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
            out["tools"].append({"name": tool.name, "annotations": annotations})
        for call in plan.get("calls", []):
            marker = call.get("cancel_when_exists")
            if marker is not None:
                with anyio.CancelScope() as scope:

                    async def cancel_once_started():
                        while not os.path.exists(marker):
                            await anyio.sleep(0.01)
                        scope.cancel()

                    async with anyio.create_task_group() as group:
                        group.start_soon(cancel_once_started)
                        await session.call_tool(call["name"], call.get("arguments", {}))
                out["cancelled"].append(call["name"])
                # Gives the server a moment to see the notification before the next call.
                await anyio.sleep(0.2)
                continue
            try:
                result = await session.call_tool(call["name"], call.get("arguments", {}))
            except MCPError as err:
                out["results"].append({"protocol_error": str(err)})
                continue
            text = "".join(block.text for block in result.content if getattr(block, "type", "") == "text")
            out["results"].append(
                {"is_error": result.is_error, "text": text, "structured": result.structured_content}
            )
    return out


async def main():
    plan = json.load(sys.stdin)
    if plan["transport"] == "stdio":
        params = StdioServerParameters(command=plan["command"][0], args=plan["command"][1:], env=plan.get("env"))
        async with stdio_client(params) as (read, write):
            out = await session_run(read, write, plan)
    else:
        headers = {"Authorization": f"Bearer {plan['token']}"} if plan.get("token") else None
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(plan["url"], http_client=http) as streams:
                out = await session_run(streams[0], streams[1], plan)
    json.dump(out, sys.stdout)


anyio.run(main)
