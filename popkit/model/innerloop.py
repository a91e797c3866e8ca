"""Inner-loop knobs for `test` and `bench`: some of the task's cases (`--cases`), some of its benchmark shapes
(`--shape`), a shorter timeout (`--timeout`). A run with any of them is not leaderboard-faithful: the report
says how it differs from the task (RunReport.changed) and the history keeps that report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from popkit.errors import UsageError
from popkit.model.tasks import MAX_TIMEOUT_S, Task


@dataclass(frozen=True)
class Knobs:
    cases: str = ""  # --cases: 1-based test case numbers, "1,3" or "2-4"
    shapes: str = ""  # --shape: 1-based benchmark shape numbers, same form
    timeout_s: float | None = None  # --timeout: seconds for each mode's eval


def _numbers(text: str, flag: str, count: int) -> tuple[int, ...]:
    """0-based indices from "1,3" or "2-4" (1-based, in the task's order); UsageError naming the flag and range."""
    picked: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise UsageError(f"{flag} {text}: `{part}` is not a number or a range",
                             f"e.g. {flag} 1,3 or {flag} 2-4 (1 to {count})") from None
        if not 1 <= first <= last <= count:
            raise UsageError(f"{flag} {text}: `{part}` is outside 1 to {count}",
                             f"the task has {count}; `popkit tasks show TASK` lists them")
        picked += [i - 1 for i in range(first, last + 1) if i - 1 not in picked]
    return tuple(sorted(picked))


def apply(task: Task, knobs: Knobs) -> tuple[Task, tuple[str, ...]]:
    """The task with only the chosen cases and shapes and the shorter timeout, and what changed, in words."""
    changed = []
    if knobs.cases:
        total = len(task.tests)
        kept = _numbers(knobs.cases, "--cases", total)
        task = replace(task, tests=tuple(task.tests[i] for i in kept))
        changed.append(f"tests {', '.join(str(i + 1) for i in kept)} of {total}")
    if knobs.shapes:
        total = len(task.benchmarks)
        kept = _numbers(knobs.shapes, "--shape", total)
        task = replace(task, benchmarks=tuple(task.benchmarks[i] for i in kept))
        changed.append(f"benchmark shapes {', '.join(str(i + 1) for i in kept)} of {total}")
    if knobs.timeout_s is not None:
        if not 0 < knobs.timeout_s <= MAX_TIMEOUT_S:
            raise UsageError(f"--timeout {knobs.timeout_s:g}: must be above 0 and at most {MAX_TIMEOUT_S} s",
                             "e.g. --timeout 30")
        task = replace(task, test_timeout=knobs.timeout_s, benchmark_timeout=knobs.timeout_s,
                       ranked_timeout=knobs.timeout_s)
        changed.append(f"timeout {knobs.timeout_s:g} s")
    return task, tuple(changed)


def note(changed: tuple[str, ...]) -> str:
    """The report's line for a run the knobs changed."""
    return f"inner loop ({'; '.join(changed)}): not leaderboard-faithful"
