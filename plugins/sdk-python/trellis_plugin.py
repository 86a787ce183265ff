"""Write Trellis tool plugins in Python.

A tool is a function with the `@tool` decorator, which gives its JSON Schema
(draft 2020-12) and optional hints; its description is the docstring. The host
checks every call's arguments against the schema, then calls the function with
them as keyword arguments; it returns anything `json.dumps` accepts.

    from trellis_plugin import tool, NotFound

    @tool(schema={
        "type": "object",
        "properties": {"text": {"type": "string", "description": "The text to return."}},
        "required": ["text"],
        "additionalProperties": False,
    }, read_only=True)
    def echo(text):
        \"\"\"Returns its input.\"\"\"
        return {"text": text}

Errors are values the agent sees: raise `InvalidArguments`, `NotFound`,
`Denied` or `Failed` with a message. An `OSError` that escapes a tool becomes
`not-found` or `denied` (a path outside the folders granted to the call) or
`failed`; any other exception becomes `failed` with its type and message.

`trellis plugin build DIR` builds `DIR/plugin.py` into a component of world
`tool-plugin`. This module also runs under CPython, so tools can be tested with
`call(name, arguments)`, as the host would call them.
"""

import errno
import inspect
import json
import os
import stat
import sys

__all__ = [
    "Denied",
    "Failed",
    "InvalidArguments",
    "NotFound",
    "ToolError",
    "UnknownTool",
    "call",
    "log",
    "tool",
    "tools",
]


class ToolError(Exception):
    """A tool call that produced no result; `kind` is the WIT `tool-error` case."""

    kind = "failed"

    def __init__(self, message):
        super().__init__(message)
        self.message = str(message)


class InvalidArguments(ToolError):
    """The arguments were well-formed but not usable."""

    kind = "invalid-arguments"


class UnknownTool(ToolError):
    """No tool of that name in this plugin."""

    kind = "unknown-tool"


class NotFound(ToolError):
    """A path, file or record the call refers to does not exist."""

    kind = "not-found"


class Denied(ToolError):
    """The grant of this call does not allow the operation."""

    kind = "denied"


class Failed(ToolError):
    """Anything else that went wrong."""

    kind = "failed"


class Tool:
    """A registered tool: its name, description, schema, hints and function."""

    def __init__(self, name, description, schema, read_only, destructive, idempotent, function):
        self.name = name
        self.description = description
        self.schema = schema
        self.read_only = read_only
        self.destructive = destructive
        self.idempotent = idempotent
        self.function = function


_TOOLS = {}


def tool(name=None, *, schema, description=None, read_only=False, destructive=False,
         idempotent=False):
    """Registers the decorated function as a tool.

    `name` defaults to the function's name (it must be `snake_case`),
    `description` to its docstring; `schema` is the JSON Schema of the
    arguments object. `read_only`, `destructive` and `idempotent` are the hints
    the host and the model see.
    """

    def register(function):
        tool_name = name or function.__name__
        if not tool_name.isascii() or not tool_name.replace("_", "a").isalnum() \
                or not tool_name[0].isalpha() \
                or tool_name.lower() != tool_name:
            raise ValueError(f"tool name {tool_name!r}: expected snake_case, e.g. count_words")
        if tool_name in _TOOLS:
            raise ValueError(f"tool name {tool_name!r} is registered twice")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ValueError(f"tool {tool_name!r}: schema must be a dict with \"type\": \"object\"")
        text = description or inspect.getdoc(function)
        if not text:
            raise ValueError(f"tool {tool_name!r}: give a description or a docstring")
        json.dumps(schema)  # a schema that is not JSON fails here, not in the host
        _TOOLS[tool_name] = Tool(tool_name, text, schema, bool(read_only), bool(destructive),
                                 bool(idempotent), function)
        return function

    return register


def tools():
    """The registered tools, in the order they were defined."""
    return list(_TOOLS.values())


def call(name, arguments):
    """Calls tool `name` with `arguments` (a dict) as the host does; returns its result.

    Raises `UnknownTool`, `InvalidArguments` when the arguments do not fit the
    function's parameters, the `ToolError` the tool raised, or the `ToolError`
    an escaped `OSError` stands for.
    """
    registered = _TOOLS.get(name)
    if registered is None:
        known = ", ".join(_TOOLS) or "none"
        raise UnknownTool(f"no tool {name!r} in this plugin (its tools: {known})")
    if not isinstance(arguments, dict):
        raise InvalidArguments("expected a JSON object of arguments")
    try:
        inspect.signature(registered.function).bind(**arguments)
    except TypeError as err:
        raise InvalidArguments(str(err)) from None
    try:
        return registered.function(**arguments)
    except OSError as err:
        raise from_os_error(err) from None


def from_os_error(err, path=None):
    """The `ToolError` an `OSError` stands for: a path outside the folders granted to
    the call is `Denied`, a missing one `NotFound`."""
    path = path or err.filename or ""
    outside = Denied(f"`{path}` is outside the folders granted to this call")
    # WASI's ENOTCAPABLE: the path lies under none of the folders granted to the call.
    if err.errno == 76:
        return outside
    if isinstance(err, FileNotFoundError):
        if path and _outside_grants(str(path)):
            return outside
        return NotFound(f"`{path}` does not exist")
    if isinstance(err, PermissionError) and ".." in str(path).split("/"):
        return Denied(f"`{path}` is outside the folders granted to this call (a `..` climbs out)")
    if err.errno == errno.EROFS:
        return Denied(f"`{path}` is in a read-only folder")
    if isinstance(err, PermissionError) and _hard_links(path) > 1:
        # The host never opens a file with other hard links for writing: another of its
        # links may be a file of a read-only folder or outside every grant.
        return Denied(
            f"`{path}` has other hard links, so it cannot be written in place (another link "
            f"may be a file of a read-only folder or outside the grants); in a writable "
            f"folder, write a new file and rename it over `{path}` instead"
        )
    if isinstance(err, PermissionError):
        return Denied(
            f"`{path}` is in a read-only folder, or outside the folders granted to this call"
        )
    if isinstance(err, IsADirectoryError):
        return Failed(f"`{path}` is a folder, not a file")
    return Failed(f"`{path}`: {err.strerror or err}")


def _hard_links(path):
    # How many hard links the regular file at `path` has; 0 when it is not one.
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return 0
    return st.st_nlink if stat.S_ISREG(st.st_mode) else 0


def _outside_grants(path):
    # Only the granted folders and what is in them exist for a plugin: a path is outside
    # them exactly when none of its folders exists.
    folder = os.path.dirname(path if path.startswith("/") else "/" + path)
    while True:
        if os.path.exists(folder):
            return False
        if folder == "/":
            return True
        folder = os.path.dirname(folder)


_LEVELS = ("trace", "debug", "info", "warn", "error")


def log(level, message):
    """Writes one line to the host's log (`level`: trace, debug, info, warn, error);
    under CPython, to stderr."""
    if level not in _LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(_LEVELS)}")
    try:
        from wit_world.imports import host
    except ImportError:
        print(f"[{level}] {message}", file=sys.stderr)
        return
    host.log(host.LogLevel[level.upper()], str(message))
