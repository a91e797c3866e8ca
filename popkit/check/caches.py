"""Reward-hack rules on output caches: a result kept across calls and returned again.

`output-cache`: a cache keyed on `data_ptr()` or `id()` of the input (freed memory is reused at the same
address, so a new input can hit an old entry); an error when custom_kernel returns the cached value.
`output-replay`: custom_kernel returning a value kept in a module-level container across calls.
"""

from __future__ import annotations

import ast

from popkit.check.rules import finding
from popkit.model.diagnostics import ERROR, WARNING, Diagnostic

ENTRY = "custom_kernel"
_CONTAINERS = {"dict", "list", "set", "collections.defaultdict", "collections.OrderedDict", "defaultdict",
               "OrderedDict"}
_LOOKUP_METHODS = {"get", "setdefault", "pop", "__getitem__", "__contains__"}

def _identity_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "data_ptr")
        or (isinstance(node.func, ast.Name) and node.func.id == "id"))


def _keyed(expr: ast.AST, tainted: set[str]) -> bool:
    return any(_identity_call(n) or (isinstance(n, ast.Name) and n.id in tainted) for n in ast.walk(expr))


def _lookup_key(node: ast.AST) -> ast.AST | None:
    """The key of a mapping access: d[key], d.get(key), key in d."""
    if isinstance(node, ast.Subscript):
        return node.slice
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in _LOOKUP_METHODS and node.args):
        return node.args[0]
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        return node.left
    return None


def cache_findings(scope: ast.AST, body: list[ast.AST], name: str) -> list[Diagnostic]:
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    tainted: set[str] = set()
    for _ in range(2):  # two passes let `k = x.data_ptr(); key = (k, n)` taint both names
        for n in nodes:
            if isinstance(n, ast.Assign) and _keyed(n.value, tainted):
                tainted |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    lookups = [n for n in nodes if (key := _lookup_key(n)) is not None and _keyed(key, tainted)]
    if not lookups:
        return []
    looked = {id(n) for n in lookups}
    cached = {t.id for n in nodes if isinstance(n, ast.Assign) and id(n.value) in looked
              for t in n.targets if isinstance(t, ast.Name)}
    for n in nodes:
        if isinstance(n, ast.Return) and n.value is not None and (
                id(n.value) in looked or (isinstance(n.value, ast.Name) and n.value.id in cached)):
            return [finding("output-cache", ERROR, n.lineno, n.col_offset + 1,
                            f"`{name}` returns a value cached by `data_ptr()`/`id()` of its input",
                            "the leaderboard reallocates and rechecks inputs; a replayed output is a hack")]
    first = lookups[0]
    return [finding("output-cache", WARNING, first.lineno, first.col_offset + 1,
                    f"a cache in `{name}` is keyed on `data_ptr()`/`id()`",
                    "freed memory is reused at the same address; key caches on shape and dtype instead")]


def replay_findings(tree: ast.Module) -> list[Diagnostic]:
    """custom_kernel returning something stored in a module-level container: a replayed output."""
    containers = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            value = stmt.value
            is_container = isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
                isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute))
                and ast.unparse(value.func) in _CONTAINERS)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if is_container:
                containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    entry = next((s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and s.name == ENTRY), None)
    if entry is None or not containers:
        return []

    def stored(expr: ast.AST, names: set[str]) -> bool:
        if isinstance(expr, ast.Subscript):
            return isinstance(expr.value, ast.Name) and expr.value.id in containers
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get":
            return isinstance(expr.func.value, ast.Name) and expr.func.value.id in containers
        return isinstance(expr, ast.Name) and expr.id in names

    names: set[str] = set()
    nodes = list(ast.walk(entry))
    for n in nodes:
        if isinstance(n, ast.Assign) and stored(n.value, names):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    for n in nodes:
        if isinstance(n, ast.Return) and n.value is not None and stored(n.value, names):
            return [finding("output-replay", WARNING, n.lineno, n.col_offset + 1,
                            f"`{ENTRY}` returns a value kept in a module-level container across calls",
                            "every call must compute its output from its own input; a stored result is a replay")]
    return []


def output_findings(tree: ast.Module) -> list[Diagnostic]:
    """Both rules on a parsed file: one finding per cache, the replay rule only where no cache rule fired."""
    module_body = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                              ast.ClassDef))]
    found = cache_findings(tree, module_body, "module code")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += cache_findings(node, node.body, node.name)
    cached_lines = {f.line for f in found if f.rule == "output-cache"}
    return found + [f for f in replay_findings(tree) if f.line not in cached_lines]


__all__ = ["output_findings"]
