"""What follows a run from beside it: one child's live progress, read from its result pipe as it arrives, and
the system probe, on a thread while the evals go on. The chain (runner.py) starts both; neither touches a result.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping

from popkit.machine import system
from popkit.progress import Progress, live_of
from popkit.run import protocol


class LiveProgress:
    """Live progress of one child from its result pipe as it arrives: step, case i/N and its spec, elapsed.

    Calls `progress.live(text, key)` when the progress printer has one (the CLI's does); `key` changes
    when the step or case does, so a printer for pipes can write a line per case, not per second. Only the
    bytes after the last newline are kept between chunks, and at most LINE_LIMIT of them: a huge line costs
    one scan of each chunk, never a rebuild per chunk (the thread that reads also enforces the timeout).
    """

    LINE_LIMIT = 4096

    def __init__(self, progress: Progress | None, label: str, total: int = 0, kind: str = ""):
        self._live = live_of(progress)
        self.label, self.total, self.kind = label, total, kind
        self.start = time.monotonic()
        self.index, self.spec = -1, ""
        self._partial = bytearray()

    def __call__(self, data: bytes) -> None:
        if self._live is None:
            return
        if data:
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(self._partial) < self.LINE_LIMIT:
                    self._partial += data[:self.LINE_LIMIT - len(self._partial)]
            else:
                lines = bytes(self._partial) + data[:cut]
                self._partial = bytearray(data[cut + 1:cut + 1 + self.LINE_LIMIT])
                for line in lines.split(b"\n"):
                    self._see(line[:self.LINE_LIMIT].decode("utf-8", "replace"))
        self._live(self.text(), f"{self.label}/{self.index}")

    def _see(self, line: str) -> None:
        pair = protocol.pipe_pair(line)
        if pair is None:
            return
        parts = pair[0].split(".")
        if len(parts) == 3 and parts[0] == self.kind and parts[1].isdigit() and parts[2] == "spec":
            self.index, self.spec = int(parts[1]), pair[1]

    def text(self) -> str:
        elapsed = f"{time.monotonic() - self.start:.0f} s"
        if self.index >= 0:
            of = f"/{self.total}" if self.total else ""
            return f"{self.label} · case {self.index + 1}{of}: {self.spec} · {elapsed}"
        cases = f" · {self.total} case{'s' if self.total != 1 else ''}" if self.total else ""
        return f"{self.label}{cases} · {elapsed}"



class SystemProbe:
    """Probes the eval's interpreter and environment on a thread while the runs go on (system.probe: tens of
    milliseconds from the driver, or seconds where it must import torch), from start() or the first result()."""

    def __init__(self, python: str, env: Mapping[str, str] | None = None, start: bool = True):
        self._result: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(python, env), daemon=True)
        self._lock = threading.Lock()
        if start:
            self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread.ident is None:
                self._thread.start()

    def _run(self, python: str, env: Mapping[str, str] | None) -> None:
        try:
            self._result = dict(system.probe(python, env=env))
        except Exception as exc:  # the report still stands without a system line
            self._result = {"error": f"{type(exc).__name__}: {exc}"}

    def result(self) -> dict[str, Any]:
        self.start()
        self._thread.join(90)
        return self._result


__all__ = ["LiveProgress", "SystemProbe"]
