"""What a task needs from the machine, read from its files; a run that cannot work stops first (exit 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import EnvironmentProblem
from popkit.machine import runnable
from popkit.machine import system
from popkit.model.tasks import load_task
from popkit.run import runner

FIX = Path(__file__).parent / "fixtures"
NEEDS = FIX / "needs"
NEEDS_SET = FIX / "needs.yaml"  # the problem set naming them (beside tasks/common, whose eval they share)
H100 = {"device": "NVIDIA H100 80GB HBM3", "cuda": "13.0", "arch": "sm_90", "gpu_count": 1, "memory": 85 * 10**9}
MI300 = {"device": "AMD Instinct MI300X", "hip": "7.1", "arch": "gfx942", "gpu_count": 8, "memory": 192 * 2**30}
CPU = {"device": "cpu", "gpu_count": 0}


def verdict(name: str, system: dict, missing=()) -> list[str]:
    return runnable.blockers(runnable.needs(load_task(NEEDS / name)), runnable.Machine.from_probe(system, missing))


def test_needs_are_read_from_the_task_files():
    gpu = runnable.needs(load_task(NEEDS / "gpu"))
    assert gpu.gpu == 'reference.py puts tensors on "cuda"' and gpu.world_size == 1 and not gpu.vendor
    rocm = runnable.needs(load_task(NEEDS / "rocm"))
    assert (rocm.vendor, rocm.leaderboard_vendor) == ("amd", "amd")
    assert [n for n, _ in rocm.packages] == ["aiter", "torch", "yaml"]
    fp4 = runnable.needs(load_task(NEEDS / "fp4"))
    assert fp4.min_sm == 100 and "cutlass" not in dict(fp4.packages)  # imported under try/except ImportError
    flush = runnable.needs(load_task(NEEDS / "flush"))
    assert flush.memory_bytes == 16000 * 2**20 * 4 and "clear_l2_cache_large" in flush.memory_why
    assert runnable.needs(load_task(NEEDS / "nccl")).world_size == 8
    assert runnable.needs(load_task(FIX / "tasks" / "double")) == runnable.Needs()


def test_each_need_is_one_reason_naming_the_file_and_the_machine():
    assert verdict("gpu", CPU) == ['needs a GPU (reference.py puts tensors on "cuda"); this machine has none']
    assert verdict("gpu", H100) == []
    assert verdict("rocm", H100, missing={"aiter"}) == [
        "needs an AMD GPU (imports aiter (ROCm only)); this one is NVIDIA H100 80GB HBM3",
        "reference.py imports aiter, which is not installed (pip: aiter (ROCm; built from github.com/ROCm/aiter))"]
    assert verdict("fp4", CPU) == [  # no tensor on "cuda" in its files, yet fp4 needs an NVIDIA GPU
        "needs a GPU (reference.py uses fp4 (torch.float4_e2m1fn_x2), which needs sm_100 (B200)); this machine has none"]
    assert verdict("fp4", H100) == [
        "reference.py uses fp4 (torch.float4_e2m1fn_x2), which needs sm_100 (B200); this GPU is sm_90"]
    assert verdict("fp4", {**H100, "arch": "sm_100"}) == []
    assert verdict("flush", {**H100, "memory": 40 * 2**30}) == [
        "utils.py:clear_l2_cache_large allocates a 62.5 GiB buffer; this GPU has 40 GiB"]
    assert verdict("nccl", H100) == [
        "cases need 8 GPUs (world_size); this machine has 1 (--world-size N runs them scaled down)"]
    assert verdict("nccl", MI300) == []
    assert runnable.notes(runnable.needs(load_task(NEEDS / "rocm")), runnable.Machine.from_probe(H100)) == [
        "the leaderboard runs it on AMD GPUs: times here are not comparable"]


def test_an_import_name_maps_to_its_pip_name():
    need = runnable.Needs(packages=(("cutlass", "eval.py"), ("yaml", "eval.py")))
    assert runnable.blockers(need, runnable.Machine.from_probe(H100, {"cutlass", "yaml"})) == [
        "eval.py imports cutlass, which is not installed (pip: nvidia-cutlass-dsl)",
        "eval.py imports yaml, which is not installed (pip: pyyaml)"]


def test_missing_packages_asks_the_interpreter_without_importing(tmp_path):
    import sys

    assert runnable.missing_packages(sys.executable, ["json", "popkit_no_such_package"]) == {"popkit_no_such_package"}


def test_a_run_that_cannot_work_stops_before_it_starts(tmp_path, monkeypatch):
    sub = FIX / "submissions" / "good.py"
    with pytest.raises(EnvironmentProblem, match="needs-8-gpus|nccl") as exc:
        runner.run_submission(load_task(NEEDS / "nccl"), sub, "test", runner.RunOptions(precompile=False),
                              system=H100)
    assert "cases need 8 GPUs" in exc.value.message and int(exc.value.exit_code) == 11
    monkeypatch.setattr(runnable, "gpu_devices_visible", lambda: False)
    with pytest.raises(EnvironmentProblem, match="needs a GPU"):
        runner.run_submission(load_task(NEEDS / "gpu"), sub, "test", runner.RunOptions(precompile=False),
                              system=CPU)


@pytest.mark.slow
def test_tasks_check_lists_every_task_with_its_reasons(monkeypatch, tmp_path):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr("popkit.machine.system.probe", lambda python=None, timeout=60.0, env=None, scripts=None: H100)
    monkeypatch.setattr(runnable, "missing_packages",
                        lambda python, names, timeout=30.0, env=None, scripts=None: {"aiter"} & set(names))
    result = CliRunner().invoke(app, ["tasks", "--check", "--tasks-root", str(NEEDS_SET), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["leaderboard"]: r for r in json.loads(result.stdout)["tasks"]}
    assert rows["needs-gpu"]["runnable"] and rows["needs-nothing"]["runnable"]
    assert not rows["needs-fp4"]["runnable"] and "sm_100" in rows["needs-fp4"]["reasons"][0]
    assert len(rows["needs-rocm"]["reasons"]) == 2
    result = CliRunner().invoke(app, ["tasks", "--check", "--tasks-root", str(NEEDS_SET)])
    assert result.exit_code == 0, result.output
    assert "needs-8-gpus" in result.output and "cases need 8 GPUs" in result.output
    assert "NVIDIA H100 80GB HBM3" in result.output  # the machine the verdicts are for


def _stand_in_interpreter(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that records each call in calls.log, then runs this one."""
    import sys

    calls = tmp_path / "calls.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python, calls


