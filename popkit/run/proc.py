"""The one place where popkit runs a child process, and makes sure nothing of it outlives the call.

Every child runs below a watchdog (popkit/run/_watchdog.py): a child subreaper that starts the child in
its own session, reports its exit, then kills every descendant it left (setsid and double fork do
not escape a subreaper), and kills the whole tree when popkit's lifeline pipe closes, which the
kernel does for popkit even on SIGKILL. popkit reads the child's stdout, stderr and result pipe
itself with bounded memory, stops reading when the child exits, and never waits unboundedly:
a call returns within its timeout plus KILL_GRACE_S whatever the descendants do.

A working directory comes with a guard process that removes it if popkit dies before it could.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from popkit.run import _watchdog

WATCHDOG = Path(_watchdog.__file__).resolve()
HEAD_BYTES = 8 * 1024  # stdout and stderr keep their first 8 KiB ...
TAIL_BYTES = 64 * 1024  # ... and their last 64 KiB
PIPE_BYTES = 8 * 1024 * 1024  # the result pipe keeps its first 8 MiB
KILL_GRACE_S = 3.0  # after a timeout or the child's exit: time for the watchdog to kill the tree
DEADLINE_POLL_S = 0.1  # how often run() asks a moving deadline

_LIFELINE: list[int] = []  # read and write end of the pipe every watchdog watches
_LIFELINE_LOCK = threading.Lock()  # A/B sets both candidates up on two threads


def _lifeline() -> int:
    """The read end of a pipe whose write end only this process holds (close-on-exec: no child inherits it)."""
    with _LIFELINE_LOCK:
        if not _LIFELINE:
            _LIFELINE.extend(os.pipe())
    return _LIFELINE[0]


def _protect_self() -> None:
    """Make this process non-dumpable (Linux), once: its /proc/<pid>/fd and environ become root's, so a child of
    the same user cannot reopen popkit's end of a result pipe through /proc (a root child still can)."""
    if not _PROTECTED:
        _PROTECTED.append(_watchdog.prctl(_watchdog.PR_SET_DUMPABLE, 0))


_PROTECTED: list[bool] = []


def watchdog_argv(*args: str) -> list[str]:
    """The command line of popkit's watchdog (run/_watchdog.py) in one of its modes, for a process to start."""
    return [sys.executable or "python3", "-I", "-S", str(WATCHDOG), *args]


KILL_WAIT_S = _watchdog.KILL_WAIT_S  # the longest a watchdog takes to kill a tree


def force_remove(path: Path | str) -> bool:
    """Remove a folder a child of popkit wrote, whatever modes it left (the watchdog's own removal)."""
    return _watchdog.force_remove(str(path))


class Buffer:
    """Bytes a child wrote, kept within bounds: the first `head` bytes and the last `tail` bytes."""

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES):
        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_limit:
            self.tail += data
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[:-self.tail_limit]

    @property
    def overflowed(self) -> bool:
        return self.total > self.head_limit + self.tail_limit

    def bytes(self) -> bytes:
        tail = bytes(self.tail[-self.tail_limit:]) if self.tail_limit else b""
        if not self.overflowed:
            return bytes(self.head) + tail
        dropped = self.total - len(self.head) - len(tail)
        return bytes(self.head) + f"\n[popkit: {dropped} bytes not kept]\n".encode() + tail

    def text(self) -> str:
        return self.bytes().decode("utf-8", "replace")


@dataclass(frozen=True)
class Finished:
    """How a child ended. `code` is its exit code (-N for signal N); `pipe` what its result pipe held."""

    code: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    pipe: bytes = b""
    pipe_overflow: bool = False  # the child wrote more than PIPE_BYTES on the result pipe


