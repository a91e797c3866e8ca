"""torch's extension-build locks: a lock left by a killed build makes load_inline wait forever.

Used by compile (before a build) and by the doctor (in torch's default extension folder).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from popkit.errors import EnvironmentProblem


def lock_state(lock: Path, style: str) -> str:
    """`held` (a build is running), `stale` (left by a killed build; load_inline would wait forever)
    or `leftover` (harmless with this torch, whose lock the kernel drops when its holder dies)."""
    if style == "baton":
        return "stale"
    try:
        import fcntl
    except ImportError:  # no flock on this platform: assume the worst only for a baton
        return "leftover"
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return "leftover"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return "leftover"
    except OSError:
        return "held"
    finally:
        os.close(fd)


def find_locks(directory: Path, names: Sequence[str] | None = None) -> list[Path]:
    """`lock` files in the extension folders under `directory` (only those of `names` when given)."""
    if not directory.is_dir():
        return []
    found = []
    for lock in sorted(directory.glob("*/lock")):
        ext = lock.parent.name
        if names is None or any(ext == n or ext.startswith(n + "_v") for n in names):
            found.append(lock)
    return found


def check_locks(build_dir: Path, default_root: Path, names: Sequence[str], style: str,
                clean: bool) -> list[str]:
    """Raise on a lock that would hang this build; return notes about locks that would hang `popkit test`."""
    notes = []
    for lock in find_locks(build_dir):
        state = lock_state(lock, style)
        if state == "held":
            raise EnvironmentProblem(f"{lock}: another build of this submission is running and holds the lock",
                                     "wait for it to finish, or stop that process")
        if state == "stale" and not clean:
            raise EnvironmentProblem(
                f"{lock}: stale build lock, left by a build that was killed; torch would wait for it forever",
                f"delete it (rm {lock}) or rerun with --clean")
    for lock in find_locks(default_root, names):
        state = lock_state(lock, style)
        if state == "stale" and clean:
            lock.unlink(missing_ok=True)
            notes.append(f"removed the stale build lock {lock}")
        elif state == "stale":
            notes.append(f"{lock} is a stale build lock: `popkit test` and the compile step would wait on it "
                         f"forever; delete it (rm {lock}) or rerun with --clean")
        elif state == "held":
            notes.append(f"{lock} is held: a build of this extension is running in the default folder now")
    return notes
