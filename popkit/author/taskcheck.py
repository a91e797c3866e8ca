"""`popkit tasks check DIR`: a task folder checked the way the runner will use it, for problem authors.

1. The folder: task.yml keys and types (tasks.load_task), every `files` source present and inside the
   problem-set root, a submission template present.
2. The reference as the submission, through test → benchmark → leaderboard: each mode's time against
   its timeout.
3. The checker: a submission returning zeros shaped like the reference's output, and one returning
   the unmodified input, must both fail the tests; a checker that passes either is flagged. A probe
   counts as rejected only when a case failed, and the probes run only once the reference passes.
An eval that writes `check: pass` with fewer results than its cases (none at all, or tests where
benchmarks were asked for) is an error: a pass no case result backs.
Runs go through runner.run_submission, so a task this machine cannot run stops at its preflight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from popkit.errors import EnvironmentProblem
from popkit.model.contract import entry_points
from popkit.model.results import ModeRun, RunReport
from popkit.model.tasks import Task, load_task
from popkit.run import protocol
from popkit.run import runner
from popkit.submission.source import reference_submission

SLOW_SHARE = 0.5  # a mode that uses more than this share of its timeout is flagged

# Lax-checker probes: each returns something a correct checker must reject.
_PROBE_HELPERS = b'''# popkit tasks check: a wrong answer a correct checker must reject
import copy

from reference import ref_kernel


def _zero(x):
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.zeros_like(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_zero(v) for v in x)
    if isinstance(x, dict):
        return {k: _zero(v) for k, v in x.items()}
    if isinstance(x, (bool, int, float, complex)):
        return type(x)(0)
    return x


def _shape(x):
    return tuple(getattr(x, "shape", ())) or (len(x) if isinstance(x, (list, tuple)) else None)
'''
LAX_PROBES = {
    "zero output": _PROBE_HELPERS + b'''

def custom_kernel(data):
    return _zero(ref_kernel(copy.deepcopy(data)))
''',
    "unmodified input": _PROBE_HELPERS + b'''

def custom_kernel(data):
    # The input itself; for a tuple of inputs, the one shaped like the output (often its untouched buffer).
    if not isinstance(data, (list, tuple)) or not data or not hasattr(data[0], "shape"):
        return data
    want = _shape(ref_kernel(copy.deepcopy(data)))
    return next((x for x in data if _shape(x) == want), data[0])
''',
}


@dataclass(frozen=True)
class ModeTime:
    mode: str
    seconds: float
    timeout_s: float
    outcome: str
    summary: str = ""


@dataclass
class TaskCheck:
    path: str
    task: str = ""
    errors: list[str] = field(default_factory=list)  # the folder is not usable as the runner would use it
    warnings: list[str] = field(default_factory=list)
    modes: list[ModeTime] = field(default_factory=list)  # the reference through the ranked chain
    lax: dict[str, str] = field(default_factory=dict)  # probe -> "rejected" / "passed" / why it did not run
    skipped: str = ""  # why nothing ran
    environment: str = ""  # this machine cannot run the task (runnable.preflight's reason)

    @property
    def ok(self) -> bool:
        return not self.errors and all(v != "passed" for v in self.lax.values()) and all(
            m.outcome == "passed" for m in self.modes)

    def to_json(self) -> dict:
        return {"path": self.path, "task": self.task, "ok": self.ok, "errors": self.errors,
                "warnings": self.warnings, "skipped": self.skipped, "environment": self.environment,
                "modes": [m.__dict__ for m in self.modes], "checker": self.lax}


def check_task_dir(directory: Path | str, *, root: Path | None = None, python: str | None = None,
                   run: bool = True, progress: Callable[[str], None] | None = None) -> TaskCheck:
    """Validate the task folder, then (where this machine can) run the reference and the lax probes."""
    directory = Path(directory)
    # TaskError (exit 3) names the file and the key, a source outside the problem-set root included
    task = load_task(directory, set_root=root.resolve() if root else None)
    result = TaskCheck(path=str(task.path), task=task.name)
    _check_templates(task, result)
    if not task.tests:
        result.errors.append("tests: no test cases (test mode would have nothing to run)")
    if not task.benchmarks:
        result.errors.append("benchmarks: no benchmark cases (benchmark and leaderboard modes need them)")
    if result.errors or not run:
        return result
    names = entry_points(task)
    if names and tuple(names) != ("custom_kernel",):
        result.skipped = (f"the eval takes {', '.join(names)} from the submission; the reference-as-submission "
                          "run needs a custom_kernel task")
        return result
    options = runner.RunOptions(python=python, precompile=False) if python else runner.RunOptions(precompile=False)
    system = _run_reference(task, options, result, progress)
    if result.skipped:
        return result
    if result.errors or any(m.outcome != "passed" for m in result.modes):
        # A probe the eval fails proves nothing about the checker while the reference does not pass either.
        result.lax = dict.fromkeys(LAX_PROBES, "not run: the reference's own runs have problems (above)")
        return result
    for label, content in LAX_PROBES.items():
        (progress or (lambda _m: None))(f"checker: {label}")
        report = runner.run_submission(task, Path(f"<{label}>"), "test", options, system=system, content=content)
        result.lax[label] = _probe_verdict(report)
    return result


def _probe_verdict(report: RunReport) -> str:
    """`rejected` only when the checker failed a case; a run that failed for another reason (no case
    results, a crash, a timeout) did not put the checker to the test."""
    if report.outcome == "passed":
        return "passed"
    if report.outcome == "failed" and any(not c.passed for r in report.runs for c in r.tests + r.benchmarks):
        return "rejected"
    summary = next((r.summary for r in report.runs if r.outcome != "passed"), "") or report.outcome
    return f"did not run ({summary})"


def _unreported(run: ModeRun) -> str:
    """The error for a run the runner failed because its eval wrote `check: pass` without a result for every case
    (protocol.judge): the task's eval is broken, not the reference."""
    where = protocol.where(run)
    prefix = f"check failed: {where} wrote `check: pass`"
    if run.outcome != "failed" or not run.summary.startswith(prefix):
        return ""
    return f"{where}: the eval wrote `check: pass`{run.summary[len(prefix):]}"


def _check_templates(task: Task, result: TaskCheck) -> None:
    for lang, rel in task.templates.items():
        if not (task.path / rel).is_file():
            result.errors.append(f"templates.{lang}: file `{rel}` not found")
    if not task.templates and not any(task.path.glob("template*.py")) and not (task.path / "submission.py").is_file():
        result.errors.append("no submission template (a `templates` entry, a template*.py or a submission.py)")


def _run_reference(task: Task, options: runner.RunOptions, result: TaskCheck, progress) -> dict:
    """The reference through the ranked chain; returns the system probe for the runs after it."""
    try:
        report = runner.run_submission(task, Path("<reference>"), "leaderboard", options, progress=progress,
                                       content=reference_submission())
    except EnvironmentProblem as exc:
        result.skipped = "not run: this machine cannot run the task"
        result.environment = exc.message
        return {}
    for run in report.runs:
        result.modes.append(ModeTime(run.mode, run.duration_s, run.timeout_s, run.outcome, run.summary))
        unreported = _unreported(run)
        if unreported:
            result.errors.append(unreported)
        if run.passed and run.duration_s > SLOW_SHARE * run.timeout_s:
            result.warnings.append(f"{run.mode}: the reference used {run.duration_s:.0f} s of {run.timeout_s:g} s; "
                                   "a submission slower than the reference may time out")
    return dict(report.system)
