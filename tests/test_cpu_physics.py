"""The physics floor on the CPU: popkit's trusted process measures the CPU's copy bandwidth once per timed run
(`system.copy_bandwidth`), and a CPU case whose reported time moves its bytes faster than CPU_COPY_MARGIN times
that fails as `time beats physics` (popkit.model.results.judge_physics)."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from popkit.model.gpus import CPU_COPY_MARGIN, cpu_copy_peak
from popkit.model.results import CaseResult, ModeRun, beats_physics, judge_physics
from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run.executor import Executor
from test_harness_split import load_harness
from test_verdict import ROOT, CHEATS, errors_of, run

MEASURED = 20e9  # bytes/s, a copy bandwidth the trusted side could have measured


def case(mean_ns: float, nbytes: int | None = 4_000_000, index: int = 0) -> CaseResult:
    return CaseResult(kind="benchmark", index=index, spec=f"size: {index}", passed=True, mean_ns=mean_ns,
                      bytes=nbytes)


def cpu_run(*cases: CaseResult, bandwidth: str | None = f"{MEASURED:.0f}") -> ModeRun:
    raw = {"system.device": "cpu"} | ({"system.copy_bandwidth": bandwidth} if bandwidth is not None else {})
    return ModeRun(mode="benchmark", secret=False, seed=None, exit_code=0, duration_s=1.0, timeout_s=60.0,
                   check="pass", benchmarks=tuple(cases), raw=raw)


def test_the_floor_is_the_measured_copy_bandwidth_times_the_margin():
    assert cpu_copy_peak({"system.copy_bandwidth": "2e10"}) == 2e10 * CPU_COPY_MARGIN
    for bad in ("", "nan", "inf", "-5", "0", "fast"):
        assert cpu_copy_peak({"system.copy_bandwidth": bad}) is None, bad
    assert cpu_copy_peak({}) is None
    peak = MEASURED * CPU_COPY_MARGIN
    at_floor_ns = 4_000_000 / peak * 1e9  # the mean that implies exactly the floor
    assert beats_physics(case(at_floor_ns * 1.01), "cpu", peak) == ""
    reason = beats_physics(case(at_floor_ns * 0.5), "cpu", peak)
    assert reason.startswith("size: 0: ") and "the CPU's measured copy bandwidth (0.020 TB/s)" in reason
    assert beats_physics(case(1.0), "cpu") == ""  # nothing measured: nothing judged
    assert beats_physics(case(1.0, nbytes=None), "cpu", peak) == ""


def test_a_forged_low_cpu_time_fails_the_case_and_the_run():
    honest, forged = case(2e6), case(10.0, index=1)  # 2 GB/s; 400 TB/s
    judged = judge_physics(cpu_run(honest, forged))
    assert judged.check == "fail" and judged.exit_code == 112
    assert judged.benchmarks[0].passed
    assert not judged.benchmarks[1].passed and judged.benchmarks[1].error.startswith("time beats physics: size: 1")


def test_a_run_without_a_measurement_is_unchanged():
    run_ = cpu_run(case(10.0), bandwidth=None)
    assert judge_physics(run_) is run_
    gpu = replace(cpu_run(case(1e9)), raw={"system.device": "NVIDIA H100 80GB HBM3", "system.copy_bandwidth": "1"})
    assert judge_physics(gpu) is gpu  # a GPU's floor is its datasheet peak, never the CPU measurement


def test_the_trusted_side_measures_a_copy_bandwidth():
    import torch

    ev = load_harness("popkit_harness_cpu_physics")
    judge = object.__new__(ev.Judge)
    judge.torch = torch
    measured = judge.copy_bandwidth()
    assert math.isfinite(measured) and measured > 0


def test_the_copy_is_timed_on_one_thread_and_counted_once_per_cpu(monkeypatch):
    """A copy split over threads waits for its slowest: on a machine whose other cores are busy it read 0.9 GB/s,
    and honest 64 MB sums failed as `time beats physics`. The trusted side times one thread and counts each CPU
    it may run on; the torch thread count it found is restored."""
    ev = load_harness("popkit_harness_cpu_physics_threads")

    class Tensor:
        def copy_(self, _source):
            threads.append(fake.get_num_threads())

    class FakeTorch:
        uint8, count = "uint8", 6

        def get_num_threads(self):
            return self.count

        def set_num_threads(self, n):
            self.count = n

        def ones(self, size, dtype):
            return Tensor()

        def empty_like(self, _tensor):
            return Tensor()

    threads: list[int] = []
    fake, clock = FakeTorch(), iter(range(0, 10**9, 1000))  # every copy takes 1 µs by this clock
    judge = object.__new__(ev.Judge)
    judge.torch = fake
    monkeypatch.setattr(ev.time, "perf_counter_ns", lambda: next(clock))
    monkeypatch.setattr(ev.os, "sched_getaffinity", lambda _pid: {0, 1, 2}, raising=False)
    measured = judge.copy_bandwidth()
    assert set(threads) == {1} and fake.count == 6
    assert measured == 3 * 2 * max(ev.COPY_SIZES) * 1e9 / 1000


@pytest.mark.slow
def test_an_honest_threaded_sum_passes_the_floor_while_every_core_is_busy(tmp_path):
    """vectorsum's PyTorch example on 16M and 50M elements with torch's own thread count, beside a busy loop on
    every CPU this process may use: the floor measured meanwhile must not call its times impossible."""
    task = load_task(ROOT / "tasks" / "vectorsum")
    ws = Executor().new_workspace(tmp_path)
    main = ws.prepare(task, (ROOT / "submissions" / "vectorsum" / "pytorch.py").read_bytes())
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        time.sleep(0.5)
        result = runner.run_mode(ws, main, "benchmark", [{"size": 16777216, "seed": 6256},
                                                        {"size": 50000017, "seed": 8711}], timeout_s=300,
                                 options=runner.RunOptions())
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.exit_code == 0 and result.check == "pass", errors_of(result)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["benchmark", "leaderboard"])
def test_a_patched_short_time_beats_physics_on_the_cpu(mode, tmp_path):
    """physics_forge.py reports 10 ns for a right kernel of microseconds: within the time witness's tolerance,
    and caught by the floor the trusted side measured.

    On a loaded 2-core machine the trusted clock once saw 258 µs unexplained a call, past the witness's 250 µs,
    and the witness named the lie first (`time forged`; 1 run in 5 in leaderboard mode there): such a run is tried
    again, up to 3 in all, since what is tested here is the floor. Every run must fail by name."""
    cases = [{"size": 256, "seed": 72}]
    for attempt in range(3):
        result = run("physics_forge.py", mode, tmp_path / str(attempt), cases=cases,
                     seed=random.randrange(1, 2**31) if mode == "leaderboard" else None)
        assert float(result.raw["system.copy_bandwidth"]) > 0
        errors = errors_of(result)
        assert result.exit_code == 112 and errors and all(e.startswith(("time beats physics: ", "time forged: "))
                                                          for e in errors), errors
        if all(e.startswith("time beats physics: ") for e in errors):
            return
    raise AssertionError(f"the witness, not the floor, named the lie in 3 runs: {errors}")


@pytest.mark.slow
def test_an_honest_cpu_run_passes_the_floor(tmp_path):
    cases = [{"size": 96, "seed": 72}, {"size": 256, "seed": 73}]
    result = run(str(ROOT / "submissions" / "vectoradd" / "pytorch.py"), "benchmark", tmp_path, cases=cases)
    assert result.exit_code == 0 and result.check == "pass", errors_of(result)
    assert float(result.raw["system.copy_bandwidth"]) > 0
    assert (CHEATS / "physics_forge.py").is_file()
