"""`popkit compare RUN RUN`: two recorded runs, mode to mode, in the numbers history and show give them.

What it promises:
- one mode on both sides: leaderboard mode when both runs timed it, else benchmark mode; a run timing
  neither, or two runs with no mode in common, is refused. Leaderboard mode times a fresh input per call,
  so its means differ from benchmark mode's for the same file: mixing them named a winner between
  identical bytes (3.77x);
- per shape each run's mean of the timed calls (what the leaderboard ranks, what `popkit show` lists),
  and on the score row each run's score in that mode by the task's ranking_by, the number `popkit history`
  shows when that mode is the run's ranked one (else a note says which mode history's score is from); the
  score's interval is the one of that very ratio (geometric mean, last shape, or ratio of sums);
- identical bytes never get a winner: their difference is the machine's, whatever the interval says;
- devices are compared by the device alone, not the run's label (`A/B side A`, `hip-on-cuda`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from popkit.errors import UsageError
from popkit.ledger.history import History, RunRecord
from popkit.measure.shapes import INCOMPLETE, UNKNOWN, Comparison, compare_shapes
from popkit.model import stats
from popkit.model.results import CaseResult, ModeRun, score_s

MODES = ("leaderboard", "benchmark")  # the timed modes, the ranked one first
SAME_BYTES = "same_bytes"  # the verdict between two runs of identical files
STATISTIC = "mean"  # per shape: the mean of the mode's timed calls
_LABEL = re.compile(r"\s*\[[^\]]*\]$")


@dataclass(frozen=True)
class RunComparison:
    """Two recorded runs compared in one mode; scores in seconds, ratios time B / time A."""

    a: RunRecord
    b: RunRecord
    comparison: Comparison
    mode: str  # leaderboard | benchmark
    ranking_by: str
    a_score_s: float | None
    b_score_s: float | None
    same_bytes: bool
    a_device: str | None
    b_device: str | None
    notes: tuple[str, ...] = ()
    statistic: str = STATISTIC

    @property
    def same_device(self) -> bool:
        return self.a_device == self.b_device

    def shape_verdict(self, code: str) -> str:
        """A shape's verdict, never a winner between identical bytes."""
        if self.same_bytes and code not in (INCOMPLETE, UNKNOWN):
            return SAME_BYTES
        return code

    @property
    def verdict(self) -> str:
        return self.shape_verdict(self.comparison.verdict)

    def to_json(self) -> dict[str, Any]:
        comparison = self.comparison.to_json()
        comparison["verdict"] = self.verdict
        for shape, original in zip(comparison["shapes"], self.comparison.shapes):
            shape["verdict"] = self.shape_verdict(original.verdict)
        return {"a": self.a.to_json(summary=True), "b": self.b.to_json(summary=True), "comparison": comparison,
                "mode": self.mode, "statistic": self.statistic, "ranking_by": self.ranking_by,
                "a_score_s": self.a_score_s, "b_score_s": self.b_score_s, "same_bytes": self.same_bytes,
                "same_device": self.same_device, "a_device": self.a_device, "b_device": self.b_device,
                "notes": list(self.notes)}


def plain_device(record: RunRecord) -> str | None:
    """The device a run used, without its label: `cpu [A/B side A, against x.py]` -> `cpu`."""
    device = (record.report.system or {}).get("device") if record.report else None
    return device or (_LABEL.sub("", record.device) if record.device else None)


def timed_run(record: RunRecord, mode: str) -> ModeRun | None:
    """The public run of `mode` with timings, or None."""
    if record.report is None:
        return None
    return next((run for run in record.report.runs_of(mode, secret=False)
                 if any(c.mean_ns for c in run.benchmarks)), None)


def _timed_modes(record: RunRecord) -> list[str]:
    return [mode for mode in MODES if timed_run(record, mode) is not None]


def _describe(record: RunRecord) -> str:
    return "a submission" if record.kind == "submit" else f"a {record.mode} run, {record.outcome}"


