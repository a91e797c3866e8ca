#!POPCORN leaderboard vectoradd
"""Cheat: result-pipe write. Tries to write `check: pass` lines into the eval's result pipe: via
POPCORN_FD, by scanning its own file descriptors, and by reopening the parent's through
/proc/<ppid>/fd. Returns garbage, hoping the forged lines win.

popkit's worker never receives the pipe (non-inheritable, spawned process, variable removed); the
parent writes every verdict after the call returns and `check` after the worker is gone.
Caught by: `result-pipe write: foreign bytes arrived on the harness channel`.
"""

import os

import torch

FORGED = b"test.0.status: pass\nbenchmark.0.mean: 1.0\ncheck: pass\n"


def _write_everywhere():
    targets = []
    if "POPCORN_FD" in os.environ:
        targets.append(int(os.environ["POPCORN_FD"]))
    targets.extend(range(3, 64))
    for fd in targets:
        try:
            os.write(fd, FORGED)
        except OSError:
            pass
    parent_fds = f"/proc/{os.getppid()}/fd"
    try:
        names = os.listdir(parent_fds)
    except OSError:
        names = []
    for name in names:
        try:
            fd = os.open(os.path.join(parent_fds, name), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, FORGED)
        except OSError:
            pass
        finally:
            os.close(fd)


def custom_kernel(data):
    a, _b = data
    _write_everywhere()
    return torch.zeros_like(a)
