"""The gfx942 device build of HIP submissions without ROCm (hipbuild.py, `popkit compile` of a HIP file).

Tests marked `hip` need clang's AMDGPU backend, the HIP headers and ROCm's device libraries (the
packages .ci/run installs); elsewhere they are skipped, and CI (POPKIT_REQUIRE_HIP=1) fails instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import ExitCode
from popkit.model.diagnostics import SourceMap
from popkit.run import compile as compiler
from popkit.toolchain import hipbuild

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((ROOT / "tests" / "golden" / "hip").glob("*/*.py"))  # every HIP template, as rendered
EXAMPLES = sorted((ROOT / "submissions").glob("*/hip.py"))
LDS_LIMIT = 64 * 1024  # bytes per workgroup on gfx942
VGPR_LIMIT = 512  # VGPRs + AGPRs per lane on gfx942

REMARKS = """\
/tmp/x/device.hip:5:1: remark: Function Name: _Z1kPKfPfi [-Rpass-analysis=kernel-resource-usage]
    5 | __global__ void k(const float* x, float* y, int n) {
      | ^
/tmp/x/device.hip:5:1: remark:     SGPRs: 15 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     VGPRs: 7 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     AGPRs: 4 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     ScratchSize [bytes/lane]: 16 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     Dynamic Stack: True [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     Occupancy [waves/SIMD]: 6 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     SGPRs Spill: 1 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     VGPRs Spill: 2 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:5:1: remark:     LDS Size [bytes/block]: 1024 [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:9:1: remark: Function Name: h [-Rpass-analysis=kernel-resource-usage]
/tmp/x/device.hip:9:1: remark:     VGPRs: 3 [-Rpass-analysis=kernel-resource-usage]
"""

SUBMISSION = '''import os
os.environ["PYTORCH_ROCM_ARCH"] = "gfx942"
os.environ["CXX"] = "clang++"
import torch
from torch.utils.cpp_extension import load_inline

DEVICE_SRC = r"""
#include <hip/hip_runtime.h>

__global__ void scale_kernel(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i]BROKEN;
}
"""

HOST_SRC = r"""
#include <torch/types.h>
void scale(torch::Tensor x) { scale_kernel<<<1, 64>>>(x.data_ptr<float>(), x.numel()); }
"""

HIP_SRC = DEVICE_SRC + HOST_SRC
_module = load_inline(name="scale", cpp_sources="void scale(torch::Tensor x);", cuda_sources=HIP_SRC,
                      functions=["scale"], extra_cuda_cflags=["--offload-arch=gfx942", "-O2", "-Wall"])


def custom_kernel(data):
    return _module.scale(data)
'''


@pytest.fixture(autouse=True)
def _plain(monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_HOME", str(Path(__file__).parent / ".no-home-needed"))


def _no_rocm_torch(monkeypatch):
    """The machine's torch as a CUDA build (a HIP file then takes the device-build path)."""
    tools = compiler.Toolchain(python="python", python_tag="py311", torch="2.9", cuda="13.0", hip=None,
                               lock_style="flock", ninja="ninja")
    monkeypatch.setattr(compiler, "toolchain", lambda python, scripts=None: tools)


# --------------------------------------------------------------------------------- no compiler


def test_isa_version_of_an_architecture():
    assert hipbuild.isa_version("gfx942") == 9402
    assert hipbuild.isa_version("gfx940") == 9400
    assert hipbuild.isa_version("gfx90a") == 9010
    assert hipbuild.isa_version("gfx1030") == 10300
    assert not hipbuild.is_arch("sm_90a")


def test_remarks_become_kernel_usage():
    first, second = hipbuild.parse_usage(REMARKS)
    assert (first.symbol, first.vgprs, first.sgprs, first.agprs, first.lds_bytes) == ("_Z1kPKfPfi", 7, 15, 4, 1024)
    assert (first.scratch_bytes, first.vgpr_spills, first.sgpr_spills, first.occupancy) == (16, 2, 1, 6)
    assert first.dynamic_stack is True
    assert (second.name, second.vgprs, second.occupancy) == ("h", 3, None)


def test_kernel_line_maps_to_the_submission():
    text = SUBMISSION
    source = hipbuild.device_source(text)
    log = "/t/device.hip:4:1: remark: Function Name: _Z12scale_kernelPfi [-Rpass-analysis=kernel-resource-usage]\n"
    (usage,) = hipbuild.parse_usage(log, SourceMap("s.py", text), source)
    assert text.splitlines()[usage.line - 1].startswith("__global__ void scale_kernel")


def test_device_source_and_flags_come_from_the_file():
    assert hipbuild.device_source(SUBMISSION).lstrip().startswith("#include <hip/hip_runtime.h>")
    assert hipbuild.device_source("HIP_SRC = 'x'\n") is None
    assert hipbuild.submission_flags(SUBMISSION) == ["-O2"]  # --offload-arch and -Wall are not device flags
    assert hipbuild.file_arch(SUBMISSION) == "gfx942"


def test_missing_compiler_names_the_packages(monkeypatch, tmp_path):
    _no_rocm_torch(monkeypatch)
    monkeypatch.setattr(hipbuild, "find_tools", lambda: hipbuild.HipTools(None, "", None, "/usr/include"))
    sub = tmp_path / "s.py"
    sub.write_text(SUBMISSION.replace("BROKEN", ""))
    report = compiler.compile_submission(sub)
    assert report.status == "static-only"
    assert "apt-get install -y clang-19 rocm-device-libs" in " ".join(report.notes)


def test_a_file_without_device_src_is_checked_statically(monkeypatch, tmp_path):
    _no_rocm_torch(monkeypatch)
    monkeypatch.setattr(hipbuild, "find_tools", lambda: hipbuild.HipTools("clang++", "clang 19", "/libs", "/usr/include"))
    sub = tmp_path / "s.py"
    sub.write_text(SUBMISSION.replace("DEVICE_SRC", "KERNELS"))
    report = compiler.compile_submission(sub)
    assert report.status == "static-only" and "no DEVICE_SRC string" in " ".join(report.notes)


def test_a_bad_arch_is_a_usage_error(monkeypatch, tmp_path):
    _no_rocm_torch(monkeypatch)
    monkeypatch.setattr(hipbuild, "find_tools", lambda: hipbuild.HipTools("clang++", "clang 19", "/libs", "/usr/include"))
    sub = tmp_path / "s.py"
    sub.write_text(SUBMISSION)
    result = CliRunner().invoke(app, ["compile", str(sub), "--arch", "sm_90"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "--arch sm_90" in result.output


# ------------------------------------------------------------------------ with clang for gfx942


@pytest.mark.hip
def test_compile_error_maps_to_the_submission_line(monkeypatch, tmp_path):
    _no_rocm_torch(monkeypatch)
    sub = tmp_path / "s.py"
    sub.write_text(SUBMISSION)
    report = compiler.compile_submission(sub)
    assert report.status == "failed" and report.exit_code == ExitCode.COMPILE_FAILED
    errors = [d for d in report.errors if d.tool == "clang"]
    assert errors and all(d.file == str(sub) and d.line == 12 and "BROKEN" in d.source_line for d in errors)
    assert errors[0].column == errors[0].source_line.index("BROKEN") + 1


@pytest.mark.slow
@pytest.mark.hip
def test_cli_reports_registers_per_kernel(monkeypatch, tmp_path):
    _no_rocm_torch(monkeypatch)
    sub = tmp_path / "s.py"
    sub.write_text(SUBMISSION.replace("BROKEN", ""))
    result = CliRunner().invoke(app, ["compile", str(sub), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["status"], data["arch"]) == ("device-built", "gfx942")
    (kernel,) = data["kernels"]
    assert kernel["name"] == "scale_kernel" and kernel["line"] == 10 and kernel["vgprs"] > 0
    text = CliRunner().invoke(app, ["compile", str(sub), "--arch", "gfx90a"]).output
    assert "built for gfx90a" in text and "scale_kernel" in text
    unknown = CliRunner().invoke(app, ["compile", str(sub), "--arch", "gfx999"])
    assert unknown.exit_code == ExitCode.COMPILE_FAILED and "does not know gfx999" in unknown.output


@pytest.mark.hip
@pytest.mark.slow
@pytest.mark.parametrize("path", TEMPLATES + EXAMPLES, ids=lambda p: "/".join(p.parts[-3:]))
def test_every_hip_template_and_example_builds_for_gfx942(path):
    text = path.read_text()
    build = hipbuild.build_device(text, str(path), "gfx942")
    assert build.ok, build.log[-2000:]
    assert not [d for d in build.diagnostics if d.severity == "error"]
    assert build.kernels, "no kernel was built"
    for k in build.kernels:
        assert 0 < k.vgprs and k.vgprs + k.agprs <= VGPR_LIMIT, k
        assert 0 <= k.lds_bytes <= LDS_LIMIT, k
        assert k.line is not None and "__global__" in text.splitlines()[k.line - 1], k
        assert not k.dynamic_stack, k  # every call was inlined: the device libraries were linked
        if path in EXAMPLES:
            assert (k.vgpr_spills, k.sgpr_spills, k.scratch_bytes) == (0, 0, 0), k
