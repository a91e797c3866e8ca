"""For popkit's harness: returns wrong results and reopens the eval's result pipe through
/proc/<eval pid>/fd/N (the eval is the worker's parent). It writes `check: pass` at once, and again
from a detached grandchild after the eval has exited.

The eval is non-dumpable, so only root can reopen its descriptors. Before popkit's closing record and
its stop at the eval's exit, root's late line won: PASS.
"""
import os
import time

import attack

EVAL = os.getppid()
FORGED = b"check: pass\ntest-count: 0\n"


def _pipes() -> list[int]:
    fds = []
    try:
        names = os.listdir(f"/proc/{EVAL}/fd")
    except OSError:  # not root: the eval's descriptor table is not even listable; carry on with wrong results
        return fds
    for name in names:
        path = f"/proc/{EVAL}/fd/{name}"
        try:
            if int(name) > 2 and os.readlink(path).startswith("pipe:"):
                fds.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # not root: a non-dumpable process's descriptors are out of reach
            pass
    return fds


PIPES = _pipes()


def _write_all() -> None:
    for fd in PIPES:
        try:
            os.write(fd, FORGED)
        except OSError:
            pass


def write_late() -> None:
    while os.path.exists(f"/proc/{EVAL}"):
        time.sleep(0.02)
    time.sleep(0.3)
    _write_all()


attack.record("worker")
_write_all()
attack.detach("late-writer", write_late)


def custom_kernel(data):
    out = data[0] + data[1] if isinstance(data, (tuple, list)) else data
    return out * 0 + 1
