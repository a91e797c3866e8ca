"""popkit commands: remote."""

from __future__ import annotations

from popkit.cli import app  # noqa: F401
