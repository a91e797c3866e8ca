"""The `popkit` command: a Typer app (popkit.cli.app) whose commands live in running, tuning, authoring, remote, confidence and serve."""

from __future__ import annotations

import copy
import importlib
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn, Sequence

from popkit.errors import Interrupted

if TYPE_CHECKING:
    import typer

# Importing a command module registers its commands on `app`; help lists them in this order.
MODULES = ("running", "tuning", "authoring", "remote", "confidence", "serve")
# The module of each command: `popkit NAME ...` imports NAME's module alone (the others' imports cost every
# command tens of milliseconds: the MCP server, tune, the cluster). tests/test_cli_exit.py checks the table.
COMMAND_MODULES = {
    "test": "running", "bench": "running", "tasks": "running", "watch": "running",
    "tune": "tuning",
    "new": "authoring", "templates": "authoring", "compile": "authoring", "doctor": "authoring",
    "check": "remote", "submit": "remote", "history": "remote", "show": "remote", "compare": "remote",
    "risk": "confidence", "verify": "confidence",
    "mcp": "serve",
}


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, _frame) -> None:
    for sig in _STOP_SIGNALS:  # the first one wins: a second must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def main() -> None:
    for sig in _STOP_SIGNALS:  # each unwinds like Ctrl-C: the finally blocks kill children and remove files
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup popkit ...` keeps ignoring SIGHUP
            signal.signal(sig, _interrupt)
    try:
        narrowed(sys.argv[1:])(prog_name="popkit")
    except SystemExit as done:
        leave(done.code)
    leave(0)


def registered(name: str | None = None) -> typer.Typer:
    """The app with command `name`'s module imported (every module for None or a name it does not know)."""
    whole = name not in COMMAND_MODULES
    for module in MODULES if whole else [COMMAND_MODULES[name]]:
        importlib.import_module(f"popkit.cli.{module}")
    from popkit.cli.app import app

    # Importing popkit.cli.app made `app` this package's attribute: the module. `from popkit.cli import app` is
    # the Typer app with every command; until all are registered it goes through __getattr__ below.
    if whole:
        globals()["app"] = app
    else:
        globals().pop("app", None)
    return app


def __getattr__(attribute: str):
    if attribute == "app":  # `from popkit.cli import app`: the whole app, every command registered
        return registered()
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def narrowed(args: Sequence[str]) -> typer.Typer:
    """`app` holding only the command that `args` name (a group with its sub-commands), where they name one.
    Only that command's module is imported, and Typer builds every command it holds before it parses (tens of
    milliseconds for all of popkit's); what one command parses, prints and does is the same in either. Anything
    else (--help, --version, an unknown name) gets the whole app."""
    from typer.main import get_command_name

    name = next((arg for arg in args if not arg.startswith("-")), None)
    app = registered(name)
    commands = [c for c in app.registered_commands
                if (c.name or (get_command_name(c.callback.__name__) if c.callback else None)) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if name is None or not commands and not groups:
        return app
    only = copy.copy(app)
    only.registered_commands, only.registered_groups = commands, groups
    return only


def leave(code: object) -> NoReturn:
    """End the process as SystemExit(code) would, without Python's module teardown (tens of milliseconds on
    every run, in the inner loop). By now every child is gone, every file popkit writes is closed and every
    work folder removed (context managers and finally blocks, not atexit); only the output is flushed here."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if _observed():
        sys.exit(code)  # a profiler or coverage writes its data at exit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what was written stays written, the code still counts
            pass
    os._exit(code)


def _observed() -> bool:
    """Whether a profiler, tracer or coverage tool watches this process (`python -m cProfile -m popkit ...`)."""
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+
    return bool(sys.getprofile() or sys.gettrace()
                or (monitoring is not None and any(monitoring.get_tool(i) for i in range(6))))
