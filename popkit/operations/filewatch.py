"""Noticing the saves of one file with the standard library: stat polling, partial writes debounced.

A save is a change of the file's stamp (modification time in ns, size, inode: an editor that saves by
renaming a new file over the old one changes the inode). A change is taken only once the stamp stayed the
same for one poll (a writer still appending changes it) and the bytes read then parse as Python (an editor
that truncates, then writes, can leave a stable half file for a moment). A file that stays unparsable for
`settle_s` after its last change is taken as it is: its syntax error is the verdict.
"""

from __future__ import annotations

import ast
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

POLL_S = 0.05  # stat every 50 ms: a save is noticed within 50-100 ms
SETTLE_S = 0.5  # an unparsable file this long unchanged is a syntax error, not a partial write


@dataclass(frozen=True)
class Stamp:
    mtime_ns: int
    size: int
    inode: int


def stamp(path: Path) -> Optional[Stamp]:
    """The file's stamp, or None while it is missing or unreadable (between an editor's unlink and rename)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return Stamp(st.st_mtime_ns, st.st_size, st.st_ino)


def parses(data: bytes) -> bool:
    """Whether `data` is a complete Python module (ast.parse; a null byte or bad UTF-8 fails too)."""
    try:
        ast.parse(data)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Save:
    """One save as the watcher took it: the bytes, whether they parse, and when (for the save-to-verdict time)."""

    content: bytes
    stamp: Stamp
    parses: bool
    noticed_at: float  # time.monotonic() when the stamp first changed
    saved_at: float  # time.time() of the save: the file's modification time, within one poll of noticed_at


class SaveWatcher:
    """Polls `path` every `poll_s` seconds; `next_save()` blocks until a save is complete (module doc).

    `clock`, `wall`, `sleep`, `stat` and `read` are injectable for tests (fake time, a scripted file).
    """

    def __init__(self, path: Path, *, poll_s: float = POLL_S, settle_s: float = SETTLE_S,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, stat: Callable[[Path], Optional[Stamp]] = stamp,
                 read: Callable[[Path], bytes] = lambda p: p.read_bytes(),
                 parse: Callable[[bytes], bool] = parses):
        self.path = path
        self.poll_s, self.settle_s = poll_s, settle_s
        self.clock, self.wall, self.sleep, self.stat, self.read, self.parse = clock, wall, sleep, stat, read, parse
        self.taken: Optional[Stamp] = stat(path)  # the stamp of the last save taken (or of the start)
        self.unchanged_at = wall()  # time.time() when the file last still had the stamp `taken`

    def next_save(self, stop: Callable[[], bool] = lambda: False,
                  tick: Callable[[], None] = lambda: None) -> Optional[Save]:
        """The next complete save, or None once `stop()` says so (asked every poll). `tick()` runs every poll
        (the caller's chance to notice other things while it waits)."""
        seen: Optional[Stamp] = self.taken
        noticed: Optional[float] = None  # monotonic time of the first change of this save
        changed: Optional[float] = None  # and of its last change
        changed_wall = 0.0  # time.time() when the stamp now seen was first seen
        while not stop():
            tick()
            now, now_wall = self.clock(), self.wall()
            current = self.stat(self.path)
            if current == self.taken and noticed is None:
                self.unchanged_at = now_wall
            if current != seen:  # still changing (or gone): wait for it to stay put for a poll
                seen, changed, changed_wall = current, now, now_wall
                if noticed is None:
                    noticed = now
                self.sleep(self.poll_s)
                continue
            if current is None or current == self.taken:
                self.sleep(self.poll_s)
                continue
            try:
                data = self.read(self.path)
            except OSError:
                seen = None
                self.sleep(self.poll_s)
                continue
            if self.stat(self.path) != current:  # written to while it was read
                self.sleep(self.poll_s)
                continue
            ok = self.parse(data)
            if ok or now - (changed or now) >= self.settle_s:
                self.taken = current
                # The modification time, where it is believable: after the last poll that saw the old stamp
                # (a save made while a verdict ran counts from then), never after this stamp was first seen.
                saved = min(changed_wall if changed is not None else now_wall,
                            max(current.mtime_ns / 1e9, self.unchanged_at))
                self.unchanged_at = now_wall
                return Save(data, current, ok, noticed if noticed is not None else now, saved)
            self.sleep(self.poll_s)
        return None
