"""A public task is judged by what its runs reach, and torch's "no CUDA here" crash is a refusal (exit 11), not a
crash (exit 6); leaderboards as they stand (deadline, GPUs offered) in `tasks`, `new`, `check` and `submit`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from popkit.machine import runnable
from popkit.model.results import OUTCOME_EXIT, CaseResult, ModeRun
from popkit.model.tasks import load_task
from popkit.run import protocol

SET = Path(__file__).parent / "fixtures" / "leaderboards"
SET_YAML = SET / "problems.yaml"
NO_CUDA_TORCH = ('Traceback (most recent call last):\n  File "reference.py", line 25, in generate_input\n'
                 "    gen = torch.Generator(device=\"cuda\")\n"
                 "RuntimeError: Cannot get CUDA generator without ATen_cuda library. PyTorch splits its backend "
                 "into two shared libraries\n")


def test_a_helper_naming_cpu_does_not_make_a_cuda_only_generate_input_runnable():
    need = runnable.needs(load_task(SET / "open_py"))
    assert need.gpu == 'reference.py:generate_input puts tensors on "cuda" with no CPU path'
    assert runnable.blockers(need, runnable.Machine()) == [
        'needs a GPU (reference.py:generate_input puts tensors on "cuda" with no CPU path); this machine has none']


def test_a_cuda_only_public_task_is_refused_on_the_cpu_with_exit_11(cli, monkeypatch):
    monkeypatch.setattr(runnable, "gpu_devices_visible", lambda: False)
    sub = SET / "open_py" / "submission.py"
    result = cli("test", str(sub), "--task", "open_v2", "--tasks-root", str(SET_YAML), "--no-history", "--json")
    assert result.exit_code == 11, result.output
    doc = json.loads(result.stdout)
    assert "needs a GPU" in doc["message"] and "generate_input" in doc["message"]


@pytest.mark.parametrize("where", ["stderr", "case"])
def test_torch_without_cuda_is_a_needs_gpu_outcome(where):
    """When the judgement misses, the run's own words decide: exit 11, not CRASHED (6) or a task error (3)."""
    if where == "stderr":
        run = ModeRun("test", False, None, exit_code=1, duration_s=1.0, timeout_s=60, stderr=NO_CUDA_TORCH)
    else:
        case = CaseResult(kind="test", index=0, spec="size: 3", passed=False, error="generate_input failed: " + NO_CUDA_TORCH)
        run = ModeRun("test", False, None, exit_code=112, duration_s=1.0, timeout_s=60, check="fail", tests=(case,))
    outcome, summary = protocol.classify(run)
    assert outcome == "needs_gpu" and "Cannot get CUDA generator without ATen_cuda library" in summary
    assert int(OUTCOME_EXIT[outcome]) == 11


# ------------------------------------------------------------------------------ leaderboards as they stand


def test_deadlines_read_as_utc_and_a_set_without_one_is_open():
    from datetime import datetime, timezone

    from popkit.model import leaderboards
    from popkit.model.tasks import load_problem_set

    assert leaderboards.parse_deadline("2025-06-30 07:00") == datetime(2025, 6, 30, 7, tzinfo=timezone.utc)
    assert leaderboards.parse_deadline("") is None and leaderboards.parse_deadline("soon") is None
    pset = load_problem_set(SET_YAML)
    before = datetime(2025, 6, 30, 6, 59, tzinfo=timezone.utc)
    after = datetime(2025, 6, 30, 7, 0, tzinfo=timezone.utc)
    closed = next(p for p in pset.problems if p.name == "closed")
    assert leaderboards.standing(pset, closed, before).state == "open"
    assert leaderboards.standing(pset, closed, after).words == "closed since 2025-06-30 07:00"
    assert leaderboards.lookup("open_v2", [SET_YAML]).gpus == ("B200", "H100", "A100", "L4")
    assert leaderboards.lookup("softmax", [SET_YAML]).state == "practice"  # bundled, and in no set given
    assert leaderboards.lookup("no-such-board", [SET_YAML]).state == "unknown"


def test_tasks_lists_each_leaderboard_open_or_closed_and_the_bundled_ones_as_practice(cli):
    result = cli("tasks", "--tasks-root", str(SET_YAML), "--json")
    assert result.exit_code == 0, result.output
    rows = {r["leaderboard"]: r["standing"] for r in json.loads(result.stdout)["tasks"]}
    assert rows["open_v2"]["state"] == "open" and rows["open_v2"]["deadline"] == "2100-12-31"
    assert rows["closed"]["state"] == "closed" and rows["closed"]["gpus"] == ["H100", "A100", "T4", "L4"]
    assert rows["vectoradd"]["state"] == "practice"
    result = cli("tasks", "--tasks-root", str(SET_YAML))
    assert "closed 2025-06-30" in result.output and "open to 2100-12-31" in result.output
    assert "practice" in result.output


def _check(cli, sub: Path, *args: str) -> tuple[int, list[dict]]:
    result = cli("check", str(sub), "--json", *args)
    return result.exit_code, json.loads(result.stdout)["findings"]


def test_check_refuses_a_closed_leaderboard_and_names_an_open_one(cli):
    code, found = _check(cli, SET / "closed_py" / "submission.py", "--tasks-root", str(SET_YAML))
    assert code == 8 and [f["rule"] for f in found] == ["leaderboard-closed"]
    assert "closed on 2025-06-30 07:00" in found[0]["message"] and "open today" in found[0]["hint"]
    code, found = _check(cli, SET / "open_py" / "submission.py", "--tasks-root", str(SET_YAML))
    assert code == 0 and found == []
    code, found = _check(cli, SET / "open_py" / "submission.py", "--tasks-root", str(SET_YAML), "--gpu", "T4")
    assert code == 8 and [f["rule"] for f in found] == ["gpu-not-offered"]


def test_check_of_an_unknown_leaderboard_is_an_error_where_problem_sets_are_given(cli, tmp_path):
    sub = tmp_path / "mine.py"
    sub.write_text((SET / "open_py" / "submission.py").read_text().replace("open_v2", "no-such-board"))
    code, found = _check(cli, sub, "--tasks-root", str(SET_YAML))
    assert code == 8 and [(f["rule"], f["severity"]) for f in found] == [("leaderboard-unknown", "error")]
    code, found = _check(cli, sub)
    assert code == 0 and [(f["rule"], f["severity"]) for f in found] == [("leaderboard-unknown", "warning")]


def test_check_and_new_say_a_bundled_task_is_practice(cli, tmp_path):
    result = cli("new", "--task", "softmax", "-o", str(tmp_path / "s.py"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["standing"]["state"] == "practice" and "practice task" in doc["warning"]
    code, found = _check(cli, tmp_path / "s.py")
    assert code == 0 and [f["rule"] for f in found] == ["practice-task"]


def test_new_for_hip_refuses_a_leaderboard_that_offers_no_amd_gpu(cli, tmp_path):
    result = cli("new", "--task", "open_v2", "--tasks-root", str(SET_YAML), "--target", "hip",
                 "-o", str(tmp_path / "h.py"))
    assert result.exit_code == 2 and "offers no GPU that runs HIP code (B200, H100, A100, L4)" in result.output
    assert not (tmp_path / "h.py").exists()
