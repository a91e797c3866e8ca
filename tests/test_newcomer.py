"""A newcomer's first hour on a CPU machine (issue 12): each dead end now stops early with what to do.

Each test writes out the exact message the user sees.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app

FIX = Path(__file__).parent / "fixtures"
DOUBLE = str(FIX / "tasks" / "double")
CUDA_SUBMISSION = '''#!POPCORN leaderboard vectoradd
import torch
from torch.utils.cpp_extension import load_inline

SRC = "__global__ void k(float* x) { x[0] = 1; }"
ext = load_inline(name="k", cpp_sources="", cuda_sources=SRC, functions=[])


def custom_kernel(data):
    a, b = data
    return a + b
'''


@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("POPKIT_ASSUME_GPU", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("popkit.system.probe", lambda python=None, timeout=60.0: {"device": "cpu"})
    monkeypatch.setattr("popkit.system.has_gpu", lambda: False)

    def invoke(*args: str):
        return CliRunner().invoke(app, list(args))

    return invoke


def _never_runs(monkeypatch):
    def fail(*_a, **_k):
        raise AssertionError("nothing may run")

    monkeypatch.setattr("popkit.runner.run_mode", fail)
    monkeypatch.setattr("popkit.runner.precompile", fail)


def test_cuda_submission_without_a_gpu_exits_11_before_anything_runs(cli, tmp_path, monkeypatch):
    _never_runs(monkeypatch)
    path = tmp_path / "mine.py"
    path.write_text(CUDA_SUBMISSION)
    result = cli("test", str(path), "--no-history")
    assert result.exit_code == 11, result.output
    assert ("error: this machine has no CUDA GPU: `popkit compile` builds it, `popkit test` needs a GPU"
            in result.output)
    assert f"hint: `popkit compile {path}` checks the build here" in result.output


def test_pure_pytorch_still_runs_on_the_cpu(cli, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def custom_kernel(data):\n    return 2 * data\n")
    result = cli("test", str(path), "--task", DOUBLE, "--no-history")
    assert result.exit_code == 0, result.output


def test_gpu_sized_benchmarks_on_a_cpu_are_said_before_the_run(cli, monkeypatch):
    _never_runs(monkeypatch)
    sub = str(Path(__file__).parents[1] / "submissions" / "vectoradd" / "pytorch.py")
    result = cli("bench", sub, "--leaderboard", "--baseline", "reference", "--no-history")
    assert result.exit_code == 11, result.output
    assert "error: this machine has no GPU, and the benchmarks of `vectoradd` are sized for H100/A100 GPUs" in result.output
    assert ("hint: `popkit test` runs the tests on the CPU; pass --allow-cpu to run the benchmarks here anyway"
            in result.output)


def test_allow_cpu_runs_them_anyway(cli, monkeypatch):
    seen = []
    monkeypatch.setattr("popkit.runner.run_submission", lambda task, *a, **k: seen.append(task.name) or (_ for _ in ()).throw(SystemExit(0)))
    sub = str(Path(__file__).parents[1] / "submissions" / "vectoradd" / "pytorch.py")
    cli("bench", sub, "--allow-cpu", "--no-history")
    assert seen == ["vectoradd"]


def test_baseline_typo_is_a_usage_error_before_any_run(cli, monkeypatch):
    _never_runs(monkeypatch)
    result = cli("bench", str(FIX / "submissions" / "good.py"), "--task", DOUBLE, "--baseline", "ref")
    assert result.exit_code == 2, result.output
    assert "error: unknown baseline `ref`" in result.output
    assert "hint: the only baseline is `reference`: --baseline reference" in result.output


@pytest.mark.parametrize("command", ["test", "check"])
def test_cu_file_for_a_python_task_is_refused_with_exit_4(cli, tmp_path, monkeypatch, command):
    _never_runs(monkeypatch)
    path = tmp_path / "mine.cu"
    path.write_text("//!POPCORN leaderboard vectoradd\n__global__ void add(float* a) {}\n")
    result = cli(command, str(path), *(["--no-history"] if command == "test" else ["--no-guard"]))
    assert result.exit_code == 4, result.output
    assert (f"error: {path}: a .cu source file, but task `vectoradd` runs Python (`lang: py`): the runner would run "
            "it as submission.py and fail with syntax errors") in result.output
    assert "`popkit new --target cuda --task vectoradd` writes one" in result.output


def _problem_set(root: Path) -> Path:
    """A problem set naming a leaderboard `vectoradd`, like a checkout of the public sets does."""
    task = root / "theirs"
    task.mkdir(parents=True)
    (task / "task.yml").write_text((FIX / "tasks" / "double" / "task.yml").read_text()
                                   .replace("../common/tiny_eval.py", str(FIX / "tasks" / "common" / "tiny_eval.py")))
    (root / "set.yaml").write_text("name: s\ndeadline: ''\ndescription: ''\nproblems:\n"
                                   "  - {directory: theirs, name: vectoradd, deadline: '', gpus: []}\n")
    return task


def test_bundled_name_wins_over_tasks_root_and_the_shadowing_is_said(cli, tmp_path, monkeypatch):
    theirs = _problem_set(tmp_path / "set")
    seen = []
    monkeypatch.setattr("popkit.runner.run_submission",
                        lambda task, *a, **k: seen.append(task) or (_ for _ in ()).throw(SystemExit(0)))
    sub = str(Path(__file__).parents[1] / "submissions" / "vectoradd" / "pytorch.py")
    result = cli("test", sub, "--tasks-root", str(tmp_path / "set"), "--no-history")
    assert seen[0].bundled and seen[0].name == "vectoradd"
    assert (f"note: `vectoradd` is popkit's bundled task; {theirs.resolve()} (under --tasks-root) has the same "
            f"leaderboard name: pass --task {theirs.resolve()} to run that one") in result.output
    seen.clear()
    cli("test", sub, "--tasks-root", str(tmp_path / "set"), "--task", str(theirs), "--no-history")
    assert not seen[0].bundled and seen[0].path == theirs.resolve()
