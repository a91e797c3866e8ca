"""A newcomer's first hour on a CPU machine: each dead end now stops early with what to do.

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
def cli(cli, monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.delenv("POPKIT_ASSUME_GPU", raising=False)
    monkeypatch.setattr("popkit.machine.system.probe",
                        lambda python=None, timeout=60.0, env=None, scripts=None: {"device": "cpu"})
    monkeypatch.setattr("popkit.machine.system.has_gpu", lambda: False)
    return cli


def _never_runs(monkeypatch):
    def fail(*_a, **_k):
        raise AssertionError("nothing may run")

    monkeypatch.setattr("popkit.run.runner.run_mode", fail)
    monkeypatch.setattr("popkit.run.runner.precompile", fail)


@pytest.mark.parametrize("cpu_only", [False, True], ids=["cuda-torch", "cpu-only-torch"])
def test_cuda_submission_without_a_gpu_exits_11_before_anything_runs(cli, tmp_path, monkeypatch, cpu_only):
    """The hint depends on the torch installed (the README's quick start installs the CPU-only one): each is pinned
    here, so the test passes with either torch."""
    _never_runs(monkeypatch)
    monkeypatch.setattr("popkit.machine.cputorch.is_cpu_only", lambda python=None: cpu_only)
    path = tmp_path / "mine.py"
    path.write_text(CUDA_SUBMISSION)
    result = cli("test", str(path), "--no-history")
    assert result.exit_code == 11, result.output
    assert ("error: this machine has no CUDA GPU: `popkit compile` builds it, `popkit test` needs a GPU"
            in result.output)
    if cpu_only:
        assert "hint: a CPU-only torch cannot build CUDA extensions, so `popkit compile` cannot check it" in \
            " ".join(result.output.split())
    else:
        assert f"hint: `popkit compile {path}` checks the build here" in result.output


def test_pure_pytorch_still_runs_on_the_cpu(cli, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def custom_kernel(data):\n    return 2 * data\n")
    result = cli("test", str(path), "--task", DOUBLE, "--no-history")
    assert result.exit_code == 0, result.output


def _cpu_timing(monkeypatch, case_s: float) -> list:
    """No GPU here; in every timed mode the smallest benchmark shape (1024) takes `case_s` and the next (2048)
    four times that, after 2 s of the eval's own (popkit.measure.sizing's probe, faked)."""
    from popkit.machine import system
    from popkit.measure import sizing

    probed = []
    monkeypatch.setattr(system, "has_gpu", lambda: False)
    monkeypatch.setattr(sizing, "probe", lambda task, source, options, executor, indices, mode, progress:
                        probed.append((list(indices), mode)) or sizing.Timing(((1024, case_s), (2048, 4 * case_s)),
                                                                               2.0))
    return probed


def test_gpu_sized_benchmarks_on_a_cpu_are_timed_and_said_before_the_run(cli, monkeypatch):
    probed = _cpu_timing(monkeypatch, 5.0)  # 5 s, 20 s: a case's time grows with the square of `size`
    _never_runs(monkeypatch)
    sub = str(Path(__file__).parents[1] / "submissions" / "vectoradd" / "pytorch.py")
    result = cli("bench", sub, "--leaderboard", "--baseline", "reference", "--no-history")
    assert result.exit_code == 11, result.output
    assert probed == [([0, 1], "benchmark"), ([0, 1], "leaderboard")]
    assert ("error: this machine has no GPU, and the benchmark shapes of `vectoradd` up to size: 8192; seed: 1358 "
            "would take about 425 s here in all (that one about 320 s; timed from size: 1024; seed: 3211), past what "
            "the 300 s timeout leaves") in result.output  # the sum 5 + 20 + 80 + 320 s is what passes the timeout
    assert ("hint: pass --allow-cpu to run the 3 shape(s) that fit (not leaderboard-faithful); `popkit test` runs "
            "the tests on the CPU") in result.output


def test_allow_cpu_runs_the_shapes_that_fit_and_names_the_others(cli, monkeypatch):
    _cpu_timing(monkeypatch, 2.0)  # 2 + 8 + 32 s with 2 s fixed fit 60% of 180 s; 8192 (128 s) does not
    seen = []
    monkeypatch.setattr("popkit.run.runner.run_submission", lambda task, *a, **k: seen.append(task) or (_ for _ in ()).throw(SystemExit(0)))
    sub = str(Path(__file__).parents[1] / "submissions" / "vectoradd" / "pytorch.py")
    cli("bench", sub, "--allow-cpu", "--no-history")
    assert [t.name for t in seen] == ["vectoradd"] and [c["size"] for c in seen[0].benchmarks] == [1024, 2048, 4095]


def test_benchmarks_that_fit_a_cpu_run_as_the_task_gives_them(cli, monkeypatch):
    _cpu_timing(monkeypatch, 0.1)
    seen = []
    monkeypatch.setattr("popkit.run.runner.run_submission", lambda task, *a, **k: seen.append(task) or (_ for _ in ()).throw(SystemExit(0)))
    sub = str(Path(__file__).parents[1] / "submissions" / "vectoradd" / "pytorch.py")
    cli("bench", sub, "--no-history")
    assert len(seen[0].benchmarks) == 4


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


def _problem_set(root: Path, board: str = "vectoradd", gpus: str = "[]") -> Path:
    """A problem set naming a leaderboard `board` (`vectoradd`, as a checkout of the public sets does); its task."""
    task = root / "theirs"
    task.mkdir(parents=True)
    (task / "task.yml").write_text((FIX / "tasks" / "double" / "task.yml").read_text()
                                   .replace("../common/tiny_eval.py", "tiny_eval.py"))
    (task / "tiny_eval.py").write_text((FIX / "tasks" / "common" / "tiny_eval.py").read_text())
    (root / "set.yaml").write_text("name: s\ndeadline: ''\ndescription: ''\nproblems:\n"
                                   f"  - {{directory: theirs, name: {board}, deadline: '', gpus: {gpus}}}\n")
    return task


def test_bundled_name_wins_over_tasks_root_and_the_shadowing_is_said(cli, tmp_path, monkeypatch):
    theirs = _problem_set(tmp_path / "set")
    seen = []
    monkeypatch.setattr("popkit.run.runner.run_submission",
                        lambda task, *a, **k: seen.append(task) or (_ for _ in ()).throw(SystemExit(0)))
    sub = str(Path(__file__).parents[1] / "submissions" / "vectoradd" / "pytorch.py")
    result = cli("test", sub, "--tasks-root", str(tmp_path / "set"), "--no-history")
    assert seen[0].bundled and seen[0].name == "vectoradd"
    assert (f"note: `vectoradd` is popkit's bundled task; {theirs.resolve()} (under --tasks-root) has the same "
            f"leaderboard name: pass --task {theirs.resolve()} to run that one") in result.output
    seen.clear()
    cli("test", sub, "--tasks-root", str(tmp_path / "set"), "--task", str(theirs), "--no-history")
    assert not seen[0].bundled and seen[0].path == theirs.resolve()


GUESS_PROBLEM = ("CUDA_HOME is unset, so torch uses /usr/local, which has no lib64/libcudart.so: linking an "
                 "extension fails with `cannot find -lcudart`", "export CUDA_HOME=/usr/local/cuda")


def test_compile_builds_with_the_toolkit_it_found_and_says_so(tmp_path, monkeypatch):
    from popkit.machine import system
    from popkit.run import compile as compiler
    from tests.test_compile import cuda_tools, fake_import, rendered_file

    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools())
    monkeypatch.setattr(compiler, "cuda_home_problem", lambda: GUESS_PROBLEM)
    monkeypatch.setattr(system, "toolkit_candidates", lambda: ["/opt/cuda-13.0"])
    fake, calls = fake_import([{"ok": True, "seconds": 50.0, "has_custom_kernel": True},
                               {"ok": True, "seconds": 1.0, "has_custom_kernel": True}])
    monkeypatch.setattr(compiler, "_import", fake)
    result = CliRunner().invoke(app, ["compile", str(rendered_file(tmp_path))])
    assert result.exit_code == 0, result.output
    assert calls[0]["env"]["CUDA_HOME"] == "/opt/cuda-13.0"
    assert ("note: builds use the CUDA toolkit at /opt/cuda-13.0 (CUDA_HOME is unset, and torch would guess "
            "/usr/local, which cannot build an extension)") in result.output
    assert "export CUDA_HOME" not in result.output


def test_a_users_cuda_home_is_kept(monkeypatch):
    from popkit.machine import system

    monkeypatch.setenv("CUDA_HOME", "/mine")
    monkeypatch.setattr(system, "toolkit_candidates", lambda: ["/opt/cuda-13.0"])
    assert system.toolkit_for_builds(GUESS_PROBLEM) == (None, "")


def test_test_passes_the_toolkit_to_the_pre_step_and_evals(tmp_path, monkeypatch):
    from popkit.machine import system
    from popkit.model.tasks import load_task
    from popkit.run import runner

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(system, "has_gpu", lambda: True)
    monkeypatch.setattr(system, "cuda_home_problem", lambda: GUESS_PROBLEM)
    monkeypatch.setattr(system, "toolkit_candidates", lambda: ["/opt/cuda-13.0"])
    seen = tmp_path / "seen.txt"
    path = tmp_path / "mine.py"
    path.write_text("# load_inline(cuda_sources=...) is faked here\nimport os\n\nif __name__ == '__main__':\n"
                    f"    open({str(seen)!r}, 'w').write(os.environ.get('CUDA_HOME', 'unset'))\n\n\n"
                    "def custom_kernel(data):\n    return 2 * data\n")
    lines: list[str] = []
    report = runner.run_submission(load_task(DOUBLE), path, "test", runner.RunOptions(isolation="none"),
                                   progress=lines.append, system={"device": "test"})  # seen.txt is outside
    assert report.outcome == "passed" and seen.read_text() == "/opt/cuda-13.0"
    assert lines[0] == ("builds use the CUDA toolkit at /opt/cuda-13.0 (CUDA_HOME is unset, and torch would guess "
                        f"{system.cuda_home()}, which cannot build an extension)")


HIP_ON_NVCC_LOG = """Traceback (most recent call last):
  File "submission.py", line 9, in <module>
    module = load_inline(name="softmax_hip", cpp_sources=HOST_SRC, cuda_sources=DEVICE_SRC,
RuntimeError: Error building extension 'softmax_hip': [1/3] /usr/local/cuda/bin/nvcc --offload-arch=gfx942 -c cuda.cu
FAILED: cuda.cuda.o
nvcc fatal   : Unknown option '--offload-arch=gfx942'
ninja: build stopped: subcommand failed.
"""


def test_hip_file_on_a_cuda_torch_shows_the_compilers_error_and_the_right_hint(monkeypatch, capsys):
    from dataclasses import replace

    from popkit.model.results import CompileStep
    from popkit.model.tasks import load_task
    from popkit.views import running as view
    from tests.test_history import make_report

    monkeypatch.setenv("POPKIT_WIDTH", "400")
    monkeypatch.setenv("NO_COLOR", "1")
    step = CompileStep(exit_code=1, duration_s=9.0, stderr=HIP_ON_NVCC_LOG)
    report = replace(make_report(mode="test"), precompile=step, runs=(), system={"cuda": "13.0", "hip": None})
    view.show_run(report, load_task(DOUBLE))
    out = capsys.readouterr().out
    assert "compiler errors:\nnvcc fatal   : Unknown option '--offload-arch=gfx942'\n" in out
    assert ("hint: this is a HIP kernel and this torch is not a ROCm build, so nvcc built it and failed: "
            "`popkit compile FILE` checks the HIP code here, `popkit test --hip-on-cuda FILE` runs it on an NVIDIA "
            "GPU through popkit's HIP-to-CUDA mapping, and an AMD GPU with ROCm torch runs it as is") in out


def test_gpu_detection_without_torch(monkeypatch):
    from popkit.machine import system

    monkeypatch.delenv("POPKIT_ASSUME_GPU", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert system.has_gpu() is False  # every GPU hidden: nothing can run here
    monkeypatch.setenv("POPKIT_ASSUME_GPU", "1")
    assert system.has_gpu() is True  # a container that passes the GPU without /dev nodes


def test_under_ranking_by_last_the_largest_shape_that_fits_is_kept_last():
    from popkit.measure import sizing

    cases = [{"size": s, "seed": 1} for s in (1024, 2048, 4096, 8192)]
    timing = sizing.Timing(((1024, 5.0), (2048, 20.0)), 2.0)  # 4096: 80 s, 8192: 320 s
    assert sizing.plan(cases, timing, 180.0, "last") == sizing.Plan((0, 1, 2), (3,), (5.0, 20.0, 80.0, 320.0))
    assert sizing.plan(cases, timing, 180.0, "geom").kept == (0, 1, 2)  # 5 + 20 + 80 = 105 s of 106
    assert sizing.plan(cases, timing, 100.0, "geom").kept == (0, 1)


@pytest.mark.parametrize("name,code", [("wrong.py", 1), ("crash.py", 6)])
def test_a_submission_that_fails_while_sizing_is_reported_as_its_verdict(name, code, tmp_path, monkeypatch):
    """A cheat caught (or a wrong result, a crash) while sizing CPU benchmarks said exit 11 "no GPU": it is the
    submission's verdict, with its exit code."""
    from popkit.errors import EnvironmentProblem, PopkitError
    from popkit.measure import sizing
    from popkit.model.tasks import load_task
    from popkit.run import runner
    from popkit.run.executor import Executor
    from popkit.submission.source import Source

    monkeypatch.setenv("POPKIT_HOME", str(tmp_path))
    fixtures = Path(__file__).parent / "fixtures"
    path = fixtures / "submissions" / name
    source = Source(path, path.read_bytes())
    with pytest.raises(PopkitError) as info:
        sizing.probe(load_task(fixtures / "tasks" / "double"), source, runner.RunOptions(), Executor(), [0, 1], "benchmark", lambda _m: None)
    assert not isinstance(info.value, EnvironmentProblem) and int(info.value.exit_code) == code, info.value.message
