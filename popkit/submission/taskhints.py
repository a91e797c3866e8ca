"""Signs in a failed run that the file was written for another task, and what to say about it.

The public problem set pmpp_v2 has the bundled tasks' problems under `_v2` leaderboard names, with other
data: vectoradd_v2's generate_input returns (A, B, output) where the bundled vectoradd gives (a, b). A
pmpp_v2 file run with the bundled name (`--task vectoradd`) fails every case with the same
`ValueError: not enough values to unpack (expected 3, got 2)`, six lines that never say why. When every
failed case fails that way, the report adds one hint naming the likely task.
"""

from __future__ import annotations

import re
from typing import Iterable

from popkit.model.results import CaseResult, RunReport

_UNPACK = re.compile(r"ValueError: (?:not enough|too many) values to unpack \(expected (\d+)(?:, got (\d+))?\)")


def unpack_mismatch(cases: Iterable[CaseResult]) -> tuple[int, int | None] | None:
    """(values the file unpacks, values the task gave) when every failed case failed unpacking `data` the same
    way; None otherwise (no failure, or any other failure among them)."""
    seen = set()
    for case in cases:
        if case.passed:
            continue
        m = _UNPACK.search(case.error or "") or _UNPACK.search(case.message or "")
        if m is None:
            return None
        seen.add((int(m.group(1)), int(m.group(2)) if m.group(2) else None))
    return seen.pop() if len(seen) == 1 else None


def other_task_hint(report: RunReport, task_name: str, bundled: bool) -> str:
    """One line for a run whose every failure is the same unpacking of `data`; "" when the pattern is absent."""
    found = unpack_mismatch(case for run in report.runs for case in run.tests + run.benchmarks)
    if found is None:
        return ""
    expected, got = found
    gives = f"gives {got}" if got is not None else "gives another number"
    said = (f"every failed case unpacks `data` into {expected} values and task `{task_name}` {gives}: the file "
            "looks written for another task")
    if bundled:
        return (f"{said}. A public problem set's version of this problem (e.g. `{task_name}_v2` of pmpp_v2) passes "
                f"other data: run it with --task {task_name}_v2 --tasks-root DIR (a checkout of the problem sets)")
    return f"{said}: check --task (popkit tasks lists the names) and what the task's generate_input returns"
