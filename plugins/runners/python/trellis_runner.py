"""The Trellis Python script runner: the app of the `script-runner` component.

The host runs `code/<step-id>/main.py` of a scripted step (spec section 7) by
calling `wasi:cli/run` on a fresh instance of this component. Everything the
script may touch comes from the host: the folders of the step's grant, the
environment, the arguments (`main.py`) and the working directory
(`/code/<step-id>`).

componentize-py pre-initializes the component: this module's top level runs
once, at build time, and the interpreter's memory is snapshotted after it. The
standard library modules imported below are therefore already loaded when a
script starts, and cost it nothing.
"""

# Preloaded for scripts: the modules step scripts commonly use. Keep the list in
# README.md in step with it.
import base64
import collections
import csv
import datetime
import hashlib
import itertools
import json
import math
import pathlib
import re
import textwrap
import urllib.parse

# The runner's own needs.
import builtins
import encodings
import importlib
import io
import os
import pkgutil
import random
import sys
import traceback

import trellis_db
import trellis_http
import trellis_sqlite3
import trellis_sqlite3_cli
from wit_world import exports
from wit_world.imports import environment
from wit_world.imports import exit as wasi_exit

# At run time the interpreter has no standard library on disk: only modules imported
# now, at build time, exist for scripts. So import the rest of what a data script may
# reach for, including what the modules above import lazily (`heapq` for
# `Counter.most_common`, `_strptime` for `datetime.strptime`, the codecs), skipping any
# this interpreter build lacks (it has no `socket` or `ssl`; `sqlite3` is the runner's own,
# backed by the host's database).
MORE_MODULES = """
    _strptime abc argparse array ast binascii bisect calendar cmath codecs
    collections.abc colorsys contextlib copy copyreg dataclasses decimal difflib dis
    enum errno fnmatch fractions functools gettext glob graphlib gzip heapq hmac html
    html.entities html.parser inspect io ipaddress keyword linecache locale logging
    mimetypes numbers operator os.path pickle pprint quopri random reprlib runpy
    secrets shlex shutil statistics string stringprep struct tempfile textwrap time
    tokenize tomllib traceback types typing unicodedata uuid warnings weakref
    xml.dom.minidom xml.etree.ElementTree xml.sax zipfile zlib zoneinfo
    email email.message email.parser email.policy email.utils
    json.decoder json.encoder
""".split()

PRELOADED = [
    "base64", "collections", "csv", "datetime", "hashlib", "itertools", "json",
    "math", "pathlib", "re", "textwrap", "urllib.parse", "trellis_db", "trellis_http",
    "sqlite3",
]
# Scripts written for the original open the database with `sqlite3.connect(DB_PATH)`.
sys.modules["sqlite3"] = trellis_sqlite3
for _name in MORE_MODULES:
    try:
        importlib.import_module(_name)
        PRELOADED.append(_name)
    except Exception:  # noqa: BLE001 - a module this build cannot import is left out
        pass
for _codec in pkgutil.iter_modules(encodings.__path__):
    try:
        importlib.import_module("encodings." + _codec.name)
    except Exception:  # noqa: BLE001 - platform-specific codecs (mbcs, oem) are left out
        pass
del _name, _codec

DEFAULT_SCRIPT = "main.py"


class Run(exports.Run):
    """The `wasi:cli/run` export: runs the script named by the first argument."""

    def run(self) -> None:
        # The snapshot was taken at build time: take the environment, arguments and
        # working directory of this run from the host now.
        os.environ.clear()
        os.environ.update(dict(environment.get_environment()))
        sys.argv = list(environment.get_arguments()) or [DEFAULT_SCRIPT]
        # `random` was seeded when it was imported, at build time: every run would draw
        # the same numbers.
        random.seed()
        buffered_streams()
        cwd = environment.initial_cwd()
        if cwd:
            os.chdir(cwd)
        code = run_command_line(sys.argv)
        flush()
        if code != 0:
            # Does not return: the host sees the status as the command's exit code.
            wasi_exit.exit_with_code(code)


def buffered_streams() -> None:
    """Puts a buffered writer under `sys.stdout` and `sys.stderr`.

    The interpreter runs unbuffered: its text streams write straight to the raw file, which
    takes at most 8 KiB of one write, and a text stream does not write the rest (a `print`
    of 100,000 characters kept 8,192). A buffered writer writes everything, in as many
    writes as it takes; `flush()` at the end empties it.
    """
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(
            io.BufferedWriter(raw), encoding="utf-8", errors=errors, line_buffering=True
        )
        setattr(sys, name, stream)


def run_command_line(argv: list) -> int:
    """Runs what `argv` names as `python3` would: `-c CODE`, `-m MODULE`, `-` (the code
    on stdin), or a script file; `sqlite3` is the shell's `sqlite3` command."""
    first = argv[0]
    if first == "sqlite3":
        sys.argv = argv
        return run_callable(lambda: sys.exit(trellis_sqlite3_cli.main(argv[1:])))
    if first == "-c":
        if len(argv) < 2:
            print("python3: argument expected for the -c option", file=sys.stderr)
            return 2
        sys.argv = ["-c"] + argv[2:]
        return run_source(argv[1], "<string>")
    if first == "-m":
        if len(argv) < 2:
            print("python3: argument expected for the -m option", file=sys.stderr)
            return 2
        sys.argv = [argv[1]] + argv[2:]
        import runpy
        return run_callable(lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
    if first == "-":
        sys.argv = argv
        return run_source(sys.stdin.read(), "<stdin>")
    return run_script(first)


def run_callable(call) -> int:
    """Runs `call` as a script's top level: its exit status."""
    try:
        call()
    except SystemExit as exit:
        return exit_status(exit.code)
    except BaseException as err:  # noqa: BLE001 - every failure is the command's to report
        flush()
        # The traceback starts in the command's code, not in the runner's frames.
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename.endswith("trellis_runner.py"):
            tb = tb.tb_next
        traceback.print_exception(type(err), err, tb)
        return 1
    return 0


def run_source(source: str, name: str) -> int:
    """Runs Python `source` (from `-c` or stdin) as `__main__`; its exit status."""
    try:
        code = compile(source, name, "exec")
    except SyntaxError as err:
        traceback.print_exception(err)
        return 1
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    return run_callable(lambda: exec(code, namespace))


def run_script(name: str) -> int:
    """Runs the script file `name` as `__main__`; returns its exit status."""
    path = os.path.join(os.getcwd(), name)
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as err:
        print(f"trellis: cannot read the script {path}: {err}", file=sys.stderr)
        return 2
    try:
        code = compile(source, path, "exec")
    except SyntaxError as err:
        traceback.print_exception(err)
        return 1
    # Helper modules beside the script can be imported.
    sys.path.insert(0, os.path.dirname(path))
    namespace = {
        "__name__": "__main__",
        "__file__": path,
        "__builtins__": builtins,
    }
    try:
        exec(code, namespace)
    except SystemExit as exit:
        return exit_status(exit.code)
    except BaseException as err:  # noqa: BLE001 - every failure is the script's to report
        # Leave the runner's own frame out: the traceback starts in the script.
        flush()
        traceback.print_exception(type(err), err, err.__traceback__.tb_next)
        return 1
    return 0


def exit_status(code: object) -> int:
    """The exit status of `sys.exit(code)`, as Python itself would compute it."""
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing left to lose
            pass
