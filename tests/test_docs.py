"""The docs are tested: every command has help with an example; the README's commands are real."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from popkit.cli import app

README = (Path(__file__).parents[1] / "README.md").read_text()


def _commands() -> dict:
    group = typer.main.get_command(app)
    found = {}
    for name, cmd in group.commands.items():
        found[name] = cmd
        if hasattr(cmd, "commands"):  # a command group (tasks)
            found.update({f"{name} {sub}": c for sub, c in cmd.commands.items()})
    return found


COMMANDS = _commands()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_with_an_example(name):
    result = CliRunner().invoke(app, name.split() + ["--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"`popkit {name} --help` shows no example"


DOCS = "\n".join(p.read_text() for p in sorted((Path(__file__).parents[1] / "docs").glob("*.md"))
                 if p.name != "benchmarks.md")  # the topic docs; benchmarks quote scripts, not commands


def _readme_popkit_lines() -> list[str]:
    """Every `popkit ...` line of a bash block in README.md and the topic docs."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README + "\n" + DOCS, flags=re.S):
        for line in block.splitlines():
            line = line.split("#")[0].strip()
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("popkit "):
                    lines.append(part)
    return lines


@pytest.mark.parametrize("line", _readme_popkit_lines())
def test_readme_commands_name_real_commands_and_options(line):
    words = shlex.split(line)[1:]
    name = words[0] if words[0] in COMMANDS else None
    if len(words) > 1 and f"{words[0]} {words[1]}" in COMMANDS:
        name = f"{words[0]} {words[1]}"
    assert name, f"README runs `{line}`, but there is no such command"
    known = {opt for param in COMMANDS[name].params for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", [])}
    for word in words:
        if word.startswith("-"):
            assert word.split("=")[0] in known, f"README: `{line}` uses {word}, which `popkit {name}` does not take"


def test_readme_documents_every_exit_code():
    from popkit.errors import ExitCode

    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \|", README, flags=re.M), f"README's exit-code table lacks {int(code)}"


def test_the_command_reference_lists_every_command():
    reference = (Path(__file__).parents[1] / "docs" / "commands.md").read_text()
    for name in COMMANDS:
        top = name.split()[0]
        assert f"`popkit {top}" in reference, f"docs/commands.md does not mention `popkit {top}`"
