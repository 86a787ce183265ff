"""`sqlite3` for step scripts: the common DB-API subset, backed by the host's database.

The runner installs this module as `sqlite3` (the interpreter has no SQLite).

Scripts written for the original open the workflow database with
`sqlite3.connect(os.environ["DB_PATH"])`. The interpreter has no SQLite of its own
and the script cannot open the file: every statement goes to the host through the
`workflow-db` interface, with the step's database access (a statement that
modifies the database raises `OperationalError` when the step may only read it).

What works: `connect` (of `DB_PATH`, or `":memory:"`-free paths naming it), `cursor`,
`execute`, `executemany`, `executescript`, `fetchone`, `fetchmany`, `fetchall`,
iteration, `description`, `rowcount`, `lastrowid`, `commit`, `close`, `with conn:`,
`row_factory` (`sqlite3.Row` or any callable `(cursor, row)`), qmark (`?`) and named
(`:name`) parameters.

Differences: each statement is committed as it runs (`commit()` has nothing left to
do, `rollback()` raises `NotSupportedError`), and the database is the workflow
database whatever path is given.
"""

import re as _re

from componentize_py_types import Err
from wit_world.imports import workflow_db as _db

import json as _json

apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"
sqlite_version = "3"
sqlite_version_info = (3, 0, 0)
version = "2.6.0"
PARSE_DECLTYPES = 1
PARSE_COLNAMES = 2

__all__ = [
    "Connection",
    "Cursor",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Row",
    "connect",
]


class Warning(Exception):  # noqa: A001 - DB-API name
    pass


class Error(Exception):
    pass


class InterfaceError(Error):
    pass


class DatabaseError(Error):
    pass


class DataError(DatabaseError):
    pass


class OperationalError(DatabaseError):
    pass


class IntegrityError(DatabaseError):
    pass


class InternalError(DatabaseError):
    pass


class ProgrammingError(DatabaseError):
    pass


class NotSupportedError(DatabaseError):
    pass


class Row:
    """A row readable by index and by column name (case-insensitive), like sqlite3.Row."""

    def __init__(self, cursor, values):
        self._names = [d[0] for d in (cursor.description or ())]
        self._values = tuple(values)

    def keys(self):
        return list(self._names)

    def __getitem__(self, key):
        if isinstance(key, (int, slice)):
            return self._values[key]
        lowered = key.lower()
        for i, name in enumerate(self._names):
            if name.lower() == lowered:
                return self._values[i]
        raise IndexError(f"No item with that key: {key!r}")

    def __len__(self):
        return len(self._values)

    def __iter__(self):
        return iter(self._values)

    def __eq__(self, other):
        return (isinstance(other, Row) and self._names == other._names
                and self._values == other._values)

    def __hash__(self):
        return hash((tuple(self._names), self._values))

    def __repr__(self):
        return f"<sqlite3.Row {dict(zip(self._names, self._values))!r}>"


def connect(database=None, timeout=5.0, detect_types=0, isolation_level="", **kwargs):
    """A connection to the workflow database (`DB_PATH`)."""
    return Connection(database)


def complete_statement(sql):
    return sql.rstrip().endswith(";")


