"""The smaller dead ends of a first hour: each message a newcomer met, asserted as it is now."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from popkit import __version__
from popkit.author.kernelspec import infer_skeleton
from popkit.machine import cputorch
from popkit.machine import runnable
from popkit.model.refinputs import Returned, generated_inputs
from popkit.model.results import CaseResult, ModeRun, RunReport
from popkit.model.tasks import bundled_problem_set, _from_problem
from popkit.submission.taskhints import other_task_hint, unpack_mismatch

FIX = Path(__file__).parent / "fixtures"
VADD = FIX / "inline_set" / "vadd_py"


@pytest.fixture
def cli(cli, monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "300")
    return cli


def test_version_and_h(cli):
    for flag in ("--version", "-V"):
        result = cli(flag)
        assert result.exit_code == 0 and result.output == f"popkit {__version__}\n"
    assert cli("-h").exit_code == 0 and "Usage: popkit [OPTIONS] COMMAND" in cli("-h").output
    result = cli("compile", "-h")
    assert result.exit_code == 0 and "Usage: popkit compile [OPTIONS]" in result.output


def test_check_names_the_guard_extra_as_the_readme_does(cli):
    result = cli("check", str(FIX / "submissions" / "good.py"))
    doc = (Path(__file__).parents[1] / "docs" / "check.md").read_text()
    assert "pip install 'popkit[guard]'" in doc and "pip install kernelguard" not in doc
    if "KernelGuard: not installed" in result.output:  # without the optional analyser
        assert ("KernelGuard: not installed (`pip install 'popkit[guard]'` to run the server's screening here too)"
                in result.output)
    assert "pip install kernelguard" not in result.output


def test_a_hip_file_without_a_gpu_says_what_hip_needs():
    message, hint = cputorch.no_gpu_message("mine.py", "test", cpu_only=False, target="hip")
    assert message == ("this machine has no AMD GPU: a HIP file's kernels run on an AMD GPU with a ROCm build of torch, "
                       "and `popkit test` needs one")
    assert hint == ("`popkit compile mine.py` checks it here (its kernels built for the AMD GPU where clang's AMDGPU "
                    "backend is installed: popkit doctor checks); `popkit test --hip-on-cuda mine.py` runs their logic "
                    "on an NVIDIA GPU")
    assert "CUDA" not in message


def test_tasks_check_says_for_which_kind_of_file(cli, monkeypatch):
    monkeypatch.setattr("popkit.machine.system.probe",
                        lambda python=None, timeout=60.0, env=None, scripts=None: {"device": "cpu", "gpu_count": 0})
    monkeypatch.setattr(runnable, "missing_packages", lambda python, names, timeout=30.0, env=None, scripts=None: set())
    result = cli("tasks", "--check")
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "PyTorch file" in line)
    assert "CUDA/HIP build" in header
    row = next(line for line in result.output.splitlines() if line.lstrip().startswith("vectoradd "))
    assert row.split("│")[1].strip() == "yes" and row.split("│")[2].strip() == "no"
    assert ("a CUDA or HIP build needs a GPU to run; this machine has none (`popkit compile` checks the build)"
            in row)
    assert ("6 of 6 tasks can run a PyTorch file here, 0 a file that builds a CUDA or HIP kernel (load_inline)"
            in result.output)


def test_build_blockers_by_vendor():
    need = runnable.Needs(leaderboard_vendor="amd")
    nvidia = runnable.Machine(vendor="nvidia", device="NVIDIA H100", sm=90, arch="sm_90", gpu_count=1)
    assert runnable.build_blockers(need, nvidia) == [
        "a HIP build needs an AMD GPU; this one is NVIDIA H100 (`popkit test --hip-on-cuda` checks a HIP file's logic "
        "on it)"]
    assert runnable.build_blockers(runnable.Needs(leaderboard_vendor="nvidia"), nvidia) == []


def test_new_unpacks_what_generate_input_returns():
    assert generated_inputs(VADD / "reference.py") == [Returned("a", "float16"), Returned("b", "float16"),
                                                       Returned("out", "float16")]
    spec = infer_skeleton(VADD)
    assert [(i.name, i.dtype) for i in spec.inputs] == [("in0", "float16"), ("in1", "float16"), ("in2", "float16")]
    assert spec.output.dtype == "float16" and spec.data == "tuple"
    assert ("reference.py's generate_input returns a (float16), b (float16), out (float16): custom_kernel unpacks that "
            "(task.py's input_t names 2 values; generate_input is what data holds).") in spec.notes


def test_generate_input_that_popkit_cannot_read_falls_back(tmp_path):
    (tmp_path / "reference.py").write_text("def generate_input(size, seed):\n    return make(size)\n")
    assert generated_inputs(tmp_path / "reference.py") is None
    (tmp_path / "reference.py").write_text("import torch\ndef generate_input(size, seed):\n"
                                           "    x = torch.randint(0, 5, (size,))\n    n = size * 2\n    return x, n\n")
    assert generated_inputs(tmp_path / "reference.py") == [Returned("x", "int64"), Returned("n", None)]
    assert generated_inputs(tmp_path / "missing.py") is None


def test_new_renders_the_unpacking_for_a_problem_set_task(cli, tmp_path):
    out = tmp_path / "mine.py"
    result = cli("new", "--task", "vadd_v9", "--tasks-root", str(FIX / "inline_set"), "-o", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "    in0, in1, in2 = data\n" in text
    compile(text, str(out), "exec")


UNPACK = "ValueError: not enough values to unpack (expected 3, got 2)"


def _failed(error: str, index: int = 0) -> CaseResult:
    return CaseResult(kind="test", index=index, spec=f"size: {index}", passed=False, error=error,
                      message=f"Traceback ...\n{error}\n")


def _report(*cases: CaseResult) -> RunReport:
    run = ModeRun(mode="test", secret=False, seed=None, exit_code=0, duration_s=1.0, timeout_s=10.0, check="fail",
                  tests=cases)
    return RunReport(task="vectoradd", task_path="/t", leaderboard="vectoradd", ranking_by="geom", submission="v2.py",
                     sha256="x", mode="test", harness="task", started_at="now", duration_s=1.0, system={}, runs=(run,))


def test_a_file_for_another_task_gets_one_hint():
    report = _report(*[_failed(UNPACK, i) for i in range(6)])
    assert unpack_mismatch(report.runs[0].tests) == (3, 2)
    assert other_task_hint(report, "vectoradd", bundled=True) == (
        "every failed case unpacks `data` into 3 values and task `vectoradd` gives 2: the file looks written for "
        "another task. A public problem set's version of this problem (e.g. `vectoradd_v2` of pmpp_v2) passes other "
        "data: run it with --task vectoradd_v2 --tasks-root DIR (a checkout of the problem sets)")
    mixed = _report(_failed(UNPACK), _failed("RuntimeError: boom", 1))
    assert other_task_hint(mixed, "vectoradd", bundled=True) == ""
    assert other_task_hint(_report(), "vectoradd", bundled=True) == ""


def test_the_hint_is_in_the_report(capsys, monkeypatch):
    from popkit.views.running import show_run

    monkeypatch.setenv("POPKIT_WIDTH", "400")
    monkeypatch.setenv("NO_COLOR", "1")
    task = _from_problem(bundled_problem_set(), next(p for p in bundled_problem_set().problems
                                                     if p.name == "vectoradd"), bundled=True)
    show_run(_report(*[_failed(UNPACK, i) for i in range(6)]), task)
    shown = capsys.readouterr().out
    assert shown.count("hint: every failed case unpacks `data` into 3 values and task `vectoradd` gives 2") == 1


def test_ab_footer_has_one_wording(tmp_path, capsys, monkeypatch):
    from tests.test_ab import FakeEval, _ab
    from popkit.views.comparison import show_ab

    monkeypatch.setenv("POPKIT_WIDTH", "400")
    monkeypatch.setenv("NO_COLOR", "1")
    report = _ab(tmp_path, FakeEval({"A": 1.0, "B": 1.0}))
    footers = []
    for statistic in ("median", "mean"):
        show_ab(dataclasses.replace(report, statistic=statistic))
        shown = capsys.readouterr().out
        assert f"A ({statistic})" in shown and f"B ({statistic})" in shown
        footers.append(next(line for line in shown.splitlines() if line.startswith("A = ")))
    assert footers[0] == footers[1]
    assert ("A and B columns: per shape, the median over rounds of the statistic the column names (each eval's "
            "median of its timed calls, or its mean where the eval reports no median)") in footers[0]
