"""`#!POPCORN` directives, read the way the server reads them and the way popcorn-cli reads them.

Server (docs/protocol-notes.md §6): only the leading block of lines starting with `#` or `//` counts;
a blank line ends it; known directives are `leaderboard` and `gpu` (alias `gpus`); a directive without a
value, an unknown or a repeated one is an error. popcorn-cli (same notes, §7): every comment line anywhere
counts, the last wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_DIRECTIVE = re.compile(r"^\s*(#|//)!POPCORN\b(.*)$", re.IGNORECASE)
_ALIASES = {"leaderboard": "leaderboard", "gpu": "gpu", "gpus": "gpu"}


@dataclass(frozen=True)
class DirectiveProblem:
    line: int  # 1-based
    message: str


@dataclass(frozen=True)
class Directives:
    leaderboard: str | None = None
    gpu: str | None = None
    leaderboard_line: int | None = None
    gpu_line: int | None = None
    problems: tuple[DirectiveProblem, ...] = field(default_factory=tuple)


def _split(rest: str) -> tuple[str, str]:
    parts = rest.strip().split(None, 1)
    if not parts:
        return "", ""
    return parts[0].lower(), parts[1].strip() if len(parts) > 1 else ""


def server_directives(text: str) -> Directives:
    """Directives as the server reads them: the leading comment block only, strictly."""
    found: dict[str, tuple[str, int]] = {}
    problems: list[DirectiveProblem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or not (stripped.startswith("#") or stripped.startswith("//")):
            break
        match = _DIRECTIVE.match(line)
        if not match:
            continue
        name, value = _split(match.group(2))
        key = _ALIASES.get(name)
        if key is None:
            problems.append(DirectiveProblem(number, f"unknown directive `{name or '(empty)'}`"
                                                     " (known: leaderboard, gpu)"))
        elif not value:
            problems.append(DirectiveProblem(number, f"directive `{name}` has no value"))
        elif key in found:
            problems.append(DirectiveProblem(number, f"directive `{name}` repeated"
                                                     f" (first on line {found[key][1]})"))
        else:
            found[key] = (value, number)
    lb, gpu = found.get("leaderboard"), found.get("gpu")
    return Directives(
        leaderboard=lb[0] if lb else None, gpu=gpu[0] if gpu else None,
        leaderboard_line=lb[1] if lb else None, gpu_line=gpu[1] if gpu else None,
        problems=tuple(problems),
    )


def cli_directives(text: str) -> Directives:
    """Directives as popcorn-cli reads them: every comment line in the file, the last one wins."""
    values: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = _DIRECTIVE.match(line)
        if match:
            name, value = _split(match.group(2))
            key = _ALIASES.get(name)
            if key and value:
                values[key] = (value, number)
    lb, gpu = values.get("leaderboard"), values.get("gpu")
    return Directives(leaderboard=lb[0] if lb else None, gpu=gpu[0] if gpu else None,
                      leaderboard_line=lb[1] if lb else None, gpu_line=gpu[1] if gpu else None)