def run(argv: Sequence[str], cwd: Path | str | None, env: Mapping[str, str], timeout_s: float,
        result_fd_env: str | None = None, watch: Callable[[bytes], None] | None = None,
        inputs: Mapping[str, bytes | int] | None = None,
        deadline: Callable[[], float | None] | None = None,
        started: Callable[[], None] | None = None) -> Finished:
    """Run `argv` to its end or its timeout; its whole process tree is gone when this returns.

    With `result_fd_env`, the child also gets the write end of a result pipe, its number in that
    environment variable. Reading stops when the child exits: what its leftovers write later is lost.
    `watch`, when given, gets each chunk of the result pipe as it arrives and b"" about once a second
    (for live progress); it runs on the calling thread and must be quick. `inputs` maps an environment
    variable to bytes the child reads from the descriptor it names (a pipe holding them, then closed):
    a secret passed that way is in no environment and no command line. An int instead of bytes is the read end
    of a pipe the caller made and keeps writing to (a warm start's control channel); it is passed on as it is,
    and closed here once the child has it.
    `deadline`, when given, is asked at least every DEADLINE_POLL_S for the time (time.monotonic()) by which the
    child must end; None keeps start + timeout_s (a warm start's run gets its mode's timeout from `go`).
    `started`, when given, is called once the child's tree has been started, before reading begins: work that
    can go on beside the child (on threads of its own) starts there, off the path to the child's start.
    Raises OSError when argv[0] cannot be executed.
    """
    start = time.monotonic()
    _protect_self()
    env = dict(env)
    status_r, status_w = os.pipe()
    result_r = result_w = None
    passed = [status_w, _lifeline()]
    if result_fd_env:
        result_r, result_w = os.pipe()
        env[result_fd_env] = str(result_w)
        passed.append(result_w)
    given = []
    for name, data in (inputs or {}).items():
        if isinstance(data, int):
            env[name] = str(data)
            given.append(data)
            continue
        read, write = os.pipe()
        try:
            os.write(write, data)  # a few bytes: the pipe's buffer holds them
        finally:
            os.close(write)
        env[name] = str(read)
        given.append(read)
    passed += given
    try:
        watchdog = subprocess.Popen(
            watchdog_argv("run", str(status_w), str(passed[1]), "--", *argv), cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=passed)
    except BaseException:
        for fd in (status_r, result_r):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (status_w, result_w, *given):  # only the child's tree holds these now
            if fd is not None:
                os.close(fd)
    reader = _Reader(watchdog, status_r, result_r, watch)
    try:
        if started is not None:
            started()
        reader.until(start + timeout_s, deadline)
    finally:
        reader.close()
    if reader.exec_errno is not None:
        raise OSError(reader.exec_errno, os.strerror(reader.exec_errno), argv[0])
    code = reader.code if reader.code is not None else (-signal.SIGKILL if reader.timed_out else watchdog.returncode)
    return Finished(code=code, stdout=reader.out.text(), stderr=reader.err.text(),
                    seconds=(reader.ended or time.monotonic()) - start, timed_out=reader.timed_out,
                    pipe=bytes(reader.result.head), pipe_overflow=reader.result.overflowed)


