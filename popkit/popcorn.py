"""`popkit submit`: hand a checked submission to popcorn-cli, read back its result (§7 of the protocol).

The hand-off is a pure argv builder plus one subprocess call with a timeout. popcorn-cli gets a
copy of the exact bytes that were checked, in a fresh temporary folder under the original name,
so the user's file is never touched and a later edit cannot slip in between check and submit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit import history, runner, tasks
from popkit.errors import ExitCode, HistoryError, PopcornError, RefusedError, SubmissionError, UsageError
from popkit.lint import LintReport, check_bytes, read_bytes
from popkit.results import RemoteResult, RunReport
from popkit.tasks import MODES

SUBMIT_SCHEMA = "popkit/submit/1"
POPCORN_ENV = "POPKIT_POPCORN"
EXECUTABLES = ("popcorn-cli", "popcorn")
DEFAULT_TIMEOUT_S = 3600.0  # a leaderboard submission waits in the queue, then runs two ranked chains
GATES = ("none", "test", "leaderboard")
TAIL_LINES = 20
TAIL_LINE_CHARS = 200  # a line of popcorn-cli's output quoted in a hint is cut to this many characters
REGISTER_HINT = "run `popcorn-cli register discord` (or `popcorn-cli register github`) once"
INSTALL_HINT = ("install popcorn-cli and put it on PATH, or set POPKIT_POPCORN (it is a release binary"
                " of gpu-mode/popcorn-cli on GitHub; it may be installed as `popcorn-cli` or `popcorn`)")

_SCORE = re.compile(r"^\s*geomean score \((public|secret)\) on ([^:]+):\s*([-+0-9.eE]+)\s*s\s*$",
                    re.IGNORECASE | re.MULTILINE)
_RATE_LIMIT = re.compile(r"\b429\b|too many requests|rate.?limit", re.IGNORECASE)
_HACKED = re.compile(r"\bhack(ed)?\b", re.IGNORECASE)

Progress = Callable[[str], None]


# ------------------------------------------------------------------------------ reading output


def parse_output(text: str) -> RemoteResult | None:
    """Score lines, then the JSON object after a blank line; None when no JSON object is there."""
    scores: dict[str, float] = {}
    gpu = None
    for kind, name, value in _SCORE.findall(text):
        try:
            scores[kind.lower()] = float(value)
        except ValueError:
            continue
        gpu = name.strip()
    doc = None
    decoder = json.JSONDecoder()
    for match in re.finditer(r"^\{", text, re.MULTILINE):
        try:
            candidate, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(candidate, dict) and ("submission_id" in candidate or "runs" in candidate):
            doc = candidate
            break
    if doc is None:
        return None
    try:
        result = RemoteResult.from_json(doc)
    except ValueError:  # not the shape popcorn-cli writes: no result, not a crash
        return None
    return replace(result, score_public_s=scores.get("public"), score_secret_s=scores.get("secret"),
                   score_gpu=gpu)


# ------------------------------------------------------------------------------- popcorn-cli


def find_popcorn(env: Mapping[str, str] | None = None) -> str:
    """POPKIT_POPCORN, else `popcorn-cli`, else `popcorn` on PATH."""
    env = os.environ if env is None else env
    explicit = env.get(POPCORN_ENV)
    if explicit:
        found = shutil.which(explicit, path=env.get("PATH"))
        if found is None:
            raise PopcornError(f"{POPCORN_ENV}={explicit}: not an executable file", INSTALL_HINT)
        return found
    for name in EXECUTABLES:
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    raise PopcornError("popcorn-cli not found (looked for `popcorn-cli` and `popcorn` on PATH)", INSTALL_HINT)


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """popcorn-cli's registration file, ~/.popcorn.yaml (HOME decides, as for popcorn-cli)."""
    env = os.environ if env is None else env
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".popcorn.yaml"


def registration_problem(env: Mapping[str, str] | None = None) -> str:
    """Why popcorn-cli would refuse to submit for lack of registration; empty when registered."""
    path = config_path(env)
    if not path.is_file():
        return f"{path} not found"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror or exc})"
    if not re.search(r"^\s*cli_id\s*:\s*\S", text, re.MULTILINE):
        return f"{path} has no cli_id"
    return ""


