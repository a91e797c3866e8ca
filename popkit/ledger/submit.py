"""`popkit submit`: check, gate, hand off, record, in that order (docs/check.md: submitting).

1. check: lint the exact bytes, resolve leaderboard and GPU (flags, then directives), stage a copy;
2. gate (optional): run the staged bytes locally in test or leaderboard mode, submit only if they pass;
3. hand-off: popkit.ledger.popcorn gives the copy to popcorn-cli and reads back its result;
4. record: the gate run and the submission go to the history (popkit.ledger.history), failed hand-offs too.

popcorn-cli gets a copy of the exact bytes that were checked, in a fresh temporary folder under the
original name, so the user's file is never touched and a later edit cannot slip in between check and submit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

from popkit.check.lint import LintReport, check_bytes, read_bytes
from popkit.errors import ExitCode, HistoryError, PopcornError, RefusedError, UsageError
from popkit.ledger import history
from popkit.ledger import popcorn
from popkit.ledger.history import RunRecord
from popkit.model import tasks
from popkit.model.results import RemoteResult, RunReport
from popkit.model.tasks import MODES
from popkit.progress import Progress
from popkit.run import proc
from popkit.run import runner
from popkit.run import warm
from popkit.run.protocol import random_secret_seeds
from popkit.run.runner import RunOptions

SUBMIT_SCHEMA = "popkit/submit/1"
GATES = ("none", "test", "leaderboard")



# ------------------------------------------------------------------------------------- 1. check


@dataclass(frozen=True)
class SubmitPlan:
    """Where a submission goes and the exact command that sends it."""

    path: str
    sha256: str
    leaderboard: str
    gpu: str
    mode: str
    gate: str
    argv: tuple[str, ...]
    staged: str  # the byte-identical copy popcorn-cli gets
    output: str  # popcorn-cli's -o file
    check: LintReport

    def to_json(self) -> dict:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["check"] = self.check.to_json()
        return data


@dataclass(frozen=True)
class SubmitResult:
    plan: SubmitPlan
    dry_run: bool = False
    remote: RemoteResult | None = None
    gate_report: RunReport | None = None
    local: RunRecord | None = None  # the latest local run of the same bytes, when there is one
    history_id: int | None = None
    warnings: tuple[str, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        if self.gate_report is not None and self.gate_report.outcome != "passed":
            return self.gate_report.exit_code
        if self.remote is not None and not self.remote.passed:
            return ExitCode.FAILED
        return ExitCode.OK

    def to_json(self) -> dict:
        return {"plan": self.plan.to_json(), "dry_run": self.dry_run,
                "remote": self.remote.to_json() if self.remote else None,
                "gate": self.gate_report.to_json() if self.gate_report else None,
                "local": self.local.to_json(summary=True) if self.local is not None else None,
                "history_id": self.history_id, "warnings": list(self.warnings),
                "exit_code": int(self.exit_code)}


def _resolve(check: LintReport, path: Path) -> tuple[str, str]:
    if not check.leaderboard:
        raise UsageError(f"{path}: no leaderboard to submit to",
                         "pass --leaderboard NAME or add `#!POPCORN leaderboard NAME` as the file's first line")
    if not check.gpu:
        offered = f" (offered: {', '.join(check.offered_gpus)})" if check.offered_gpus else ""
        raise UsageError(f"{path}: no GPU to submit to{offered}",
                         "pass --gpu NAME or add `#!POPCORN gpu NAME` to the file's first lines")
    return check.leaderboard, check.gpu


def plan_submission(path: Path, content: bytes, *, mode: str, gpu: str | None, leaderboard: str | None,
                    gate: str, exe: str, folder: Path, roots: Sequence[Path] = (), guard: bool = True) -> SubmitPlan:
    """Check the bytes, resolve leaderboard and GPU (flags, then directives), stage the copy in `folder`
    (a proc.WorkDir: its guard removes it if popkit dies), build argv.

    Raises RefusedError when the check finds errors: the server would refuse the file.
    """
    if mode not in MODES:
        raise UsageError(f"unknown mode `{mode}`", "modes: " + ", ".join(MODES))
    if gate not in GATES:
        raise UsageError(f"unknown gate `{gate}`", "gates: " + ", ".join(GATES))
    check = check_bytes(content, path.name, leaderboard=leaderboard, gpu=gpu, mode=mode, resolve_gpus=True,
                        roots=roots, guard=guard, path=str(path))
    if not check.ok:
        first = check.errors[0]
        where = f":{first.line}" if first.line else ""
        raise RefusedError(f"{path}{where}: {first.message} ({len(check.errors)} error(s); nothing submitted)",
                           f"`popkit check {path}` lists them all")
    board, chosen_gpu = _resolve(check, path)
    staged = popcorn.stage_copy(content, path.name, check.sha256, folder)
    output = staged.parent / "popcorn-result.txt"
    argv = popcorn.build_argv(exe, staged, gpu=chosen_gpu, leaderboard=board, mode=mode, output=output)
    return SubmitPlan(path=str(path), sha256=check.sha256, leaderboard=board, gpu=chosen_gpu, mode=mode, gate=gate,
                      argv=tuple(argv), staged=str(staged), output=str(output), check=check)


# -------------------------------------------------------------------------------------- 2. gate


def run_gate(plan: SubmitPlan, path: Path, content: bytes, task_spec: str | None, roots: Sequence[Path],
             options: RunOptions | None, progress: Progress) -> RunReport:
    """Run the checked bytes locally as the gate asks: `test`, or `leaderboard` with one secret seed."""
    progress(f"local gate: {plan.gate}")
    task = tasks.resolve_task(task_spec or plan.leaderboard, roots)
    mode = "test" if plan.gate == "test" else "leaderboard"
    if options is None:
        options = runner.RunOptions()
    warm.refuse_unfit(task, options.harness)  # a gate popkit's harness cannot judge is refused, never run openly
    if mode == "leaderboard" and not options.secret_seeds:
        options = replace(options, secret_seeds=random_secret_seeds(1))
    return runner.run_submission(task, path, mode, options, progress=progress, content=content)


# ---------------------------------------------------------------------------------- 3. hand-off


def _find_tool() -> tuple[str, PopcornError | None]:
    """popcorn-cli's path, or the error of its absence (reported after the check: refusals matter more)."""
    try:
        return popcorn.find_popcorn(), None
    except PopcornError as exc:
        return popcorn.EXECUTABLES[0], exc


