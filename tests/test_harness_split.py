"""popkit's harness split by side: tasks/eval.py is a thin entry that loads its modules from its own folder by
path; the trusted process never imports a worker-side module and the worker never a trusted-side one; every place
that copies or hashes the harness takes the whole set (popkit.resources.harness_paths)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from popkit.check import lint
from popkit.errors import TaskError
from popkit.machine import runnable
from popkit.model.tasks import load_task
from popkit.resources import HARNESS_ENTRY, HARNESS_MODULES, harness_paths
from popkit.run.executor import POPKIT_EVAL_NAME, Executor

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tasks"
TRUSTED_ONLY = {"popkit_judge", "popkit_trusted"}
WORKER_ONLY = {"popkit_calls", "popkit_timed", "popkit_worker"}


def load_entry(name: str = "popkit_harness_entry"):
    """tasks/eval.py as a module under `name` (its top level defines the loader and nothing runs)."""
    spec = importlib.util.spec_from_file_location(name, TASKS / HARNESS_ENTRY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_harness(name: str = "popkit_harness_under_test") -> SimpleNamespace:
    """Every module of the harness loaded here, its names in one namespace (for unit tests of its parts; one
    process never holds both sides in a real eval)."""
    entry = load_entry(name)
    entry.load(entry.TRUSTED)
    entry.load(entry.WORKER)
    names: dict = {}
    for module in dict.fromkeys(entry.TRUSTED + entry.WORKER):
        names.update({k: v for k, v in vars(sys.modules[module]).items() if not k.startswith("__")})
    names.update({k: getattr(entry, k) for k in ("load", "worker_entry", "TRUSTED", "WORKER", "SHARED")})
    return SimpleNamespace(**names)


def copy_harness(folder: Path, entry: str = HARNESS_ENTRY) -> None:
    """popkit's harness, every file of it, into `folder` (a test that runs the eval by hand)."""
    for name, path in harness_paths(entry).items():
        (folder / name).write_bytes(path.read_bytes())


