"""Timings that beat physics are flagged; the harness reports the bytes a call must move."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from popkit.model import gpus
from popkit.model.gpus import peak_bandwidth
from popkit.model.results import CaseResult, ModeRun, RunReport, beats_physics, judge_physics
from popkit.model.tasks import load_task
from popkit.run import protocol
from popkit.run import runner
from popkit.run.executor import Executor

DOUBLER = Path(__file__).parent / "fixtures" / "harness" / "doubler"


@pytest.mark.parametrize("device,peak", [
    ("NVIDIA H100 80GB HBM3", 3.9e12), ("NVIDIA H200", 4.8e12), ("NVIDIA GH200 480GB", 4.9e12),
    ("NVIDIA L40S", 0.864e12), ("NVIDIA L4", 0.3e12), ("AMD Instinct MI300X", 5.3e12), ("cpu", None), (None, None),
])
def test_peak_bandwidth_by_device_name(device, peak):
    assert peak_bandwidth(device) == peak


def case(mean_ns: float, nbytes: int | None = 402_653_184) -> CaseResult:
    return CaseResult(kind="benchmark", index=0, spec="size: 8192", passed=True, runs=10, mean_ns=mean_ns,
                      bytes=nbytes)


def test_a_time_below_the_bandwidth_floor_is_flagged():
    assert case(138_000).bandwidth_bytes_per_s == pytest.approx(402_653_184 / 138e-6)
    assert beats_physics(case(138_000), "NVIDIA H100 80GB HBM3") == ""  # 2.9 TB/s: fine
    warning = beats_physics(case(50_000), "NVIDIA H100 80GB HBM3")  # 8.1 TB/s: impossible
    assert warning.startswith("size: 8192: 8.05 TB/s implied, above the NVIDIA H100 80GB HBM3's 3.90 TB/s peak")
    assert beats_physics(case(50_000), "cpu") == "" and beats_physics(case(50_000, None), "NVIDIA H100") == ""


def _run_of(*cases: CaseResult, device: str = "NVIDIA H200") -> ModeRun:
    return ModeRun(mode="benchmark", secret=False, seed=None, exit_code=0, duration_s=1, timeout_s=10, check="pass",
                   benchmarks=cases, raw={"system.device": device, "check": "pass"})


def test_a_time_that_beats_physics_fails_the_case_and_the_run():
    run = judge_physics(_run_of(case(50_000), replace(case(500_000), index=1, spec="size: 4096")))
    failed, kept = run.benchmarks
    assert not failed.passed and failed.error.startswith("time beats physics: size: 8192: 8.05 TB/s implied, "
                                                         "above the NVIDIA H200's 4.80 TB/s peak")
    assert kept.passed and kept.error == ""
    assert (run.check, run.exit_code) == ("fail", 112)
    outcome, summary = protocol.classify(run)
    assert outcome == "failed" and "time beats physics" in summary
    report = RunReport(task="t", task_path="p", leaderboard=None, ranking_by="geom", submission="s", sha256="x",
                       mode="benchmark", harness="popkit", started_at="now", duration_s=1,
                       system={"device": "NVIDIA H200"}, runs=(replace(run, outcome=outcome, summary=summary),))
    assert report.exit_code == 1 and report.score_public_s is None
    assert RunReport.from_json(report.to_json()) == report


def test_possible_times_and_unknown_devices_leave_the_run_alone():
    for run in (_run_of(case(138_000)), _run_of(case(50_000), device="cpu"), _run_of(case(50_000, None))):
        assert judge_physics(run) == run


@pytest.mark.slow
def test_the_runner_fails_an_impossible_time(tmp_path, monkeypatch):
    """The CPU's floor (its measured copy bandwidth times the margin) is made absurdly low here, so the doubler's
    honest time beats it."""
    monkeypatch.setattr(gpus, "CPU_COPY_MARGIN", 1e-12)
    ws = Executor().new_workspace(tmp_path)
    main = ws.prepare(load_task(DOUBLER), b"def custom_kernel(d):\n    return d['x'] * d['scale']\n")
    run = runner.run_mode(ws, main, "benchmark", [{"size": 1000, "seed": 3}], timeout_s=120,
                          options=runner.RunOptions(env={"OMP_NUM_THREADS": "1"}))
    assert run.outcome == "failed" and run.benchmarks[0].error.startswith("time beats physics: size: 1000")


@pytest.mark.slow
def test_harness_reports_the_bytes_a_call_must_move(tmp_path):
    ws = Executor().new_workspace(tmp_path)
    main = ws.prepare(load_task(DOUBLER), b"def custom_kernel(d):\n    return d['x'] * d['scale']\n")
    run = runner.run_mode(ws, main, "benchmark", [{"size": 1000, "seed": 3}], timeout_s=120,
                          options=runner.RunOptions(env={"OMP_NUM_THREADS": "1"}))
    assert run.passed, run.summary
    assert run.benchmarks[0].bytes == 1000 * 4 + 1000 * 4  # x read once, the output written once


def test_a_mean_pulled_above_the_median_is_flagged_as_noisy():
    from popkit.model.results import noisy_timing

    def timed(mean_ns, median_ns, runs=100):
        return CaseResult(kind="benchmark", index=0, spec="size: 8192", passed=True, runs=runs, mean_ns=mean_ns,
                          median_ns=median_ns)

    assert noisy_timing(timed(138_000, 137_500)) == ""
    assert noisy_timing(timed(141_000, 138_000)) == ""  # 2.2%: within the limit
    assert noisy_timing(timed(144_000, 138_000)) != ""  # 4.3%: the tail moved the score
    warning = noisy_timing(timed(198_000, 138_000), "NVIDIA H100")
    assert warning == ("size: 8192: mean 198.0 µs is 43% above the median 138.0 µs: a few slow calls (other work on "
                       "the GPU, clocks, the host) pulled the mean, which is what ranks; rerun before trusting a "
                       "difference this size")
    assert noisy_timing(timed(198_000, 138_000, runs=5)) == ""  # too few calls to tell a tail
    assert noisy_timing(timed(198_000, None)) == ""  # another harness: no median reported
    run = ModeRun(mode="benchmark", secret=False, seed=None, exit_code=0, duration_s=1, timeout_s=10, check="pass",
                  benchmarks=(timed(198_000, 138_000),))
    report = RunReport(task="t", task_path="p", leaderboard=None, ranking_by="geom", submission="s", sha256="x",
                       mode="benchmark", harness="task", started_at="now", duration_s=1,
                       system={"device": "NVIDIA H100"}, runs=(run,))
    assert report.warnings == (warning,)
