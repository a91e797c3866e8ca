"""A task with a CPU path is never refused on a CPU machine: its eval calls
`torch.cuda.synchronize()` only under `torch.cuda.is_available()`, and its utils.py picks the CPU there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from popkit.machine import runnable
from popkit.machine import system
from popkit.model.tasks import load_task

SET = Path(__file__).parent / "fixtures" / "cpupath"
TASK = SET / "guarded"
GOOD = "from reference import ref_kernel\n\n\ndef custom_kernel(data):\n    return ref_kernel(data)\n"


@pytest.mark.parametrize("harness", ["task", "popkit"])
def test_a_guarded_gpu_call_is_no_gpu_need(harness):
    need = runnable.needs(load_task(TASK), harness)
    assert not need.gpu and not runnable.blockers(need, runnable.Machine(vendor="", device="cpu"))


def test_a_helper_with_a_cpu_path_does_not_hide_an_unguarded_call_the_run_reaches(tmp_path):
    """An unguarded CUDA call the eval's main reaches needs a GPU though another file of the task names the CPU
    (torch.cuda.synchronize() raises without one); the same call in a function nothing calls needs none."""
    for f in TASK.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    eval_py = tmp_path / "eval.py"
    guarded = eval_py.read_text()
    eval_py.write_text(guarded.replace("    if torch.cuda.is_available():\n        torch.cuda.synchronize()",
                                       "    torch.cuda.synchronize()"))
    assert runnable.needs(load_task(tmp_path)).gpu == 'eval.py:sync puts tensors on "cuda" with no CPU path'
    eval_py.write_text(guarded + "\n\ndef unused():\n    torch.cuda.synchronize()\n")
    assert not runnable.needs(load_task(tmp_path)).gpu
    (tmp_path / "utils.py").write_text("def device():\n    return 'cuda'\n")
    assert runnable.needs(load_task(tmp_path)).gpu == 'eval.py puts tensors on "cuda"'


@pytest.fixture
def cpu_cli(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(system, "has_gpu", lambda: False)
    sub = tmp_path / "mine.py"
    sub.write_text(GOOD)
    return lambda *args: cli(*(str(sub) if a == "MINE" else a for a in args))


@pytest.mark.slow
@pytest.mark.parametrize("harness", ["task", "popkit"])
def test_test_and_bench_run_on_the_cpu_with_either_harness(cpu_cli, harness):
    for args in (("test",), ("bench", "--allow-cpu")):
        result = cpu_cli(*args, "MINE", "--task", str(TASK), "--harness", harness, "--no-history", "--json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["outcome"] == "passed" and doc["harness"] == harness


@pytest.mark.slow
def test_tasks_check_runs_the_folder_here(cpu_cli):
    result = cpu_cli("tasks", "check", str(TASK), "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code in (0, 1), result.output  # 1: a finding about the checker, never "cannot run here"
    assert not doc.get("environment") and not doc.get("skipped"), doc
