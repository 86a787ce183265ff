"""The workflow database (`db/db.sqlite`) for step scripts.

The interpreter has no `sqlite3` module and the script cannot open the file
itself: every statement goes to the host through the `workflow-db` interface.
Queries always work; statements that modify the database work only when the
step may write it, and raise `ReadOnlyError` otherwise.

    import trellis_db

    rows = trellis_db.query("SELECT id, title FROM tickets WHERE status = ?", ["open"])
    for row in rows:                       # each row is a dict keyed by column name
        print(row["id"], row["title"])
    changed = trellis_db.execute("UPDATE tickets SET status = ? WHERE id = ?", ["done", 7])

Parameters bind to `?` placeholders in order: `None`, `bool`, `int`, `float`
and `str` values are accepted.
"""

import json

from componentize_py_types import Err
from wit_world.imports import workflow_db as _db

__all__ = [
    "DbError",
    "NotGrantedError",
    "ReadOnlyError",
    "SqlError",
    "TooLargeError",
    "execute",
    "query",
]


class DbError(Exception):
    """A statement did not run."""


class NotGrantedError(DbError):
    """The step has no workflow database (the workspace has no `db/` folder)."""


class ReadOnlyError(DbError, PermissionError):
    """The statement would modify the database and the step may only read it."""


class SqlError(DbError):
    """SQLite rejected the statement; the message is SQLite's."""


class TooLargeError(DbError):
    """The result exceeded the host's row or size limit."""


def query(sql, params=()):
    """Runs a read-only statement; returns its rows as a list of dicts."""
    try:
        text = _db.query(sql, _params(params))
    except Err as err:
        raise _error(err.value) from None
    return json.loads(text)


def execute(sql, params=()):
    """Runs a statement that modifies the database; returns the number of rows changed."""
    try:
        return _db.execute(sql, _params(params))
    except Err as err:
        raise _error(err.value) from None


def _params(params):
    if isinstance(params, (str, bytes, dict)):
        raise TypeError("params must be a list or tuple of values bound to `?` in order")
    return [_param(i, value) for i, value in enumerate(params)]


def _param(index, value):
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
    raise TypeError(
        f"params[{index}]: expected None, bool, int, float or str, found {type(value).__name__}"
    )


def _error(error):
    if isinstance(error, _db.DbError_NotGranted):
        return NotGrantedError("this step has no access to the workflow database")
    if isinstance(error, _db.DbError_ReadOnly):
        return ReadOnlyError(f"the workflow database is read-only for this step: {error.value}")
    if isinstance(error, _db.DbError_TooLarge):
        return TooLargeError(error.value)
    return SqlError(error.value)
