"""The JSON documents popkit prints with `--json` and returns through popkit.api and `popkit mcp`.

Most results carry their document themselves (`to_json()`, `runcompare.RunComparison` for `compare`
among them); the few commands whose result is several library objects get a frozen result here (a task
list, a task, the history, one recorded run, the runs of `--gpus`), so that the CLI's views, popkit.api
and the MCP server build each document from the same code. `document(result)` adds the schema tag (`popkit/<kind>/1`) as
`--json` prints it; `exit_code(result)` is the exit code the CLI gives that result.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from popkit.errors import ExitCode, PopkitError
from popkit.model import leaderboards
from popkit.model.contract import entry_points

if TYPE_CHECKING:  # the result types are imported where a document is made (_kinds): `popkit test` needs two
    from popkit.ledger.history import RunRecord
    from popkit.machine.runnable import Verdict
    from popkit.model.tasks import Skipped, Task


def schema_document(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """`{"schema": "popkit/<kind>/1", **payload}`: every JSON document popkit prints or returns."""
    return {"schema": f"popkit/{kind}/1", **payload}


def task_row(task: Task) -> dict[str, Any]:
    """A task as `popkit tasks --json` lists it."""
    return {
        "name": task.name, "leaderboard": task.leaderboard, "path": str(task.path), "gpus": list(task.gpus),
        "ranking_by": task.ranking_by, "tests": len(task.tests), "benchmarks": len(task.benchmarks),
        "bundled": task.bundled, "standing": leaderboards.of_task(task).to_json(),
    }


@dataclass(frozen=True)
class TaskList:
    """`popkit tasks`: the tasks found, and the sets or entries that did not load (with their error)."""

    tasks: tuple[Task, ...]
    skipped: tuple[Skipped, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"tasks": [task_row(t) for t in self.tasks], "skipped": [s.to_json() for s in self.skipped]}


@dataclass(frozen=True)
class TaskChecks:
    """`popkit tasks --check`: per task whether this machine can run it (runnable.Verdict), and the machine."""

    tasks: tuple[Task, ...]
    verdicts: tuple[Verdict, ...]
    system: Mapping[str, Any]
    skipped: tuple[Skipped, ...] = ()  # said on stderr by the CLI; not part of the document

    def to_json(self) -> dict[str, Any]:
        return {"system": dict(self.system),
                "tasks": [{**task_row(t), **v.to_json()} for t, v in zip(self.tasks, self.verdicts)]}


@dataclass(frozen=True)
class TaskDetail:
    """`popkit tasks show NAME`: one task's description, cases, timeouts (s), files, and the names a submission
    must define (`entry_points`, read from the task's eval; empty where the eval's use cannot be read)."""

    task: Task

    @property
    def entry_points(self) -> tuple[str, ...]:
        return entry_points(self.task)

    def to_json(self) -> dict[str, Any]:
        task = self.task
        return {**task_row(task), "description": task.description,
                "test_cases": list(task.tests), "benchmark_cases": list(task.benchmarks),
                "timeouts_s": {m: task.timeout_for(m) for m in ("test", "benchmark", "leaderboard")},
                "files": [{"name": f.name, "source": f.source} for f in task.files], "main": task.main,
                "entry_points": list(self.entry_points)}


@dataclass(frozen=True)
class HistoryList:
    """`popkit history`: recorded runs, newest first, and which ledger they come from."""

    records: tuple[RunRecord, ...]
    database: Path
    database_source: str = ""  # POPKIT_HOME, working directory or per-user (resources.popkit_home_source)

    def to_json(self) -> dict[str, Any]:
        return {"database": str(self.database), "database_source": self.database_source,
                "runs": [r.to_json(summary=True) for r in self.records]}


@dataclass(frozen=True)
class RunDetail:
    """`popkit show RUN`: one recorded run with its report; `source` the exact bytes that ran, when asked."""

    record: RunRecord
    source: bytes | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.record.to_json()
        if self.source is not None:
            data["source"] = self.source.decode("utf-8", errors="replace")
        return data


@functools.cache
def _kinds() -> tuple[tuple[type, str], ...]:
    from popkit.author.render import Catalog, Written
    from popkit.author.taskcheck import TaskCheck
    from popkit.check.lint import LintReport
    from popkit.ledger.runcompare import RunComparison
    from popkit.ledger.submit import SubmitResult
    from popkit.measure.ncu import NcuReport
    from popkit.operations.doctor import DoctorReport
    from popkit.operations.evidence import VerifyReport
    from popkit.operations.requests import SpreadOutcome
    from popkit.operations.risk import RiskReport
    from popkit.operations.workflows import ABOutcome, RunOutcome
    from popkit.run.compile import CompileReport
    from popkit.tuning.result import TuneReport

    return (
        (RunOutcome, "run"), (ABOutcome, "ab"), (SpreadOutcome, "runs"), (NcuReport, "ncu"),
        (TaskList, "tasks"), (TaskChecks, "tasks"), (TaskDetail, "task"), (TaskCheck, "taskcheck"),
        (Written, "new"), (Catalog, "templates"), (CompileReport, "compile"), (DoctorReport, "doctor"),
        (LintReport, "check"), (SubmitResult, "submit"), (TuneReport, "tune"), (RiskReport, "risk"),
        (VerifyReport, "verify"),
        (HistoryList, "history"), (RunDetail, "history-run"), (RunComparison, "compare"),
        (PopkitError, "error"),
    )


def kind_of(result: object) -> str:
    """The schema kind of a result (`run`, `ab`, `tasks`, ...); TypeError for an object popkit does not report."""
    for cls, kind in _kinds():
        if isinstance(result, cls):
            return kind
    raise TypeError(f"no popkit document for {type(result).__name__}")


def document(result: Any) -> dict[str, Any]:
    """The document `--json` prints for `result`, as JSON reads it back (tuples are lists, paths strings);
    a PopkitError gives the `popkit/error/1` document."""
    return json.loads(json.dumps(schema_document(kind_of(result), result.to_json()), default=str))


def exit_code(result: Any) -> int:
    """The exit code the CLI gives `result`: the run's verdict, 8 for a check with errors, 11 for a doctor that
    found problems, 0 for listings."""
    from popkit.author.taskcheck import TaskCheck
    from popkit.check.lint import LintReport
    from popkit.operations.doctor import DoctorReport

    if isinstance(result, LintReport):
        return int(ExitCode.OK if result.ok else ExitCode.REFUSED)
    if isinstance(result, DoctorReport):
        return int(ExitCode.OK if result.ok else ExitCode.ENVIRONMENT)
    if isinstance(result, TaskCheck):
        return int(ExitCode.BAD_TASK if result.errors else ExitCode.ENVIRONMENT if result.environment
                   else ExitCode.OK if result.ok else ExitCode.FAILED)
    code = getattr(result, "exit_code", 0)
    return int(code)
