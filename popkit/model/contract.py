"""A task's contract: the names a submission must define, read from the task's own eval.

Most evals do `from submission import custom_kernel`; others differ (the princeton cross-entropy eval
does `import submission` and checks `cross_entropy_forward` and `cross_entropy_backward`). popkit reads
the eval's source with `ast` and never runs it. Where the eval's use of the submission cannot be read
statically (importlib, computed names), the contract is empty and nothing is refused before the run:
popkit never refuses what the task's eval would accept.
"""

from __future__ import annotations

import ast
from pathlib import Path

from popkit.model.tasks import SUBMISSION_SOURCE, Task

POPKIT_HARNESS_ENTRY = ("custom_kernel",)  # popkit's own harness (--harness popkit) calls this


def entry_points(task: Task, harness: str = "task") -> tuple[str, ...]:
    """The module-level names a submission to `task` must define, in the order the eval names them."""
    if harness == "popkit" or task.bundled:  # bundled tasks run popkit's harness as their eval
        return POPKIT_HARNESS_ENTRY
    module = Path(task.submission_name).stem
    names: list[str] = []
    for path in _eval_sources(task):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        for name in _names_used(tree, module):
            if name not in names:
                names.append(name)
    return tuple(names)


def _eval_sources(task: Task) -> list[Path]:
    """The task's own Python files (the eval first): any of them may import the submission."""
    files = sorted((f for f in task.files if f.source != SUBMISSION_SOURCE and f.name.endswith(".py")),
                   key=lambda f: f.name != task.main)
    return [task.path / f.source for f in files]


def _names_used(tree: ast.AST, module: str) -> list[str]:
    """Names taken from `module`: `from module import a`, `module.a`, get/hasattr(module, "a" or a loop var)."""
    aliases: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module and node.level == 0:
            found += [a.name for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == module}
    if not aliases:
        return found
    loops = _string_loops(tree)
    negated = {id(n.operand) for n in ast.walk(tree) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)}
    optional: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if isinstance(node.ctx, ast.Load) and not node.attr.startswith("__"):
                found.append(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases):
            what = node.args[1]
            names = ([what.value] if isinstance(what, ast.Constant) and isinstance(what.value, str)
                     else loops.get(what.id, []) if isinstance(what, ast.Name) else [])
            # `getattr(m, x, default)` and `if hasattr(m, x):` make x optional; `if not hasattr(m, x)` requires it.
            required = len(node.args) == 2 if node.func.id == "getattr" else id(node) in negated
            (found.extend if required else optional.update)(names)
    return [name for name in found if name not in optional]


def _string_loops(tree: ast.AST) -> dict[str, list[str]]:
    """`for NAME in ("a", "b")` loops (also over a module-level tuple of strings): NAME -> its strings."""
    constants: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            strings = _strings(node.value)
            if strings:
                constants[node.targets[0].id] = strings
    loops: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            strings = _strings(node.iter)
            if not strings and isinstance(node.iter, ast.Name):
                strings = constants.get(node.iter.id, [])
            if strings:
                loops.setdefault(node.target.id, []).extend(strings)
    return loops


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return []
