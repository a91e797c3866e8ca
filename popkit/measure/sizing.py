"""Benchmarks sized for a GPU, on a machine without one: which shapes finish within the mode's timeout.

A task's benchmarks are chosen for the leaderboard's GPUs; on a CPU the largest can run for many minutes
and the whole mode then times out with no number at all. Whether they fit is not a static guess: on a
machine without a GPU, each timing mode of a GPU task first runs its two smallest benchmark shapes alone
(one eval per mode) and extrapolates every shape's time from them as a power of its size, the product of
its whole-number parameters (seeds excluded: `size`, `rows * cols`, `m * n * k`), with the exponent the
two shapes show (1 to 3: a `size` that is a side length costs its square). A shape's time is its wall time
as popkit's harness reports it (`benchmark.I.wall_ns`: checks, input generation and the timing loop); for
another eval it is modeled from its mean call time and the timing loop's budget (docs/protocol-notes.md §4).
Shapes are kept while the predicted mode time stays under FILL of the timeout (under `ranking_by: last` the
ranked modes run only the last shape: the largest that fits is kept last). When all fit, the run is the
task's own; when some do not, popkit stops (exit 11) naming the first that does not fit, and with
`--allow-cpu` runs the shapes that fit, each skipped shape named and the run marked not leaderboard-faithful.
Tests, machines with a GPU and tasks that name no GPU are never sized.

The timing is remembered per task, mode, harness and machine (memo.py, in popkit's cache folder): the first
sizing on this machine decides the shapes of every later run of any file of that task, so their scores are over
the same shapes and rank against each other (a busy machine's second probe predicted 95 s where the first said
478 s). Removing popkit's cache folder (`POPKIT_CACHE_DIR`, default ~/.cache/popkit) sizes afresh.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from popkit.errors import EnvironmentProblem, ExitCode, PopkitError
from popkit.machine import memo
from popkit.machine import system
from popkit.model.tasks import Task
from popkit.progress import Progress
from popkit.run import runner
from popkit.run.executor import Executor
from popkit.submission.source import Source

FILL = 0.6  # keep the predicted time under this share of the timeout: the prediction is rough
# The timing loop's budget per case (docs/protocol-notes.md §4): at most 100 calls or this many seconds of
# measured time; at least 3 calls. Leaderboard mode also regenerates and checks every call's input (x3).
LOOP = {"benchmark": (100, 10.0, 1.0), "leaderboard": (100, 30.0, 3.0), "profile": (7, 1e9, 1.0)}
MIN_CALLS = 3
# A sizing run that ends with one of these is the submission's verdict, with its exit code (not "no GPU", exit 11).
VERDICTS = {"failed": ExitCode.FAILED, "compile_failed": ExitCode.COMPILE_FAILED, "crashed": ExitCode.CRASHED}
CHECKED_CALLS = 3  # calls outside the loop per case (the checked call, the reference's, a fresh-seed check)



def work(case: Mapping[str, Any]) -> float:
    """The size of a shape: the product of its whole-number parameters other than seeds (1 when none)."""
    numbers = [v for k, v in case.items() if isinstance(v, int) and not isinstance(v, bool) and "seed" not in k]
    return float(math.prod(max(1, v) for v in numbers)) if numbers else 1.0


@dataclass(frozen=True)
class Plan:
    """What fits: the shapes kept, the ones skipped, and each shape's predicted seconds."""

    kept: tuple[int, ...]
    skipped: tuple[int, ...]
    predicted_s: tuple[float, ...]


def case_seconds(call_s: float, mode: str) -> float:
    """Predicted seconds of one case whose call takes `call_s`: the timing loop plus the checked calls."""
    most, budget_s, factor = LOOP.get(mode, LOOP["benchmark"])
    calls = max(MIN_CALLS, min(most, math.ceil(budget_s / call_s) if call_s > 0 else most))
    return (calls * factor + CHECKED_CALLS) * call_s


