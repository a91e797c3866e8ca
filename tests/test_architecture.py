"""The shape of the package: popkit's modules import each other without a cycle, each only from its own
package or lower-ranked ones, as the package table of docs/design.md says.

The import graph is read from the source with `ast`: imports at module level and inside functions both
count, so a cycle cannot hide behind an import placed late in a function.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "popkit"
DESIGN = ROOT / "docs" / "design.md"
_TABLE_ROW = re.compile(r"^\| `([\w.]+\.py|\w+/)` \| (\d+) \| (.+) \|$", re.MULTILINE)
MAX_ROOT_MODULES = 10


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package is named by its __init__.py)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement can load: `from a import b` loads a, and a.b when b is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The popkit module that `name` (a module, or a name inside one) belongs to."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, modules: dict[str, Path]) -> dict[str, int]:
    """The popkit modules `module` imports, each with the line of its first import."""
    path = modules[module]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = _imported(node, module, path.name == "__init__.py")
        # `from popkit import runner` loads popkit.run.runner; the package itself only when a name is not a module
        owners = {_owner(n, modules) for n in names[1:]} if isinstance(node, ast.ImportFrom) else set()
        if isinstance(node, ast.Import) or any(o == names[0] for o in owners) or not owners:
            owners.add(_owner(names[0], modules))
        for owner in owners - {None, module}:
            found[owner] = min(found.get(owner, node.lineno), node.lineno)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    modules = module_files(package)
    return {module: imports_of(module, modules) for module in modules}


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_path_through(sorted(group), graph) for group in groups]


def _path_through(group: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """A closed import path from the group's first module back to itself, staying inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for nxt in sorted(graph[node]):
            if nxt == start:
                return paths[node] + [start]
            if nxt in members and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                frontier.append(nxt)
    raise AssertionError(f"no cycle through {group}")


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


def test_popkit_has_no_import_cycle():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


# Modules on the path of every command that import some popkit modules where they are used: what only one
# option or command needs is not paid for by `popkit test FILE` (0.59 s -> 0.41 s to the eval's start on the
# 2-core CI machine, docs/benchmarks.md, "The inner loop"). The import graph above reads late imports too, so the
# layer and cycle tests still see them.
LATE_IMPORTS_ALLOWED = {"popkit/cli/__init__.py", "popkit/cli/running.py", "popkit/documents.py",
                        "popkit/operations/workflows.py"}


def test_no_popkit_import_inside_a_function():
    """An import placed in a function hides a dependency (and, once, hid four cycles); popkit's own
    modules are imported at the top, except in the start-up path's modules (LATE_IMPORTS_ALLOWED). Third-party
    ones (torch) may be late."""
    late = []
    for module, path in module_files().items():
        if str(path.relative_to(PACKAGE.parent)) in LATE_IMPORTS_ALLOWED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in {imp for f in functions for imp in ast.walk(f) if isinstance(imp, (ast.Import, ast.ImportFrom))}:
            names = _imported(node, module, path.name == "__init__.py")
            if any(n == "popkit" or n.startswith("popkit.") for n in names):
                late.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not late, "imports of popkit modules inside functions (move them to the top):\n" + "\n".join(sorted(late))


