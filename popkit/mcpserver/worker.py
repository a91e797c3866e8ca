"""One MCP tool call in a process of its own: `python -m popkit.mcpserver.worker`, started by the server.

Why a process: a call is stopped the way Ctrl-C stops `popkit` (SIGINT raises Interrupted in the thread
running it, and every finally block kills its children and removes its folders); what the call's threads
started dies with the process's lifeline when it exits; two calls share no state; and nothing a call
does can take the server down.

The server writes one JSON line on stdin, `{"tool": NAME, "arguments": {...}, "cwd": FOLDER}` (the call runs
in the server's working folder; the worker starts where popkit was imported from), and keeps stdin open:
when it closes (the server died), the call stops as on SIGTERM. The worker answers with JSON lines on
its stdout, which it keeps for itself (anything else printing to fd 1 lands on stderr):
`{"progress": TEXT}` for each step, then one of `{"done": DOCUMENT, "exit_code": N}`,
`{"error": ERROR_DOCUMENT}` (a PopkitError, or a popkit bug as InternalError, exit 70) and
`{"cancelled": SIGNUM}`. It exits 0, or 128 + SIGNUM when stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import IO, Any, Iterator

from popkit.documents import document, exit_code
from popkit.errors import EnvironmentProblem, Interrupted, PopkitError
from popkit.mcpserver.tools import tool

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LIVE_EVERY_S = 5.0  # a running case's line is sent again after this long, or at once when the step changes


class Reporter:
    """The progress callback the api gets: step lines, and `live`/`timed` lines at most every LIVE_EVERY_S."""

    def __init__(self, out: IO[str]):
        self._out = out
        self._lock = threading.Lock()  # builds tick on a thread of their own
        self._key: str | None = None
        self._sent_at = 0.0

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps(message, default=str) + "\n")
            self._out.flush()

    def __call__(self, text: str) -> None:
        self._key = None
        self.send({"progress": text})

    def live(self, text: str, key: str = "") -> None:
        now = time.monotonic()
        if key != self._key or now - self._sent_at >= LIVE_EVERY_S:
            self._key, self._sent_at = key, now
            self.send({"progress": text})

    @contextlib.contextmanager
    def timed(self, label: str) -> Iterator[None]:
        """`label · N s` while the block runs (a build writes no result pipe)."""
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


def _interrupt(signum: int, _frame: Any) -> None:
    for sig in STOP_SIGNALS:  # the first stop wins: a second must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def _watch_stdin() -> None:
    """The server closed our stdin (it exited or died): stop as on SIGTERM."""
    while sys.stdin.buffer.read1(65536):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def internal_error(exc: BaseException) -> dict[str, Any]:
    """The document of a popkit bug, as `popkit --json` prints it (exit 70)."""
    return {"schema": "popkit/error/1", "error": "InternalError",
            "message": f"internal error: {type(exc).__name__}: {exc}",
            "hint": "this is a popkit bug; rerun with POPKIT_DEBUG=1 for the traceback and report it", "exit_code": 70}


def enter(folder: str) -> None:
    try:
        os.chdir(folder)
    except OSError as exc:
        raise EnvironmentProblem(f"the server's working folder {folder} cannot be entered: {exc.strerror}",
                                 "start the MCP server from a folder that exists") from None


def serve_one(request: dict[str, Any], reporter: Reporter) -> int:
    """Run one call and send its outcome; the exit status of the process."""
    try:
        if request.get("cwd"):
            enter(str(request["cwd"]))
        result = tool(str(request.get("tool"))).call(request.get("arguments") or {}, reporter)
        reporter.send({"done": document(result), "exit_code": exit_code(result)})
        return 0
    except PopkitError as exc:
        reporter.send({"error": document(exc)})
        return 0
    except KeyboardInterrupt as exc:  # children killed, folders removed: the finally blocks have run
        signum = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
        reporter.send({"cancelled": signum})
        return 128 + signum
    except Exception as exc:  # a popkit bug: the call fails, the server goes on
        if os.environ.get("POPKIT_DEBUG"):
            traceback.print_exc()
        reporter.send({"error": internal_error(exc)})
        return 0


def main() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # a stray print goes to stderr, never into the messages
    reporter = Reporter(out)
    code = 0
    try:
        line = sys.stdin.buffer.readline()
        threading.Thread(target=_watch_stdin, daemon=True).start()
        try:
            request = json.loads(line)
        except ValueError:
            request = {}
        code = serve_one(request if isinstance(request, dict) else {}, reporter)
    except KeyboardInterrupt as exc:  # stopped before the call began
        signum = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
        with contextlib.suppress(OSError, ValueError):
            reporter.send({"cancelled": signum})
        code = 128 + signum
    with contextlib.suppress(OSError, ValueError):
        out.flush()
    sys.stderr.flush()
    os._exit(code)  # like `popkit` itself: everything is closed and removed by now


if __name__ == "__main__":
    main()