class Connection:
    """A connection to the workflow database through the host."""

    def __init__(self, database):
        self.database = database
        self.row_factory = None
        self.text_factory = str
        self.isolation_level = ""
        self.total_changes = 0
        self._closed = False

    def cursor(self, factory=None):
        self._check()
        return (factory or Cursor)(self)

    def execute(self, sql, parameters=()):
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql, seq_of_parameters):
        return self.cursor().executemany(sql, seq_of_parameters)

    def executescript(self, script):
        return self.cursor().executescript(script)

    def commit(self):
        self._check()

    def rollback(self):
        raise NotSupportedError(
            "rollback: each statement of the workflow database is committed as it runs")

    def close(self):
        self._closed = True

    @property
    def in_transaction(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False

    def _check(self):
        if self._closed:
            raise ProgrammingError("Cannot operate on a closed database.")


class Cursor:
    """A DB-API cursor."""

    arraysize = 1

    def __init__(self, connection):
        self.connection = connection
        self.row_factory = connection.row_factory
        self.description = None
        self.rowcount = -1
        self.lastrowid = None
        self._rows = []
        self._pos = 0

    def execute(self, sql, parameters=()):
        self.connection._check()
        self.row_factory = self.connection.row_factory
        sql, values = _bind(sql, parameters)
        result = _run(sql, values)
        columns = result.get("columns") or []
        self.description = (
            tuple((name, None, None, None, None, None, None) for name in columns)
            if columns else None)
        self._rows = [tuple(r) for r in result.get("rows") or []]
        self._pos = 0
        if "changed" in result:
            self.rowcount = result["changed"]
            self.connection.total_changes += result["changed"]
            if result.get("last-insert-rowid"):
                self.lastrowid = result["last-insert-rowid"]
        else:
            self.rowcount = -1
        return self

    def executemany(self, sql, seq_of_parameters):
        total = 0
        for parameters in seq_of_parameters:
            self.execute(sql, parameters)
            total += max(self.rowcount, 0)
        self.rowcount = total
        return self

    def executescript(self, script):
        for statement in _split(script):
            self.execute(statement)
        return self

    def fetchone(self):
        if self._pos >= len(self._rows):
            return None
        row = self._rows[self._pos]
        self._pos += 1
        return self._make(row)

    def fetchmany(self, size=None):
        size = self.arraysize if size is None else size
        out = []
        while len(out) < size:
            row = self.fetchone()
            if row is None:
                break
            out.append(row)
        return out

    def fetchall(self):
        out = [self._make(r) for r in self._rows[self._pos:]]
        self._pos = len(self._rows)
        return out

    def close(self):
        self._rows = []

    def setinputsizes(self, sizes):
        pass

    def setoutputsize(self, size, column=None):
        pass

    def __iter__(self):
        return self

    def __next__(self):
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def _make(self, row):
        factory = self.row_factory
        return factory(self, row) if factory else row


def _run(sql, values):
    try:
        return _json.loads(_db.run(sql, values))
    except Err as err:
        raise _error(err.value) from None


def _error(error):
    if isinstance(error, _db.DbError_NotGranted):
        return OperationalError("this step has no access to the workflow database")
    if isinstance(error, _db.DbError_ReadOnly):
        return OperationalError(f"attempt to write a readonly database: {error.value}")
    if isinstance(error, _db.DbError_TooLarge):
        return OperationalError(error.value)
    message = error.value
    if "constraint" in message.lower():
        return IntegrityError(message)
    return OperationalError(message)


_NAMED = _re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")|[:@$]([A-Za-z_][A-Za-z0-9_]*)""")


def _bind(sql, parameters):
    """The statement with named parameters turned into `?`, and the values in order."""
    if isinstance(parameters, dict):
        values = []

        def replace(match):
            if match.group(1):
                return match.group(1)
            name = match.group(2)
            if name not in parameters:
                raise ProgrammingError(
                    f"You did not supply a value for binding parameter :{name}.")
            values.append(parameters[name])
            return "?"

        sql = _NAMED.sub(replace, sql)
        return sql, [_value(i, v) for i, v in enumerate(values)]
    if isinstance(parameters, (str, bytes)):
        raise ProgrammingError("parameters must be a sequence or a dict")
    return sql, [_value(i, v) for i, v in enumerate(parameters or ())]


def _value(index, value):
    if value is None:
        return _db.SqlValue_Null()
    if isinstance(value, bool):
        return _db.SqlValue_Integer(int(value))
    if isinstance(value, int):
        return _db.SqlValue_Integer(value)
    if isinstance(value, float):
        return _db.SqlValue_Real(value)
    if isinstance(value, str):
        return _db.SqlValue_Text(value)
    if hasattr(value, "isoformat"):
        return _db.SqlValue_Text(value.isoformat(" ") if hasattr(value, "hour") and
                                 hasattr(value, "day") else value.isoformat())
    raise ProgrammingError(
        f"Error binding parameter {index + 1}: type {type(value).__name__!r} is not supported")


def _split(script):
    """The statements of a script, split on `;` outside quotes and comments."""
    statements, current, quote, i = [], [], None, 0
    while i < len(script):
        c = script[i]
        if quote:
            current.append(c)
            if c == quote:
                quote = None
        elif c in ("'", '"'):
            quote = c
            current.append(c)
        elif script.startswith("--", i):
            end = script.find("\n", i)
            i = len(script) if end < 0 else end
            continue
        elif c == ";":
            text = "".join(current).strip()
            if text:
                statements.append(text)
            current = []
        else:
            current.append(c)
        i += 1
    text = "".join(current).strip()
    if text:
        statements.append(text)
    return statements
