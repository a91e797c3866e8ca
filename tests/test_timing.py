"""What popkit records about timing itself: the clocks a run ran at (bench), doctor --timing's measurements."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from popkit import gpustate
from popkit.cli import app

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
