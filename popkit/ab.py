"""Interleaved A/B benchmarking, and the per-shape comparison that `popkit compare` shares.

Both candidates run in one session, interleaved per shape: for each benchmark case, A and B
alternate for several rounds (who goes first alternates too, so a clock or thermal drift hits
both alike), each round one benchmark-mode eval over that single case. Ratios are time B / time
A: below 1 means B is faster. Intervals are 95%, from raw samples when the harness reports them
(`benchmark.I.samples`), else from each eval's runs/mean/std.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit import proc, runner, stats
from popkit.errors import ExitCode, TaskError
from popkit.results import OUTCOME_EXIT, CaseResult, ModeRun, RunReport
from popkit.stats import Interval, Summary
from popkit.tasks import Task

AB_SCHEMA = "popkit/ab/1"
DEFAULT_ROUNDS = 3
Progress = Callable[[str], None]

A_FASTER, B_FASTER, SAME, UNKNOWN = "a_faster", "b_faster", "no_significant_difference", "too_few_samples"


def verdict(ratio: Interval) -> str:
    """Which is faster, from the interval of time B / time A; spanning 1 means no significant difference."""
    if not ratio.defined:
        return UNKNOWN
    if ratio.high < 1.0:  # type: ignore[operator]
        return B_FASTER
    if ratio.low > 1.0:  # type: ignore[operator]
        return A_FASTER
    return SAME


@dataclass(frozen=True)
class ShapeComparison:
    """One benchmark shape timed for both candidates (ns); `ratio` is time B / time A."""

    spec: str
    a: Summary
    b: Summary
    ratio: Interval
    from_samples: bool  # False: the interval comes from runs/mean/std (no raw samples reported)
    a_samples_ns: tuple[float, ...] = ()
    b_samples_ns: tuple[float, ...] = ()

    @property
    def verdict(self) -> str:
        return verdict(self.ratio)

    def to_json(self) -> dict:
        data = asdict(self)
        data["ratio"] = self.ratio.to_json()
        data["a_samples_ns"], data["b_samples_ns"] = list(self.a_samples_ns), list(self.b_samples_ns)
        data["verdict"] = self.verdict
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ShapeComparison":
        return cls(spec=data["spec"], a=Summary(**data["a"]), b=Summary(**data["b"]),
                   ratio=Interval.from_json(data["ratio"]), from_samples=data["from_samples"],
                   a_samples_ns=tuple(data.get("a_samples_ns", ())), b_samples_ns=tuple(data.get("b_samples_ns", ())))


@dataclass(frozen=True)
class Comparison:
    """Per-shape ratios and the score ratio (geometric mean of the per-shape ratios)."""

    a_label: str
    b_label: str
    shapes: tuple[ShapeComparison, ...] = ()
    score: Interval | None = None

    @property
    def verdict(self) -> str:
        return verdict(self.score) if self.score is not None else UNKNOWN

    def to_json(self) -> dict:
        return {"a_label": self.a_label, "b_label": self.b_label, "shapes": [s.to_json() for s in self.shapes],
                "score": self.score.to_json() if self.score else None, "verdict": self.verdict}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Comparison":
        return cls(a_label=data["a_label"], b_label=data["b_label"],
                   shapes=tuple(ShapeComparison.from_json(s) for s in data.get("shapes", ())),
                   score=Interval.from_json(data["score"]) if data.get("score") else None)


def _summary(cases: Sequence[CaseResult]) -> tuple[Summary, tuple[float, ...]]:
    """Pool one shape's timings over rounds: raw samples when every round has them, else summaries."""
    samples = tuple(x for c in cases for x in c.samples_ns)
    if cases and all(len(c.samples_ns) >= 1 for c in cases) and len(samples) >= 2:
        return Summary.of(samples), samples
    parts = [Summary(n=max(c.runs, 1), mean=float(c.mean_ns), std=float(c.std_ns or 0.0))  # type: ignore[arg-type]
             for c in cases]
    return stats.pooled_summary(parts), ()


