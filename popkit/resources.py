"""Where popkit's files are: its bundled material (inside the wheel, or at the top of a source
checkout) and the folder where it keeps its own data (history, builds)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Mapping

HOME_ENV = "POPKIT_HOME"
LEGACY_DIR = ".popkit"  # the per-folder ledger of earlier versions, still used where it exists

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The bundled folder `name` (`tasks`, `templates` or `submissions`).

    An installed wheel carries it under popkit/_data/; a source checkout or editable install
    has it beside the package.
    """
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    return _PACKAGE.parent / name


# popkit's harness (tasks/eval.py and the modules it loads from its own folder, by side: see its docstring). An eval
# folder that runs it holds all of them under these names; tests/test_harness_split.py pins this to eval.py's lists.
HARNESS_ENTRY = "eval.py"
HARNESS_MODULES = ("popkit_protocol.py", "popkit_seal.py", "popkit_shared.py", "popkit_judge.py", "popkit_trusted.py",
                   "popkit_calls.py", "popkit_timed.py", "popkit_worker.py")


def harness_paths(entry: str = HARNESS_ENTRY) -> dict[str, Path]:
    """Every file of popkit's harness by the name it has in an eval's folder, the entry under `entry` (a task's
    `eval.py`, or `popkit_eval.py` beside a task's own eval): the one list that copies, hashes and bundles use."""
    folder = data_dir("tasks")
    return {entry: folder / HARNESS_ENTRY, **{name: folder / name for name in HARNESS_MODULES}}


def popkit_home(env: Mapping[str, str] | None = None) -> Path:
    """Where popkit keeps its ledger and builds: one folder per user by default.

    POPKIT_HOME (`~` expanded) when set; else a `.popkit` folder that already exists in the working
    directory (where popkit kept it before, so such ledgers keep working); else the per-user data folder,
    `$XDG_DATA_HOME/popkit` or `~/.local/share/popkit`.
    """
    return _home(os.environ if env is None else env)[0]


def popkit_home_source(env: Mapping[str, str] | None = None) -> str:
    """Why popkit_home() is where it is: `POPKIT_HOME`, `working directory` or `per-user`."""
    return _home(os.environ if env is None else env)[1]


def _home(env: Mapping[str, str]) -> tuple[Path, str]:
    home = env.get(HOME_ENV)
    if home:
        return Path(home).expanduser(), HOME_ENV
    local = Path.cwd() / LEGACY_DIR
    if local.is_dir():
        return local, "working directory"
    return user_dir("XDG_DATA_HOME", ".local/share", env) / "popkit", "per-user"


def user_dir(xdg_var: str, fallback: str, env: Mapping[str, str] | None = None) -> Path:
    """An XDG base folder: `$XDG_…` when set, else `~/FALLBACK` (`~` from the environment's HOME).

    The one rule behind popkit's data folder, its cache and torch's default build root."""
    env = os.environ if env is None else env
    base = env.get(xdg_var) or str(Path(env.get("HOME") or Path.home()) / fallback)
    return Path(base).expanduser()


def replace_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `path` whole or not at all: a new file beside it (one per process and thread, never opened through a
    link), renamed over it, so nothing is written through a link at either name. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_cache_json(path: Path, data: Any) -> None:
    """Replace the cache file `path` with `data` as JSON (replace_file); a cache that cannot be written is left as
    it was: it only costs work next time."""
    try:
        replace_file(path, json.dumps(data).encode("utf-8"))
    except OSError:
        pass
