"""Honest examples pass every trust check with fresh seeds, ten runs in a row (CPU; the PyTorch examples).

Each "run" is the task's test cases with new random case seeds and a new random secret seed; the ten
runs go through one eval process per task and mode, so the check stays affordable on a CPU. The seeds
are in the failure message, so a failure can be reproduced.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run.executor import Executor

ROOT = Path(__file__).parents[1]
TASKS = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
RUNS = 10


def _fresh_cases(task, rng: random.Random, runs: int) -> list[dict]:
    return [{**case, "seed": rng.randrange(1, 2**31)} for _ in range(runs) for case in task.tests]


@pytest.mark.slow
@pytest.mark.parametrize("task_name", TASKS)
def test_honest_example_passes_ten_fresh_runs(task_name, tmp_path):
    task = load_task(ROOT / "tasks" / task_name)
    rng = random.SystemRandom()
    submission = (ROOT / "submissions" / task_name / "pytorch.py").read_bytes()
    ws = Executor().new_workspace(tmp_path)
    main = ws.prepare(task, submission)
    options = runner.RunOptions(env={"OMP_NUM_THREADS": "1"})
    secret = rng.randrange(1, 2**31)

    cases = _fresh_cases(task, rng, RUNS)
    run = runner.run_mode(ws, main, "test", cases, timeout_s=600, options=options, seed=secret)
    failed = [c for c in run.tests if not c.passed]
    assert run.passed and len(run.tests) == len(cases), (
        f"secret seed {secret}: {run.summary}; {[(c.spec, c.error) for c in failed][:3]}; {run.stderr[-800:]}")
    assert "output-aliasing" in run.raw.get("trust.checks", ""), "the trust checks did not run"

    # Leaderboard mode on test-sized shapes: every timed call gets a fresh input and a full recheck.
    ranked = _fresh_cases(task, rng, 1)[:2]
    run = runner.run_mode(ws, main, "leaderboard", ranked, timeout_s=600, options=options, seed=secret)
    assert run.passed, f"secret seed {secret}, cases {ranked}: {run.summary}; {run.stderr[-800:]}"
