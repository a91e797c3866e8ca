"""Shared view helpers: the consoles, the leaderboard's time format, JSON emission, error printing.

Rich is imported where terminal output is made, not with this module: a `--json` command prints with json
alone, and would otherwise pay rich's import (some 50 ms on a small machine) on every run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from popkit.documents import schema_document
from popkit.errors import PopkitError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_state = {"json": False}


def set_json(enabled: bool) -> None:
    """Called first by every command that takes --json, so later errors print as JSON too."""
    _state["json"] = bool(enabled)


def json_mode() -> bool:
    return _state["json"]


MIN_WIDTH = 40  # narrower, and tables have no room for their columns (0 printed nothing at all)
_warned_width: set[str] = set()


def _width() -> int | None:
    """POPKIT_WIDTH when it is a usable width; else the terminal's, with one warning per bad value."""
    value = os.environ.get("POPKIT_WIDTH")
    if not value:
        return None
    if value.strip().isdigit() and int(value) >= MIN_WIDTH:
        return int(value)
    if value not in _warned_width:
        _warned_width.add(value)
        sys.stderr.write(f"warning: POPKIT_WIDTH={value} ignored: it must be a whole number of columns,"
                         f" at least {MIN_WIDTH}\n")
    return None


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape(markup: str) -> str:
    """Text with rich's markup characters escaped (rich.markup.escape) and every control character but newline
    and tab shown as `\\xNN`: a terminal escape in a submission's message (clear the screen, a green PASSED)
    never reaches the terminal."""
    from rich.markup import escape as rich_escape

    return rich_escape(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", markup))


def console() -> Console:
    """stdout console; made per call so tests that swap sys.stdout see the output."""
    from rich.console import Console

    return Console(file=sys.stdout, width=_width(), highlight=False, soft_wrap=False, emoji=False)


def err_console() -> Console:
    from rich.console import Console

    return Console(file=sys.stderr, width=_width(), highlight=False, soft_wrap=True, emoji=False)


def table(columns, *, right=(), no_wrap=(), **options) -> Table:
    """A table that reads at 80 columns and in pipes: no word is broken inside.

    Cells wrap at spaces; a single word too long for its column is cut with `…` (--json keeps the full
    value); a column is never narrower than its header's longest word. `right` names the right-justified
    columns, `no_wrap` those kept on one line.
    """
    from rich.table import Table

    out = Table(**options)
    for name in columns:
        out.add_column(name, justify="right" if name in right else "left", overflow="ellipsis",
                       no_wrap=name in no_wrap, min_width=max(len(w) for w in name.split()))
    return out


def keep_whole(table: Table, values: dict[str, Sequence[str]]) -> None:
    """Never cut or wrap the named columns (names a user must type): each is as wide as its longest value."""
    for column in table.columns:
        if column.header in values:
            column.no_wrap, column.overflow = True, "ignore"
            column.min_width = max([column.min_width or 0] + [len(v) for v in values[column.header]])


def fold(table: Table, *headers: str) -> None:
    """Let the named columns (paths) break anywhere onto more lines instead of losing their end to `…`."""
    for column in table.columns:
        if column.header in headers:
            column.overflow = "fold"


def emit_json(kind: str, payload: dict[str, Any]) -> None:
    """One JSON document on stdout with a schema tag (`popkit/<kind>/1`)."""
    doc = schema_document(kind, payload)
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")


class ProgressPrinter:
    """Progress on stderr for people; silence in JSON mode (stdout carries one document).

    Calling it prints a step line (`… test`). `live(text, key)` shows what a running step is doing
    (case i/N, elapsed): on a terminal a spinner line updated in place (Rich status), in a pipe a plain
    line each time `key` changes and every LIVE_EVERY_S seconds otherwise. Use it as a context manager
    (or call close()) so the spinner is gone before the report prints.
    """

    LIVE_EVERY_S = 15.0

    def __init__(self, enabled: bool = True, con: Console | None = None):
        self.enabled = enabled
        self._con = con
        self._status = None
        self._key: str | None = None
        self._printed_at = 0.0

    @property
    def con(self) -> Console:
        """stderr's console, made when first used (never in JSON mode)."""
        if self._con is None:
            self._con = err_console()
        return self._con

    def __call__(self, msg: str) -> None:
        if not self.enabled:
            return
        self.close()
        self.con.print(f"[dim]… {escape(msg)}[/]")

    def live(self, text: str, key: str = "") -> None:
        if not self.enabled:
            return
        if self.con.is_terminal:
            if self._status is None:
                self._status = self.con.status(escape(text), spinner="dots")
                self._status.start()
            else:
                self._status.update(escape(text))
            return
        now = time.monotonic()
        if key != self._key or now - self._printed_at >= self.LIVE_EVERY_S:
            self._key, self._printed_at = key, now
            self.con.print(f"[dim]  {escape(text)}[/]")

    @contextlib.contextmanager
    def timed(self, label: str):
        """`label · N s`, updated every second while the block runs (a build, which writes no pipe)."""
        done = threading.Event()
        start = time.monotonic()

        def tick() -> None:
            while not done.wait(1.0):
                self.live(f"{label} · {time.monotonic() - start:.0f} s", label)

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(2.0)
            self.close()

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> "ProgressPrinter":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def progress_printer(json: bool) -> ProgressPrinter:
    """Progress on stderr (see ProgressPrinter); silent with --json."""
    return ProgressPrinter(enabled=not json)


def print_error(exc: PopkitError) -> None:
    if json_mode():
        emit_json("error", exc.to_json())
        return
    con = err_console()
    con.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.hint:
        con.print(f"[dim]hint:[/] {escape(exc.hint)}")


def print_internal_error(exc: BaseException) -> None:
    message = f"internal error: {type(exc).__name__}: {exc}"
    hint = "this is a popkit bug; rerun with POPKIT_DEBUG=1 for the traceback and report it"
    if json_mode():
        emit_json("error", {"error": "InternalError", "message": message, "hint": hint, "exit_code": 70})
        return
    con = err_console()
    con.print(f"[bold red]error:[/] {escape(message)}")
    con.print(f"[dim]hint:[/] {hint}")


def format_time(ns: float, err_ns: float | None = None) -> str:
    """The leaderboard's time format (docs/protocol-notes.md §5): ns, µs above 2000 ns, ms above 2,000,000 ns.

    Value below 10: 2 decimals (error 3); below 100: 1 decimal (error 2); else none (error 1).
    The error is omitted when it is zero or absent.
    """
    scale, unit = _unit(ns)
    value = ns / scale
    digits = _digits(value)
    text = f"{value:.{digits}f}"
    if err_ns:
        text += f" ± {err_ns / scale:.{digits + 1}f}"
    return f"{text} {unit}"


def _unit(ns: float) -> tuple[float, str]:
    if ns > 2_000_000:
        return 1e6, "ms"
    if ns > 2_000:
        return 1e3, "µs"
    return 1.0, "ns"


def _digits(value: float) -> int:
    return 2 if value < 10 else 1 if value < 100 else 0


def format_interval(low_ns: float, high_ns: float) -> str:
    """A time interval `[low, high] unit` in one unit: the unit and decimals format_time gives its upper end,
    with more decimals (up to 4) when the lower end would otherwise show fewer than two significant digits."""
    scale, unit = _unit(high_ns)
    digits = _digits(high_ns / scale)
    low = low_ns / scale
    if 0 < low < 10 ** (1 - digits):
        digits = min(4, max(digits, 1 - math.floor(math.log10(low))))
    return f"[{low:.{digits}f}, {high_ns / scale:.{digits}f}] {unit}"
