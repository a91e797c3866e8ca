"""scripts/gpu_verdict_doors.py on a CPU: the files and commands it runs, and how it reads popkit's JSON back."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from popkit.model import tunespec

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_verdict_doors", ROOT / "scripts" / "gpu_verdict_doors.py")
doors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(doors)


def test_the_plan_runs_each_door_and_writes_files_that_parse(tmp_path):
    rows = doors.plan(list(doors.TASKS), tmp_path)
    labels = [(label, task) for label, task, _ in rows]
    assert len(rows) == 3 * len(doors.TASKS) + 3
    assert ("bench-leaderboard measure_forge", "matmul") in labels and ("submit-gate tensor_int", "vectoradd") in labels
    for path in tmp_path.glob("*.py"):
        names = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert {"custom_kernel", "_honest_kernel"} <= names, path
    tunable = (tmp_path / "vectoradd_tunable.py").read_text()
    assert [p.values for p in tunespec.parse(tunable, "t").parameters] == [(0, 1, 2)]
    (submit,) = [argv for label, _, argv in rows if label.startswith("submit")]
    assert submit[0] == "env" and f"FAKE_POPCORN_LOG={tmp_path / 'calls.jsonl'}" in submit
    assert doors.plan(["softmax"], tmp_path)[-1][0] == "bench-leaderboard measure_forge"  # the A/B etc.: vectoradd


def test_dry_run_prints_every_command(capsys):
    assert doors.main(["--out", "unused", "--dry-run", "--tasks", "vectoradd"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6


def _run(outcome="failed", error="elements mismatch: 3 of 3", judged="sealed", score=None):
    case = {"passed": not error, "error": error}
    return {"outcome": outcome, "judged": judged, "score_public_s": score,
            "runs": [{"tests": [case], "benchmarks": []}]}


def test_a_row_is_as_expected_only_when_the_door_failed_the_cheat_by_name_on_the_sealed_side():
    assert doors.summarize("test tensor_int", "softmax", 1, _run(), 1.0)["ok"]
    assert not doors.summarize("test tensor_int", "softmax", 0, _run("passed", ""), 1.0)["ok"]
    assert not doors.summarize("test tensor_int", "softmax", 1, _run(judged="open"), 1.0)["ok"]
    assert not doors.summarize("test channel_takeover", "softmax", 1, _run(), 1.0)["ok"]  # not `no output`
    forged = _run(error="time forged: the worker reported 1.2 µs")
    assert doors.summarize("bench-leaderboard measure_forge", "matmul", 1, forged, 1.0)["classes"] == ["time forged"]
    assert doors.summarize("submit-gate tensor_int", "vectoradd", 1, {"gate": _run(), "remote": None}, 1.0)["ok"]
    assert not doors.summarize("submit-gate tensor_int", "vectoradd", 1, {"gate": _run(), "remote": {}}, 1.0)["ok"]


def test_tune_and_ab_rows_need_the_cheat_dropped_and_never_counted():
    variants = [{"label": "CHEAT=1", "message": "check failed: ... elements mismatch"},
                {"label": "CHEAT=2", "race_failure": "check failed: benchmark ...: time forged: ..."}]
    assert doors.summarize("tune x", "vectoradd", 0, {"variants": variants, "winner_label": "CHEAT=0"}, 1.0)["ok"]
    assert not doors.summarize("tune x", "vectoradd", 0, {"variants": variants, "winner_label": "CHEAT=2"}, 1.0)["ok"]
    failure = {"tests": [], "benchmarks": [{"passed": False, "error": "time forged: x"}]}
    ab = {"failed_side": "B", "failure": failure, "score": {"b_ns": []}, "judged": "sealed"}
    row = doors.summarize("ab measure_forge", "vectoradd", 1, ab, 1.0)
    assert row["ok"] and row["judged"] == "sealed"
    assert not doors.summarize("ab measure_forge", "vectoradd", 1, {**ab, "score": {"b_ns": [1.2]}}, 1.0)["ok"]
    assert not doors.summarize("ab measure_forge", "vectoradd", 1, {**ab, "judged": "open"}, 1.0)["ok"]
    assert "| ab | vectoradd | measure_forge | 1 | time forged | sealed |" in doors.markdown([row], "H100")


def test_a_run_of_every_door_writes_its_rows_and_prints_a_line_per_row(tmp_path, monkeypatch, capsys):
    """main() through gpu_sealed.execute, with a stand-in GPU and popkit: each row read, saved and printed."""
    import sys
    import types

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True,
                                                                  get_device_name=lambda: "Stand-in GPU"))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(sys.modules["gpu_sealed"], "run_json", lambda argv: (1, _run(), 0.5))
    assert doors.main(["--out", str(tmp_path), "--tasks", "vectoradd"]) == 1  # tune/ab rows read a test's doc
    printed = capsys.readouterr().out
    saved = __import__("json").loads((tmp_path / "doors.json").read_text())
    assert saved["device"] == "Stand-in GPU" and len(saved["rows"]) == 6
    assert "vectoradd test tensor_int: as expected: elements mismatch" in printed
    assert "| test | vectoradd | tensor_int | 1 | elements mismatch | sealed |" in (tmp_path / "doors.md").read_text()