def build_argv(exe: str, file: Path | str, *, gpu: str, leaderboard: str, mode: str,
               output: Path | str) -> list[str]:
    """The exact popcorn-cli command line: flags override directives, and there is no TUI."""
    return [exe, "submit", "--gpu", gpu, "--leaderboard", leaderboard, "--mode", mode, "--no-tui",
            "-o", str(output), str(file)]


def stage_copy(content: bytes, name: str, sha256: str, folder: Path | None = None) -> Path:
    """Write `content` under `name` in a fresh folder and prove the copy is byte-identical."""
    folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="popkit-submit-"))
    copy = folder / name
    copy.write_bytes(content)
    written = hashlib.sha256(copy.read_bytes()).hexdigest()
    if written != sha256:
        raise SubmissionError(f"{copy}: the staged copy differs from the checked file (sha256 {written[:12]}"
                              f" ≠ {sha256[:12]})", "the disk may be full; nothing was submitted")
    return copy


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last lines of `text`, each cut to TAIL_LINE_CHARS: a hint stays a few lines whatever was printed."""
    return "\n".join(_cut(line) for line in text.rstrip().splitlines()[-lines:])


def _cut(line: str) -> str:
    extra = len(line) - TAIL_LINE_CHARS
    return line if extra <= 0 else f"{line[:TAIL_LINE_CHARS]} … ({extra} characters cut)"


def call_popcorn(argv: Sequence[str], output: Path, timeout_s: float,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> RemoteResult:
    """Run popcorn-cli once and read its result (the -o file, else stdout); errors say what happened."""
    try:
        proc = run(list(argv), capture_output=True, text=True, encoding="utf-8", errors="replace",
                   timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PopcornError(f"popcorn-cli did not finish in {timeout_s:g} s",
                           "the remote run may still finish: check the leaderboard, or raise --timeout") from None
    except OSError as exc:
        raise PopcornError(f"cannot run {argv[0]}: {exc.strerror or exc}", INSTALL_HINT) from None
    both = (proc.stdout or "") + ("\n" + proc.stderr if proc.stderr else "")
    written = output.read_text(encoding="utf-8", errors="replace") if output.is_file() else ""
    result = parse_output(written) or parse_output(proc.stdout or "")
    if result is None or proc.returncode != 0:
        _raise_failure(proc.returncode, both, result is None)
    assert result is not None
    return result


def _raise_failure(returncode: int, both: str, no_result: bool) -> None:
    # A refused request prints no result; where a result is there, its JSON may hold 429 as an id.
    if no_result and _RATE_LIMIT.search(both):
        raise PopcornError("rate-limited by the leaderboard (HTTP 429)",
                           "submissions are limited per hour; wait, and meanwhile iterate with `popkit bench`:\n"
                           + _tail(both, 5))
    if returncode != 0:
        what = "flagged as hacked" if _HACKED.search(both) else f"failed (popcorn-cli exit {returncode})"
        raise PopcornError(f"remote submission {what}", "popcorn-cli's last lines:\n" + _tail(both))
    if no_result:
        raise PopcornError("popcorn-cli finished but printed no result JSON",
                           "popcorn-cli's last lines:\n" + (_tail(both) or "(no output)"))


# ------------------------------------------------------------------------------------- planning


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
    local: Any = None  # history.RunRecord: the latest local run of the same bytes, when there is one
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
                    gate: str, exe: str, roots: Sequence[Path] = (), guard: bool = True) -> SubmitPlan:
    """Check the bytes, resolve leaderboard and GPU (flags, then directives), stage the copy, build argv.

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
    staged = stage_copy(content, path.name, check.sha256)
    output = staged.parent / "popcorn-result.txt"
    argv = build_argv(exe, staged, gpu=chosen_gpu, leaderboard=board, mode=mode, output=output)
    return SubmitPlan(path=str(path), sha256=check.sha256, leaderboard=board, gpu=chosen_gpu, mode=mode, gate=gate,
                      argv=tuple(argv), staged=str(staged), output=str(output), check=check)


