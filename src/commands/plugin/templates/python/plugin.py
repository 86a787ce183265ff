"""The `__ID__` tool plugin: its tools are `__ID__:<name>` to agents.

Build with `trellis plugin build .`; test with `python3 -m unittest`.

Every call runs in a fresh sandbox that sees only the folders granted to it, at
their workspace-relative paths; there is no network and no environment.
"""

from trellis_plugin import tool


@tool(
    schema={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "A file inside the folders granted to the call, e.g. `notes/today.md`.",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    read_only=True,
)
def count_words(path):
    """Counts the words and lines of a text file."""
    with open(path, encoding="utf-8") as file:
        return counts(file.read())


def counts(text):
    """The counts of `text`, kept apart from the file access so it can be tested anywhere."""
    return {"words": len(text.split()), "lines": len(text.splitlines())}