@dataclass(frozen=True)
class Timing:
    """One mode timed on a CPU: `points` (size, seconds the case took) and the eval's seconds outside the cases."""

    points: tuple[tuple[float, float], ...]
    fixed_s: float

    @property
    def exponent(self) -> float:
        """How a case's time grows with the size, from the two points: between 1 and 3 (1 with one point)."""
        (w1, t1), (w2, t2) = self.points[0], self.points[-1]
        if w2 <= w1 or t1 <= 0 or t2 <= 0:
            return 1.0
        return min(3.0, max(1.0, math.log(t2 / t1) / math.log(w2 / w1)))

    def case_s(self, size: float) -> float:
        w, t = self.points[-1]
        return t * (size / w) ** self.exponent


def plan(cases: Sequence[Mapping[str, Any]], timing: Timing, timeout_s: float, ranking_by: str = "geom") -> Plan:
    """The shapes that fit FILL of `timeout_s` with the eval's fixed time: in order while the sum fits; under
    `ranking_by: last` (only the last shape runs) every shape up to the largest one that fits alone."""
    predicted = tuple(timing.case_s(work(c)) for c in cases)
    budget = FILL * timeout_s - timing.fixed_s
    if ranking_by == "last":
        fits = [i for i, seconds in enumerate(predicted) if seconds <= budget]
        last = max(fits) if fits else -1
        kept = tuple(range(last + 1))
        return Plan(kept, tuple(i for i in range(len(cases)) if i > last), predicted)
    kept, skipped, total = [], [], 0.0
    for i, seconds in enumerate(predicted):
        if total + seconds <= budget:
            kept.append(i)
            total += seconds
        else:
            skipped.append(i)
    return Plan(tuple(kept), tuple(skipped), predicted)


def needs_sizing(task: Task, mode: str) -> bool:
    """A timing mode of a task made for GPUs, on a machine without one."""
    return mode != "test" and bool(task.gpus) and bool(task.benchmarks) and not system.has_gpu()


