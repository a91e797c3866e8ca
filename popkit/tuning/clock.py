"""`popkit tune`'s clock: where its wall time goes (per phase), what is left of `--budget`, what the rest costs.

Tuner mixes this in. A phase (probe, build, check, race, A/B, final check) is charged the wall time spent
inside it; a phase entered inside another charges its own time only. The budget bounds wall time: no new
step starts when what it would take (from the evals timed so far) does not fit, and an eval that starts
gets the task's timeout cut to what is left, so an eval in flight stops at the bound (the eval is then
"cut by the budget", not a verdict on the variant).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterator

from popkit.model import stats
from popkit.model.tasks import Task
from popkit.tuning.result import Phase

BUDGET_SLACK_S = 1.0  # an eval cut to what is left still gets at least this long


class Timekeeping:
    """Phases, the budget and estimates, for popkit.tuning.workflow.Tuner (which sets `clock`, `t0`, `settings`, `_lock`)."""

    clock: Callable[[], float]
    t0: float
    stopped: str

    def init_time(self) -> None:
        self.phases: dict[str, list[float]] = {}  # phase -> [wall seconds, evals], in the order first entered
        self._stack: list[str] = []
        self._mark = self.t0
        self.eval_times: dict[str, list[float]] = {}  # mode -> wall time of each eval (check: test, race: benchmark)

    # ------------------------------------------------------------------------------------ phases

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the wall time inside to `name` (a phase entered inside another charges its own time only)."""
        self._charge()
        self._stack.append(name)
        self.phases.setdefault(name, [0.0, 0])
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    def _charge(self) -> None:
        now = self.clock()
        if self._stack:
            self.phases[self._stack[-1]][0] += now - self._mark
        self._mark = now

    def count_evals(self, n: int = 1) -> None:
        with self._lock:  # type: ignore[attr-defined]
            if self._stack:
                self.phases[self._stack[-1]][1] += n

    def phase_report(self) -> tuple[Phase, ...]:
        return tuple(Phase(name, seconds, int(evals)) for name, (seconds, evals) in self.phases.items())

    # ------------------------------------------------------------------------------------ budget

    def remaining_s(self) -> float | None:
        if not self.settings.budget_s:  # type: ignore[attr-defined]
            return None
        return self.settings.budget_s - (self.clock() - self.t0)  # type: ignore[attr-defined]

    def out_of_time(self, need_s: float = 0.0) -> bool:
        left = self.remaining_s()
        if left is None or left - need_s > 0:
            return False
        self.stopped = "budget"
        return True

    def bounded(self, task: Task) -> tuple[Task, bool]:
        """The task with its timeouts cut to what is left of the budget; True when a cut was made."""
        left = self.remaining_s()
        if left is None:
            return task, False
        cap = max(BUDGET_SLACK_S, left)
        if cap >= max(task.test_timeout, task.benchmark_timeout, task.ranked_timeout):
            return task, False
        return replace(task, test_timeout=min(task.test_timeout, cap),
                       benchmark_timeout=min(task.benchmark_timeout, cap),
                       ranked_timeout=min(task.ranked_timeout, cap)), True

    def timed(self, mode: str, seconds: float) -> None:
        with self._lock:  # type: ignore[attr-defined]
            self.eval_times.setdefault(mode, []).append(seconds)

    def per_eval_s(self, mode: str) -> float:
        """The mean wall time of an eval of `mode` so far (of any mode when none; 0 when nothing ran)."""
        times = self.eval_times.get(mode) or [t for ts in self.eval_times.values() for t in ts]
        return stats.mean(times) if times else 0.0

    def left_text(self, mode: str, evals: int, jobs: int = 1) -> str:
        """`, ~N s left in this phase` from the evals timed so far ("" before the first)."""
        each = self.per_eval_s(mode)
        if not each or evals <= 0:
            return ""
        return f", ~{math.ceil(each * math.ceil(evals / max(1, jobs))):.0f} s left in this phase"


__all__ = ["BUDGET_SLACK_S", "Timekeeping"]