def _gate(plan: SubmitPlan, path: Path, content: bytes, task_spec: str | None, roots: Sequence[Path],
          options: Any, progress: Progress) -> RunReport:
    task = tasks.resolve_task(task_spec or plan.leaderboard, roots)
    mode = "test" if plan.gate == "test" else "leaderboard"
    if options is None:
        options = runner.RunOptions()
    if mode == "leaderboard" and not options.secret_seeds:
        options = replace(options, secret_seeds=runner.random_secret_seeds(1))
    return runner.run_submission(task, path, mode, options, progress=progress, content=content)


def submit(path: Path | str, *, mode: str = "leaderboard", gpu: str | None = None,
           leaderboard: str | None = None, gate: str = "none", dry_run: bool = False,
           task: str | None = None, roots: Sequence[Path] = (), timeout_s: float = DEFAULT_TIMEOUT_S,
           run_options: Any = None, guard: bool = True, record: bool = True,
           progress: Progress | None = None) -> SubmitResult:
    """`popkit submit`: check, optionally gate locally, call popcorn-cli, record the result in history.

    A dry run checks and stages the copy and returns the exact command without running anything.
    """
    progress = progress or (lambda _msg: None)
    path = Path(path)
    content = read_bytes(path)
    warnings: list[str] = []
    missing: PopcornError | None = None
    try:
        exe = find_popcorn()
    except PopcornError as exc:  # reported after the check: refusals matter more than the tool
        missing, exe = exc, EXECUTABLES[0]
    unregistered = registration_problem()
    plan = plan_submission(path, content, mode=mode, gpu=gpu, leaderboard=leaderboard, gate=gate, exe=exe,
                           roots=roots, guard=guard)
    local = None
    try:
        local = history.latest_local(plan.sha256) if record else None
    except HistoryError as exc:
        warnings.append(f"history not read: {exc.message}")
    if dry_run:
        if missing is not None:
            warnings.append(f"{missing.message}: {INSTALL_HINT}")
        if unregistered:
            warnings.append(f"popcorn-cli is not registered ({unregistered}): {REGISTER_HINT}")
        gate_report = None
        if gate != "none":  # the gate is local: a dry run runs it too, so its verdict is the real one
            progress(f"local gate: {gate}")
            gate_report = _gate(plan, path, content, task, roots, run_options, progress)
            if record:
                warnings += _record(lambda: history.record_run(gate_report, content))
        return SubmitResult(plan=plan, dry_run=True, gate_report=gate_report, local=local, warnings=tuple(warnings))
    if missing is not None or unregistered:
        shutil.rmtree(Path(plan.staged).parent, ignore_errors=True)
        if missing is not None:
            raise missing
        raise PopcornError(f"popcorn-cli is not registered: {unregistered}", REGISTER_HINT)

    staged = Path(plan.staged)
    try:
        gate_report = None
        if gate != "none":
            progress(f"local gate: {gate}")
            gate_report = _gate(plan, path, content, task, roots, run_options, progress)
            if record:
                warnings += _record(lambda: history.record_run(gate_report, content))
            if gate_report.outcome != "passed":
                return SubmitResult(plan=plan, gate_report=gate_report, local=local, warnings=tuple(warnings))
        progress(f"popcorn-cli: {plan.mode} on {plan.gpu} ({plan.leaderboard})")
        try:
            remote = call_popcorn(plan.argv, Path(plan.output), timeout_s)
        except BaseException as exc:  # noqa: B036  (Ctrl-C too: popcorn-cli may have sent it already)
            error = exc.message if isinstance(exc, PopcornError) else f"interrupted ({type(exc).__name__})"
            if record:  # a failed submission still spent a rate-limited slot: keep it in the ledger
                _record(lambda: history.record_submission(plan, None, content, error=error))
            raise
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)
    history_id = None
    if record:
        ids: list[int] = []
        warnings += _record(lambda: ids.append(history.record_submission(plan, remote, content)))
        history_id = ids[0] if ids else None
    return SubmitResult(plan=plan, remote=remote, gate_report=gate_report, local=local, history_id=history_id,
                        warnings=tuple(warnings))


def _record(write: Callable[[], Any]) -> list[str]:
    """A history failure is a warning: the remote result is already in hand and is shown anyway."""
    try:
        write()
    except HistoryError as exc:
        return [f"not recorded in history: {exc.message}"]
    return []