def test_popkit_test_imports_none_of_the_other_commands_machinery():
    """`popkit test FILE` imports what a single run needs: not the cluster, tune, the MCP server, ncu, watch,
    the template engine's renderer or the task checker."""
    import subprocess
    import sys

    code = ("import sys; from popkit.cli import narrowed; narrowed(['test', 'x.py']); "
            "import popkit.cli.running, popkit.views.running, popkit.documents, popkit.operations.workflows; "
            "print(sorted(m for m in ('popkit.distributed.scheduler', 'popkit.tuning.workflow', 'popkit.mcpserver.server', 'popkit.measure.ncu', "
            "'popkit.operations.watch', 'popkit.author.render', 'popkit.author.taskcheck', 'popkit.operations.doctor', 'popkit.ledger.submit', 'ray') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def design_ranks(text: str) -> dict[str, int]:
    """The package table of docs/design.md: a root module (`api.py`) or a package (`run/`) -> its rank."""
    return {row: int(rank) for row, rank, _owns in _TABLE_ROW.findall(text)}


def room_of(path: Path) -> str:
    """The row of the package table a module belongs to: its top-level package (`run/`), or itself at the root."""
    parts = path.relative_to(PACKAGE).parts
    return f"{parts[0]}/" if len(parts) > 1 else parts[0]


def test_design_lists_every_package_and_root_module_and_only_those():
    listed = design_ranks(DESIGN.read_text(encoding="utf-8"))
    present = {room_of(path) for path in module_files().values()}
    assert not present - set(listed), f"packages or root modules missing from docs/design.md: {sorted(present - set(listed))}"
    assert not set(listed) - present, f"docs/design.md lists rows that do not exist: {sorted(set(listed) - present)}"


def test_the_root_holds_few_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at popkit/'s root (put them in a package): {root}"


def test_no_module_imports_from_a_higher_ranked_package():
    listed = design_ranks(DESIGN.read_text(encoding="utf-8"))
    modules = module_files()
    rank = {name: listed.get(room_of(path)) for name, path in modules.items()}
    upward = [f"{modules[a].relative_to(PACKAGE)} ({room_of(modules[a])} rank {rank[a]}, line {line}) imports "
              f"{modules[b].relative_to(PACKAGE)} ({room_of(modules[b])} rank {rank[b]})"
              for a, imported in import_graph().items() for b, line in imported.items()
              if None not in (rank[a], rank[b]) and rank[b] > rank[a]]
    assert not upward, "imports against the package order of docs/design.md:\n" + "\n".join(sorted(upward))


def test_each_package_init_is_a_docstring_only():
    """A package's __init__.py says what the room owns and imports nothing: importing one module of a package
    pays for that module alone (lazy start-up)."""
    busy = []
    for init in PACKAGE.glob("*/__init__.py"):
        body = ast.parse(init.read_text(encoding="utf-8")).body
        if init.parent.name == "cli":  # the console entry point (main) lives there
            continue
        if not body or not isinstance(body[0], ast.Expr) or len(body) > 1:
            busy.append(str(init.relative_to(PACKAGE)))
    assert not busy, f"package __init__ files with code beyond a docstring: {busy}"


def test_the_package_table_is_read_as_written():
    text = ("| package | rank | owns |\n|---|---|---|\n"
            "| `errors.py` | 0 | the error tree |\n| `cli/` | 9 | app |\n| `cli/app.py` | 9 | not a row |\n")
    assert design_ranks(text) == {"errors.py": 0, "cli/": 9}


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    (cycle,) = find_cycles(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert describe(cycle, graph) == "a (line 3) -> b (line 5) -> c (line 7) -> a"
    assert find_cycles({"a": {"b": 1}, "b": {}}) == []


def test_imports_inside_functions_and_relative_imports_count(tmp_path):
    pkg = tmp_path / "popkit"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from popkit import high\n")
    (pkg / "high.py").write_text("from popkit.low import f\n")
    (pkg / "cli" / "__init__.py").write_text("from .app import app\n")
    (pkg / "cli" / "app.py").write_text("from popkit import __version__\nfrom popkit.cli import helper\n")
    (pkg / "cli" / "helper.py").write_text("import json\n")
    graph = import_graph(pkg)
    assert graph["popkit.low"] == {"popkit.high": 2}
    assert graph["popkit.cli"] == {"popkit.cli.app": 1}
    assert graph["popkit.cli.app"] == {"popkit": 1, "popkit.cli.helper": 2}
    assert graph["popkit.cli.helper"] == {}
    assert find_cycles(graph) == [["popkit.high", "popkit.low", "popkit.high"]]


def test_popcorn_only_talks_to_popcorn_cli():
    """The submit workflow (check, gate, record) lives in popkit.ledger.submit; popkit.ledger.popcorn needs none of it."""
    assert set(import_graph()["popkit.ledger.popcorn"]) <= {"popkit.errors", "popkit.model.results"}


def test_the_cli_starts_without_the_template_engine():
    """Every `popkit` command pays for the CLI's imports; Jinja2 is for `popkit new` and `templates` only."""
    import subprocess
    import sys

    code = "import sys, popkit.cli; print(sorted(m for m in ('jinja2', 'torch') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_json_command_runs_without_rich():
    """Rich is for people: `--json` prints with json alone (views.common imports rich where output is made)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "popkit", "test", "missing.py", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert json.loads(done.stdout)["schema"] == "popkit/error/1" and done.returncode == 4, done.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "popkit.views.common" in imported
    assert not [name for name in imported if name == "rich" or name.startswith("rich.")]


MAX_MODULE_LINES = 500
SCRIPTS = ROOT / "scripts"


def test_no_module_is_over_500_lines():
    long = {name: n for name, path in module_files().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by what they own): {long}"


def private_uses(path: Path) -> list[str]:
    """`_private` names of popkit modules that `path` reaches: `from popkit.x import _y`, `x._y` on a popkit
    module bound by an import (dunder names and the private modules' own public names are fine)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("popkit"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and \
                        not (ROOT / (node.module or "").replace(".", "/") / f"{alias.name}.py").exists():
                    found.append(f"{path.name}:{node.lineno}: from {node.module} import {alias.name}")
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("popkit"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and isinstance(node.value, ast.Name) and node.value.id in modules:
            found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_imported_across_modules_or_by_scripts():
    paths = list(module_files().values()) + sorted(SCRIPTS.glob("*.py"))
    found = [use for path in paths for use in private_uses(path)]
    assert not found, "private names used outside their module (make them public or move the code):\n" + "\n".join(found)


def test_a_private_module_is_used_only_inside_its_package():
    """`popkit/PKG/_x.py` is PKG's own: other packages reach what it does through PKG's public modules."""
    found = []
    for path in list(module_files().values()) + sorted(SCRIPTS.glob("*.py")):
        owner = path.parent.relative_to(ROOT).as_posix().replace("/", ".") if path.is_relative_to(ROOT) else ""
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("popkit"):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("popkit")]
            else:
                continue
            for name in names:
                parts = name.split(".")
                private = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
                if private is None or not (ROOT / "/".join(parts[:private + 1])).with_suffix(".py").exists():
                    continue
                if ".".join(parts[:private]) != owner:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not found, "a package's private module used from outside it:\n" + "\n".join(found)


def test_the_private_name_finder_finds_both_forms(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from popkit.run.runner import _cases\nfrom popkit import runner as r\nr._where(1)\nr.__doc__\n")
    assert private_uses(bad) == ["bad.py:1: from popkit.run.runner import _cases", "bad.py:3: r._where"]
