"""Answers of pure analyses of files, remembered in popkit's cache folder under a digest of all they read.

Before every run popkit reads the task's files with `ast` to learn what the task needs from the machine
(runnable.needs): 0.1-0.2 s a run on the bundled tasks, whose eval is popkit's 100 KB harness. That answer
depends only on the bytes of those files, a few names, the interpreter (its parser and standard library)
and popkit's own code. `remembered` keeps it under a sha256 of all of them (`digest`), so the next run of the
same task files reads it back; an entry that is missing, unreadable or malformed is computed again, and a
cache that cannot be written only costs the analysis. What protects a run is never taken from here: the
workspace check reads the files it guards afresh on every run (executor.Workspace.tampered).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from popkit import __version__
from popkit.resources import write_cache_json
from popkit.toolchain.prestep import cache_dir

MAX_ENTRIES = 500  # per kind; the oldest go first
T = TypeVar("T")


def digest(kind: str, code: Sequence[Path], parts: Sequence[bytes | str]) -> str:
    """The key of one answer: the analysis (`kind`, popkit's version, the bytes of the modules in `code`), the
    interpreter, and `parts` (every byte and name the analysis reads), each length-prefixed."""
    h = hashlib.sha256()
    for item in (kind, __version__, sys.version, *(path.read_bytes() for path in code), *parts):
        data = item.encode("utf-8", "surrogateescape") if isinstance(item, str) else item
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def remembered(kind: str, key: str, compute: Callable[[], T], dump: Callable[[T], Any],
               load: Callable[[Any], T]) -> T:
    """compute()'s answer for `key`: read back when this kind's memo holds it, else computed and kept (`dump`
    makes it JSON, `load` makes it back and raises KeyError, TypeError or ValueError on what it cannot read)."""
    path = cache_dir() / f"{kind}-memo.json"
    entries = _read(path)
    if key in entries:
        try:
            return load(entries[key])
        except (KeyError, TypeError, ValueError):
            pass
    value = compute()
    entries.pop(key, None)
    entries[key] = dump(value)
    write_cache_json(path, dict(list(entries.items())[-MAX_ENTRIES:]))
    return value


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


