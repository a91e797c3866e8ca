"""Where popkit's files are: its bundled material (inside the wheel, or at the top of a source
checkout) and the folder where it keeps its own data (history, builds)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

HOME_ENV = "POPKIT_HOME"

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


def popkit_home(env: Mapping[str, str] | None = None) -> Path:
    """POPKIT_HOME (`~` expanded), else `.popkit` in the working directory: history and builds live there."""
    env = os.environ if env is None else env
    home = env.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.cwd() / ".popkit"
