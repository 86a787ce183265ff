"""The `csv-stats` tool plugin: column statistics of CSV files, written in Python.

Build it with `trellis plugin build examples/plugins/csv-stats` (into its `dist/`), then:

    trellis tool call csv-stats:csv_stats --plugins examples/plugins/csv-stats/dist \
      --root examples/ticket-triage --read knowledgebase \
      --args '{"path": "knowledgebase/tickets.csv"}'

Each call sees only the folders granted to it; a path anywhere else is refused
with `denied`, and the plugin has no network.
"""

import csv
import io
import json
import os

from trellis_plugin import Failed, InvalidArguments, tool

PATH = {
    "type": "string",
    "description": "A CSV file (with a header row) inside the folders granted to the call, "
    "e.g. `knowledgebase/sales.csv`.",
}


@tool(
    schema={
        "type": "object",
        "properties": {
            "path": PATH,
            "columns": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Only these columns (default: all).",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    read_only=True,
)
def csv_stats(path, columns=None):
    """Reads a CSV file and returns its row count and, per column, how many values are
    filled in and, for numeric columns, their minimum, maximum and mean."""
    with open(path, encoding="utf-8", newline="") as file:
        return stats(file.read(), columns)


@tool(
    schema={
        "type": "object",
        "properties": {
            "path": PATH,
            "out": {
                "type": "string",
                "description": "The JSON file to write, in a folder the call may write, "
                "e.g. `runs/iteration-0/execution/report/stats.json`.",
            },
        },
        "required": ["path", "out"],
        "additionalProperties": False,
    },
    idempotent=True,
)
def write_stats(path, out):
    """Writes the statistics of a CSV file (as `csv_stats` returns them) to a JSON file,
    replacing it; returns the path written and the row count."""
    if not out.endswith(".json"):
        raise InvalidArguments(f"out: expected a .json file, found {out!r}")
    with open(path, encoding="utf-8", newline="") as file:
        result = stats(file.read(), None)
    folder = os.path.dirname(out)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(out, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=2)
    return {"written": out, "rows": result["rows"]}


def stats(text, columns):
    """The statistics of CSV `text` (kept apart from the files, to test it anywhere)."""
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise Failed("the file has no header row")
    wanted = list(columns) if columns else list(reader.fieldnames)
    missing = [c for c in wanted if c not in reader.fieldnames]
    if missing:
        raise InvalidArguments(
            f"columns: no column {', '.join(map(repr, missing))} "
            f"(the file has: {', '.join(reader.fieldnames)})"
        )
    values = {c: [] for c in wanted}
    rows = 0
    for row in reader:
        rows += 1
        for c in wanted:
            value = (row.get(c) or "").strip()
            if value:
                values[c].append(value)
    return {"rows": rows, "columns": {c: column(values[c]) for c in wanted}}


def column(values):
    out = {"filled": len(values)}
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        out["distinct"] = len(set(values))
        return out
    if numbers:
        out.update(min=min(numbers), max=max(numbers), mean=round(sum(numbers) / len(numbers), 6))
    return out
