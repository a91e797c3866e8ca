"""scripts/gpu_tune.py on the CPU: the files it tunes, its table, and a dry run on the fixture task."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from popkit.model import tunespec

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_tune", ROOT / "scripts" / "gpu_tune.py")
gpu_tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_tune)
PROBLEMS = next((r for r in gpu_tune.ROOTS if (r / gpu_tune.PUBLIC).is_dir()), None)


@pytest.mark.skipif(PROBLEMS is None, reason="no public problem sets here")
def test_the_plan_renders_tunable_grids_and_trims_matmul(tmp_path):
    rows = {r["name"]: r for r in gpu_tune.plan(tmp_path, None, dry_run=False)}
    assert set(rows) == {"softmax", "matmul", "pmpp_v2 vectoradd", "pmpp_v2 grayscale"}
    sizes = {name: len(list(tunespec.load(r["file"]).points())) for name, r in rows.items()}
    assert sizes == {"softmax": 20, "matmul": 22, "pmpp_v2 vectoradd": 20, "pmpp_v2 grayscale": 15}
    assert rows["pmpp_v2 vectoradd"]["task"] == PROBLEMS / gpu_tune.PUBLIC
    assert rows["pmpp_v2 grayscale"]["task"] == PROBLEMS / "pmpp_v2" / "grayscale_py"
    assert "\n    a, b, _ = data\n" in rows["pmpp_v2 vectoradd"]["file"].read_text()  # pmpp_v2 passes (A, B, C)
    assert "\n    rgb, _ = data\n" in rows["pmpp_v2 grayscale"]["file"].read_text()  # and (rgb, gray)
    shapes = yaml.safe_load((rows["matmul"]["task"] / "task.yml").read_text())["benchmarks"]
    assert len(shapes) == 3 and all(s["m"] != 8192 for s in shapes)


def _report(winner, ratio=None) -> dict:
    variants = [{"index": 0, "label": "BLOCK=256 ROWS=1", "outcome": "passed", "incumbent": True, "ab": None},
                {"index": 1, "label": "BLOCK=512 ROWS=2", "outcome": "passed", "incumbent": False,
                 "ab": {"score": {"ratio": ratio}} if ratio else None},
                {"index": 2, "label": "BLOCK=64 ROWS=8", "outcome": "failed", "incumbent": False, "ab": None}]
    return {"variants": variants, "winner": winner, "winner_label": "BLOCK=512 ROWS=2" if winner == 1 else "",
            "grid_points": 20, "builds": 1, "confirmed": True, "race_rounds": 2, "stopped": "done", "exit_code": 0,
            "notes": [], "parameters": [{"name": "BLOCK", "default": 256}, {"name": "ROWS", "default": 1}]}


def test_summary_and_table():
    won = gpu_tune.summary("softmax", _report(1, {"estimate": 0.8, "low": 0.78, "high": 0.82}), 95.0,
                           {"builds": 1, "seconds": 50.0})
    kept = gpu_tune.summary("matmul", _report(None), 120.0, {})
    assert (won["variants"], won["passed"], won["ratio"]["estimate"], won["kept"]) == (3, 2, 0.8, False)
    assert kept["kept"] and kept["winner"] == "(default kept)"
    text = gpu_tune.markdown({"device": "NVIDIA H100", "started_at": "2026-11-27T10:00:00+00:00", "total_s": 400,
                              "prebuild_s": 60, "tasks": [won, kept]})
    assert "| softmax | 3 (of 20) | 2 | 1 | BLOCK=512 ROWS=2 | 0.800 [0.780, 0.820] | 2 | 95 s |" in text
    assert "| matmul | 3 (of 20) | 2 | 1 | (default kept) | 1 (default kept) | 2 | 120 s |" in text
    assert text.startswith("`python3 scripts/gpu_tune.py` on NVIDIA H100, 2026-11-27 10:00 UTC")


@pytest.mark.slow
def test_dry_run_writes_both_files(tmp_path, capsys):
    assert gpu_tune.main(["--out", str(tmp_path), "--dry-run", "--minutes", "6"]) == 0
    doc = json.loads((tmp_path / "tune.json").read_text())
    (row,) = doc["tasks"]
    assert doc["device"] == "cpu (dry run)" and row["task"] == "chunksum (dry run)" and row["variants"] == 4
    assert row["winner"] not in ("CHUNK=1", "CHUNK=1000")
    assert capsys.readouterr().out.startswith("`python3 scripts/gpu_tune.py` on cpu (dry run)")
    assert (tmp_path / "tune.md").read_text().count("| chunksum (dry run) |") == 1
