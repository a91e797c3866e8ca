"""A verdict the submission cannot write: cheats that take over the worker (the process that imports the
submission) still fail, because the trusted process judges every output and witnesses every time itself.

Each file in submissions/cheats/ says what it does and what catches it. They run against the bundled
vectoradd task through popkit.runner, with small cases so a CPU box gets through them.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from popkit import runner
from popkit.executor import Executor
from popkit.tasks import load_task

ROOT = Path(__file__).resolve().parent.parent
CHEATS = ROOT / "submissions" / "cheats"
CHILD_ENV = {"OMP_NUM_THREADS": "1"}
TEST_CASES = [{"size": 1, "seed": 21}, {"size": 17, "seed": 22}, {"size": 64, "seed": 23}]
BENCH_CASES = [{"size": 96, "seed": 72}]


def run(name: str, mode: str, tmp_path: Path, *, cases=None, seed=None):
    task = load_task(ROOT / "tasks" / "vectoradd")
    ws = Executor().new_workspace(tmp_path / f"{Path(name).stem}-{mode}")
    main = ws.prepare(task, (CHEATS / name).read_bytes())
    cases = cases or (TEST_CASES if mode == "test" else BENCH_CASES)
    return runner.run_mode(ws, main, mode, cases, timeout_s=240,
                           options=runner.RunOptions(env=CHILD_ENV), seed=seed)


def errors_of(mode_run) -> list[str]:
    return [c.error for c in mode_run.tests + mode_run.benchmarks if not c.passed]


def assert_failed_by_name(mode_run, expected: str) -> None:
    errors = errors_of(mode_run)
    assert mode_run.exit_code == 112 and mode_run.check == "fail", (mode_run.exit_code, errors, mode_run.stderr)
    assert errors and all(expected in e for e in errors), errors


WRONG_RESULT = [
    ("tensor_int.py", "elements mismatch"),
    ("judge_swap.py", "elements mismatch"),
    ("json_forge.py", "elements mismatch"),
    ("channel_takeover.py", "no output"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,expected", WRONG_RESULT, ids=[c[0][:-3] for c in WRONG_RESULT])
@pytest.mark.parametrize("mode", ["test", "leaderboard"])
def test_a_worker_that_writes_its_own_verdict_still_fails(name, expected, mode, tmp_path):
    seed = random.randrange(1, 2**31) if mode == "leaderboard" else None
    assert_failed_by_name(run(name, mode, tmp_path, seed=seed), expected)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["benchmark", "leaderboard"])
def test_a_patched_measurement_is_a_forged_time(mode, tmp_path):
    """A right kernel sleeping 20 ms per call that reports 1234 ns: the trusted clock saw 20 ms."""
    assert_failed_by_name(run("measure_forge.py", mode, tmp_path), "time forged")


@pytest.mark.slow
def test_the_ready_reply_chooses_neither_device_nor_audit(tmp_path):
    result = run("ready_forge.py", "benchmark", tmp_path)
    assert result.exit_code == 0, errors_of(result)
    assert result.raw["system.device"] != "forged-device"
    assert result.raw["trust.audit"] == "off"  # a CPU has no device queues: nothing to audit, by the trusted side


@pytest.mark.slow
def test_an_honest_kernel_is_timed_as_before(tmp_path):
    """The trusted clock's witness does not fail a right kernel, and the reported times stay the event times."""
    result = run(str(ROOT / "submissions" / "vectoradd" / "pytorch.py"), "leaderboard", tmp_path,
                 seed=random.randrange(1, 2**31))
    assert result.exit_code == 0 and result.check == "pass", errors_of(result)
    samples = [float(x) for x in result.raw["benchmark.0.samples"].split(",")]
    assert statistics.median(samples) > 0
