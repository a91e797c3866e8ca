"""`popkit bench a.py b.py c.py --gpus 0,1`: independent runs, one process per GPU, recorded as single runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit import runner, spread
from popkit.cli import app
from popkit.errors import UsageError
from popkit.tasks import load_task
from test_cli_running import cli  # noqa: F401  (the fixture: fixture tasks, no probe, a fresh history)

FIX = Path(__file__).parent / "fixtures"
DOUBLE = FIX / "tasks" / "double"
SUBS = FIX / "submissions"


def test_gpu_lists_are_checked():
    assert spread.parse_gpus("0, 1,3") == ("0", "1", "3")
    for bad in ("", "0,a", "0,0"):
        with pytest.raises(UsageError):
            spread.parse_gpus(bad)


@pytest.mark.slow
def test_run_j_goes_to_gpu_j_mod_n_and_results_keep_the_files_order():
    jobs = [spread.Job(SUBS / name, (SUBS / name).read_bytes(), load_task(DOUBLE))
            for name in ("good.py", "wrong.py", "good.py")]
    outcomes = spread.run_spread(jobs, "benchmark", runner.RunOptions(precompile=False), ("3", "5"))
    assert [o.gpu for o in outcomes] == ["3", "5", "3"]
    assert [o.report.runs[0].raw["env.visible"] for o in outcomes] == ["3", "5", "3"]
    assert [o.report.outcome for o in outcomes] == ["passed", "failed", "passed"]


def test_the_cli_runs_each_file_records_each_and_returns_the_first_failure(cli):
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