def compare_shapes(a_rounds: Mapping[str, Sequence[CaseResult]], b_rounds: Mapping[str, Sequence[CaseResult]],
                   a_label: str = "A", b_label: str = "B") -> Comparison:
    """Compare timings shape by shape (keyed by spec, in A's order); shapes timed on one side only are left out."""
    shapes = []
    for spec, a_cases in a_rounds.items():
        a_timed = [c for c in a_cases if c.mean_ns]
        b_timed = [c for c in b_rounds.get(spec, ()) if c.mean_ns]
        if not a_timed or not b_timed:
            continue
        a_sum, a_samples = _summary(a_timed)
        b_sum, b_samples = _summary(b_timed)
        from_samples = bool(a_samples and b_samples)
        ratio = stats.ratio_ci95_summary(b_sum, a_sum)
        shapes.append(ShapeComparison(spec, a_sum, b_sum, ratio, from_samples,
                                      a_samples if from_samples else (), b_samples if from_samples else ()))
    score = stats.geomean_ratio_ci95([(s.b, s.a) for s in shapes]) if shapes else None
    return Comparison(a_label, b_label, tuple(shapes), score)


# ------------------------------------------------------------------------------------ the A/B run


@dataclass(frozen=True)
class ABReport:
    """`popkit bench A B`: the comparison, and the failing run when one side did not pass."""

    task: str
    a_path: str
    b_path: str
    a_sha256: str
    b_sha256: str
    rounds: int
    harness: str
    started_at: str  # ISO 8601, UTC
    duration_s: float
    comparison: Comparison
    system: Mapping[str, Any] = field(default_factory=dict)
    failed_side: str = ""  # "A" or "B" when a run did not pass
    failure: ModeRun | None = None
    schema: str = AB_SCHEMA

    @property
    def exit_code(self) -> ExitCode:
        return OUTCOME_EXIT[self.failure.outcome] if self.failure is not None else ExitCode.OK

    def to_json(self) -> dict:
        data = {k: getattr(self, k) for k in ("schema", "task", "a_path", "b_path", "a_sha256", "b_sha256",
                                              "rounds", "harness", "started_at", "duration_s", "failed_side")}
        data["system"] = dict(self.system)
        data["comparison"] = self.comparison.to_json()
        data["failure"] = self.failure.to_json() if self.failure else None
        data["exit_code"] = int(self.exit_code)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ABReport":
        return cls(task=data["task"], a_path=data["a_path"], b_path=data["b_path"], a_sha256=data["a_sha256"],
                   b_sha256=data["b_sha256"], rounds=data["rounds"], harness=data["harness"],
                   started_at=data["started_at"], duration_s=data["duration_s"],
                   comparison=Comparison.from_json(data["comparison"]), system=dict(data.get("system") or {}),
                   failed_side=data.get("failed_side", ""),
                   failure=ModeRun.from_json(data["failure"]) if data.get("failure") else None,
                   schema=data.get("schema", AB_SCHEMA))


