"""popkit compile of files shaped like the public problem sets' examples: `from task import
...`, load_inline with cuda_sources, no `#!POPCORN` lines. They build as published with --task, the architecture
is chosen and said when no GPU is here, and a failure inside torch's builder is one line with a hint.

The published examples themselves are not in the repository (their licence): the `nvcc`/`slow` test at the end
builds them from a checkout of the problem sets when one is here (/work/refk/problems or .refk/problems).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from popkit.errors import ExitCode
from popkit.model.diagnostics import missing_module_hint, task_imports, torch_error
from popkit.run import compile as compiler
from popkit.toolchain import arch as buildarch
from tests.test_compile import fake_import

FIX = Path(__file__).parent / "fixtures"
SET = FIX / "inline_set"
SUB = FIX / "submissions" / "task_import_cuda.py"
ROOT = Path(__file__).resolve().parents[1]
ARCH_NOTE = ("note: architecture: TORCH_CUDA_ARCH_LIST=8.0, no GPU here and no `#!POPCORN gpu` line: A100, the first "
             "GPU of task `vadd_v9` (its GPUs: A100, H100)")


@pytest.fixture
def cli(cli, monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "300")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(compiler, "local_gpu_archs", lambda: (None, False))  # as on the newcomer's machine
    return cli


def test_a_file_importing_task_without_task_says_to_pass_task(cli):
    result = cli("compile", str(SUB))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert (f"error: {SUB}:3: the file imports `task`, one of the task's files, and popkit does not know the task "
            "(no --task, and no `#!POPCORN leaderboard` line names one it knows)") in result.output
    assert ("hint: pass --task NAME: a leaderboard name with --tasks-root DIR (e.g. --task vectoradd_v2 --tasks-root "
            "reference-kernels/problems), or the task's folder") in result.output


def test_with_task_the_task_files_are_beside_it_and_the_arch_comes_from_the_tasks_gpus(cli, monkeypatch):
    from tests.test_compile import cuda_tools

    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools())
    monkeypatch.setattr(compiler, "cuda_home_problem", lambda: None)
    monkeypatch.setattr(compiler, "supported_archs", lambda nvcc: {"7.5", "8.0", "9.0"})
    fake, calls = fake_import([{"ok": True, "seconds": 40.0, "has_custom_kernel": True},
                               {"ok": True, "seconds": 0.5, "has_custom_kernel": True}])
    monkeypatch.setattr(compiler, "_import", fake)
    result = cli("compile", str(SUB), "--task", "vadd_v9", "--tasks-root", str(SET))
    assert result.exit_code == 0, result.output
    assert f"built {SUB} (cuda with TORCH_CUDA_ARCH_LIST=8.0)" in result.output
    assert ARCH_NOTE in result.output
    assert calls[0]["env"]["TORCH_CUDA_ARCH_LIST"] == "8.0"
    assert {"submission.py", "task.py", "eval.py"} <= set(calls[0]["files"])


# ----------------------------------------------------------------------------- the architecture's rule


def _choose(**kw):
    base = dict(env_list=None, local_archs=None, local_gpu=False, directive_gpu=None, directive_line=None,
                task_gpus=(), task_label="t", supported=lambda: None)
    return buildarch.choose_arch(**{**base, **kw})


def test_arch_order_environment_local_gpu_directive_task_default():
    assert _choose(env_list="8.6", local_archs=["sm_90"]).note == (
        "architecture: TORCH_CUDA_ARCH_LIST=8.6, from TORCH_CUDA_ARCH_LIST in the environment")
    assert _choose(local_archs=["sm_90"], local_gpu=True, directive_gpu="B200").note == (
        "architecture: TORCH_CUDA_ARCH_LIST=9.0a, this machine's GPU (sm_90)")
    assert _choose(local_archs=["sm_80", "sm_80"], local_gpu=True).arch_list == "8.0"
    assert _choose(local_gpu=True, directive_gpu="B200").note == (
        "architecture: torch's choice, this machine's GPU (torch reads its architecture)")
    assert _choose(directive_gpu="H100", directive_line=2, task_gpus=["A100"]).note == (
        "architecture: TORCH_CUDA_ARCH_LIST=9.0a, no GPU here: from `#!POPCORN gpu H100` (line 2)")
    assert _choose(task_gpus=["B200_Nebius"], task_label="fp8_quant").note == (
        "architecture: TORCH_CUDA_ARCH_LIST=10.0a, no GPU here and no `#!POPCORN gpu` line: B200_Nebius, the first "
        "GPU of task `fp8_quant`")
    assert _choose(task_gpus=["MI300"]).note == (
        "architecture: TORCH_CUDA_ARCH_LIST=9.0a, no GPU here, no `#!POPCORN gpu` line and no GPU in the task: "
        "popkit's default, H100 (sm_90a); add `#!POPCORN gpu NAME` to build for another")


def test_a_task_gpu_the_toolkit_cannot_build_is_passed_over():
    asked = []
    choice = _choose(task_gpus=["B200", "H100"], task_label="v", supported=lambda: asked.append(1) or {"8.0", "9.0"})
    assert choice.arch_list == "9.0a" and "H100, the first GPU of task `v` (its GPUs: B200, H100)" in choice.why
    assert asked == [1]
    _choose(directive_gpu="H100", supported=lambda: asked.append(2))
    assert asked == [1]  # nvcc is asked only when the task's list decides


@pytest.mark.skipif(not shutil.which("nvcc") and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no nvcc")
def test_supported_archs_reads_nvcc():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    found = buildarch.supported_archs(nvcc)
    assert found and "9.0" in found
    assert buildarch.supported_archs("/nonexistent/nvcc") is None


# ------------------------------------------------------------------- failures inside torch, missing modules

TORCH_FRAMES = [["/x/submission.py", 54, "<module>"],
                ["/usr/lib/python3/site-packages/torch/utils/cpp_extension.py", 2100, "load_inline"],
                ["/usr/lib/python3/site-packages/torch/utils/cpp_extension.py", 2480, "_get_cuda_arch_flags"]]


def test_a_torch_exception_in_the_build_is_one_line_with_a_hint(cli, monkeypatch, tmp_path):
    from tests.test_compile import cuda_tools

    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools())
    monkeypatch.setattr(compiler, "cuda_home_problem", lambda: None)
    sub = tmp_path / "s.py"
    sub.write_text(SUB.read_text().replace("from task import input_t, output_t\n", ""))
    line = sub.read_text().splitlines().index('module = load_inline(name="popkit_fixture_task_import", '
                                              'cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,') + 1
    frames = [[str(sub), line, "<module>"]] + TORCH_FRAMES[1:]
    fake, _ = fake_import([{"ok": False, "seconds": 1.0, "error_type": "IndexError",
                            "error": "list index out of range", "frames": frames}])
    monkeypatch.setattr(compiler, "_import", fake)
    result = cli("compile", str(sub))
    assert result.exit_code == ExitCode.COMPILE_FAILED, result.output
    assert (f"{sub}:{line}: error: torch's extension builder raised IndexError: list index out of range "
            "(torch/utils/cpp_extension.py:2480 in _get_cuda_arch_flags) [torch]") in result.output
    assert ("hint: torch found no GPU architecture to build for (no GPU here): set TORCH_CUDA_ARCH_LIST (9.0a for "
            "H100) or add `#!POPCORN gpu H100`") in result.output
    assert "Traceback" not in result.output


def test_torch_error_generic_and_outside_the_builder():
    message, hint = torch_error("RuntimeError", "boom\nmore", [TORCH_FRAMES[0], TORCH_FRAMES[1]])
    assert message == ("torch's extension builder raised RuntimeError: boom "
                       "(torch/utils/cpp_extension.py:2100 in load_inline)")
    assert hint.startswith("the failure is inside torch's extension builder, not in your code: `popkit doctor`")
    assert torch_error("RuntimeError", "x", [TORCH_FRAMES[0], ["/t/torch/cuda/__init__.py", 3, "_lazy_init"]]) is None


def test_missing_modules_and_task_imports():
    assert task_imports("import torch\nfrom task import input_t\nimport utils, os\n") == [("task", 2), ("utils", 3)]
    assert task_imports("def f(:\n") == []
    assert missing_module_hint("ModuleNotFoundError", "No module named 'helion'", "/usr/bin/python3") == (
        "`helion` is not installed for /usr/bin/python3: install it (pip install helion) if the leaderboard's runner "
        "has it; popkit builds with the interpreter of --python")
    assert missing_module_hint("ModuleNotFoundError", "No module named 'task'", "p").startswith(
        "`task` is one of the task's files: pass --task NAME")
    assert missing_module_hint("ImportError", "cannot import name 'x'", "p") == ""


# ------------------------------------------------------------------------------------------ real builds


def _can_build() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.version.cuda) and (shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists())


@pytest.mark.nvcc
@pytest.mark.slow
def test_the_fixture_builds_with_task_and_no_directive(cli):
    result = cli("compile", str(SUB), "--task", "vadd_v9", "--tasks-root", str(SET))
    assert result.exit_code == 0, result.output
    assert f"built {SUB} (cuda with TORCH_CUDA_ARCH_LIST=8.0)" in result.output
    assert ARCH_NOTE in result.output


def _problems() -> Path | None:
    for candidate in (Path("/work/refk/problems"), ROOT / ".refk" / "problems"):
        if (candidate / "pmpp_v2.yaml").is_file():
            return candidate
    return None


def _helion_importable() -> bool:
    out = subprocess.run([sys.executable, "-c", "import helion"], capture_output=True)
    return out.returncode == 0


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(_problems() is None, reason="no checkout of the public problem sets (.refk/problems)")
def test_the_published_examples_compile_as_published(cli):
    problems = _problems()
    example = problems / "pmpp_v2" / "vectoradd_py" / "solutions" / "correct" / "submission_cuda_inline.py"
    result = cli("compile", str(example), "--task", "vectoradd_v2", "--tasks-root", str(problems))
    assert result.exit_code == 0, result.output
    assert f"built {example} (cuda with TORCH_CUDA_ARCH_LIST=" in result.output
    assert "note: architecture: TORCH_CUDA_ARCH_LIST=" in result.output
    helion = _helion_importable()
    for folder in sorted((problems / "helion").glob("*_py")):
        board = folder.name.removesuffix("_py")
        result = cli("compile", str(folder / "submission.py"), "--task", board, "--tasks-root", str(problems))
        if helion:
            assert result.exit_code == 0, (board, result.output)
            assert "the file calls no load_inline: nothing was compiled" in result.output
        else:  # the examples need the Helion package: the report says so, with the install
            assert result.exit_code == ExitCode.BAD_SUBMISSION, (board, result.output)
            assert "error: ModuleNotFoundError: No module named 'helion' [python]" in result.output
            assert "hint: `helion` is not installed for" in result.output
