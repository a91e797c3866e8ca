"""The `popkit` command: a Typer app (popkit.cli.app) whose commands live in running, authoring and remote."""

from __future__ import annotations

import signal

from popkit.errors import Interrupted

# Importing a command module registers its commands on `app`; help lists them in this order.
from popkit.cli import running, authoring, remote  # noqa: F401,I001
from popkit.cli.app import app


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, _frame) -> None:
    for sig in _STOP_SIGNALS:  # the first one wins: a second must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def main() -> None:
    for sig in _STOP_SIGNALS:  # each unwinds like Ctrl-C: the finally blocks kill children and remove files
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup popkit ...` keeps ignoring SIGHUP
            signal.signal(sig, _interrupt)
    app(prog_name="popkit")
