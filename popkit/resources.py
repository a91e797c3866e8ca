"""Where popkit's bundled material lives: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path

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
