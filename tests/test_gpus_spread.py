"""`popkit bench a.py b.py c.py --gpus 0,1`: independent runs, one process per GPU, recorded as single runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from popkit.errors import UsageError
from popkit.machine import system
from popkit.operations import workflows
from popkit.run import runner
from popkit.submission.source import Source

FIX = Path(__file__).parent / "fixtures"
DOUBLE = FIX / "tasks" / "double"
SUBS = FIX / "submissions"


def test_gpu_lists_are_checked():
    assert workflows.parse_devices("0, 1,3") == ("0", "1", "3")
    for bad in ("", "0,a", "0,0"):
        with pytest.raises(UsageError):
            workflows.parse_devices(bad)


@pytest.fixture
def six_gpus(monkeypatch):
    monkeypatch.setattr(system, "gpu_count", lambda: 6)


@pytest.mark.slow
def test_run_j_goes_to_gpu_j_mod_n_and_results_keep_the_files_order(six_gpus):
    sources = tuple(Source.read(SUBS / name) for name in ("good.py", "wrong.py", "good.py"))
    request = workflows.Request(sources, "benchmark", str(DOUBLE), options=runner.RunOptions(precompile=False),
                                record=False, devices=("3", "5"))
    outcomes = workflows.spread(request)
    assert [o.gpu for o in outcomes] == ["3", "5", "3"]
    assert [o.report.runs[0].raw["env.visible"] for o in outcomes] == ["3", "5", "3"]
    assert [o.report.outcome for o in outcomes] == ["passed", "failed", "passed"]


def test_gpus_that_do_not_exist_stop_before_anything_runs(cli, monkeypatch):
    monkeypatch.setattr(system, "gpu_count", lambda: 0)
    result = cli("bench", str(SUBS / "good.py"), "--task", str(DOUBLE), "--gpus", "99")
    assert result.exit_code == 11, result.output
    assert "--gpus 99: there is no GPU 99 (this machine has no GPU)" in result.output
    monkeypatch.setattr(system, "gpu_count", lambda: 2)
    result = cli("bench", str(SUBS / "good.py"), "--task", str(DOUBLE), "--gpus", "0,2")
    assert result.exit_code == 11 and "there is no GPU 2 (GPUs here: 0, 1)" in result.output


@pytest.mark.slow
def test_the_cli_runs_each_file_records_each_and_returns_the_first_failure(cli, six_gpus):
    files = [str(SUBS / n) for n in ("good.py", "wrong.py", "good.py")]
    result = cli("bench", *files, "--task", str(DOUBLE), "--gpus", "0,1", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/runs/1"
    assert [(r["gpu"], r["report"]["outcome"]) for r in doc["runs"]] == [("0", "passed"), ("1", "failed"),
                                                                         ("0", "passed")]
    listed = json.loads(cli("history", "--json").stdout)
    assert len(listed["runs"]) == 3
    text = cli("bench", files[0], files[2], "--task", str(DOUBLE), "--gpus", "0", "--no-history")
    assert text.exit_code == 0 and text.output.count("PASSED") == 2  # two files with --gpus: two runs, no A/B
