"""`popkit tasks check DIR` on fixture tasks: a good one, a lax checker, a broken folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.author import taskcheck
from popkit.cli import app
from popkit.errors import TaskError

AUTH = Path(__file__).parent / "fixtures" / "authoring"
NO_GPU_SYSTEM = {"device": "cpu", "gpu_count": 0}


@pytest.fixture(autouse=True)
def _no_probe(monkeypatch):
    monkeypatch.setattr("popkit.machine.system.probe", lambda python=None, timeout=60.0, env=None, scripts=None:
                        NO_GPU_SYSTEM)


@pytest.mark.slow
def test_a_good_task_runs_the_reference_through_the_ranked_chain_and_rejects_the_probes():
    result = taskcheck.check_task_dir(AUTH / "good")
    assert result.errors == [] and result.ok, result
    assert [(m.mode, m.outcome, m.timeout_s) for m in result.modes] == [
        ("test", "passed", 30.0), ("benchmark", "passed", 30.0), ("leaderboard", "passed", 30.0)]
    assert result.lax == {"zero output": "rejected", "unmodified input": "rejected"}


@pytest.mark.slow
def test_a_lax_checker_is_flagged():
    result = taskcheck.check_task_dir(AUTH / "lax")
    assert result.lax == {"zero output": "passed", "unmodified input": "passed"} and not result.ok


def test_folder_problems_are_listed_without_running(tmp_path):
    root = tmp_path / "set"
    shutil.copytree(AUTH, root)
    (root / "good" / "template.py").unlink()
    outside = tmp_path / "outside.py"
    outside.write_text("x = 1\n")
    yml = root / "good" / "task.yml"
    yml.write_text(yml.read_text().replace("  - {name: eval.py, source: ../eval.py}",
                                           "  - {name: eval.py, source: ../eval.py}\n"
                                           "  - {name: extra.py, source: ../../outside.py}"))
    with pytest.raises(TaskError, match=rf"`../../outside.py` is outside the problem set \({root.resolve()}\)"):
        taskcheck.check_task_dir(root / "good")
    result = taskcheck.check_task_dir(root / "good", root=tmp_path)  # --root: the author widens it
    assert result.errors == ["templates.Python: file `template.py` not found"]
    assert result.modes == [] and not result.ok
    (root / "good" / "task.yml").write_text("lang: py\n")
    with pytest.raises(TaskError, match="missing required key `files`"):
        taskcheck.check_task_dir(root / "good")


@pytest.mark.slow
def test_the_cli_reports_times_and_exit_codes(monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "160")
    monkeypatch.setenv("NO_COLOR", "1")
    good = CliRunner().invoke(app, ["tasks", "check", str(AUTH / "good")])
    assert good.exit_code == 0, good.output
    assert "leaderboard" in good.output and "zero output: the checker rejects it" in good.output
    lax = CliRunner().invoke(app, ["tasks", "check", str(AUTH / "lax"), "--json"])
    assert lax.exit_code == 1, lax.output
    doc = json.loads(lax.stdout)
    assert doc["schema"] == "popkit/taskcheck/1" and doc["checker"]["zero output"] == "passed"


def test_a_task_this_machine_cannot_run_still_gets_its_folder_checked(monkeypatch):
    monkeypatch.setattr("popkit.machine.runnable.gpu_devices_visible", lambda: False)
    needs_gpu = Path(__file__).parent / "fixtures" / "needs" / "gpu"
    result = CliRunner().invoke(app, ["tasks", "check", str(needs_gpu), "--root", str(needs_gpu.parents[1]), "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 11 and "needs a GPU" in doc["environment"] and doc["errors"] == []