def spec(case: Mapping[str, Any]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def probe(task: Task, source: Source, options: runner.RunOptions, executor: Executor, indices: Sequence[int],
          mode: str, progress: Progress) -> Timing:
    """Run the shapes `indices` in `mode` alone, in one eval; each shape's seconds and the eval's fixed time.
    Profile mode reports tables, not times: its shapes are timed in benchmark mode."""
    mode = "benchmark" if mode == "profile" else mode
    shapes = tuple(task.benchmarks[i] for i in indices)
    quick = replace(options, secret_seeds=(), chain=False, label="CPU sizing")
    progress(f"CPU sizing: {mode} mode on the smallest benchmark shapes ({' | '.join(spec(c) for c in shapes)})")
    # ranking_by mean: every shape runs (under `last` the timed modes get only the last, as on the leaderboard)
    report = runner.run_submission(replace(task, benchmarks=shapes, ranking_by="mean"), source.path, mode,
                                   quick, content=source.content, executor=executor)
    run = next((r for r in report.runs if r.mode == mode), None)
    cases = run.benchmarks if run is not None else ()
    if run is None or not run.passed or len(cases) < len(shapes) or not all(c.mean_ns for c in cases):
        why = (run.summary or run.outcome) if run is not None else report.outcome
        if report.outcome in VERDICTS:  # the submission's own verdict (a wrong result, a cheat caught), not the machine's
            raise PopkitError(f"`{task.name}`, {mode} mode on the smallest benchmark shapes ({spec(shapes[0])}): "
                              f"{report.outcome.replace('_', ' ')}: {why}",
                              "`popkit test` shows the same on the tests", exit_code=VERDICTS[report.outcome])
        if why == "passed":
            why = "it passed without a time for every shape"
        raise EnvironmentProblem(
            f"this machine has no GPU, and even the smallest benchmark shapes of `{task.name}` "
            f"({spec(shapes[0])}) did not run here in {mode} mode: {why}",
            "`popkit test` runs the tests on the CPU; run the benchmarks on a machine with a GPU")
    seconds = []
    for i, case in enumerate(cases):
        wall = run.raw.get(f"benchmark.{i}.wall_ns", "")
        seconds.append(float(wall) / 1e9 if wall.isdigit() else case_seconds(case.mean_ns / 1e9, mode))
    points = tuple((work(shape), t) for shape, t in zip(shapes, seconds))
    return Timing(points, max(0.0, run.duration_s - sum(seconds)))


def machine_words() -> str:
    """This machine, for the sizing's key: its name, processor and core count."""
    return f"{platform.node()}|{platform.machine()}|{platform.processor()}|{os.cpu_count()}"


def remembered_timing(task: Task, source: Source, options: runner.RunOptions, executor: Executor,
                      indices: Sequence[int], mode: str, progress: Progress) -> Timing:
    """`probe`'s timing, from the first sizing of this task's shapes in this mode on this machine (module doc)."""
    shapes = json.dumps([task.benchmarks[i] for i in indices], sort_keys=True, default=str)
    key = memo.digest("sizing", [Path(__file__)], [str(task.path), task.name, shapes, mode, options.harness,
                                                   machine_words()])
    return memo.remembered("sizing", key, lambda: probe(task, source, options, executor, indices, mode, progress),
                           dump=lambda t: {"points": [list(p) for p in t.points], "fixed_s": t.fixed_s},
                           load=lambda d: Timing(tuple((float(w), float(t)) for w, t in d["points"]),
                                                 float(d["fixed_s"])))


def fit(task: Task, source: Source, request: Any, executor: Executor, progress: Progress) -> tuple[Task, tuple[str, ...]]:
    """The task to run for `request` (a workflows.Request) here, and the benchmark shapes left out (module doc)."""
    if not needs_sizing(task, request.mode):
        return task, ()
    cases = list(task.benchmarks)
    by_size = sorted(range(len(cases)), key=lambda i: (work(cases[i]), i))
    two = [by_size[0]] + [i for i in by_size[1:] if work(cases[i]) > work(cases[by_size[0]])][:1]
    modes = ("benchmark", "leaderboard") if request.mode == "leaderboard" else (request.mode,)
    plans = [plan(cases, remembered_timing(task, source, request.options, executor, two, mode, progress),
                  task.timeout_for(mode), task.ranking_by) for mode in modes]
    skipped = sorted({i for p in plans for i in p.skipped})
    if not skipped:
        return task, ()
    first = skipped[0]
    seconds = max(p.predicted_s[first] for p in plans)
    # What passes the timeout is the sum of the shapes in order up to this one, not this one alone.
    total = max(sum(p.predicted_s[: first + 1]) for p in plans)
    if not request.allow_cpu:
        raise EnvironmentProblem(
            f"this machine has no GPU, and the benchmark shapes of `{task.name}` up to {spec(cases[first])} would "
            f"take about {total:.0f} s here in all (that one about {seconds:.0f} s; timed from "
            f"{spec(cases[two[0]])}), past what the {task.timeout_for(request.mode):g} s timeout leaves",
            f"pass --allow-cpu to run the {len(cases) - len(skipped)} shape(s) that fit (not leaderboard-faithful);"
            " `popkit test` runs the tests on the CPU")
    kept = tuple(c for i, c in enumerate(cases) if i not in skipped)
    if not kept:
        raise EnvironmentProblem(f"this machine has no GPU, and no benchmark shape of `{task.name}` fits the "
                                 f"{task.timeout_for(request.mode):g} s timeout here",
                                 "run the benchmarks on a machine with a GPU")
    return replace(task, benchmarks=kept), tuple(spec(cases[i]) for i in skipped)


def skipped_note(skipped: Sequence[str], total: int) -> str:
    """The report's note for a CPU run that left shapes out."""
    return (f"CPU run: {len(skipped)} of {total} benchmark shapes skipped, predicted past the timeout here "
            f"({', '.join(skipped)}): not leaderboard-faithful")
