"""What popkit records about timing itself: the clocks a run ran at (bench), doctor --timing's measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.machine import gpustate

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TASK_DIR = FIXTURES / "tasks" / "double"
GOOD = FIXTURES / "submissions" / "good.py"
STATE = gpustate.GpuState(samples=40, sm_mhz=1980, sm_mhz_low=345, mem_mhz=2619, temp_c=47, power_w=312.0,
                          throttle=("sw_power_cap",))


class Watched:
    """gpustate.Sampler as NVML on an H100 would answer it."""

    def __init__(self, env, load=None, interval_s=0.2):
        self.state = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.state = STATE


def test_bench_reports_the_clocks_it_ran_at(monkeypatch, cli_env):
    monkeypatch.setattr(gpustate, "Sampler", Watched)
    args = ["bench", str(GOOD), "--task", str(TASK_DIR), "--no-precompile", "--no-history"]
    result = CliRunner().invoke(app, args + ["--json"], env=cli_env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["gpu_state"] == STATE.to_json()
    shown = CliRunner().invoke(app, args, env={**cli_env, "POPKIT_WIDTH": "300"})
    assert ("GPU during the run: SM clock up to 1980 MHz (lowest 345) · memory 2619 MHz · up to 47 °C, 312 W · "
            "throttled: sw_power_cap") in shown.output


def test_without_nvml_a_run_records_no_gpu_state(cli_env, monkeypatch):
    def no_driver():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    real = gpustate.Sampler
    monkeypatch.setattr(gpustate, "Sampler", lambda env: real(env, load=no_driver))
    result = CliRunner().invoke(app, ["bench", str(GOOD), "--task", str(TASK_DIR), "--no-precompile", "--no-history",
                                      "--json"], env=cli_env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["gpu_state"] == {}


H100_CHILD = {"cpu": {"timer_resolution_ns": 30, "timer_call_ns": 61.5, "copy_bandwidth_bytes_per_s": 2.1e10,
                      "copy_bytes": 134217728},
              "gpu": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "launch_floor_us": 4.91,
                      "event_pair_us": 2.05, "back_to_back_launch_us": 2.2, "copy_bandwidth_bytes_per_s": 2.9e12,
                      "copy_bytes": 1073741824}}


def _fake_python(tmp_path, output, code=0):
    script = tmp_path / "python"
    to = " >&2" if code else ""  # a failing child writes its traceback on stderr
    script.write_text(f"#!/bin/sh\ncat{to} <<'EOF'\n{output}\nEOF\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


def test_doctor_timing_reads_the_child_and_shows_every_number(tmp_path, cli_env, monkeypatch):
    from popkit.operations import timingcheck
    from popkit.views.authoring import timing_rows

    monkeypatch.setattr(gpustate, "Sampler", Watched)
    python = _fake_python(tmp_path, "torch says hello\n" + json.dumps(H100_CHILD))
    report = timingcheck.measure(python)
    assert report.ok and report.gpu == H100_CHILD["gpu"] and report.gpu_state == STATE.to_json()
    rows = dict(timing_rows(report))
    assert rows["launch floor"].startswith("4.91 µs") and rows["event pair"].startswith("2.05 µs")
    assert rows["GPU memory copy"] == "2,900.0 GB/s (read + write, 1024 MiB)"
    assert rows["CPU memory copy"].startswith("21.0 GB/s") and rows["clocks"].startswith("SM clock up to 1980 MHz")
    result = CliRunner().invoke(app, ["doctor", "--timing", "--python", python, "--json"], env=cli_env)
    assert result.exit_code == 0 and json.loads(result.stdout)["schema"] == "popkit/timing/1"


def test_doctor_timing_names_a_child_that_fails(tmp_path, cli_env):
    python = _fake_python(tmp_path, "Traceback ...\nMemoryError", code=1)
    result = CliRunner().invoke(app, ["doctor", "--timing", "--python", python], env=cli_env)
    assert result.exit_code == 11 and "exited with code 1: MemoryError" in result.output
    result = CliRunner().invoke(app, ["doctor", "--timing", "--python", str(tmp_path / "none")], env=cli_env)
    assert result.exit_code == 11 and "timing not measured" in result.output


@pytest.mark.slow
def test_doctor_timing_measures_this_cpu(cli_env):
    result = CliRunner().invoke(app, ["doctor", "--timing", "--json"], env=cli_env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["cpu"]["timer_resolution_ns"] > 0 and doc["cpu"]["copy_bandwidth_bytes_per_s"] > 1e8
    assert doc["gpu"].get("error") or doc["gpu"]["launch_floor_us"] > 0