def _spec(case: Mapping[str, Any]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def run_ab(task: Task, a_path: Path | str, b_path: Path | str, options: Any = None, rounds: int = DEFAULT_ROUNDS,
           progress: Progress | None = None, system: Mapping[str, Any] | None = None) -> ABReport:
    """Time A and B interleaved per shape in one session and compare them (see the module docstring).

    `options` is a runner.RunOptions (python, harness, precompile, env, keep_workdir). Stops at the
    first run that does not pass; the report then names the side and carries that run. `system`
    replaces the environment probe (as in runner.run_submission).
    """
    options = options or runner.RunOptions()
    progress = progress or (lambda _msg: None)
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    cases = task.cases_for("benchmark")
    if not cases:
        raise TaskError(f"{task.yml}: no `benchmarks` to compare on", "add benchmark cases to task.yml")
    paths = {"A": Path(a_path), "B": Path(b_path)}
    names = runner.entry_points(task, options.harness)
    contents = {side: runner.read_submission(p, names) for side, p in paths.items()}
    for side, content in contents.items():
        runner.check_runnable(task, paths[side], content, "benchmark")
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    probe = runner.SystemProbe(options.python) if system is None else None
    runner.runnable.preflight(task, options.python, lambda: system if system is not None else probe.result())
    gpus = None
    if task.multi_gpu:
        gpus = (probe.result() if probe else dict(system or {})).get("gpu_count")
    timings: dict[str, dict[str, list[CaseResult]]] = {"A": {}, "B": {}}
    failed_side, failure = "", None
    with proc.WorkDir("popkit-ab-", keep=options.keep_workdir) as root:
        if options.keep_workdir:
            progress(f"working directories kept: {root}")
        mains = {}
        for side, content in contents.items():
            mains[side] = runner.prepare_workdir(task, content, root / side, options.harness)
            runner.pre_step(root / side, task.submission_name, content, options, progress, side)
        if probe is not None:
            probe.result()  # its CUDA context must not be opened while a candidate is timed
        for i, case in enumerate(cases):
            for r in range(rounds):
                for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                    progress(f"shape {i + 1}/{len(cases)} · round {r + 1}/{rounds} · {side}")
                    run = runner.run_mode(root / side, mains[side], "benchmark", [case],
                                          timeout_s=task.timeout_for("benchmark"), options=options, gpus=gpus,
                                          cases_name=f"ab-{i}-{r}.txt")
                    if not run.passed or not run.benchmarks:
                        failed_side, failure = side, run
                        break
                    bench = run.benchmarks[0]
                    timings[side].setdefault(bench.spec or _spec(case), []).append(bench)
                if failure is not None:
                    break
            if failure is not None:
                break
    comparison = compare_shapes(timings["A"], timings["B"], str(paths["A"]), str(paths["B"]))
    return ABReport(task=task.name, a_path=str(paths["A"]), b_path=str(paths["B"]),
                    a_sha256=hashlib.sha256(contents["A"]).hexdigest(),
                    b_sha256=hashlib.sha256(contents["B"]).hexdigest(), rounds=rounds, harness=options.harness,
                    started_at=started.isoformat(timespec="seconds"), duration_s=time.monotonic() - t0,
                    comparison=comparison, system=probe.result() if probe else dict(system or {}),
                    failed_side=failed_side, failure=failure)


def side_report(report: ABReport, side: str, task: Task) -> RunReport:
    """One candidate's pooled timings as a benchmark-mode RunReport, for the history.

    Each shape's statistics pool every round of that side; best/worst/median come from the raw
    samples when the eval reported them.
    """
    path, sha = (report.a_path, report.a_sha256) if side == "A" else (report.b_path, report.b_sha256)
    cases = []
    for i, shape in enumerate(report.comparison.shapes):
        summary, samples = (shape.a, shape.a_samples_ns) if side == "A" else (shape.b, shape.b_samples_ns)
        cases.append(CaseResult(
            kind="benchmark", index=i, spec=shape.spec, passed=True, runs=summary.n, mean_ns=summary.mean,
            std_ns=summary.std, err_ns=summary.std / summary.n ** 0.5 if summary.n else None,
            best_ns=min(samples) if samples else None, worst_ns=max(samples) if samples else None,
            median_ns=stats.median(samples) if samples else None, samples_ns=tuple(samples)))
    run = ModeRun(mode="benchmark", secret=False, seed=None, exit_code=0, duration_s=report.duration_s,
                  timeout_s=task.timeout_for("benchmark"), check="pass", benchmarks=tuple(cases))
    other = report.b_path if side == "A" else report.a_path
    return RunReport(task=task.name, task_path=str(task.path), leaderboard=task.leaderboard,
                     ranking_by=task.ranking_by, submission=path, sha256=sha, mode="benchmark",
                     harness=report.harness, started_at=report.started_at, duration_s=report.duration_s,
                     system=dict(report.system), runs=(run,), label=f"A/B side {side}, against {other}")
