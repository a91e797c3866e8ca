"""popkit.api: its names and signatures stay as docs/api.md documents them; each function does what its command
does, on fixture tasks (no GPU, no torch)."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit import api
from popkit.cli import app
from popkit.errors import SubmissionError, UsageError

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"
DOUBLE = str(FIX / "tasks" / "double")  # its own eval, no reference.py: popkit's harness cannot judge it
GOOD = FIX / "submissions" / "good.py"
SNAPSHOT = Path(__file__).parent / "golden" / "api.txt"


def snapshot() -> str:
    """popkit.api's public surface, one line per name: functions with their signatures, result classes with
    their fields, other names (type aliases) by name only."""
    lines = []
    for name in api.__all__:
        obj = getattr(api, name)
        if inspect.isfunction(obj):
            lines.append(f"def {name}{inspect.signature(obj)}")
        elif inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            lines.append(f"class {name}({', '.join(f'{f.name}: {f.type}' for f in dataclasses.fields(obj))})")
        elif inspect.isclass(obj):
            lines.append(f"class {name}")
        else:
            lines.append(name)
    return "\n".join(lines) + "\n"


def steady(doc):
    """`doc` without what differs from one run to the next: timestamps and durations."""
    if isinstance(doc, dict):
        return {k: steady(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [steady(v) for v in doc]
    return doc


VOLATILE = {"started_at", "created_at", "duration_s"}


def test_the_public_surface_is_the_snapshot():
    """A change here is a change for every script and orchestrator: update tests/golden/api.txt and docs/api.md
    together (POPKIT_UPDATE_GOLDEN=1 rewrites the snapshot)."""
    if os.environ.get("POPKIT_UPDATE_GOLDEN"):
        SNAPSHOT.write_text(snapshot())
    assert snapshot() == SNAPSHOT.read_text()


def test_docs_name_every_public_function():
    text = (ROOT / "docs" / "api.md").read_text()
    functions = [n for n in api.__all__ if inspect.isfunction(getattr(api, n))]
    missing = [n for n in functions if f"`{n}(" not in text]
    assert not missing, f"docs/api.md does not document {missing}"


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("popkit.machine.system.probe",
                        lambda python=None, timeout=60.0, env=None, scripts=None: {"device": "cpu"})
    return tmp_path


def test_source_text_runs_from_a_private_file_named_by_its_hash(home):
    text = GOOD.read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()
    outcome = api.test(api.SourceText(text), task=DOUBLE, harness="task")
    assert outcome.report.outcome == "passed" and api.exit_code(outcome) == 0
    assert Path(outcome.report.submission).name == f"{digest[:16]}.py" and outcome.report.sha256 == digest
    assert list((home / "tmp").iterdir()) == []  # the private folder is gone
    (row,) = api.history().records
    assert row.sha256 == digest and row.submission == outcome.report.submission
    assert api.show(row.id, source=True).source == text.encode()


def test_documents_are_what_json_prints(home):
    outcome = api.bench(GOOD, task=DOUBLE, harness="task", record=False)
    doc = api.document(outcome)
    assert doc["schema"] == "popkit/run/1" and doc["outcome"] == "passed"
    printed = CliRunner().invoke(app, ["bench", str(GOOD), "--task", DOUBLE, "--no-history", "--json"])
    assert steady(doc) == steady(json.loads(printed.stdout))
    assert api.document(api.task_show(DOUBLE))["schema"] == "popkit/task/1"
    assert api.kind_of(api.tasks()) == "tasks"


def test_an_ab_of_two_files_is_an_ab_outcome(home):
    other = home / "same.py"
    other.write_bytes(GOOD.read_bytes())
    outcome = api.bench(GOOD, other, task=DOUBLE, harness="task", rounds=4, budget_s=0)
    assert api.kind_of(outcome) == "ab" and outcome.report.rounds == 4
    assert len(api.history().records) == 2  # each side recorded as a bench run


@pytest.mark.parametrize("call, message", [
    (lambda: api.test(GOOD, GOOD, task=DOUBLE), "test takes one submission"),
    (lambda: api.bench(GOOD, GOOD, task=DOUBLE, rounds=6, leaderboard=True),
     "an A/B comparison runs the task's own benchmarks in benchmark mode only"),
    (lambda: api.bench(GOOD, GOOD, task=DOUBLE, rounds=5), "--rounds 5: the A/B runs rounds in pairs (ABBA)"),
    (lambda: api.bench(GOOD, task=DOUBLE, rounds=2), "rounds: 2 is out of range"),
    (lambda: api.bench(GOOD, task=DOUBLE, profiler="perf"), "unknown profiler `perf`"),
    (lambda: api.test(GOOD, task=DOUBLE, harness="mine"), "unknown harness `mine`"),
    (lambda: api.test(GOOD, task=DOUBLE, secret_runs=101), "secret_runs: 101 is out of range"),
    (lambda: api.test(GOOD, task=DOUBLE, device="x"), "--gpus 'x': give device indices separated by commas"),
    (lambda: api.test(api.SourceText("x", suffix="py; rm"), task=DOUBLE),
     "source suffix 'py; rm': not a file extension"),
    (lambda: api.history(limit=0), "limit: 0 is out of range"),
])
def test_bad_arguments_are_usage_errors(home, call, message):
    with pytest.raises(UsageError) as info:
        call()
    assert info.value.message == message and int(info.value.exit_code) == 2


def test_a_cuda_file_for_a_python_task_is_refused_by_check(home):
    cu = home / "kernel.cu"
    cu.write_text("// #!POPCORN leaderboard vectoradd\n__global__ void k() {}\n")
    with pytest.raises(SubmissionError) as info:
        api.check(cu, leaderboard="vectoradd")
    assert re.search(r"kernel\.cu: a \.cu source file, but task `vectoradd` runs Python", info.value.message)


def test_exit_codes_are_the_clis(home):
    lint = api.check(ROOT / "submissions" / "cheats" / "timer_patch.py")
    assert not lint.ok and api.exit_code(lint) == 8
    assert api.exit_code(api.check(ROOT / "submissions" / "vectoradd" / "pytorch.py")) == 0


def test_scripts_import_popkit_only_through_the_api():
    """scripts/ use popkit.api or the CLI's --json, never runner internals or private names."""
    import ast

    found = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "popkit":
                if node.module != "popkit" or [a.name for a in node.names] != ["api"]:
                    found.append(f"{path.name}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] == "popkit" and a.name != "popkit.api"]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "api":
                if node.attr.startswith("_") or node.attr not in api.__all__:
                    found.append(f"{path.name}:{node.lineno}: api.{node.attr}")
    assert not found, "\n".join(found)
