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

Per-shape ratios and verdicts: popkit/measure/shapes.py.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit.errors import ExitCode, TaskError
from popkit.measure.shapes import A_FASTER, B_FASTER, INCOMPLETE, OK, UNKNOWN, verdict
from popkit.model import stats
from popkit.model.results import OUTCOME_EXIT, CaseResult, CompileStep, ModeRun, RunReport, score_s
from popkit.model.stats import Interval
from popkit.model.tasks import Task
from popkit.run import proc
from popkit.run import runner
from popkit.run import sandbox
from popkit.run.executor import Executor

AB_SCHEMA = "popkit/ab/2"
FIRST_LOOK = 4  # rounds before the first interval: two ABBA blocks, t with 3 degrees of freedom
DEFAULT_MAX_ROUNDS = 8
DEFAULT_BUDGET_S = 60.0  # wall time after which no new ABBA block starts (never before the first look)
ALPHA = 1.0 - stats.CONFIDENCE
EQUIVALENCE = 0.01  # an interval inside [1/1.01, 1.01] settles a shape: no difference above 1%
SIDES = ("A", "B")
Progress = Callable[[str], None]
RunEval = Callable[..., ModeRun]  # runner.run_mode's signature

# ------------------------------------------------------------------------------------ the A/B run


def looks(max_rounds: int) -> dict[int, float]:
    """The rounds after which the A/B looks at its data, each with the share of α it spends.

    One look after every ABBA block from FIRST_LOOK rounds on. The first look, where the default
    time budget usually ends an A/B, spends half of α; the later looks share the other half. The
    shares are fixed before any data and sum to α, so by the union bound the intervals of all looks
    cover the true ratio together with probability at least 1 - α: the interval shown at whatever
    look the A/B stopped is a 95% interval, whatever made it stop (repeated confidence intervals).
    """
    if max_rounds < FIRST_LOOK or max_rounds % 2:
        raise ValueError(f"the rounds must be even and at least {FIRST_LOOK} (got {max_rounds})")
    rounds = list(range(FIRST_LOOK, max_rounds + 1, 2))
    if len(rounds) == 1:
        return {rounds[0]: ALPHA}
    return {n: ALPHA / 2 if i == 0 else ALPHA / 2 / (len(rounds) - 1) for i, n in enumerate(rounds)}


def round_order(round_index: int) -> tuple[str, str]:
    """ABBA: A first in even rounds (0, 2, ...), B first in odd ones; each look sees both first equally often."""
    return SIDES if round_index % 2 == 0 else SIDES[::-1]


