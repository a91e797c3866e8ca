"""scripts/gpu_submit_check.py on the CPU: its commands, its expectations and how results are judged."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_submit_check", ROOT / "scripts" / "gpu_submit_check.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def test_every_file_it_runs_exists_and_the_risk_fixtures_expect_their_levels():
    for file in script.EXPECTED:
        assert (ROOT / file).is_file(), file
    levels = {Path(f).name: level for f, (_task, level) in script.EXPECTED.items() if "fixtures" in f}
    assert levels == {"near_tolerance.py": "high", "nondeterministic.py": "medium", "off_grid.py": "high"}
    assert (ROOT / script.EVIDENCE_FILE).is_file() and (ROOT / script.NCU_FILE).is_file()


def test_the_dry_run_lists_each_parts_commands(capsys, tmp_path):
    assert script.main(["--out", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("risk: risk ") == len(script.EXPECTED) and "--benchmarks" in out
    assert "--ncu-kernel-name add_kernel --ncu-launch-count 1" in out
    assert "--evidence" in out and " verify " in out and "compile submissions/vectoradd/cuda.py" in out
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_results_are_judged_against_the_expectations():
    ok_shapes = [{"key": "leaderboard: size: 1024", "status": "reproduces"}]
    results = {
        "risk tests/fixtures/risk/off_grid.py": {"exit": 1, "doc": {"level": "high", "reason": "r"}, "stderr_tail": ""},
        "risk tests/fixtures/risk/nondeterministic.py": {"exit": 0, "doc": {"level": "low"}, "stderr_tail": ""},
        "check vectoradd": {"exit": 0, "doc": {"precompile": {"status": "compiled", "extensions": [
            {"artifact": {"unpacked_bytes": 5_000_000, "zipped_bytes": 900_000}}]}}, "stderr_tail": ""},
        "check vectorsum": {"exit": 0, "doc": {"precompile": {"status": "compiled", "extensions": [{}]}},
                            "stderr_tail": ""},
        "ncu request": {"exit": 0, "doc": {"kernels": [{"name": "add_kernel(const __half *)"}],
                                           "ncu_version": "2025.2.1", "warnings": []}, "stderr_tail": ""},
        "evidence verify": {"exit": 0, "doc": {"reproduces": True, "shapes": ok_shapes}, "stderr_tail": ""},
    }
    held = {what: ok for what, ok, _detail in script.checks(results)}
    assert held["risk tests/fixtures/risk/off_grid.py: high"] is True
    assert held["risk tests/fixtures/risk/nondeterministic.py: medium"] is False
    assert held["precompile vectoradd: compiled, artifact measured"] is True
    assert held["precompile vectorsum: compiled, artifact measured"] is False  # not measured
    assert held["ncu request profiles only the named kernel"] is True
    assert held["evidence verifies on the host that wrote it"] is True
    assert "| FAIL |" in script.table(script.checks(results))


def test_a_run_writes_its_results_and_checks_each_compile_before_its_check(tmp_path, monkeypatch, capsys):
    calls = []

    def fake(argv, deadline=None):
        calls.append(argv[3:5])
        return {"argv": argv, "exit": 0, "seconds": 0.0, "doc": {}, "stderr_tail": ""}

    monkeypatch.setattr(script, "run", fake)
    assert script.main(["--out", str(tmp_path), "--parts", "compile"]) == 1  # nothing measured: the checks fail
    for task in script.COMPILE_TASKS:
        assert calls.index(["compile", f"submissions/{task}/cuda.py"]) < calls.index(["check", f"submissions/{task}/cuda.py"])
    assert (tmp_path / "submit_check.json").is_file() and "| FAIL |" in (tmp_path / "submit_check.md").read_text()


def test_a_budget_stops_each_command_by_the_deadline(monkeypatch):
    """--budget-s: a command's timeout is what is left of the budget (at least 1 s), never more than TIMEOUT_S."""
    seen = []

    def fake_run(argv, **kwargs):
        seen.append(kwargs["timeout"])
        return types.SimpleNamespace(returncode=0, stdout="{}", stderr="")

    monkeypatch.setattr(script.subprocess, "run", fake_run)
    now = script.time.monotonic()
    script.run(["x"], now + 30)
    script.run(["x"], now - 5)
    script.run(["x"])
    assert 25 < seen[0] <= 30 and seen[1] == 1.0 and seen[2] == script.TIMEOUT_S
