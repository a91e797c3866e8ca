"""The one progress type every long call takes: a callable getting one line per step.

A printer may also show live progress and time a block: `live(text, key)` (the running case, its spec and
elapsed time; `key` changes when the step or case does) and `timed(label)` (a context manager: an
elapsed-time spinner around a build). The terminal's printer (views.common.ProgressPrinter) and the MCP
server's worker have both; a plain function has neither, and `live` and `timed` below then do nothing.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Optional, Protocol, runtime_checkable


@runtime_checkable
class Progress(Protocol):
    def __call__(self, step: str) -> None: ...


def silent(_step: str) -> None:
    """Progress that shows nothing."""


def live_of(progress: Optional[Progress]) -> Optional[Callable[[str, str], None]]:
    """The printer's `live(text, key)`, or None when it has none."""
    return getattr(progress, "live", None)


def timed(progress: Optional[Progress], label: str) -> ContextManager[None]:
    """The printer's elapsed-time spinner around a block (a build), when it has one."""
    spinner = getattr(progress, "timed", None)
    return spinner(label) if spinner is not None else contextlib.nullcontext()


__all__ = ["Progress", "silent", "live_of", "timed"]