@dataclass(frozen=True)
class Series:
    """One shape (or the score) over the rounds: each side's per-round time (ns) and the interval of B / A.

    `ratio` is the interval at the last look this series took part in, at level 1 - `alpha`; None
    before the first look. `status` is `ok`, or the outcome on side `status_side` (`failed`,
    `timed_out`, `crashed`, ...), or `incomplete` for a score that lacks the shapes in `missing`.
    """

    spec: str
    a_ns: tuple[float, ...] = ()
    b_ns: tuple[float, ...] = ()
    a_means_ns: tuple[float, ...] = ()  # each round's eval mean (what the leaderboard ranks), for the history
    b_means_ns: tuple[float, ...] = ()
    ratio: Interval | None = None
    alpha: float | None = None
    status: str = OK
    status_side: str = ""
    missing: tuple[str, ...] = ()

    @property
    def rounds(self) -> int:
        return min(len(self.a_ns), len(self.b_ns))

    def values(self, side: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Side "A" or "B": (each round's statistic, each round's eval mean)."""
        return (self.a_ns, self.a_means_ns) if side == "A" else (self.b_ns, self.b_means_ns)

    def extended(self, side: str, value: float, mean: float) -> "Series":
        """This series with one more round on `side`."""
        ns, means = self.values(side)
        key = side.lower()
        return replace(self, **{f"{key}_ns": ns + (value,), f"{key}_means_ns": means + (mean,)})

    @property
    def verdict(self) -> str:
        if self.status != OK:
            return INCOMPLETE
        return verdict(self.ratio) if self.ratio is not None else UNKNOWN

    @property
    def settled(self) -> bool:
        """A winner, or no difference above EQUIVALENCE: more rounds would not change what to do."""
        if self.status != OK or self.ratio is None or not self.ratio.defined:
            return False
        inside = 1 / (1 + EQUIVALENCE) <= self.ratio.low and self.ratio.high <= 1 + EQUIVALENCE  # type: ignore
        return self.verdict in (A_FASTER, B_FASTER) or inside

    def at_look(self, rounds: int, alpha: float) -> "Series":
        """This series cut to its first `rounds` rounds, with the interval a look there gives."""
        a, b = self.a_ns[:rounds], self.b_ns[:rounds]
        ratio = stats.paired_ratio_interval([y / x for x, y in zip(a, b)], 1 - alpha)
        return replace(self, a_ns=a, b_ns=b, a_means_ns=self.a_means_ns[:rounds],
                       b_means_ns=self.b_means_ns[:rounds], ratio=ratio, alpha=alpha)

    def to_json(self) -> dict:
        data = asdict(self)
        data["ratio"] = self.ratio.to_json() if self.ratio is not None else None
        data.update(rounds=self.rounds, verdict=self.verdict)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Series":
        return cls(spec=data["spec"], a_ns=tuple(data["a_ns"]), b_ns=tuple(data["b_ns"]),
                   a_means_ns=tuple(data.get("a_means_ns", ())), b_means_ns=tuple(data.get("b_means_ns", ())),
                   ratio=Interval.from_json(data["ratio"]) if data.get("ratio") else None, alpha=data.get("alpha"),
                   status=data.get("status", OK), status_side=data.get("status_side", ""),
                   missing=tuple(data.get("missing", ())))


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
                   schema=data.get("schema", AB_SCHEMA))


def _spec(case: Mapping[str, Any]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in case.items())


class _Rounds:
    """The A/B's state between rounds: each shape's series, which shapes still run, and the score's series."""

    def __init__(self, cases: Sequence[Mapping[str, Any]], ranking_by: str, max_rounds: int):
        self.cases, self.ranking_by = list(cases), ranking_by
        self.alphas = looks(max_rounds)
        self.shapes = [Series(_spec(c)) for c in cases]
        self.score = Series("score")
        self.scoring = [len(cases) - 1] if ranking_by == "last" else list(range(len(cases)))
        self.active = list(range(len(cases)))
        self.last_look: dict[int | str, int] = {}  # shape index or "score" -> rounds at its last look
        self.score_open = True  # the score still takes rounds
        self.statistic = ""
        self.done = 0

    def value(self, case: CaseResult) -> float:
        if not self.statistic:
            self.statistic = "median" if case.median_ns else "mean"
        return float(case.median_ns if self.statistic == "median" and case.median_ns else case.mean_ns)  # type: ignore

    def add(self, runs: Mapping[str, ModeRun]) -> None:
        """One complete round: both sides' evals over the active shapes, every shape timed."""
        for side, run in runs.items():
            for i, case in zip(self.active, run.benchmarks):
                self.shapes[i] = self.shapes[i].extended(side, self.value(case), float(case.mean_ns))  # type: ignore
        if self.score_open:  # every scoring shape is still active: this round has them all
            for side in SIDES:
                rows = [self.shapes[i].values(side) for i in self.scoring]
                value = score_s([ns[self.done] for ns, _ in rows], self.ranking_by)
                mean = score_s([means[self.done] for _, means in rows], self.ranking_by)
                self.score = self.score.extended(side, value * 1e9, mean * 1e9)  # type: ignore[operator]
        self.done += 1
        if self.done in self.alphas:
            self._look()

    def _look(self) -> None:
        """A look: shapes whose verdict is settled leave, unless an unsettled score still needs them."""
        alpha = self.alphas[self.done]
        if self.score_open:
            self.last_look["score"] = self.done
            self.score_open = not self.score.at_look(self.done, alpha).settled
        still = []
        for i in self.active:
            self.last_look[i] = self.done
            needed = self.score_open and i in self.scoring
            if needed or not self.shapes[i].at_look(self.done, alpha).settled:
                still.append(i)
        self.active = still

    def mark_failed(self, side: str, outcome: str, benchmarks: Sequence[CaseResult] = ()) -> None:
        """An eval (or the pre-step) of `side` did not pass: the shapes it did not time get its outcome."""
        timed = {i for i, c in zip(self.active, benchmarks) if c.passed and c.mean_ns}
        for pos, i in enumerate(self.active):
            if i in timed:
                continue
            failed_here = pos < len(benchmarks) and not benchmarks[pos].passed
            self.shapes[i] = replace(self.shapes[i], status="failed" if failed_here else outcome, status_side=side)

    def final(self) -> tuple[tuple[Series, ...], Series]:
        """Every series at its last look (untouched before the first), and the score, incomplete if a shape is."""
        shapes = tuple(s.at_look(self.last_look[i], self.alphas[self.last_look[i]]) if i in self.last_look else s
                       for i, s in enumerate(self.shapes))
        score = self.score
        if "score" in self.last_look:
            score = score.at_look(self.last_look["score"], self.alphas[self.last_look["score"]])
        missing = tuple(shapes[i].spec for i in self.scoring if shapes[i].status != OK)
        if missing:
            score = replace(score, status=INCOMPLETE, missing=missing)
        return shapes, score


def run_ab(task: Task, a_path: Path | str, b_path: Path | str, options: runner.RunOptions | None = None,
           max_rounds: int = DEFAULT_MAX_ROUNDS, budget_s: float = DEFAULT_BUDGET_S, progress: Progress | None = None,
           system: Mapping[str, Any] | None = None, run_eval: RunEval | None = None,
           clock: Callable[[], float] = time.monotonic, warmup: bool = True,
           contents: Mapping[str, bytes] | None = None, executor: Executor | None = None) -> ABReport:
    """Compare A and B in counterbalanced rounds until settled, out of rounds or out of budget (module doc).

    Both sides are set up as runner.run_submission sets up one (`runner.set_up`), their pre-steps in
    parallel since nothing is timed yet. One discarded eval of A (`warmup`) takes the first-process
    slowdown seen on an idle GPU. A new ABBA block starts only while `budget_s` (0: none) is not
    expected to run out, and never before the first look. The A/B stops at the first eval that does
    not pass; the report names the side and keeps that run. `run_eval` replaces runner.run_mode
    (tests), `system` the environment probe. `contents` ({"A": bytes, "B": bytes}) are the bytes that run
    (read once by the caller; default: the files'); `executor` where (default: sandbox.executor_for).
    """
    options = options or runner.RunOptions()
    progress = progress or (lambda _msg: None)
    run_eval = run_eval or runner.run_mode
    cases = task.cases_for("benchmark")
    if not cases:
        raise TaskError(f"{task.yml}: no `benchmarks` to compare on", "add benchmark cases to task.yml")
    state = _Rounds(cases, task.ranking_by, max_rounds)
    paths = {"A": Path(a_path), "B": Path(b_path)}
    contents = {side: runner.checked_submission(task, p, "benchmark", options, (contents or {}).get(side))
                for side, p in paths.items()}
    executor = executor or sandbox.executor_for(options.isolation)
    for content in contents.values():
        options = runner.with_toolkit(options, content, progress)
    started, t0 = datetime.now(timezone.utc), clock()
    probe = runner.probe_and_preflight(task, options, system, executor)
    failed_side, failure, compile_failure, stopped = "", None, None, "max_rounds"
    eval_s: list[float] = []
    with proc.WorkDir("popkit-ab-", keep=options.keep_workdir) as root:
        if options.keep_workdir:
            progress(f"working directories kept: {root}")
        from concurrent.futures import ThreadPoolExecutor  # here: it brings logging, which few runs need

        with ThreadPoolExecutor(2) as pool:  # both pre-steps at once: nothing is timed yet
            jobs = {side: pool.submit(runner.set_up, task, paths[side], contents[side],
                                      executor.new_workspace(root / side), options, progress, side)
                    for side in SIDES}
            dirs = {side: job.result() for side, job in jobs.items()}
        failed_side = next((side for side in SIDES if dirs[side].build_failed), "")
        if failed_side:
            compile_failure, stopped = dirs[failed_side].precompile, "failed"
            state.mark_failed(failed_side, "compile_failed")
        gpus = runner.eval_gpus(task, system, probe)

        def evaluate(side: str, shapes: Sequence[Mapping[str, Any]], name: str) -> ModeRun:
            run = run_eval(dirs[side].workspace, dirs[side].main, "benchmark", shapes, options=options, gpus=gpus,
                           timeout_s=task.timeout_for("benchmark"), cases_name=name)
            tampered = dirs[side].tampered or dirs[side].workspace.tampered(f"the benchmark mode of side {side}")
            return replace(run, outcome="failed", summary=tampered) if tampered else run

        if warmup and not failed_side:  # its timings are not used, so the system probe may still run beside it
            progress("warm-up eval of A (not counted)")
            evaluate("A", cases, "ab-warmup.txt")  # a failure shows again in round 1, where it counts
        if probe is not None:
            probe.result()  # its CUDA context must not be opened while a candidate is timed
        while not failed_side:
            if not state.active:
                stopped = "settled"
                break
            if state.done >= max_rounds:
                break
            block_s = 4 * stats.mean(eval_s) if eval_s else 0.0  # two rounds, two evals each
            at_look = state.done >= FIRST_LOOK and state.done % 2 == 0
            if at_look and budget_s and clock() - t0 + block_s > budget_s:
                stopped = "budget"
                break
            shapes = [cases[i] for i in state.active]
            runs: dict[str, ModeRun] = {}
            for side in round_order(state.done):
                progress(f"round {state.done + 1}/{max_rounds} · {side} · {len(shapes)} shape(s)")
                t = clock()
                run = evaluate(side, shapes, f"ab-{state.done}.txt")
                eval_s.append(clock() - t)
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
    shapes_out, score = state.final()
    return ABReport(task=task.name, a_path=str(paths["A"]), b_path=str(paths["B"]),
                    a_sha256=hashlib.sha256(contents["A"]).hexdigest(),
                    b_sha256=hashlib.sha256(contents["B"]).hexdigest(), harness=options.harness,
                    ranking_by=task.ranking_by, statistic=state.statistic or "mean", max_rounds=max_rounds,
                    budget_s=budget_s, rounds=state.done, stopped=stopped,
                    started_at=started.isoformat(timespec="seconds"), duration_s=clock() - t0, shapes=shapes_out,
                    score=score, system=probe.result() if probe else dict(system or {}), failed_side=failed_side,
                    failure=failure, compile_failure=compile_failure, eval_s=tuple(eval_s),
                    isolation=executor.isolation.to_json())


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
