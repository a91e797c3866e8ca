"""scripts/gpu_split_cost.py on the CPU: the trust checks on and off in alternating order, the per-shape table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_split_cost", ROOT / "scripts" / "gpu_split_cost.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def _run(median_ns: float, mean_ns: float) -> dict:
    return {"benchmark-count": "2", "benchmark.0.spec": "size: 1", "benchmark.0.median": str(median_ns),
            "benchmark.0.mean": str(mean_ns), "benchmark.1.spec": "size: 2", "_exit": 0, "_passed": True}


def test_rows_compare_medians_and_means_and_say_each_ways_spread():
    runs = {"sealed": [_run(12e3, 15e3), _run(10e3, 11e3), _run(11e3, 13e3)],
            "open": [_run(10e3, 10e3), _run(10e3, 10e3), _run(8e3, 12e3)]}
    (row,) = script.summarize(runs)  # shape 2 has no timing: left out
    assert row["shape"] == "size: 1"
    assert row["median_ratio"] == 11e3 / 10e3 and row["mean_ratio"] == 13e3 / 10e3
    assert row["sealed"]["spread"] == 12e3 / 10e3 and row["open"]["spread"] == 10e3 / 8e3
    text = script.table({"tasks": {"vectoradd": {"rows": [row], "failed": ["open (exit 1)"]}}})
    assert "| vectoradd | size: 1 | 10.0 µs | 11.0 µs | 1.100 | 1.300 | - | - | - | 1.25x, 1.20x | - |" in text
    assert "runs that did not pass: open (exit 1)" in text


def test_the_untraced_and_spun_ways_and_the_traces_kernel_time_tell_the_parts_of_the_cost_apart():
    sealed = [{**_run(30e3, 40e3), "benchmark.0.kernel_ns": "10000,10500,11000"}]
    runs = {"sealed": sealed, "open": [_run(15e3, 15e3)], "untraced": [_run(16.5e3, 17e3)],
            "spun": [_run(45e3, 50e3)]}
    (row,) = script.summarize(runs)
    assert row["median_ratio"] == 2.0 and row["untraced_median_ratio"] == 1.1 and row["spun_median_ratio"] == 3.0
    assert row["sealed"]["trace_kernel_ns"] == 10500.0
    assert "| 2.000 | 2.667 | 1.100 | 3.000 | 10.5 µs |" in script.table({"tasks": {"softmax": {"rows": [row]}}})
    del runs["spun"]
    rows = script.summarize(runs)
    assert "| 2.000 | 2.667 | 1.100 | - | 10.5 µs |" in script.table({"tasks": {"softmax": {"rows": rows}}})


def test_the_sealed_runs_witness_margins_are_pooled_per_shape():
    sealed = [{**_run(10e3, 10e3), "benchmark.0.unexplained_ns": "2000,-500,4000"},
              {**_run(10e3, 10e3), "benchmark.0.unexplained_ns": "1000,90000"}]
    (row,) = script.summarize({"sealed": sealed, "open": [_run(10e3, 10e3)]})
    assert row["unexplained_ns"] == {"median": 2000.0, "max": 90000.0}
    assert "| 2.0 µs, 90.0 µs |" in script.table({"tasks": {"softmax": {"rows": [row]}}})


def test_the_ways_alternate_with_the_trust_switch_and_results_are_saved(tmp_path, monkeypatch, capsys):
    calls = []

    def fake(task_dir, source, mode, cases=None, **kwargs):
        env = kwargs["env"]
        calls.append((Path(task_dir).name, mode, env["POPKIT_TRUST"] + env.get("POPKIT_TIMING_AUDIT", "")
                      + env.get("POPKIT_WORKER_SPIN", "")))
        return _run(10e3, 10e3)

    monkeypatch.setattr(script, "bare_run", fake)
    assert script.main(["--out", str(tmp_path), "--tasks", "vectoradd", "--pairs", "2"]) == 0
    # the build, then sealed/open/untraced/spun, spun/untraced/open/sealed
    assert [trust for *_, trust in calls] == ["1", "1", "0", "1off", "11", "11", "1off", "0", "1"]
    assert {(task, mode) for task, mode, _ in calls} == {("vectoradd", "leaderboard")}
    saved = json.loads((tmp_path / "split_cost.json").read_text())
    assert len(saved["tasks"]["vectoradd"]["runs"]["sealed"]) == 2 and saved["tasks"]["vectoradd"]["rows"]
    assert "| vectoradd | size: 1 |" in capsys.readouterr().out
    assert "| vectoradd | size: 1 |" in (tmp_path / "split_cost.md").read_text()


def test_the_dry_run_plans_every_bundled_task_and_an_unknown_one_is_refused(capsys):
    assert script.main(["--out", "x", "--dry-run", "--pairs", "2"]) == 0
    out = capsys.readouterr().out
    plan = "build once, then sealed/open/untraced/spun, spun/untraced/open/sealed (leaderboard mode)"
    assert all(f"{t}: {plan}" in out for t in script.TASKS)
    assert script.main(["--out", "x", "--dry-run", "--pairs", "2", "--ways", "open,sealed,spun"]) == 0
    assert "vectoradd: build once, then open/sealed/spun, spun/sealed/open" in capsys.readouterr().out
    for bad in ("sealed,untraced", "sealed,open,fast"):
        with pytest.raises(SystemExit):
            script.main(["--out", "x", "--dry-run", "--ways", bad])
    try:
        script.main(["--out", "x", "--tasks", "nosuch"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("an unknown task was accepted")
