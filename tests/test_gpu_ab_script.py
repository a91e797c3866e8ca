"""scripts/gpu_ab.py on the CPU: the planted slowdown keeps outputs exact, the tables and pass criteria, a dry run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from popkit.measure import shapes

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_ab", ROOT / "scripts" / "gpu_ab.py")
gpu_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_ab)


@pytest.mark.parametrize("task, data", [
    ("vectoradd", lambda: (torch.randn(64, 64).half(), torch.randn(64, 64).half())),
    ("softmax", lambda: torch.randn(8, 100) * 30),
])
def test_planted_pass_changes_no_output_bit(task, data):
    text = (ROOT / "submissions" / task / "pytorch.py").read_text()
    plain, slow = {}, {}
    exec(compile(text, "pytorch.py", "exec"), plain)
    exec(compile(text + gpu_ab.SLOW_TAIL.format(share=gpu_ab.SLOW_SHARE[task]), "slow.py", "exec"), slow)
    x = data()
    assert torch.equal(slow["custom_kernel"](x), plain["custom_kernel"](x))
    assert "stream" not in gpu_ab.SLOW_TAIL.lower()  # the server refuses any file containing it


def test_extended_shapes_span_the_task_and_count_large_ones():
    for task in gpu_ab.TASKS:
        shapes = gpu_ab.extended_shapes(task, gpu_ab.EXTRA_SHAPES)
        assert len(shapes) == gpu_ab.EXTRA_SHAPES and len({json.dumps(s) for s in shapes}) == len(shapes)
        assert any(gpu_ab.elements(s) >= gpu_ab.LARGE_ELEMENTS for s in shapes)
    assert gpu_ab.elements({"size": 4095}) >= gpu_ab.LARGE_ELEMENTS > gpu_ab.elements({"size": 2048})


def _run(kind, step, verdicts, spec="size: 8192; seed: 1", wall=30.0):
    shapes = [{"spec": spec, "verdict": v, "rounds": 4, "ratio": {"estimate": 1.0, "low": 0.99, "high": 1.01}}
              for v in verdicts]
    return {"task": "vectoradd", "kind": kind, "step": step, "wall_s": wall, "exit_code": 0,
            "report": {"shapes": shapes, "rounds": 4, "stopped": "budget"}}


def test_summary_applies_the_issue_criteria():
    results = {"device": "NVIDIA H100", "started_at": "2026-11-26T15:00:00+00:00", "runs": [
        _run("self", "calibrate", [shapes.SAME] * 36 + [shapes.A_FASTER] * 2 + [shapes.B_FASTER] * 2),
        _run("slow", "calibrate", [shapes.A_FASTER] * 9 + [shapes.SAME]),
        _run("slow", "calibrate", [shapes.SAME] * 5, spec="size: 1024; seed: 2"),  # small shapes do not count
        _run("self", "speed", [shapes.SAME] * 4, wall=55.0)]}
    s = gpu_ab.summary(results)
    assert (s["self_verdicts"], s["self_winners"], s["self_ok"]) == (44, 4, True)
    assert (s["slow_large_verdicts"], s["slow_large_named"], s["slow_ok"]) == (10, 9, True)
    assert s["speed_ok"]
    text = gpu_ab.markdown(results)
    assert "NVIDIA H100, 2026-11-26" in text and "4 of 44 shape verdicts" in text
    assert "Calibration PASS · sensitivity PASS · speed PASS" in text
    results["runs"].append(_run("self", "speed", [shapes.B_FASTER] * 4, wall=61.0))
    s = gpu_ab.summary(results)
    assert not s["self_ok"] and not s["speed_ok"]


@pytest.mark.slow
def test_dry_run_writes_both_files(tmp_path, capsys):
    assert gpu_ab.main(["--out", str(tmp_path), "--dry-run", "--minutes", "5"]) == 0
    doc = json.loads((tmp_path / "ab.json").read_text())
    assert doc["device"] == "cpu (dry run)" and {r["step"] for r in doc["runs"]} == {"speed", "calibrate"}
    assert doc["build"]["double"]["exit_code"] == 0
    assert doc["summary"]["self_verdicts"] == 3 + gpu_ab.EXTRA_SHAPES
    assert (tmp_path / "ab.md").read_text() in capsys.readouterr().out
