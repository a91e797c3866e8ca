"""What `popkit tune`'s race reads from its evals and decides by: each eval's times and why one did not pass
(race_stats, first_line), and the A/B's statistics (stats.paired_ratio_interval on per-round ratios).

A race round gives every variant still in it one fresh benchmark-mode eval, in an order that alternates
between rounds; round i of one variant is paired with round i of another, as an A/B pairs its two evals of a
round. From round 2 a variant whose interval against the leader lies above 1 (Bonferroni over the
comparisons of that look) leaves the race; at the finalists' look the race decides alone when its leader's
interval against every other lies below 1. `state` arguments are tunerace.State (`scores`: one per round, s;
`index`).
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from popkit.model import stats
from popkit.model.results import RunReport


def first_line(report: RunReport) -> str:
    """Why a run did not pass, in one line ("" when it passed): the first mismatch or the first compiler error."""
    if report.outcome == "passed":
        return ""
    step = report.precompile
    if report.outcome == "compile_failed" and step is not None and step.diagnostics:
        first = step.diagnostics[0]
        return f"compile failed: {first.location}: {first.message}"
    failure = report.failure
    why = failure.summary if failure is not None and failure.summary else report.outcome
    raised = exception_line(failure.stderr) if failure is not None and report.outcome == "crashed" else ""
    return (f"{why}: {raised}" if raised else why)[:500]


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")


def exception_line(stderr: str) -> str:
    """The exception a crashed eval ended on: the last line of its traceback ("" when there is none)."""
    for line in reversed(stderr.splitlines()):
        if _RAISED.match(line.strip()):
            return line.strip()
    return ""


def race_spec(case: dict) -> str:
    """A benchmark case as the report names it (`size: 4096; seed: 3`)."""
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def race_stats(report: RunReport, shapes: int) -> tuple[float, ...] | str:
    """Each benchmark shape's time in a passed benchmark run (ns: the median of its calls, else the mean), or
    why the report has none to race with."""
    run = next((r for r in report.runs if r.mode == "benchmark" and not r.secret and r.passed), None)
    if run is None:
        modes = ", ".join(f"{r.mode}{' (secret)' if r.secret else ''}: {'passed' if r.passed else 'failed'}"
                          for r in report.runs) or "none"
        return f"no passed benchmark run in its report (runs: {modes})"
    if len(run.benchmarks) != shapes:
        return f"its eval reported {len(run.benchmarks)} of the {shapes} benchmark shape(s) it was given"
    times = tuple(float(c.median_ns or c.mean_ns or 0.0) for c in run.benchmarks)
    untimed = [c.spec or f"benchmark {c.index}" for c, t in zip(run.benchmarks, times) if not t > 0]
    if untimed:
        return f"no time for {untimed[0]} (neither a median nor a mean above 0)"
    return times


def halving_evals(alive: int, confirm: int) -> int:
    """The evals successive halving still runs from `alive` variants down to `confirm` (one round at least)."""
    total = alive
    while alive > confirm:
        alive = max(confirm, math.ceil(alive / 2))
        total += alive if alive > confirm else 0
    return total


def race_ratio(state: Any, other: Any, confidence: float = stats.CONFIDENCE) -> stats.Interval | None:
    """The interval of state's score / other's over the rounds both ran, paired by round (None under 2 rounds)."""
    pairs = list(zip(state.scores, other.scores))
    if len(pairs) < 2 or not all(math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0 for a, b in pairs):
        return None
    return stats.paired_ratio_interval([a / b for a, b in pairs], confidence)


def clearly_slower(leader: Any, others: Sequence[Any]) -> list[int]:
    """The indices of `others` whose interval against `leader` lies above 1, Bonferroni over the comparisons."""
    confidence = 1 - (1 - stats.CONFIDENCE) / max(1, len(others))
    found = []
    for state in others:
        ratio = race_ratio(state, leader, confidence)
        if ratio is not None and ratio.defined and ratio.low > 1:  # type: ignore[operator]
            found.append(state.index)
    return found


__all__ = ["clearly_slower", "exception_line", "first_line", "halving_evals", "race_ratio", "race_spec",
           "race_stats"]
