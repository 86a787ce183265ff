"""The app module of a Python tool plugin: exports the `tool` interface of world
`tool-plugin` from the tools `plugin.py` registers with `trellis_plugin.tool`.

componentize-py imports this module at build time and snapshots the interpreter, so the
tools are registered (and `plugin.py`'s top level has run) before the first call.
"""

import json
import sys
import traceback

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import tool as _wit

import plugin  # noqa: F401 - its decorators register the tools
import trellis_plugin

_ERRORS = {
    "invalid-arguments": _wit.ToolError_InvalidArguments,
    "unknown-tool": _wit.ToolError_UnknownTool,
    "not-found": _wit.ToolError_NotFound,
    "denied": _wit.ToolError_Denied,
    "failed": _wit.ToolError_Failed,
}


class Tool(exports.Tool):
    """The `tool` export."""

    def list_tools(self):
        return [
            _wit.ToolInfo(
                name=t.name,
                description=t.description,
                input_schema=json.dumps(t.schema),
                hints=_wit.ToolHints(
                    read_only=t.read_only, destructive=t.destructive, idempotent=t.idempotent
                ),
            )
            for t in trellis_plugin.tools()
        ]

    def call_tool(self, name, arguments):
        try:
            result = trellis_plugin.call(name, json.loads(arguments))
            return json.dumps(result)
        except trellis_plugin.ToolError as err:
            raise Err(_ERRORS.get(err.kind, _wit.ToolError_Failed)(err.message))
        except Exception as err:  # noqa: BLE001 - every failure is the tool's to report
            traceback.print_exc(file=sys.stderr)
            raise Err(_wit.ToolError_Failed(f"{type(err).__name__}: {err}"))
