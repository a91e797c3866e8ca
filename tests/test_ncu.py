"""`popkit bench FILE --profile --profiler ncu`: Nsight Compute's raw CSV, per kernel; the run on a GPU."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import EnvironmentProblem
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
