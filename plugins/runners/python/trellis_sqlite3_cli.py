"""The `sqlite3` command of Trellis's shell: the common part of SQLite's command-line tool.

`sqlite3 [OPTIONS] DATABASE [SQL]` runs SQL (or the SQL on stdin) against the workflow
database through the host, with the turn's access and the host's SQL fences (no
`ATTACH`, no `load_extension`, read-only unless the turn may write). DATABASE must be the
workflow database, `/db/db.sqlite` (relative paths are taken from the working folder):
there is no other database in the sandbox. Options: `-header`/`-noheader`, `-json`,
`-csv`, `-line`, `-list` (the default: `|`-separated), `-separator SEP`, `-bail`. Dot
commands are not supported, but `.tables` and `.schema [TABLE]` are read as the queries
they stand for.
"""

import csv
import io
import json
import os
import sys

import trellis_sqlite3

WORKFLOW_DB = "/db/db.sqlite"
USAGE = "usage: sqlite3 [-header] [-json|-csv|-line|-list] [-separator SEP] /db/db.sqlite [SQL]"


def main(argv):
    mode, header, separator, bail = "list", False, "|", False
    rest = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-header", "--header"):
            header = True
        elif arg in ("-noheader", "--noheader"):
            header = False
        elif arg in ("-json", "-csv", "-line", "-list", "--json", "--csv", "--line", "--list"):
            mode = arg.lstrip("-")
        elif arg in ("-separator", "--separator"):
            i += 1
            if i >= len(argv):
                return fail(USAGE)
            separator = argv[i]
        elif arg in ("-bail", "--bail"):
            bail = True
        elif arg.startswith("-") and len(arg) > 1:
            return fail(f"sqlite3: unknown option: {arg}\n{USAGE}")
        else:
            rest.append(arg)
        i += 1
    if not rest:
        return fail(USAGE)
    database = os.path.normpath(os.path.join(os.getcwd(), rest[0]))
    if database != WORKFLOW_DB:
        return fail(
            f"sqlite3: cannot open {rest[0]}: the only database in the sandbox is the "
            f"workflow database, {WORKFLOW_DB}")
    sql = " ".join(rest[1:]) if len(rest) > 1 else sys.stdin.read()
    connection = trellis_sqlite3.connect(WORKFLOW_DB)
    status = 0
    for statement in statements(sql):
        try:
            cursor = connection.execute(statement)
        except trellis_sqlite3.Error as err:
            print(f"Error: {err}", file=sys.stderr)
            status = 1
            if bail:
                break
            continue
        if cursor.description:
            names = [d[0] for d in cursor.description]
            show(mode, header, separator, names, cursor.fetchall())
    return status


def statements(sql):
    """The statements of `sql`; the two dot commands are read as the queries they stand for."""
    kept = []
    for line in sql.splitlines():
        stripped = line.strip()
        if stripped == ".tables":
            yield ("SELECT name FROM sqlite_master WHERE type IN ('table','view') "
                   "AND name NOT LIKE 'sqlite_%' ORDER BY name")
        elif stripped.startswith(".schema"):
            table = stripped[len(".schema"):].strip().replace("'", "''")
            where = f" AND name = '{table}'" if table else ""
            yield f"SELECT sql || ';' FROM sqlite_master WHERE sql IS NOT NULL{where} ORDER BY name"
        elif stripped.startswith("."):
            print(f"sqlite3: dot command {stripped.split()[0]} is not supported", file=sys.stderr)
        else:
            kept.append(line)
    for statement in trellis_sqlite3._split("\n".join(kept)):
        if statement.strip():
            yield statement


def text(value):
    return "" if value is None else str(value)


def show(mode, header, separator, names, rows):
    out = sys.stdout
    if mode == "json":
        out.write(json.dumps([dict(zip(names, row)) for row in rows]) + "\n")
    elif mode == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if header:
            writer.writerow(names)
        writer.writerows([[text(v) for v in row] for row in rows])
        out.write(buffer.getvalue())
    elif mode == "line":
        width = max((len(n) for n in names), default=0)
        for index, row in enumerate(rows):
            if index:
                out.write("\n")
            for name, value in zip(names, row):
                out.write(f"{name.rjust(width)} = {text(value)}\n")
    else:
        if header:
            out.write(separator.join(names) + "\n")
        for row in rows:
            out.write(separator.join(text(v) for v in row) + "\n")


def fail(message):
    print(message, file=sys.stderr)
    return 1
