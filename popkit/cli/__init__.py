"""The `popkit` command: a Typer app (popkit.cli.app) whose commands live in running, authoring and remote."""

from __future__ import annotations

# Importing a command module registers its commands on `app`; help lists them in this order.
from popkit.cli import running, authoring, remote  # noqa: F401,I001
from popkit.cli.app import app


def main() -> None:
    app(prog_name="popkit")
