"""Leaderboards as they stand: open or closed today, and the GPUs each offers, read from the problem sets.

A problem set names each leaderboard with its `deadline` ("2025-06-30" or "2025-06-30 07:00", UTC; a date alone
is that day's 00:00) and its `gpus`; an entry without a deadline takes the set's, and neither means open. popkit's
bundled tasks are practice tasks: their cases are popkit's own, not a leaderboard's, so a score on them is no
leaderboard's score, and a leaderboard of the same name is known only from the public problem sets
(`--tasks-root`). A leaderboard is looked up in the sets under the roots first; the bundled set answers only
for a name none of them has.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from popkit.model.tasks import Problem, ProblemSet, Task, bundled_problem_set, problem_sets

OPEN, CLOSED, PRACTICE, UNKNOWN = "open", "closed", "practice", "unknown"
PUBLIC_SETS = "git clone https://github.com/gpu-mode/reference-kernels, then --tasks-root reference-kernels/problems"
# (lint_rules.py, at a lower layer, spells the same words)


@dataclass(frozen=True)
class Standing:
    """One leaderboard name as popkit knows it today."""

    leaderboard: str
    state: str  # OPEN, CLOSED, PRACTICE (a bundled task only) or UNKNOWN (in no problem set)
    deadline: str = ""  # as the problem set writes it; "" for none
    gpus: tuple[str, ...] = ()
    problem_set: str = ""  # the set's name

    @property
    def words(self) -> str:
        """`open until 2100-12-31`, `closed since 2025-06-30`, `practice task`, `unknown`."""
        if self.state == OPEN:
            return f"open until {self.deadline}" if self.deadline else "open"
        if self.state == CLOSED:
            return f"closed since {self.deadline}"
        return "practice task (not a leaderboard)" if self.state == PRACTICE else "unknown"

    def to_json(self) -> dict:
        return {"leaderboard": self.leaderboard, "state": self.state, "deadline": self.deadline or None,
                "gpus": list(self.gpus), "problem_set": self.problem_set}


def parse_deadline(text: str | None) -> datetime | None:
    """The moment a deadline names, in UTC; None for an empty or unreadable one (no deadline)."""
    text = (text or "").strip()
    for form in ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return datetime.strptime(text, form).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def standing(pset: ProblemSet, problem: Problem, now: datetime | None = None, practice: bool = False) -> Standing:
    """Where `problem` of `pset` stands at `now` (default: this moment)."""
    deadline = problem.deadline or pset.deadline or ""
    moment = parse_deadline(deadline)
    closed = moment is not None and moment <= (now or datetime.now(timezone.utc))
    state = PRACTICE if practice else CLOSED if closed else OPEN
    return Standing(problem.name, state, deadline if moment else "", tuple(problem.gpus), pset.name)


def of_task(task: Task, now: datetime | None = None) -> Standing:
    """Where a listed task's leaderboard stands (a bundled task is a practice task; one no set names, unknown)."""
    if not task.leaderboard:
        return Standing(task.name, UNKNOWN)
    problem = Problem("", task.leaderboard, task.deadline, tuple(task.gpus))
    return standing(ProblemSet(task.path, "", (problem,)), problem, now, practice=task.bundled)


def lookup(leaderboard: str, roots: Sequence[Path] = (), now: datetime | None = None) -> Standing:
    """The leaderboard's standing: from the problem sets under `roots` first, then the bundled set (practice)."""
    for pset in problem_sets(roots, []):
        for problem in pset.problems:
            if problem.name == leaderboard:
                return standing(pset, problem, now)
    bundled = bundled_problem_set()
    for problem in bundled.problems:
        if problem.name == leaderboard:
            return standing(bundled, problem, now, practice=True)
    return Standing(leaderboard, UNKNOWN)


def open_boards(roots: Sequence[Path] = (), now: datetime | None = None) -> list[Standing]:
    """Every leaderboard under `roots` that is open at `now`."""
    found = [standing(ps, p, now) for ps in problem_sets(roots, []) for p in ps.problems]
    return [s for s in found if s.state == OPEN]


def advice(board: Standing, roots: Sequence[Path] = (), now: datetime | None = None) -> tuple[str, str]:
    """(message, hint) when a submission for `board` would not count on a leaderboard today; ("", "") when it would.
    The hint names open leaderboards of a similar name (vectoradd -> vectoradd_v2), or how to find them."""
    if board.state == OPEN:
        return "", ""
    if board.state == CLOSED:
        message = f"leaderboard `{board.leaderboard}` ({board.problem_set}) closed on {board.deadline}"
    elif board.state == PRACTICE:
        message = (f"`{board.leaderboard}` is popkit's practice task, not a leaderboard popkit knows: its cases are "
                   "popkit's own and its score is no leaderboard's")
    else:
        message = f"no problem set popkit knows names leaderboard `{board.leaderboard}`"
    opened = open_boards(roots, now)
    similar = [s.leaderboard for s in opened if s.leaderboard.startswith(board.leaderboard.split("_")[0])]
    if similar:
        hint = "open today: " + ", ".join(f"`{n}`" for n in similar[:4])
    elif opened:
        hint = f"{len(opened)} leaderboards are open today: `popkit tasks` lists them"
    else:
        hint = f"for the leaderboards open today: {PUBLIC_SETS}"
    return message, hint
