"""One timed eval per GPU at a time, across every popkit process on this machine.

The leaderboard times one submission per GPU. Two timed evals sharing a GPU time-slice it: each call waits for
the other's work, its event time and the trusted clock's witness both grow by milliseconds, and the harness
then fails honest kernels as `time forged` or `unsynchronized work` (eight evals on one H100 did exactly that).
So a timed mode (benchmark, leaderboard, profile) holds an OS lock per GPU it runs on, exclusively, for the
eval's life; test mode holds it shared (its kernels would time-slice a timed run's calls, and the trace audit
fails a call 10 µs late), so tests run beside tests but never beside a timed run. A timed eval that waits
passes a gate first that later tests queue behind, so a stream of tests cannot starve it. A warm pair's start-up
(`popkit test --watch`: the device, the cases' inputs) holds it shared until the pair is ready, and its `go`
locks anew for the mode. The kernel drops a lock when its holder dies, so a killed run blocks nobody.

The locks live in one folder of the machine's temporary directory (not a user's HOME, which tests and users
point elsewhere), shared by every user: a lock file is opened read-only (flock needs no write access), never
through a link. Where the folder cannot be used, the eval runs unlocked, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

from popkit.errors import EnvironmentProblem
from popkit.machine import nvml, system

TIMED_MODES = frozenset({"benchmark", "leaderboard", "profile"})
LOCK_DIR = Path("/tmp/popkit-gpu-locks")
WAIT_S = 1800.0  # every holder is an eval with its own timeout; a wait this long means a stuck holder
POLL_S = 0.25


def gpus_of(env: Mapping[str, str], gpu_count: int | None = None) -> list[str]:
    """The GPUs a process started with `env` runs on, as lock names: the first visible one (torch's cuda:0), or
    the first `gpu_count` for a multi-GPU task. Driver indices where the visible-devices variable maps to them,
    else its own entries; [] where no GPU is visible."""
    if system.gpu_devices_visible(env) is False:
        return []
    want = max(1, gpu_count or 1)
    nvidia = env.get("CUDA_VISIBLE_DEVICES")
    count = system.gpu_count()
    if Path("/dev/kfd").exists() and not Path("/dev/nvidia0").exists():
        raw = env.get("HIP_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES") or nvidia
        entries = [e.strip() for e in raw.split(",") if e.strip()] if raw else [str(i) for i in range(want)]
        return [f"amd-{e}" for e in entries[:want]]
    indices = nvml.visible_indices(nvidia, count) if count else None
    if indices is not None:
        return [f"nvidia-{i}" for i in indices[:want]]
    entries = [e.strip() for e in (nvidia or "").split(",") if e.strip()] or [str(i) for i in range(want)]
    return [f"nvidia-{e}" for e in entries[:want]]


def _open(name: str, folder: Path) -> int | None:
    """A descriptor on the lock file `name` in `folder`, made if missing; None where that cannot be done."""
    try:
        folder.mkdir(mode=0o777, exist_ok=True)
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode):
            return None
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != 0o1777:
            os.chmod(folder, 0o1777)  # every user's evals share it; the sticky bit keeps each one's files its own
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return os.open(folder / f"{safe}.lock", os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return None


@contextlib.contextmanager
def timing(mode: str, env: Mapping[str, str], gpu_count: int | None = None, *,
           waiting: Callable[[str], None] | None = None, folder: Path | None = None,
           wait_s: float = WAIT_S, stop: Callable[[], bool] | None = None) -> Iterator[list[str]]:
    """Hold the lock of every GPU a `mode` eval under `env` runs on, for the `with` block: exclusively for a
    timed mode, shared otherwise. Yields the locked names ([] on a CPU, or where locking is not possible).
    `waiting` hears once that another run holds one. Raises EnvironmentProblem after `wait_s` of waiting, or as
    soon as `stop()` says the wait is no longer wanted."""
    folder = LOCK_DIR if folder is None else folder
    timed = mode in TIMED_MODES
    deadline = time.monotonic() + wait_s
    held: list[int] = []
    names: list[str] = []
    try:
        for name in sorted(gpus_of(env, gpu_count)):  # one order for every process: no deadlock
            gate, fd = _open(f"{name}.gate", folder), _open(name, folder)
            if fd is None or gate is None:
                for unused in (gate, fd):
                    if unused is not None:
                        os.close(unused)
                continue
            try:
                _acquire(gate, name, fcntl.LOCK_EX, waiting, deadline, wait_s, stop)
                if timed:  # hold the gate while waiting: tests that come later queue behind this run
                    _acquire(fd, name, fcntl.LOCK_EX, waiting, deadline, wait_s, stop)
                else:
                    os.close(gate)
                    gate = None
                    _acquire(fd, name, fcntl.LOCK_SH, waiting, deadline, wait_s, stop)
            except BaseException:
                os.close(fd)
                raise
            finally:
                if gate is not None:
                    os.close(gate)
            held.append(fd)
            names.append(name)
            waiting = None  # said once
        yield names
    finally:
        for fd in held:
            os.close(fd)  # closing drops the lock


def _acquire(fd: int, name: str, how: int, waiting: Callable[[str], None] | None, deadline: float,
             wait_s: float, stop: Callable[[], bool] | None = None) -> None:
    told = False
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError:
            return  # a file system without locks: run unlocked
        if not told and waiting is not None:
            waiting(f"waiting for GPU {name}: another popkit eval is timing on it" if how == fcntl.LOCK_SH else
                    f"waiting for GPU {name}: another popkit eval is using it")
            told = True
        if stop is not None and stop():
            raise EnvironmentProblem(f"GPU {name}: the wait for it was stopped", "start the run again")
        if time.monotonic() > deadline:
            raise EnvironmentProblem(f"GPU {name}: another popkit eval has held it for {wait_s:.0f} s",
                                     f"find the process holding {LOCK_DIR}/{name}.lock (fuser), or stop it")
        time.sleep(POLL_S)


__all__ = ["timing", "gpus_of", "TIMED_MODES", "LOCK_DIR"]
