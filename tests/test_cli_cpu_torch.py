"""A CPU-only torch (the README's quick start on a machine without a GPU) and CUDA builds:
`test`, `compile` and `doctor` give one way out, the second venv of README.md, and doctor does not say
"no problems" as if CUDA builds could work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import ExitCode
from popkit.machine import cputorch
from popkit.machine import system
from popkit.operations import doctor
from popkit.run import compile as compiler
from tests.test_compile import cuda_tools
from tests.test_doctor import fake_probe

ROOT = Path(__file__).resolve().parents[1]
SECOND_VENV = ("put the CUDA build of torch in a second venv (about 3 GB): python3 -m venv ~/popkit-cuda && "
               "~/popkit-cuda/bin/pip install torch ninja numpy, then build with `popkit compile FILE --python "
               "~/popkit-cuda/bin/python` (docs/cpu.md: CUDA builds on a CPU machine)")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "popkit"))
    monkeypatch.setenv("POPKIT_WIDTH", "400")
    monkeypatch.setenv("NO_COLOR", "1")


def test_the_wording_is_the_readmes():
    assert cputorch.SECOND_VENV == SECOND_VENV
    doc = (ROOT / "docs" / "cpu.md").read_text()
    assert "## CUDA builds on a CPU machine" in doc
    section = doc.split("## CUDA builds on a CPU machine", 1)[1].split("\n## ", 1)[0]
    assert "python3 -m venv ~/popkit-cuda && ~/popkit-cuda/bin/pip install torch ninja numpy" in section
    assert "popkit compile mine.py --python ~/popkit-cuda/bin/python" in section


def test_compile_with_a_cpu_only_torch_points_at_the_second_venv(monkeypatch, tmp_path):
    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools(torch="2.14.1+cpu",
                                                                                               cuda=None))
    sub = tmp_path / "mine.py"
    sub.write_text("from torch.utils.cpp_extension import load_inline\n\ndef custom_kernel(data):\n    return data\n")
    result = CliRunner().invoke(app, ["compile", str(sub)])
    assert result.exit_code == ExitCode.ENVIRONMENT, result.output
    assert (f"error: torch 2.14.1+cpu at {sys.executable} is a CPU-only build: a CPU-only torch cannot build CUDA "
            "extensions (load_inline needs a CUDA or ROCm build)") in result.output
    assert f"hint: {SECOND_VENV}" in result.output


def test_doctor_warns_that_a_cpu_only_torch_cannot_build(monkeypatch):
    fake_probe(monkeypatch, torch="2.14.1+cpu", cuda=None)
    torch = {c.name: c for c in doctor.doctor().checks}["torch"]
    assert (torch.status, torch.value) == ("warn", "2.14.1+cpu (CPU only)")
    assert torch.fix == ("a CPU-only torch cannot build CUDA extensions (nor HIP ones): `popkit compile`, and `popkit "
                         f"test`/`bench` of a file that builds one, cannot run with it; {SECOND_VENV}")
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert f"warn torch: a CPU-only torch cannot build CUDA extensions (nor HIP ones)" in result.output
    assert "no problems" not in result.output
    assert "warnings (torch, " in result.output.splitlines()[-1]


def test_the_no_gpu_message_agrees_with_compile():
    message, hint = cputorch.no_gpu_message("mine.py", "test", cpu_only=True)
    assert message == "this machine has no CUDA GPU: `popkit compile` builds it, `popkit test` needs a GPU"
    assert hint == ("a CPU-only torch cannot build CUDA extensions, so `popkit compile` cannot check it here either: "
                    + SECOND_VENV.replace("FILE", "mine.py")
                    + "; run `popkit test` on a machine with a GPU (a pure-PyTorch submission runs on the CPU)")
    _, hint = cputorch.no_gpu_message("mine.py", "bench", cpu_only=False)
    assert hint == ("`popkit compile mine.py` checks the build here; run `popkit bench` on a machine with a GPU "
                    "(a pure-PyTorch submission runs on the CPU)")


def test_the_backend_is_read_from_torchs_version_file(tmp_path):
    assert cputorch.version_file_backend("__version__ = '2.14.1+cpu'\ncuda: Optional[str] = None\nhip = None\n") == "cpu"
    assert cputorch.version_file_backend("cuda: Optional[str] = '13.0'\nhip = None\n") == "cuda"
    assert cputorch.version_file_backend("cuda = None\nhip = '6.4'\n") == "hip"
    assert cputorch.version_file_backend("x = 1\n") is None
    assert cputorch.version_file_backend("def (\n") is None
    import torch  # this machine's: a CUDA build (README, Development)

    expected = "cuda" if torch.version.cuda else "hip" if torch.version.hip else "cpu"
    assert cputorch.torch_backend() == expected
    assert cputorch.torch_backend(sys.executable + "-missing") is None
    assert cputorch.is_cpu_only() is (expected == "cpu")
