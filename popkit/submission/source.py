"""The submission file itself: read once, checked as far as a file can be without running it.

`Source` is a submission's path and its bytes, read once and passed on (every later step, history
included, sees exactly the bytes that ran). The checks here are the ones a file fails on its own:
empty, not UTF-8, a syntax error, the task's entry points missing or bound to data, a C++ file for a
Python task, a CUDA build on a machine without a GPU.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from popkit.check.lint import read_bytes
from popkit.errors import EnvironmentProblem, SubmissionError, TaskError, UsageError
from popkit.machine import cputorch
from popkit.machine import system
from popkit.model.directives import cli_directives, server_directives
from popkit.model.tasks import Task, bundled_problem_set, resolve_task
from popkit.toolchain.hipcheck import detect_target


@dataclass(frozen=True)
class Source:
    """A submission as popkit runs it: where it came from (for messages and history) and its bytes."""

    path: Path
    content: bytes

    @classmethod
    def read(cls, path: Path | str) -> "Source":
        """The file's bytes after the checks that need no task (empty, UTF-8, syntax); see validate_submission."""
        return cls(Path(path), read_submission(Path(path), entry_points=None))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def read_submission(path: Path, entry_points: Sequence[str] | None = ("custom_kernel",)) -> bytes:
    """The submission's bytes, after the checks a file can fail on its own (see validate_submission).

    `entry_points`: the names the task's eval takes from the submission (popkit.model.contract); None
    before the task is known.
    """
    return validate_submission(Path(path), read_bytes(path), entry_points)


def validate_submission(path: Path, data: bytes, entry_points: Sequence[str] | None) -> bytes:
    """Not empty, UTF-8, parses (a .py file), and defines every name in `entry_points` at module level."""
    if not data.strip():
        raise SubmissionError(f"{path}: the file is empty", "write the functions the task asks for in it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionError(f"{path}: not UTF-8 (byte {exc.start})", "save the file as UTF-8") from None
    if Path(path).suffix == ".py":
        try:
            tree = ast.parse(text.removeprefix(BOM), filename=str(path))  # Python skips a leading BOM too
        except SyntaxError as exc:
            raise SubmissionError(f"{path}:{exc.lineno}:{exc.offset or 0}: syntax error: {exc.msg}",
                                  "fix the syntax; `python -m py_compile FILE` shows the same") from None
        for name in entry_points or ():
            bound = _bound_to_data(tree, name)
            if bound:
                raise SubmissionError(f"{path}: {name} is not a function (it is bound to {bound})",
                                      f"define `def {name}(data):` returning the output")
        missing = [name for name in entry_points or () if not _defines(tree, name)]
        if missing:
            hint = f"the task's eval takes {', '.join(entry_points)} from the submission"
            if tuple(entry_points) == ("custom_kernel",):
                hint = "define `def custom_kernel(data):` returning the output"
            raise SubmissionError(f"{path}: no `{missing[0]}` defined at module level", hint)
    return data


NATIVE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hip")
# What marks a submission that builds a CUDA (or HIP) extension: it cannot run without a GPU.
CUDA_MARKERS = ("cuda_sources", "CUDAExtension", "--offload-arch")
CUDA_SOURCE_FILE = re.compile(r"""\.cu['"]""")


def needs_gpu(data: bytes) -> bool:
    """Whether the submission builds a CUDA/HIP extension (load_inline with cuda_sources, a .cu source)."""
    text = data.decode("utf-8", "replace")
    return any(m in text for m in CUDA_MARKERS) or bool(CUDA_SOURCE_FILE.search(text))


def check_language(task: Task, submission: Path) -> None:
    """A C++/CUDA/HIP source file cannot be a Python task's submission.py (exit 4, before anything runs)."""
    suffix = Path(submission).suffix.lower()
    if task.lang == "py" and suffix in NATIVE_SUFFIXES:
        raise SubmissionError(
            f"{submission}: a {suffix} source file, but task `{task.name}` runs Python (`lang: py`): the runner "
            "would run it as submission.py and fail with syntax errors",
            f"put the kernel in a .py file that builds it with load_inline(cuda_sources=...); "
            f"`popkit new --target cuda --task {task.name}` writes one")


def check_language_for(submission: Path, leaderboard: str | None, roots: Sequence[Path]) -> None:
    """`popkit check`: a C++/CUDA file for the Python task its leaderboard names is refused (exit 4); a
    leaderboard popkit does not know leaves the server's rules as all there is to check."""
    if not leaderboard or Path(submission).suffix.lower() == ".py":
        return
    try:
        task = resolve_task(leaderboard, roots)
    except TaskError:
        return
    check_language(task, submission)


def check_runnable(task: Task, submission: Path, data: bytes, mode: str) -> None:
    """What must hold before anything runs: a Python file for a Python task, a GPU for a CUDA build."""
    check_language(task, submission)
    if needs_gpu(data) and not system.has_gpu():
        command = "test" if mode == "test" else "bench"
        target = detect_target(data.decode("utf-8", "replace"))
        raise EnvironmentProblem(*cputorch.no_gpu_message(submission, command, cputorch.is_cpu_only(), target))


def task_spec_for(path: Path, content: bytes, explicit: str | None) -> str:
    """The task to run: --task if given, else the file's `#!POPCORN leaderboard` directive."""
    if explicit:
        return explicit
    text = content.decode("utf-8")
    name = server_directives(text).leaderboard or cli_directives(text).leaderboard
    if not name:
        known = [p.name for p in bundled_problem_set().problems]
        close = difflib.get_close_matches(Path(path).stem.lower(), known, n=1, cutoff=0.5)
        example = f"`#!POPCORN leaderboard {close[0]}`" if close else "`#!POPCORN leaderboard NAME`"
        raise UsageError(f"{path}: no `#!POPCORN leaderboard NAME` directive and no --task",
                         f"add {example} as the file's first line, or pass --task (`popkit tasks` lists the names)")
    return name


BOM = "\ufeff"  # a UTF-8 byte-order mark, as decoded text


def _bound_to_data(tree: ast.Module, name: str) -> str:
    """`an int at line 3` when the module's last top-level binding of `name` is a literal; else ''."""
    last = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            last = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == name
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            last = node.value
    if isinstance(last, ast.Constant):
        kind = type(last.value).__name__
    elif isinstance(last, (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr)):
        kind = {"JoinedStr": "str"}.get(type(last).__name__, type(last).__name__.lower())
    else:
        return ""
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{article} {kind} at line {last.lineno}"


def _defines(tree: ast.Module, name: str) -> bool:
    """Whether module-level code binds `name` (a def, class, assignment or import, also under if/try/with)."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name) == name for alias in node.names):
            return True
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for attr in ("body", "orelse", "finalbody"):
                pending.extend(getattr(node, attr, []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)
    return False


def reference_submission() -> bytes:
    """A submission that runs the task's own ref_kernel (used by `--baseline reference`)."""
    return (b"# popkit baseline: the task's reference implementation\n"
            b"from reference import ref_kernel\n\n\n"
            b"def custom_kernel(data):\n    return ref_kernel(data)\n")