def _tool_warnings(missing: PopcornError | None, unregistered: str) -> list[str]:
    """What a dry run says about popcorn-cli instead of failing on it."""
    out = [f"{missing.message}: {popcorn.INSTALL_HINT}"] if missing is not None else []
    if unregistered:
        out.append(f"popcorn-cli is not registered ({unregistered}): {popcorn.REGISTER_HINT}")
    return out


def _require_tool(missing: PopcornError | None, unregistered: str) -> None:
    if missing is not None:
        raise missing
    if unregistered:
        raise PopcornError(f"popcorn-cli is not registered: {unregistered}", popcorn.REGISTER_HINT)


def hand_off(plan: SubmitPlan, content: bytes, timeout_s: float, record: bool, progress: Progress) -> RemoteResult:
    """Call popcorn-cli; a hand-off that fails, or is interrupted, is still recorded (it may have spent a
    rate-limited slot) before the error goes on."""
    progress(f"popcorn-cli: {plan.mode} on {plan.gpu} ({plan.leaderboard})")
    try:
        return popcorn.call_popcorn(plan.argv, Path(plan.output), timeout_s, run=proc.completed)
    except BaseException as exc:  # noqa: B036  (Ctrl-C too: popcorn-cli may have sent it already)
        error = exc.message if isinstance(exc, PopcornError) else f"interrupted ({type(exc).__name__})"
        if record:
            _record_submission(plan, None, content, error)
        raise


# ------------------------------------------------------------------------------------ 4. record


def _record_submission(plan: SubmitPlan, remote: RemoteResult | None, content: bytes,
                       error: str = "") -> history.Recorded:
    return history.record_submission(submission=plan.path, sha256=plan.sha256, leaderboard=plan.leaderboard,
                                     gpu=plan.gpu, mode=plan.mode, remote=remote, content=content, error=error)


def _latest_local(sha256: str, warnings: list[str]) -> RunRecord | None:
    try:
        return history.latest_local(sha256)
    except HistoryError as exc:
        warnings.append(f"history not read: {exc.message}")
        return None


# ---------------------------------------------------------------------------------- the workflow


def submit(path: Path | str, *, mode: str = "leaderboard", gpu: str | None = None,
           leaderboard: str | None = None, gate: str = "none", dry_run: bool = False,
           task: str | None = None, roots: Sequence[Path] = (), timeout_s: float = popcorn.DEFAULT_TIMEOUT_S,
           run_options: RunOptions | None = None, guard: bool = True, record: bool = True,
           progress: Progress | None = None) -> SubmitResult:
    """`popkit submit`: check, optionally gate locally, call popcorn-cli, record the result in history.

    A dry run checks, stages the copy and runs the gate (its verdict is the real one), and returns the
    exact command without calling popcorn-cli.
    """
    progress = progress or (lambda _msg: None)
    path = Path(path)
    content = read_bytes(path)
    exe, missing = _find_tool()
    unregistered = popcorn.registration_problem()
    # The staging folder is removed when the block ends (a dry run's too: a real submit stages a fresh copy,
    # the view says so), and by its guard if popkit is killed while popcorn-cli runs.
    with proc.WorkDir("popkit-submit-") as folder:
        plan = plan_submission(path, content, mode=mode, gpu=gpu, leaderboard=leaderboard, gate=gate, exe=exe,
                               folder=folder, roots=roots, guard=guard)
        warnings: list[str] = []
        local = _latest_local(plan.sha256, warnings) if record else None
        if dry_run:
            warnings += _tool_warnings(missing, unregistered)
        else:
            _require_tool(missing, unregistered)
        gate_report = None
        if gate != "none":
            gate_report = run_gate(plan, path, content, task, roots, run_options, progress)
            if record:
                warnings += filter(None, [history.record_run(gate_report, content).warning])
        if dry_run or (gate_report is not None and gate_report.outcome != "passed"):
            return SubmitResult(plan=plan, dry_run=dry_run, gate_report=gate_report, local=local,
                                warnings=tuple(warnings))
        remote = hand_off(plan, content, timeout_s, record, progress)
    history_id = None
    if record:
        recorded = _record_submission(plan, remote, content)
        history_id = recorded.run_id
        warnings += filter(None, [recorded.warning])
    return SubmitResult(plan=plan, remote=remote, gate_report=gate_report, local=local, history_id=history_id,
                        warnings=tuple(warnings))