class _Reader:
    """Reads a watchdog's pipes on the calling thread, with every wait bounded."""

    def __init__(self, watchdog: subprocess.Popen, status_fd: int, result_fd: int | None,
                 watch: Callable[[bytes], None] | None = None):
        self.watchdog = watchdog
        self.watch = watch
        self.out, self.err = Buffer(), Buffer()
        self.result = Buffer(PIPE_BYTES, 0)
        self.status = bytearray()
        self.code: int | None = None
        self.exec_errno: int | None = None
        self.child_pid: int | None = None
        self.timed_out = False
        self.ended: float | None = None
        self.fds = [fd for fd in (status_fd, result_fd) if fd is not None]
        self.sel = selectors.DefaultSelector()
        for fd, sink in ((watchdog.stdout.fileno(), self.out), (watchdog.stderr.fileno(), self.err),
                         (status_fd, self.status), (result_fd, self.result)):
            if fd is not None:
                os.set_blocking(fd, False)
                self.sel.register(fd, selectors.EVENT_READ, sink)

    def _read(self, fd: int, sink) -> bool:
        """Read what `fd` holds now; False at EOF (then it is unregistered)."""
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return True
            if not data:
                self.sel.unregister(fd)
                return False
            if isinstance(sink, bytearray):
                sink += data
                self._parse_status()
            else:
                sink.add(data)
                if sink is self.result and self.watch is not None:
                    self.watch(data)

    def _parse_status(self) -> None:
        for line in bytes(self.status).decode("ascii", "replace").splitlines():
            word, _, value = line.partition(" ")
            if word == "pid" and value.isdigit():
                self.child_pid = int(value)
            elif word == "exit" and value.lstrip("-").isdigit():
                self.code = int(value)
            elif word == "error" and value.isdigit():
                self.exec_errno = int(value)

    def _child_done(self) -> bool:
        return self.code is not None or self.exec_errno is not None

    def until(self, deadline: float, moving: Callable[[], float | None] | None = None) -> None:
        """Read until the child exits, the watchdog goes, or the deadline passes (then stop the tree).
        `moving()`, when given, replaces `deadline` whenever it says a time."""
        status_open = True
        while status_open and not self._child_done():
            moved = moving() if moving is not None else None
            left = (deadline if moved is None else moved) - time.monotonic()
            if left <= 0:
                self.timed_out = True
                break
            wait = left if self.watch is None else min(left, 1.0)
            for key, _ in self.sel.select(wait if moving is None else min(wait, DEADLINE_POLL_S)):
                if not self._read(key.fd, key.data) and isinstance(key.data, bytearray):
                    status_open = False  # the watchdog is gone
            if self.watch is not None:
                self.watch(b"")
        self.ended = time.monotonic()
        self.stop()

    def stop(self) -> None:
        """The child exited or ran out of time: its tree dies now, within KILL_GRACE_S."""
        if self.watchdog.poll() is None and not self._child_done():
            self.watchdog.send_signal(signal.SIGTERM)
        try:
            self.watchdog.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
            self.watchdog.wait(KILL_GRACE_S)
        if self.child_pid is not None and not self._child_done():
            try:  # the watchdog was killed itself: its child dies by PR_SET_PDEATHSIG; make sure
                os.killpg(self.child_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Take what the pipes hold now, then close them: later writes are lost."""
        if self.watchdog.poll() is None:  # interrupted before stop() ran (KeyboardInterrupt, SIGTERM)
            self.stop()
        for key in list(self.sel.get_map().values()):
            self._read(key.fd, key.data)
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fd)
        self.sel.close()
        self.watchdog.stdout.close()
        self.watchdog.stderr.close()
        for fd in self.fds:
            os.close(fd)


def completed(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
              cwd: Path | str | None = None, **_ignored) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, timeout=...) through the watchdog.

    On timeout the whole tree is killed and subprocess.TimeoutExpired is raised.
    """
    done = run(argv, cwd, os.environ if env is None else env, timeout)
    if done.timed_out:
        raise subprocess.TimeoutExpired(list(argv), timeout, done.stdout, done.stderr)
    return subprocess.CompletedProcess(list(argv), done.code, done.stdout, done.stderr)


class WorkDir:
    """A fresh temporary folder that is removed when the block ends, or by a guard if popkit dies first.

        with WorkDir("popkit-run-", keep=False) as path: ...
    """

    def __init__(self, prefix: str, keep: bool = False):
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self.keep = keep
        read, self._write = os.pipe()
        try:
            self._guard = subprocess.Popen(watchdog_argv("guard", str(read), str(self.path)),
                                           stdin=subprocess.DEVNULL, pass_fds=[read])
        finally:
            os.close(read)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *_exc) -> None:
        if self.keep:
            os.write(self._write, b"keep")
        else:
            _watchdog.force_remove(str(self.path))
        os.close(self._write)
        try:
            self._guard.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            self._guard.kill()
