"""`popkit bench A B`: a counterbalanced A/B in rounds, and the per-shape comparison of `popkit compare`.

The A/B (docs/design.md, "How an A/B decides"): each round runs one fresh benchmark-mode eval of A
and one of B over the shapes still being compared, in ABBA order (A first in even rounds, B first in
odd ones). The unit of every interval is the round: per shape, each round gives one ratio time B /
time A of the two evals' statistics (the median of the timed calls when the eval reports it, else
the mean), and the interval is Student's t on the log ratios (`stats.paired_ratio_interval`). The
score's ratio is the task's `ranking_by` applied to each round's shapes, the same way. The A/B looks
at its data after every ABBA block from round 4 on; each look spends a share of α fixed in advance
(`looks`), so the interval shown at whichever round it stopped is a 95% interval however it stopped
(settled, out of rounds, out of time budget, or a failure).

Per-shape ratios and verdicts: popkit/measure/shapes.py; the rounds, stalled rounds and looks:
popkit/measure/abrounds.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit.errors import ExitCode, TaskError
from popkit.machine import gpustate
# FIRST_LOOK: read through ab
from popkit.measure.abrounds import FIRST_LOOK, SIDES, Rounds, Series, replacements, round_order
from popkit.measure.shapes import B_FASTER, UNKNOWN  # B_FASTER: tuning reads the verdict through ab
from popkit.model import stats
from popkit.model.results import OUTCOME_EXIT, CaseResult, CompileStep, ModeRun, RunReport
from popkit.model.tasks import Task
from popkit.progress import Progress
from popkit.run import runner
from popkit.run import warm
from popkit.run.executor import Executor

AB_SCHEMA = "popkit/ab/2"
DEFAULT_MAX_ROUNDS = 8
DEFAULT_BUDGET_S = 60.0  # wall time after which no new ABBA block starts (never before the first look)
RunEval = Callable[..., ModeRun]  # runner.run_mode's signature (a session's `run_eval`)

# ------------------------------------------------------------------------------------ the A/B run


@dataclass(frozen=True)
class ABReport:
    """`popkit bench A B`: per-shape and score series, how the A/B ended, and the failing run if any."""

    task: str
    a_path: str
    b_path: str
    a_sha256: str
    b_sha256: str
    harness: str
    ranking_by: str
    statistic: str  # `median` or `mean`: what one eval contributes per shape and round
    max_rounds: int
    budget_s: float
    rounds: int  # complete rounds run
    stopped: str  # `settled`, `max_rounds`, `budget` or `failed`
    started_at: str  # ISO 8601, UTC
    duration_s: float
    shapes: tuple[Series, ...] = ()
    score: Series | None = None
    system: Mapping[str, Any] = field(default_factory=dict)
    failed_side: str = ""  # "A" or "B" when a run or the pre-step did not pass
    failure: ModeRun | None = None  # the eval that did not pass
    compile_failure: CompileStep | None = None  # or the pre-step whose build failed
    eval_s: tuple[float, ...] = ()  # wall time of each counted eval, in order (where an A/B's time goes)
    isolation: Mapping[str, str] = field(default_factory=dict)  # executor.Isolation.to_json of the evals
    # the GPU's state during each counted eval, in order: {"round", "side", **GpuState.to_json()}; () without NVML
    gpu: tuple[Mapping[str, Any], ...] = ()
    held: str = ""  # why no winner is named (gpustate.held: clocks differed, the GPU throttled), or ""
    judged: str = ""  # `sealed`: every eval's verdict came from popkit's trusted side (RunReport.judged); `open`
    evals: str = ""  # how the evals ran: `warm, N ahead` (warm pairs started N at a time) or `cold: why`
    schema: str = AB_SCHEMA

    @property
    def failure_outcome(self) -> str:
        if self.failure is not None:
            return self.failure.outcome
        return "compile_failed" if self.compile_failure is not None else "passed"

    @property
    def failure_mode(self) -> str:
        """Where the failure happened: `benchmark` (an eval) or `compile` (the pre-step); empty if none."""
        return "benchmark" if self.failure is not None else "compile" if self.compile_failure is not None else ""

    @property
    def exit_code(self) -> ExitCode:
        return OUTCOME_EXIT[self.failure_outcome]

    @property
    def verdict(self) -> str:
        return self.score.verdict if self.score is not None else UNKNOWN

    def path(self, side: str) -> str:
        return self.a_path if side == "A" else self.b_path

    def to_json(self) -> dict:
        data = {k: getattr(self, k) for k in (
            "schema", "task", "a_path", "b_path", "a_sha256", "b_sha256", "harness", "ranking_by", "statistic",
            "max_rounds", "budget_s", "rounds", "stopped", "started_at", "duration_s", "failed_side")}
        data["eval_s"] = list(self.eval_s)
        data.update(gpu=[dict(g) for g in self.gpu], held=self.held, judged=self.judged, evals=self.evals)
        data.update(system=dict(self.system), isolation=dict(self.isolation), shapes=[s.to_json() for s in self.shapes],
                    score=self.score.to_json() if self.score is not None else None, verdict=self.verdict,
                    failure=self.failure.to_json() if self.failure else None,
                    compile_failure=self.compile_failure.to_json() if self.compile_failure else None,
                    failure_outcome=self.failure_outcome, exit_code=int(self.exit_code))
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ABReport":
        plain = {k: data[k] for k in (
            "task", "a_path", "b_path", "a_sha256", "b_sha256", "harness", "ranking_by", "statistic", "max_rounds",
            "budget_s", "rounds", "stopped", "started_at", "duration_s")}
        return cls(**plain, shapes=tuple(Series.from_json(s) for s in data.get("shapes", ())),
                   score=Series.from_json(data["score"]) if data.get("score") else None,
                   system=dict(data.get("system") or {}), failed_side=data.get("failed_side", ""),
                   failure=ModeRun.from_json(data["failure"]) if data.get("failure") else None,
                   compile_failure=CompileStep.from_json(data["compile_failure"]) if data.get("compile_failure")
                   else None, eval_s=tuple(data.get("eval_s", ())), isolation=dict(data.get("isolation") or {}),
                   gpu=tuple(dict(g) for g in data.get("gpu", ())), held=data.get("held", ""),
                   judged=data.get("judged", ""), evals=data.get("evals", ""),
                   schema=data.get("schema", AB_SCHEMA))


def run_ab(task: Task, a_path: Path | str, b_path: Path | str, options: runner.RunOptions | None = None,
           max_rounds: int = DEFAULT_MAX_ROUNDS, budget_s: float = DEFAULT_BUDGET_S, progress: Progress | None = None,
           system: Mapping[str, Any] | None = None, run_eval: RunEval | None = None,
           clock: Callable[[], float] = time.monotonic, warmup: bool = True,
           contents: Mapping[str, bytes] | None = None, executor: Executor | None = None,
           sampler: Callable[[Mapping[str, str]], gpustate.Sampler] | None = None, warm_evals: bool = True) -> ABReport:
    """Compare A and B in counterbalanced rounds until settled, out of rounds or out of budget (module doc).

    Both sides are one run session's (runner.RunSession), set up as runner.run_submission sets up one, their
    pre-steps in parallel since nothing is timed yet. One discarded eval of A (`warmup`) takes the first-process
    slowdown seen on an idle GPU. A new ABBA block starts only while `budget_s` (0: none) is not
    expected to run out, and never before the first look. The A/B stops at the first eval that does
    not pass; the report names the side and keeps that run. `run_eval` replaces runner.run_mode
    (tests), `system` the environment probe. `contents` ({"A": bytes, "B": bytes}) are the bytes that run
    (read once by the caller; default: the files'); `executor` where (default: sandbox.executor_for).
    `sampler` watches the GPU during each counted eval (gpustate.Sampler; tests give readings of their own):
    arms that ran at different clocks or throttled name no winner (`held`). With `warm_evals`, where they fit
    (warm.cold_reason), the evals go through warm pairs started a few at a time ahead (warm.Ahead): each is the
    eval a cold run gives, its start-up (a process tree, torch, the device, the inputs) overlapped with the others'.
    """
    options = options or runner.RunOptions()
    progress = progress or (lambda _msg: None)
    cases = task.cases_for("benchmark")
    if not cases:
        raise TaskError(f"{task.yml}: no `benchmarks` to compare on", "add benchmark cases to task.yml")
    state = Rounds(cases, task.ranking_by, max_rounds)
    session = runner.RunSession(task, {"A": Path(a_path), "B": Path(b_path)}, "benchmark", options, content=contents,
                                executor=executor, system=system, progress=progress, run_eval=run_eval)
    started, t0 = datetime.now(timezone.utc), clock()
    failed_side, failure, compile_failure, stopped = "", None, None, "max_rounds"
    eval_s: list[float] = []
    sealed: list[bool] = []  # per eval: its verdict came from popkit's trusted side
    gpu: list[dict[str, Any]] = []
    sampler = sampler or gpustate.Sampler
    watch_env = session.env()
    depth = warm.ahead_depth()
    evals_how = ("asked to run cold" if not warm_evals else "its evals run through another runner" if run_eval
                 else warm.cold_reason(task, options, depth))
    # The evals in the order they come (a key each): the warm-up, then each round's two sides in ABBA order.
    keys = ([("warm-up", "A")] if warmup else []) + [(r, side) for r in range(max_rounds + replacements(max_rounds))
                                                     for side in round_order(r)]
    with session, contextlib.ExitStack() as stack:
        failed_side = next((side for side in SIDES if session.sides[side].build_failed), "")
        if failed_side:
            compile_failure, stopped = session.sides[failed_side].precompile, "failed"
            state.mark_failed(failed_side, "compile_failed")
        pairs = None if evals_how else stack.enter_context(warm.Ahead(lambda key: warm.WarmPair(
            task, "benchmark", session.sides[key[1]].data, options, session.executor, path=session.sides[key[1]].path,
            system=system, cases=cases), depth))

        def evaluate(key: tuple[Any, str], shapes: Sequence[Mapping[str, Any]], name: str) -> ModeRun:
            side, run = key[1], None
            if pairs is not None:
                pairs.refill(keys[keys.index(key):])
                run = pairs.mode_run(key, session.sides[side].data, shapes)
            if run is None:
                run = session.run("benchmark", shapes, side=side, cases_name=name, live=False)
            sealed.append("trusted-verdict" in run.raw.get("trust.checks", "").split(","))
            return run

        if warmup and not failed_side:  # its timings are not used, so the system probe may still run beside it
            progress("warm-up eval of A (not counted)")
            evaluate(("warm-up", "A"), cases, "ab-warmup.txt")  # a failure shows again in round 1, where it counts
        if session.probe is not None:
            session.probe.result()  # its CUDA context must not be opened while a candidate is timed
        while not failed_side:
            if not state.active:
                stopped = "settled" if state.all_settled() else "max_rounds"
                break
            if state.over_budget(clock() - t0, eval_s, budget_s):
                stopped = "budget"
                break
            shapes = [cases[i] for i in state.active]
            runs: dict[str, ModeRun] = {}
            for side in round_order(state.done):
                progress(f"round {state.done + 1}/{max_rounds}{state.extra()} · {side} · {len(shapes)} shape(s)")
                t = clock()
                with sampler(watch_env) as watch:
                    run = evaluate((state.done, side), shapes, f"ab-{state.done}.txt")
                eval_s.append(clock() - t)
                if watch.state is not None:
                    gpu.append({"round": state.done, "side": side, **watch.state.to_json()})
                if run.passed and sum(1 for c in run.benchmarks if c.mean_ns) < len(shapes):
                    run = replace(run, outcome="crashed",
                                  summary="crashed: benchmark passed without timing every shape")
                if not run.passed or run.outcome != "passed":
                    failed_side, failure, stopped = side, run, "failed"
                    state.mark_failed(side, run.outcome, run.benchmarks)
                    break
                runs[side] = run
            else:
                state.add(runs)
    held = gpustate.held(*[[gpustate.GpuState.from_json(g) for g in gpu if g["side"] == side] for side in SIDES])
    shapes_out, score = state.final(held)
    a, b = session.sides["A"], session.sides["B"]
    return ABReport(task=task.name, a_path=str(a.path), b_path=str(b.path), a_sha256=hashlib.sha256(a.data).hexdigest(),
                    b_sha256=hashlib.sha256(b.data).hexdigest(), harness=options.harness,
                    ranking_by=task.ranking_by, statistic=state.statistic or "mean", max_rounds=max_rounds,
                    budget_s=budget_s, rounds=state.done, stopped=stopped,
                    started_at=started.isoformat(timespec="seconds"), duration_s=clock() - t0, shapes=shapes_out,
                    score=score, system=session.probe.result() if session.probe else dict(system or {}),
                    failed_side=failed_side,
                    failure=failure, compile_failure=compile_failure, eval_s=tuple(eval_s),
                    isolation=session.executor.isolation.to_json(), gpu=tuple(gpu), held=held,
                    judged="sealed" if sealed and all(sealed) else "open",
                    evals=f"cold: {evals_how}" if evals_how else f"warm, {depth} ahead")


def side_report(report: ABReport, side: str, task: Task) -> RunReport | None:
    """One candidate's part of an A/B as a benchmark-mode RunReport, for the history; None if it has none.

    A side that failed is recorded with the run (or pre-step) that failed. A side with timings is
    recorded with one case per shape: runs = rounds; mean, std, best and worst over the rounds' eval
    means (what the leaderboard ranks); median over the rounds' statistics.
    """
    path, sha = (report.a_path, report.a_sha256) if side == "A" else (report.b_path, report.b_sha256)
    failed = side == report.failed_side
    cases = []
    for i, shape in enumerate(report.shapes):
        values, means = shape.values(side)
        if means:
            cases.append(CaseResult(kind="benchmark", index=i, spec=shape.spec, passed=True, runs=len(means),
                                    mean_ns=stats.mean(means), std_ns=stats.std(means), err_ns=stats.err(means),
                                    best_ns=min(means), worst_ns=max(means), median_ns=stats.median(values)))
    if not cases and not failed:
        return None
    if failed and report.failure is not None:
        runs: tuple[ModeRun, ...] = (report.failure,)
    elif failed:
        runs = ()
    else:
        runs = (ModeRun(mode="benchmark", secret=False, seed=None, exit_code=0, duration_s=report.duration_s,
                        timeout_s=task.timeout_for("benchmark"), check="pass", benchmarks=tuple(cases)),)
    other = report.b_path if side == "A" else report.a_path
    return RunReport(task=task.name, task_path=str(task.path), leaderboard=task.leaderboard,
                     ranking_by=task.ranking_by, submission=path, sha256=sha, mode="benchmark",
                     harness=report.harness, started_at=report.started_at, duration_s=report.duration_s,
                     system=dict(report.system), runs=runs, isolation=dict(report.isolation),
                     precompile=report.compile_failure if failed and report.failure is None else None,
                     label=f"A/B side {side}, against {other}")
