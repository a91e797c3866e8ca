"""`popkit bench FILE --profile --profiler ncu`: Nsight Compute's raw CSV, per kernel; the run on a GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import EnvironmentProblem, UsageError
from popkit.measure import ncu
from popkit.model.tasks import load_task, resolve_task

FIX = Path(__file__).parent / "fixtures"
RAW = FIX / "ncu" / "raw.csv"  # recorded in ncu's `--csv --page raw --metrics ...` layout
DOUBLE = FIX / "tasks" / "double"


def test_the_raw_page_gives_one_row_per_kernel_in_base_units():
    kernels = ncu.parse_raw_csv(RAW.read_text())
    assert [k.name.split("(")[0] for k in kernels] == [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>",
        "add_kernel"]
    add = kernels[1]
    assert add.duration_ns == pytest.approx(68190.08)  # thousands separator dropped
    assert add.dram_bytes_per_s == pytest.approx(2.95e12)  # Tbyte/second
    assert (add.dram_pct, add.sm_pct, add.registers, add.occupancy_pct) == (87.71, 15.2, 16.0, None)  # n/a


def test_units_are_converted():
    text = RAW.read_text().replace('"Tbyte/second","%","nsecond"', '"Gbyte/second","%","usecond"')
    kernel = ncu.parse_raw_csv(text)[0]
    assert kernel.duration_ns == pytest.approx(23870.40 * 1e3) and kernel.dram_bytes_per_s == pytest.approx(2.81e9)


def test_no_csv_is_no_kernels():
    assert ncu.parse_raw_csv("==PROF== Connected\nno kernels were profiled\n") == ()


def _fake_ncu(tmp_path: Path) -> Path:
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint(open({str(RAW)!r}).read())\n")
    fake.chmod(0o755)
    return fake


def test_profile_runs_ncu_in_the_tasks_working_directory(tmp_path):
    sub = FIX / "submissions" / "good.py"
    report = ncu.profile(load_task(DOUBLE), sub, sub.read_bytes(), sys.executable, ncu=str(_fake_ncu(tmp_path)))
    assert report.case == {"size": 40, "seed": 5} and len(report.kernels) == 2
    assert report.to_json()["kernels"][1]["registers"] == 16.0


def test_without_ncu_the_cli_says_so_with_exit_11(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    sub = FIX / "submissions" / "good.py"
    with pytest.raises(EnvironmentProblem, match="ncu"):
        ncu.profile(load_task(DOUBLE), sub, sub.read_bytes(), sys.executable)


def test_the_cli_prints_and_emits_per_kernel_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_ncu(tmp_path).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    sub = str(FIX / "submissions" / "good.py")
    result = CliRunner().invoke(app, ["bench", sub, "--task", str(DOUBLE), "--profile", "--profiler", "ncu"])
    assert result.exit_code == 0, result.output
    assert "add_kernel" in result.output and "68.2 µs" in result.output and "2,950 GB/s" in result.output
    result = CliRunner().invoke(app, ["bench", sub, "--task", str(DOUBLE), "--profile", "ncu", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/ncu/1" and doc["kernels"][0]["dram_pct"] == 83.62


@pytest.mark.gpu
@pytest.mark.slow
def test_ncu_profiles_a_real_kernel():
    if shutil.which("ncu") is None:
        pytest.skip("ncu is not installed")
    root = Path(__file__).resolve().parents[1]
    sub = root / "submissions" / "vectoradd" / "pytorch.py"
    report = ncu.profile(resolve_task("vectoradd"), sub, sub.read_bytes(), sys.executable)
    assert report.kernels and all(k.duration_ns and k.duration_ns > 0 for k in report.kernels)
    assert any(k.dram_pct is not None and k.dram_pct > 0 for k in report.kernels)


def _fake_ncu_echoing_argv(tmp_path: Path, version: str) -> Path:
    """An ncu that says its version, writes the argv it got beside itself and prints the recorded CSV."""
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"if sys.argv[1:] == ['--version']:\n    print('NVIDIA Nsight Compute\\nVersion {version}.0 (build 1)')\n"
                    f"    sys.exit(0)\n"
                    f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                    f"print(open({str(RAW)!r}).read())\n")
    fake.chmod(0o755)
    return fake


def test_a_profile_request_selects_the_case_and_the_kernels_as_the_server_takes_them(tmp_path):
    fake = _fake_ncu_echoing_argv(tmp_path, "2025.2.1")
    sub = FIX / "submissions" / "good.py"
    task = load_task(DOUBLE)
    request = ncu.ProfileRequest(benchmark_index=0, kernel_name="add_kernel", kernel_name_base="demangled",
                                 launch_count=2)
    report = ncu.profile(task, sub, sub.read_bytes(), sys.executable, ncu=str(fake), request=request)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[argv.index("--kernel-name") + 1] == "add_kernel"
    assert argv[argv.index("--kernel-name-base") + 1] == "demangled"
    assert argv[argv.index("--launch-count") + 1] == "2"
    assert json.loads(argv[-1]) == task.benchmarks[0]
    assert report.ncu_version == "2025.2.1" and report.warnings == ()
    assert report.to_json()["request"]["kernel_name"] == "add_kernel"


def test_the_version_the_hosted_runner_avoids_is_warned_about(tmp_path):
    fake = _fake_ncu_echoing_argv(tmp_path, "2026.2.0")
    sub = FIX / "submissions" / "good.py"
    report = ncu.profile(load_task(DOUBLE), sub, sub.read_bytes(), sys.executable, ncu=str(fake))
    assert report.ncu_version == "2026.2.0"
    assert len(report.warnings) == 1 and "NaN counters" in report.warnings[0] and "2025.2.1" in report.warnings[0]


@pytest.mark.parametrize("request_, message", [
    (ncu.ProfileRequest(benchmark_index=99), "--benchmark-index 99"),
    (ncu.ProfileRequest(benchmark_index=-1), "--benchmark-index -1"),
    (ncu.ProfileRequest(kernel_name=""), "0 characters"),
    (ncu.ProfileRequest(kernel_name="k" * 1025), "1025 characters"),
    (ncu.ProfileRequest(kernel_name="k", kernel_name_base="symbol"), "not one of function, demangled, mangled"),
    (ncu.ProfileRequest(kernel_name_base="mangled"), "goes with --ncu-kernel-name"),
    (ncu.ProfileRequest(launch_count=0), "must be 1 or more"),
])
def test_requests_the_server_refuses_are_refused_before_ncu_runs(request_, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        request_.validate(load_task(DOUBLE))


def test_a_kernel_name_of_1024_characters_is_taken():
    assert ncu.ProfileRequest(kernel_name="k" * 1024).validate(load_task(DOUBLE)) == len(load_task(DOUBLE).benchmarks) - 1


def test_multi_gpu_tasks_are_refused(tmp_path):
    task = replace(load_task(DOUBLE), multi_gpu=True)
    with pytest.raises(UsageError, match="multi-GPU task: the leaderboard refuses profile requests"):
        ncu.ProfileRequest().validate(task)


def test_the_cli_takes_the_request_fields_and_refuses_them_without_ncu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_ncu_echoing_argv(tmp_path, '2026.2.0').parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    sub = str(FIX / "submissions" / "good.py")
    result = CliRunner().invoke(app, ["bench", sub, "--task", str(DOUBLE), "--profile", "ncu",
                                      "--ncu-kernel-name", "add_kernel", "--ncu-launch-count", "1"])
    assert result.exit_code == 0, result.output
    assert "--kernel-name add_kernel --kernel-name-base function --launch-count 1" in result.output
    assert "avoids this version" in result.output
    result = CliRunner().invoke(app, ["bench", sub, "--task", str(DOUBLE), "--profile", "ncu", "--benchmark-index", "9"])
    assert result.exit_code == 2 and "--benchmark-index 9" in result.output
    result = CliRunner().invoke(app, ["bench", sub, "--task", str(DOUBLE), "--ncu-launch-count", "1"])
    assert result.exit_code == 2 and "field of an ncu profile request" in result.output
