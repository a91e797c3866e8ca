"""popkit's watchdog: the process between popkit and every child it runs. Standard library only.

popkit runs it as a script (`python -I -S _watchdog.py ...`), so it works with any --python:

    _watchdog.py run STATUS_FD LIFELINE_FD -- ARGV...
        Becomes a child subreaper, so every descendant of the child stays below it whatever it does
        (setsid, double fork). Starts ARGV in a new session with PR_SET_PDEATHSIG (SIGKILL), writes
        `pid N` on STATUS_FD, then `exit CODE` (or `error ERRNO` when ARGV cannot be executed) when
        the child exits; then kills every descendant left and exits. It stops the same way, without
        an `exit` line, on SIGTERM, SIGINT or SIGHUP (popkit's timeout, a terminal) and on EOF of
        LIFELINE_FD, a pipe whose write end only popkit holds: popkit is gone, even by SIGKILL.

    _watchdog.py guard LIFELINE_FD DIR
        Waits for EOF on LIFELINE_FD (popkit finished or died) and then removes DIR, unless popkit
        wrote `keep` on the pipe first.

    _watchdog.py own STATUS_FD LIFELINE_FD DIR -- ARGV...
        `run`, then removes DIR once the whole tree is gone: a tree that writes only into a folder of
        its own (a local Ray instance, popkit/distributed/ray_local.py) leaves nothing behind, in that
        order, whether popkit stopped it or died.
"""

from __future__ import annotations

import os
import select
import sys
import time

# The C module under `signal`: the same functions and numbers without signal.py's enums, which would be a third
# of this script's start-up, and every child of popkit waits for that start-up.
import _signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
KILL_WAIT_S = 2.0  # popkit waits a little longer for a watchdog to finish


def prctl(option: int, value: int) -> bool:
    """Linux prctl(2) through ctypes; False where it is not available."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every process below `root`, from the parent links in /proc/*/stat (none without /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def reap() -> dict[int, int]:
    """Collect every exited child (orphans come to a subreaper too): pid -> exit code."""
    done = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = os.waitstatus_to_exitcode(status)


def kill_tree(group: int) -> None:
    """SIGKILL the child's process group, then everything below this process, until nothing is left
    (or KILL_WAIT_S passed). Without /proc (not Linux) only the group is killed."""
    try:
        os.killpg(group, _signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        left = descendants(os.getpid())
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, _signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        time.sleep(0.01)


def _exec_child(argv: list[str], status_fd: int, parent: int) -> None:
    """In the forked child: own session, die with the watchdog, become ARGV."""
    try:
        os.setsid()
        prctl(PR_SET_PDEATHSIG, int(_signal.SIGKILL))
        if os.getppid() != parent:  # the watchdog died before the line above
            os._exit(137)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(status_fd, f"error {exc.errno or 0}\n".encode())
    finally:
        os._exit(127)


def run(status_fd: int, lifeline_fd: int, argv: list[str]) -> int:
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # /proc/<pid>/fd and environ of a non-dumpable process are root's: a child of the same user cannot open
    # the status pipe (to forge an `exit` line) nor read the environment. The child is dumpable again after exec.
    prctl(PR_SET_DUMPABLE, 0)
    os.set_inheritable(status_fd, False)
    os.set_inheritable(lifeline_fd, False)
    stop: list[int] = []
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    _signal.set_wakeup_fd(wake_w)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, lambda signum, _frame: stop.append(signum))
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        _exec_child(argv, status_fd, me)
    os.write(status_fd, f"pid {pid}\n".encode())
    keep = {0, 1, 2, status_fd, lifeline_fd, wake_r, wake_w}
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:  # the result pipe's write end: only the child's tree may hold it
            try:
                os.close(fd)
            except OSError:
                pass
    code = None
    while code is None and not stop:
        ready, _, _ = select.select([lifeline_fd, wake_r], [], [])
        if lifeline_fd in ready and not os.read(lifeline_fd, 64):
            break
        if wake_r in ready:
            os.read(wake_r, 4096)
        code = reap().get(pid, code)
    if code is not None:
        os.write(status_fd, f"exit {code}\n".encode())
    kill_tree(pid)  # the child leads its own session, so its process group is its pid
    return 0


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602
_LOCKED_FLAGS = 0x10 | 0x20  # FS_IMMUTABLE_FL, FS_APPEND_FL


def _unlock(path: str) -> None:
    """Make `path` removable: its immutable and append-only flags cleared (where this process may), owner
    write permission on it and on its folder."""
    try:
        import fcntl
        import struct

        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            flags = struct.unpack("l", fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("l", 0)))[0]
            if flags & _LOCKED_FLAGS:
                fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("l", flags & ~_LOCKED_FLAGS))
        finally:
            os.close(fd)
    except (OSError, ImportError):
        pass
    for target in (os.path.dirname(path) or ".", path):
        try:
            if not os.path.islink(target):
                os.chmod(target, os.stat(target).st_mode | 0o700)
        except OSError:
            pass


def force_remove(path: str) -> bool:
    """Remove `path` (a file, link, FIFO or folder tree) even where the submission made parts of it read-only or
    immutable; never follows a link. Returns whether it is gone."""
    def retry(_func, failed, _exc) -> None:
        _unlock(failed)
        try:
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.rmdir(failed)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if os.path.isdir(path) and not os.path.islink(path):
        import shutil  # here, not at the top: a run's watchdog never removes a folder, and shutil slows its start

        for sub, dirs, files in os.walk(path, topdown=True):
            for name in dirs + files:
                _unlock(os.path.join(sub, name))
        shutil.rmtree(path, onerror=retry)
    elif os.path.lexists(path):
        try:
            os.unlink(path)
        except OSError:
            _unlock(path)
            try:
                os.unlink(path)
            except OSError:
                pass
    return not os.path.lexists(path)


def guard(lifeline_fd: int, directory: str) -> int:
    said = b""
    while chunk := os.read(lifeline_fd, 64):
        said += chunk
    if b"keep" in said:
        return 0
    remove(directory)
    return 0


def remove(directory: str) -> bool:
    """force_remove, tried again for a while: the runs' watchdogs may still be stopping writers."""
    deadline = time.monotonic() + KILL_WAIT_S * 5
    while not force_remove(directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.lexists(directory)


def main(args: list[str]) -> int:
    if len(args) >= 5 and args[0] == "run" and args[3] == "--":
        return run(int(args[1]), int(args[2]), args[4:])
    if len(args) >= 6 and args[0] == "own" and args[4] == "--":
        run(int(args[1]), int(args[2]), args[5:])
        remove(args[3])
        return 0
    if len(args) == 3 and args[0] == "guard":
        for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):  # signals are popkit's to handle
            _signal.signal(sig, _signal.SIG_IGN)
        return guard(int(args[1]), args[2])
    print("usage: _watchdog.py run STATUS_FD LIFELINE_FD -- ARGV... | guard LIFELINE_FD DIR | "
          "own STATUS_FD LIFELINE_FD DIR -- ARGV...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: popkit waits for this process to exit
