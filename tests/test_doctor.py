"""popkit doctor and system.probe: each problem with its fix; a broken interpreter never raises."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.machine import system
from popkit.operations import doctor

INFO = {"python": "3.11.7", "platform": "Linux", "torch": "2.14.1+cu130", "cuda": "13.0", "hip": None,
        "device": "cpu", "arch": None, "gpu_count": 0, "torch_dir": "/nonexistent", "arch_list": []}


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def toolkit(root: Path, release: str) -> Path:
    """A fake CUDA toolkit: bin/nvcc printing `release`, and lib64/libcudart.so."""
    script(root / "bin" / "nvcc", f'case "$1" in --list-gpu-arch) echo compute_90;; *) echo "Cuda compilation '
                                  f'tools, release {release}, V{release}.1";; esac')
    (root / "lib64").mkdir(parents=True, exist_ok=True)
    (root / "lib64" / "libcudart.so").touch()
    return root


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("POPKIT_POPCORN", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)


def fake_probe(monkeypatch, **changes):
    monkeypatch.setattr(system, "probe_torch", lambda python, timeout, extended, scripts=None: {**INFO, **changes})


def by_name(report) -> dict:
    return {c.name: c for c in report.checks}


@pytest.mark.slow
def test_probe_of_this_interpreter_has_the_contract_keys():
    info = system.probe()
    assert set(system.PROBE_KEYS) <= set(info)
    assert info["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert info["device"] == "cpu" or info["gpu_count"] >= 1


@pytest.mark.parametrize("body,needle", [
    (None, "cannot run"),
    ("sleep 5", "did not answer within 1 s"),
    ("echo not json; echo boom >&2; exit 3", "exited with code 3: boom"),
])
def test_probe_never_raises_on_a_broken_interpreter(tmp_path, body, needle):
    python = str(tmp_path / "python") if body is None else str(script(tmp_path / "python", body))
    info = system.probe(python, timeout=1)
    assert needle in info["error"]
    assert {k: info[k] for k in ("torch", "device", "gpu_count")} == {"torch": None, "device": "cpu", "gpu_count": 0}


def test_nvcc_major_mismatch_is_a_problem_with_its_fix(tmp_path, monkeypatch):
    fake_probe(monkeypatch)
    monkeypatch.setenv("CUDA_HOME", str(toolkit(tmp_path / "cuda-12.4", "12.4")))
    check = by_name(doctor.doctor())["nvcc"]
    assert check.status == "problem"
    assert check.value == f"12.4 at {tmp_path / 'cuda-12.4' / 'bin' / 'nvcc'}, torch uses CUDA 13.0"
    assert check.fix.startswith("the major versions differ") and "install CUDA 13.x" in check.fix


def test_matching_toolkit_is_ok(tmp_path, monkeypatch):
    fake_probe(monkeypatch)
    home = toolkit(tmp_path / "cuda-13.0", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(home))
    checks = by_name(doctor.doctor())
    assert (checks["nvcc"].status, checks["CUDA_HOME"].status) == ("ok", "ok")


def test_cuda_home_without_nvcc_or_cudart(tmp_path, monkeypatch):
    fake_probe(monkeypatch)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "empty"))
    checks = by_name(doctor.doctor())
    assert checks["CUDA_HOME"].status == "problem"
    assert checks["CUDA_HOME"].value == f"CUDA_HOME is {tmp_path / 'empty'}, which has no bin/nvcc"
    assert checks["nvcc"].value == "not found" and "install the CUDA 13 toolkit" in checks["nvcc"].fix
    half = tmp_path / "half"
    script(half / "bin" / "nvcc", "echo release 13.0")
    monkeypatch.setenv("CUDA_HOME", str(half))
    check = by_name(doctor.doctor())["CUDA_HOME"]
    assert check.status == "problem" and "no lib64/libcudart.so" in check.value
    assert check.fix.startswith("export CUDA_HOME=")


def test_unsupported_gpu_architecture(monkeypatch, tmp_path):
    fake_probe(monkeypatch, device="NVIDIA RTX PRO 6000", arch="sm_120", gpu_count=1, arch_list=["sm_80", "sm_90"])
    monkeypatch.setenv("CUDA_HOME", str(toolkit(tmp_path / "cuda", "13.0")))
    checks = by_name(doctor.doctor())
    assert checks["gpu"].status == "problem" and "has no kernels for sm_120" in checks["gpu"].fix
    assert checks["nvcc arch"].value == "nvcc 13.0 cannot build for sm_120"


def test_cpu_only_torch_and_missing_torch(monkeypatch, tmp_path):
    fake_probe(monkeypatch, cuda=None)
    monkeypatch.setattr(doctor.system, "find_nvcc", lambda: None)
    checks = by_name(doctor.doctor())
    assert checks["torch"].status == "warn" and "CPU only" in checks["torch"].value
    # the toolkit is shown, not hidden: with a second venv's CUDA torch it builds CUDA files here
    assert checks["nvcc"].status == "info" and checks["nvcc"].value == "not found"
    nvcc = toolkit(tmp_path / "cuda", "13.0") / "bin" / "nvcc"
    monkeypatch.setattr(doctor.system, "find_nvcc", lambda: str(nvcc))
    checks = by_name(doctor.doctor())
    assert checks["nvcc"].value == f"13.0 at {nvcc}" and "--python VENV/bin/python" in checks["nvcc"].fix
    fake_probe(monkeypatch, torch=None, error="ModuleNotFoundError: No module named 'torch'")
    checks = by_name(doctor.doctor())
    assert checks["torch"].status == "problem" and checks["torch"].fix.startswith("pip install torch")


def test_popcorn_found_and_registered(tmp_path, monkeypatch):
    fake_probe(monkeypatch, cuda=None)
    cli = script(tmp_path / "bin" / "popcorn-cli", "echo popcorn-cli 1.2.3")
    monkeypatch.setenv("POPKIT_POPCORN", str(cli))
    checks = by_name(doctor.doctor())
    assert checks["popcorn-cli"].value == f"{cli} (popcorn-cli 1.2.3)"
    assert checks["popcorn registration"].status == "warn"
    assert "popcorn-cli register discord" in checks["popcorn registration"].fix
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / ".popcorn.yaml").write_text("cli_id: abc\n")
    assert by_name(doctor.doctor())["popcorn registration"].status == "ok"


def test_popcorn_missing_is_a_warning(monkeypatch, tmp_path):
    fake_probe(monkeypatch, cuda=None)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing") + os.pathsep + "/usr/bin:/bin")
    check = by_name(doctor.doctor())["popcorn-cli"]
    assert (check.status, check.value) == ("warn", "not found")


def test_doctor_command_exit_codes_and_json(tmp_path, monkeypatch):
    fake_probe(monkeypatch)
    monkeypatch.setenv("CUDA_HOME", str(toolkit(tmp_path / "cuda", "12.8")))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 11
    assert "problem  nvcc" in result.output or "problem nvcc" in result.output
    assert "problem nvcc: the major versions differ" in result.output
    doc = json.loads(CliRunner().invoke(app, ["doctor", "--json"]).output)
    assert doc["schema"] == "popkit/doctor/1" and doc["ok"] is False and doc["problems"] >= 1
    monkeypatch.setenv("CUDA_HOME", str(toolkit(tmp_path / "cuda13", "13.0")))
    fake_probe(monkeypatch)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    warned = [c.name for c in doctor.doctor().checks if c.status == "warn"]  # no GPU here, popcorn-cli missing, ...
    assert warned and result.output.rstrip().endswith(f"{len(warned)} warnings ({', '.join(warned)}: see above)")
    assert "no problems" not in result.output


def test_numpy_missing_is_a_problem_with_its_fix(monkeypatch):
    fake_probe(monkeypatch, numpy_error="ModuleNotFoundError: No module named 'numpy'")
    check = by_name(doctor.doctor("/usr/bin/python3"))["numpy"]
    assert check.status == "problem"
    assert check.value == "not importable in /usr/bin/python3 (ModuleNotFoundError: No module named 'numpy')"
    assert check.fix == "/usr/bin/python3 -m pip install numpy (the public problem sets' utils.py imports it)"


def test_numpy_present_is_ok_and_a_dependency(monkeypatch):
    fake_probe(monkeypatch, numpy="2.4.6")
    assert by_name(doctor.doctor())["numpy"].value == "2.4.6"
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"numpy>=' in pyproject.split("[project.optional-dependencies]")[0]


def test_hip_device_build_tools_missing_name_their_packages(monkeypatch):
    from popkit.toolchain import hipbuild

    fake_probe(monkeypatch)
    monkeypatch.setattr(hipbuild, "find_tools", lambda: hipbuild.HipTools(None, "", None, "/usr/include"))
    check = by_name(doctor.doctor())["hip device build"]
    assert check.status == "warn" and check.value == "no compiler, device libraries"
    assert "apt-get install -y clang-19 rocm-device-libs" in check.fix
    monkeypatch.setattr(hipbuild, "find_tools",
                        lambda: hipbuild.HipTools("/usr/bin/clang++-19", "clang 19.1.7", "/libs", "/usr/include"))
    assert by_name(doctor.doctor())["hip device build"].status == "ok"
    fake_probe(monkeypatch, cuda=None, hip="6.2")  # a ROCm torch builds HIP itself
    assert "hip device build" not in by_name(doctor.doctor())


def test_doctor_finds_popcorn_by_the_rules_submit_uses(tmp_path, monkeypatch):
    fake_probe(monkeypatch, cuda=None)
    not_executable = tmp_path / "popcorn-cli"
    not_executable.write_text("")
    monkeypatch.setenv("POPKIT_POPCORN", str(not_executable))
    check = by_name(doctor.doctor())["popcorn-cli"]
    assert check.status == "warn" and "not an executable file" in check.value  # submit refuses it too
    monkeypatch.setenv("POPKIT_POPCORN", str(script(tmp_path / "bin" / "popcorn-cli", "echo 1.0")))
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / ".popcorn.yaml").write_text("url: x\n")  # no cli_id: popcorn-cli would refuse
    check = by_name(doctor.doctor())["popcorn registration"]
    assert check.status == "warn" and "has no cli_id" in check.value


@pytest.mark.slow
def test_the_background_probe_yields_the_cpu_to_the_eval():
    seen = {}

    def niceness(python, script, args, env, timeout):  # the probe's script, saying its priority at the end
        done = system.plain(python, script + "\nprint('niceness', os.nice(0))", args, env, timeout)
        seen[tuple(args)] = int(done.stdout.split("niceness")[-1])
        return done

    system.probe_torch(sys.executable, 60, extended=False, scripts=niceness)
    system.probe_torch(sys.executable, 60, extended=True, scripts=niceness)
    assert seen[()] == min(19, os.nice(0) + 10) and seen[("extended",)] == os.nice(0)
