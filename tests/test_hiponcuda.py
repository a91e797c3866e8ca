"""HIP kernel logic on an NVIDIA GPU (`popkit test --hip-on-cuda`): the mapping, the start-up hook,
the wavefront-width warnings, nvcc builds of every HIP template and example, and (on a GPU) the runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import ExitCode
from popkit.toolchain import hipbuild
from popkit.toolchain import hiponcuda

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((ROOT / "tests" / "golden" / "hip").glob("*/*.py"))  # every HIP template, as rendered
EXAMPLES = sorted((ROOT / "submissions").glob("*/hip.py"))

WAVE64 = '''import os
os.environ["PYTORCH_ROCM_ARCH"] = "gfx942"  # 64-lane wavefronts: this comment is not code
DEVICE_SRC = r"""
#include <hip/hip_runtime.h>
constexpr int WAVE_SIZE = 64;
__global__ void k(float* x) {
    const unsigned long long all = 0xffffffffffffffffull;
    if (warpSize == 64) x[0] = 1.0f;
    x[1] = __shfl_xor(x[1], 1, 64);
    const auto lanes = __ballot(x[2] > 0);  // __ballot in a comment is not flagged twice
    x[3] = __shfl_xor(x[3], warpSize / 2);
}
"""
'''


@pytest.fixture(autouse=True)
def _plain(monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")


def test_wave64_code_is_flagged_at_its_lines():
    found = hiponcuda.wave64_warnings(WAVE64, "w.py")
    lines = WAVE64.splitlines()
    assert [lines[d.line - 1].strip().split()[0] for d in found] == ["constexpr", "const", "if", "x[1]", "const"]
    assert all(d.severity == "warning" and d.tool == "wave64" for d in found)
    assert "64-lane mask" in found[1].message and "__ballot" in found[4].message
    assert found[4].column == lines[found[4].line - 1].index("__ballot") + 1


@pytest.mark.parametrize("path", TEMPLATES + EXAMPLES, ids=lambda p: "/".join(p.parts[-3:]))
def test_templates_and_examples_do_not_depend_on_the_wavefront_width(path):
    assert hiponcuda.wave64_warnings(path.read_text(), str(path)) == []


def test_notes_say_logic_check_first():
    notes = hiponcuda.notes_for(WAVE64, "w.py")
    assert notes[0].startswith("HIP on CUDA: a logic check, not AMD timing")
    assert len(notes) == 6 and notes[1].startswith("warning: w.py:5:")


def test_child_env_puts_the_hook_first(monkeypatch):
    env = hiponcuda.child_env({"PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"] == f"{hiponcuda.site_dir()}{os.pathsep}/mine"
    assert (Path(env[hiponcuda.ENV_VAR]) / "hip" / "hip_runtime.h").is_file()
    assert (hiponcuda.site_dir() / "sitecustomize.py").is_file()


def test_hook_rewrites_load_inline_and_leaves_the_file_alone(tmp_path):
    """A stand-in torch.utils.cpp_extension records what load_inline got, in a child started as the runner does."""
    fake = tmp_path / "fake"
    (fake / "torch" / "utils").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    (fake / "torch" / "utils" / "__init__.py").write_text("")
    (fake / "torch" / "utils" / "cpp_extension.py").write_text(textwrap.dedent('''\
        import json, os
        def load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                        extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None, **kw):
            print(json.dumps({"flags": extra_cuda_cflags, "include": extra_include_paths,
                              "cxx": os.environ.get("CXX")}))
        '''))
    sub = tmp_path / "submission.py"
    source = textwrap.dedent('''\
        import os
        os.environ["CXX"] = "clang++"
        from torch.utils.cpp_extension import load_inline
        load_inline("x", "", "", None, None, ["--offload-arch=gfx942", "-O3"], extra_include_paths=["/mine"])
        ''')
    sub.write_text(source)
    env = {**os.environ, **hiponcuda.child_env({"PYTHONPATH": str(fake)})}
    env.pop("CXX", None)
    out = subprocess.run([sys.executable, str(sub)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"flags": ["-O3"], "include": [str(hiponcuda.include_dir()), "/mine"], "cxx": None}
    assert sub.read_text() == source


def test_hip_on_cuda_refuses_a_cuda_file(tmp_path):
    result = CliRunner().invoke(app, ["test", str(ROOT / "submissions" / "vectoradd" / "cuda.py"), "--hip-on-cuda"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "--hip-on-cuda runs HIP submissions" in result.output


def _nvcc_device_build(path: Path, tmp: Path) -> tuple[Path, str]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = tmp / (("_".join(path.parts[-3:])).replace(".py", ".cu"))
    src.write_text(hipbuild.device_source(path.read_text()))
    cmd = [nvcc, "-c", "-arch=sm_90", "-std=c++20", "-O3", "-I", str(hiponcuda.include_dir()), str(src),
           "-o", str(src.with_suffix(".o"))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return path, "" if proc.returncode == 0 else proc.stdout + proc.stderr


@pytest.mark.nvcc
@pytest.mark.slow
def test_every_hip_template_and_example_builds_through_the_mapping(tmp_path):
    """nvcc compiles each file's DEVICE_SRC as CUDA with popkit's <hip/hip_runtime.h> (no GPU needed)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: _nvcc_device_build(p, tmp_path), TEMPLATES + EXAMPLES))
    failed = {str(p.relative_to(ROOT)): log[-1500:] for p, log in results if log}
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES + [t for t in TEMPLATES if t.stem != "_skeleton"],
                         ids=lambda p: "/".join(p.parts[-3:]))
def test_hip_examples_and_templates_pass_their_tests_on_nvidia(path, tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    task = path.parent.name if path in EXAMPLES else path.stem
    result = CliRunner().invoke(app, ["test", str(path), "--task", task, "--hip-on-cuda", "--json", "--no-history"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 0, doc.get("outcome")
    assert doc["label"] == "hip-on-cuda" and doc["notes"][0].startswith("HIP on CUDA: a logic check")
