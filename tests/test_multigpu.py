"""Multi-GPU tasks: POPCORN_GPUS and NCCL's environment, and `--world-size N` runs scaled down, marked
as not leaderboard-faithful in the report, the JSON and the history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import EnvironmentProblem, UsageError
from popkit.model.tasks import load_task, scale_world_size
from popkit.run import runner

FIX = Path(__file__).parent / "fixtures"
MULTI = FIX / "tasks" / "multi"  # world_size 2 in every case
GOOD = FIX / "submissions" / "good.py"
ONE_GPU = {"device": "NVIDIA H100", "cuda": "13.0", "arch": "sm_90", "gpu_count": 1}
FOUR_GPUS = {**ONE_GPU, "gpu_count": 4}


def test_scaling_rewrites_every_case_and_keeps_the_rest():
    task = load_task(MULTI)
    scaled = scale_world_size(task, 1)
    assert [c["world_size"] for c in scaled.tests + scaled.benchmarks] == [1] * 5
    assert [{k: v for k, v in c.items() if k != "world_size"} for c in scaled.tests] == [
        {k: v for k, v in c.items() if k != "world_size"} for c in task.tests]
    assert list(task.tests[0]) == list(scaled.tests[0])  # the key keeps its place in the cases file
    with pytest.raises(UsageError, match="no `world_size`"):
        scale_world_size(load_task(FIX / "tasks" / "double"), 1)
    with pytest.raises(UsageError, match="at least 1"):
        scale_world_size(task, 0)


def test_enough_gpus_runs_the_tasks_own_cases_with_nccl_multicast_off():
    report = runner.run_submission(load_task(MULTI), GOOD, "test", runner.RunOptions(precompile=False),
                                   system=FOUR_GPUS)
    assert report.outcome == "passed" and report.world_size is None and report.to_json()["leaderboard_faithful"]
    raw = report.runs[0].raw
    assert raw["env.gpus"] == "4" and "world_size: 2" in raw["env.cases"]
    assert raw["env.nvls"] == "0" and raw["env.multicast"] == "1"


def test_fewer_gpus_stops_unless_scaled_down():
    with pytest.raises(EnvironmentProblem, match="cases need 2 GPUs"):
        runner.run_submission(load_task(MULTI), GOOD, "test", runner.RunOptions(precompile=False), system=ONE_GPU)
    report = runner.run_submission(load_task(MULTI), GOOD, "benchmark",
                                   runner.RunOptions(precompile=False, world_size=1), system=ONE_GPU)
    assert report.outcome == "passed" and report.world_size == 1
    assert "world_size: 1" in report.runs[0].raw["env.cases"]
    doc = report.to_json()
    assert doc["leaderboard_faithful"] is False and doc["world_size"] == 1
    assert any("not leaderboard-faithful" in n for n in report.notes)
    assert "scaled" in report.label


def test_the_cli_marks_a_scaled_run_in_the_report_json_and_history(monkeypatch, tmp_path):
    monkeypatch.setenv("POPKIT_WIDTH", "160")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("popkit.machine.system.probe",
                        lambda python=None, timeout=60.0, env=None, scripts=None: ONE_GPU)
    result = CliRunner().invoke(app, ["bench", str(GOOD), "--task", str(MULTI), "--world-size", "1"])
    assert result.exit_code == 0, result.output
    assert "not leaderboard-faithful" in result.output
    result = CliRunner().invoke(app, ["bench", str(GOOD), "--task", str(MULTI), "--world-size", "1", "--json",
                                      "--no-history"])
    assert json.loads(result.stdout)["leaderboard_faithful"] is False
    listed = CliRunner().invoke(app, ["history", "--json"])
    assert "scaled" in listed.stdout, listed.stdout
