"""A public task is judged by what its runs reach, and torch's "no CUDA here" crash is a refusal (exit 11), not a
crash (exit 6); leaderboards as they stand (deadline, GPUs offered) in `tasks`, `new`, `check` and `submit`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from popkit import protocol, runnable
from popkit.results import OUTCOME_EXIT, CaseResult, ModeRun
from popkit.tasks import load_task

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