def test_an_entry_without_its_modules_says_so_in_one_line(tmp_path):
    (tmp_path / "eval.py").write_bytes((TASKS / HARNESS_ENTRY).read_bytes())
    (tmp_path / "cases.txt").write_text("size: 1\n")
    done = subprocess.run([sys.executable, "-s", "eval.py", "test", "cases.txt"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("eval: popkit's harness is incomplete (") and "popkit_protocol.py" in done.stderr
    assert "Traceback" not in done.stderr


def test_one_list_of_files_matches_the_entry_and_the_folder():
    entry = load_entry()
    listed = {f"{m}.py" for m in entry.TRUSTED + entry.WORKER}
    assert set(HARNESS_MODULES) == listed
    assert {p.name for p in TASKS.glob("popkit_*.py")} == listed
    assert set(harness_paths(POPKIT_EVAL_NAME)) == {POPKIT_EVAL_NAME, *listed}
    assert set(entry.TRUSTED) & WORKER_ONLY == set() and set(entry.WORKER) & TRUSTED_ONLY == set()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_each_side_imports_only_its_own_and_the_shared_modules():
    """Static: a module of one side never names a module of the other side; shared modules name neither."""
    for name in HARNESS_MODULES:
        stem = name[:-3]
        harness = {m for m in _imports(TASKS / name) if m.startswith("popkit_")}
        other = WORKER_ONLY if stem in TRUSTED_ONLY else TRUSTED_ONLY if stem in WORKER_ONLY else \
            TRUSTED_ONLY | WORKER_ONLY
        assert harness & other == set(), f"{name} imports {sorted(harness & other)}"


_PROBE = textwrap.dedent("""
    import json, runpy, sys
    entry = runpy.run_path(sys.argv[1], run_name="__mp_main__")
    before = {m for m in sys.modules if m.startswith("popkit_")}
    entry["load"](entry[sys.argv[2]])
    print(json.dumps({"before": sorted(before), "after": sorted(m for m in sys.modules if m.startswith("popkit_")),
                      "files": sorted(getattr(sys.modules[m], "__file__", "") for m in sys.modules
                                      if m.startswith("popkit_"))}))
""")


@pytest.mark.parametrize("side, forbidden", [("TRUSTED", WORKER_ONLY), ("WORKER", TRUSTED_ONLY)])
def test_a_fresh_interpreter_loads_one_side_only(tmp_path, side, forbidden):
    """Dynamic: in a fresh interpreter started as the worker is (`-s`, another working folder), running the entry
    loads nothing, and loading one side leaves the other side's modules out of sys.modules."""
    done = subprocess.run([sys.executable, "-s", "-c", _PROBE, str(TASKS / HARNESS_ENTRY), side],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["before"] == []
    assert set(seen["after"]) & forbidden == set()
    assert set(seen["after"]) >= {"popkit_protocol", "popkit_shared"}
    assert all(Path(f).parent == TASKS for f in seen["files"])


def test_a_module_of_the_same_name_on_the_import_path_is_not_loaded(tmp_path):
    """A planted `popkit_protocol.py` first on the import path (the working folder, PYTHONPATH) is never imported:
    the entry loads its modules from its own folder by path."""
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "popkit_protocol.py").write_text("raise SystemExit('planted module imported')\n")
    code = (f"import sys, runpy; sys.path.insert(0, {str(planted)!r}); "
            f"e = runpy.run_path({str(TASKS / HARNESS_ENTRY)!r}, run_name='x'); e['load'](e['WORKER']); "
            "print(sys.modules['popkit_protocol'].__file__)")
    done = subprocess.run([sys.executable, "-s", "-c", code], capture_output=True, text=True, cwd=planted, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == TASKS / "popkit_protocol.py"


def _task(tmp_path: Path, extra: str = "") -> Path:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "eval.py").write_bytes((TASKS / HARNESS_ENTRY).read_bytes())
    (folder / "reference.py").write_text("")
    (folder / "popkit_seal.py").write_text("# not popkit's\n")
    (folder / "task.yml").write_text(
        "files:\n  - {name: submission.py, source: '@SUBMISSION@'}\n  - {name: eval.py, source: eval.py}\n"
        "  - {name: reference.py, source: reference.py}\n" + extra +
        "lang: py\ndescription: x\nconfig: {main: eval.py}\ntests:\n  - {size: 1}\n")
    return folder


def test_a_task_running_popkits_eval_gets_every_module(tmp_path):
    """A task whose eval.py is popkit's but lists none of its modules (a copied task) gets them all in its folder,
    and the tamper check restores a changed one."""
    task = load_task(_task(tmp_path))
    with Executor().workspace() as ws:
        assert ws.prepare(task, b"x = 1\n") == "eval.py"
        for name in HARNESS_MODULES:
            assert (ws.files / name).read_bytes() == (TASKS / name).read_bytes()
        (ws.files / "popkit_worker.py").write_text("forged\n")
        assert "popkit_worker.py" in ws.tampered("test")
        assert (ws.files / "popkit_worker.py").read_bytes() == (TASKS / "popkit_worker.py").read_bytes()


def test_harness_popkit_writes_the_whole_set_beside_the_tasks_own_eval(tmp_path):
    task = load_task(_task(tmp_path))
    (task.path / "eval.py").write_text("print('the task's own eval')\n")
    with Executor().workspace() as ws:
        assert ws.prepare(task, b"x = 1\n", harness="popkit") == POPKIT_EVAL_NAME
        assert (ws.files / POPKIT_EVAL_NAME).read_bytes() == (TASKS / HARNESS_ENTRY).read_bytes()
        assert all((ws.files / name).is_file() for name in HARNESS_MODULES)


def test_a_task_file_named_like_a_harness_module_is_refused(tmp_path):
    task = load_task(_task(tmp_path, "  - {name: popkit_seal.py, source: popkit_seal.py}\n"))
    with Executor().workspace() as ws, pytest.raises(TaskError, match="popkit_seal.py"):
        ws.prepare(task, b"x = 1\n")


def test_bundled_tasks_list_every_module():
    for yml in TASKS.glob("*/task.yml"):
        task = load_task(yml.parent)
        names = {f.name for f in task.files}
        assert names >= {HARNESS_ENTRY, *HARNESS_MODULES}, yml


@pytest.mark.parametrize("name", [n[:-3] for n in HARNESS_MODULES])
def test_importing_a_harness_module_or_loading_it_by_path_is_a_lint_error(name):
    """`popkit check` knows every module of the harness as the evaluator: importing one, and loading one of its
    files by path, are errors."""
    ok = "\n\ndef custom_kernel(data):\n    return data\n"
    for source, rule in ((f"import {name}\n", "harness-import"),
                         (f"import runpy\ng = runpy.run_path('/tmp/x/' + '{name}.py')\n", "load-by-path")):
        report = lint.check_bytes((source + ok).encode(), "sub.py", guard=False)
        assert (rule, "error") in {(f.rule, f.severity) for f in report.findings}, (source, report.findings)


@pytest.mark.slow
def test_the_spawned_worker_holds_only_its_sides_modules(tmp_path):
    """Through the real chain (runner, eval.py, the spawned worker): the submission, imported in the worker, sees
    the worker side's modules and none of the trusted side's."""
    from test_verdict import errors_of, run

    spy = tmp_path / "spy.py"
    spy.write_text("import sys\n\nsys.stderr.write('harness modules: ' + ','.join(sorted(m for m in sys.modules "
                   "if m.startswith('popkit_'))) + '\\n')\n\n\ndef custom_kernel(data):\n    a, b = data\n"
                   "    return a + b\n")
    result = run(str(spy), "test", tmp_path)
    assert result.exit_code == 0, errors_of(result)
    line = next(x for x in result.stderr.splitlines() if x.startswith("harness modules: "))
    seen = set(line.split(": ", 1)[1].split(","))
    assert seen >= WORKER_ONLY and not seen & TRUSTED_ONLY, seen


@pytest.mark.parametrize("harness", ["task", "popkit"])
def test_the_static_reading_of_a_task_sees_the_harness_modules_as_its_own(tmp_path, harness):
    """What a task needs is read from the files that run: the harness's modules are among them (not packages to
    install), whether the task lists them or not."""
    task = load_task(_task(tmp_path))
    needs = runnable.needs(task, harness)
    assert not [name for name, _ in needs.packages if name.startswith("popkit_")], needs.packages
