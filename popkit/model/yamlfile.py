"""Reading the YAML of tasks and problem sets safely: one-line errors naming the file and the line, and a cap on
what aliases can expand to (a billion-laughs file is refused, not expanded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from popkit.errors import TaskError


def display_path(path: Path) -> str:
    """A path as the user would write it: relative to the current directory when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_yaml(path: Path, what: str) -> Any:
    """A task.yml or problem-set file, parsed safely (TaskError naming the file and the line on any problem)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{display_path(path)}: {what} not found", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{display_path(path)}: cannot read {what} ({exc})") from None
    try:
        raw = yaml.safe_load(text)
    except RecursionError:
        raise TaskError(f"{display_path(path)}: nested too deeply to read", "a task needs a few levels at most") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TaskError(f"{display_path(path)}: {where}invalid YAML ({problem})", "fix the YAML syntax") from None
    check_size(raw, path)
    return raw


MAX_YAML_VALUES = 100_000  # a task or problem set holds hundreds; YAML aliases can expand to billions
MAX_YAML_DEPTH = 20


def check_size(raw: Any, path: Path) -> None:
    """Refuse a document that expands (through YAML aliases) past MAX_YAML_VALUES or nests past MAX_YAML_DEPTH."""
    pending, count = [(raw, 1)], 0
    while pending:
        value, depth = pending.pop()
        count += 1
        if count > MAX_YAML_VALUES or depth > MAX_YAML_DEPTH:
            what = f"over {MAX_YAML_VALUES:,} values" if count > MAX_YAML_VALUES else f"nested over {MAX_YAML_DEPTH} deep"
            raise TaskError(f"{display_path(path)}: {what} (YAML aliases counted as expanded)",
                            "a task or problem set needs far less; remove the aliases or the generated part")
        children = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else ()
        pending.extend((child, depth + 1) for child in children)