def common_mode(a: RunRecord, b: RunRecord) -> str:
    """The mode both runs timed, the ranked one first; UsageError when a run timed nothing or none is shared."""
    modes = {}
    for record in (a, b):
        modes[record.id] = _timed_modes(record)
        if not modes[record.id]:
            raise UsageError(f"run {record.id} has no local timings ({_describe(record)})",
                             "compare two `popkit bench` runs; `popkit history` shows their ids")
    shared = [m for m in MODES if m in modes[a.id] and m in modes[b.id]]
    if not shared:
        raise UsageError(f"run {a.id} timed {' and '.join(modes[a.id])} mode, run {b.id} "
                         f"{' and '.join(modes[b.id])} mode: their times are not comparable",
                         "compare two runs of the same kind (`popkit bench FILE`, or both with --leaderboard)")
    return shared[0]


def _score_interval(shapes: Sequence[Any], ranking_by: str) -> stats.Interval | None:
    """The interval of time B / time A of the score itself (ShapeComparison.a/.b are Summaries)."""
    return stats.score_ratio_ci95([(s.b, s.a) for s in shapes], ranking_by) if shapes else None


def _run_score(run: ModeRun | None, ranking_by: str) -> float | None:
    return score_s(run.mean_times_ns(), ranking_by) if run is not None and run.passed else None


def _subset_words(a: RunRecord, b: RunRecord, a_cases: Mapping[str, Any], b_cases: Mapping[str, Any]) -> str:
    """Why the two scores do not rank against each other: the runs timed different sets of shapes (a CPU run's
    sizing, --shape); "" when they timed the same ones."""
    if set(a_cases) == set(b_cases):
        return ""

    def words(record: RunRecord, found: Mapping[str, Any]) -> str:
        report = record.report
        why = "shapes left out by the CPU sizing" if report and report.skipped_shapes else (
            "; ".join(report.changed) if report and report.changed else "its task's shapes")
        return f"run {record.id} timed {len(found)} shape(s) ({why})"
    return (f"{words(a, a_cases)}, {words(b, b_cases)}: scores over different shapes do not rank against each "
            "other, so no score row; the shapes both timed are compared one by one")


def compare_runs(a_id: int, b_id: int, history: History | None = None) -> RunComparison:
    """`popkit compare`: per-shape and score ratios (time B / time A) of two recorded runs in one mode."""
    history = history or History()
    a, b = history.get_run(a_id), history.get_run(b_id)
    mode = common_mode(a, b)
    runs = {record.id: timed_run(record, mode) for record in (a, b)}
    cases: dict[int, dict[str, list[CaseResult]]] = {
        record.id: {c.spec: [c] for c in runs[record.id].benchmarks} for record in (a, b)}  # type: ignore[union-attr]
    shapes = compare_shapes(cases[a.id], cases[b.id], f"run {a.id}", f"run {b.id}")
    if not shapes.shapes:
        raise UsageError(f"runs {a.id} and {b.id} share no {mode}-mode shape", "compare runs of the same task")
    ranking_by = a.report.ranking_by if a.report else "geom"
    subset = _subset_words(a, b, cases[a.id], cases[b.id])
    comparison = Comparison(shapes.a_label, shapes.b_label, shapes.shapes,
                            None if subset else _score_interval(shapes.shapes, ranking_by), shapes.missing)
    notes = [subset] if subset else []
    for record in (a, b):
        ranked = _timed_modes(record)[0]
        if ranked != mode:
            notes.append(f"run {record.id} also timed {ranked} mode: `popkit history` shows its score from that "
                         f"mode; this table compares {mode} mode, the mode both runs timed")
    if a.report and b.report and a.report.ranking_by != b.report.ranking_by:
        notes.append(f"the runs rank differently (run {a.id}: {a.report.ranking_by}, run {b.id}: "
                     f"{b.report.ranking_by}); the score row uses run {a.id}'s")
    return RunComparison(a=a, b=b, comparison=comparison, mode=mode, ranking_by=ranking_by,
                         a_score_s=None if subset else _run_score(runs[a.id], ranking_by),
                         b_score_s=None if subset else _run_score(runs[b.id], ranking_by),
                         same_bytes=a.sha256 == b.sha256, a_device=plain_device(a), b_device=plain_device(b),
                         notes=tuple(notes))