def test_the_eval_interpreter_being_this_one_is_asked_without_a_process(monkeypatch):
    import sys

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(runnable.sysmod.subprocess, "run", no_process)
    names = ["json", "yaml", "typer", "popkit_no_such_package"]
    assert runnable.missing_packages(sys.executable, names) == {"popkit_no_such_package"}


def test_another_interpreter_or_environment_is_asked_in_its_own_process(tmp_path):
    import sys

    python, calls = _stand_in_interpreter(tmp_path)
    assert runnable.missing_packages(str(python), ["json", "popkit_no_such_package"]) == {"popkit_no_such_package"}
    assert "-c" in calls.read_text()
    extra = tmp_path / "extra" / "popkit_only_on_the_childs_path"
    extra.mkdir(parents=True)
    (extra / "__init__.py").write_text("")
    env = {"PYTHONPATH": str(extra.parent)}  # the eval's environment adds a folder: this process cannot tell
    assert runnable.missing_packages(sys.executable, [extra.name], env=env) == set()
    assert runnable.missing_packages(sys.executable, [extra.name]) == {extra.name}


def test_a_run_with_its_own_interpreter_is_preflighted_there(tmp_path):
    python, calls = _stand_in_interpreter(tmp_path)
    task = load_task(NEEDS / "rocm")
    with pytest.raises(EnvironmentProblem, match="not installed"):
        runnable.preflight(task, str(python), lambda: MI300, env={"POPKIT_UNRELATED": "1"})
    assert calls.read_text().count("-c") == 1


def test_needs_walks_each_file_once(monkeypatch):
    import ast
    from collections import Counter

    walked: Counter = Counter()
    walk = ast.walk

    def counting(node):
        if isinstance(node, ast.Module):
            walked[id(node)] += 1
        return walk(node)

    monkeypatch.setattr(ast, "walk", counting)
    need = runnable.needs(load_task(NEEDS / "flush"))
    assert need.memory_bytes and walked and max(walked.values()) == 1, walked
    assert runnable._walk.cache_info().currsize == 0  # the task's trees do not outlive needs()


def test_python_3_10_flags_without_safe_path_still_answer_here(monkeypatch):
    import sys
    from types import SimpleNamespace

    py310 = SimpleNamespace(isolated=0, ignore_environment=0, no_user_site=0, no_site=0)  # no -P before 3.11
    monkeypatch.setattr(sys, "flags", py310)
    assert system.answers_here(sys.executable, dict(runnable.os.environ))


def test_needs_are_remembered_per_content_of_the_files(monkeypatch, tmp_path):
    """The second run of the same task files reads what they need back (memo.py) without parsing them; a changed
    file, another harness or a memo that cannot be read is read from the files again, with the same answer."""
    import ast
    import shutil

    shutil.copytree(FIX, tmp_path / "fixtures")
    task_dir = tmp_path / "fixtures" / "needs" / "gpu"
    parses = []
    parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: parses.append(1) or parse(*a, **k))
    first = runnable.needs(load_task(task_dir))
    assert first.gpu == 'reference.py puts tensors on "cuda"' and parses
    parses.clear()
    assert runnable.needs(load_task(task_dir)) == first and not parses
    runnable.needs(load_task(task_dir), "popkit")  # popkit's harness in place of the task's eval: other files
    assert parses
    parses.clear()
    reference = task_dir / "reference.py"
    reference.write_text(reference.read_text().replace('"cuda"', '"cpu"'))
    assert runnable.needs(load_task(task_dir)).gpu == "" and parses
    memo_file = next(Path(runnable.os.environ["POPKIT_CACHE_DIR"]).glob("needs-memo.json"))
    memo_file.write_text(json.dumps({key: {"packages": 7} for key in json.loads(memo_file.read_text())}))
    parses.clear()
    assert runnable.needs(load_task(task_dir)).gpu == "" and parses
    memo_file.write_text("not json")
    assert runnable.needs(load_task(NEEDS / "gpu")) == first
