"""The leaderboard's protocol, run locally (docs/protocol-notes.md §2).

One working directory per run holds the task's files flat and the user's file under the task's
submission name. The compile pre-step runs `python submission.py` once; then each mode runs
`python <main> MODE CASES` with the write end of a pipe passed as POPCORN_FD, under the task's
timeout for that mode. Results come only from the pipe, never from stdout.
"""

from __future__ import annotations

import ast
import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import math
import os
import random
import secrets
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit import diagnostics, prestep, proc, runnable, system
from popkit.contract import entry_points
from popkit.directives import cli_directives, server_directives
from popkit.errors import EnvironmentProblem, SubmissionError, TaskError, UsageError
from popkit.lint import read_bytes
from popkit.resources import data_dir
from popkit.results import (COMPILE_MARKERS, TIMEOUT_EXIT_CODE, CaseResult, CompileStep, ModeRun, RunReport,
                            judge_physics)
from popkit.tasks import MODES, SUBMISSION_SOURCE, Task, scale_world_size

# NVLink multicast (NVLS) off for multi-GPU evals: NCCL's and torch's symmetric memory's (the GPU hosts require it).
MULTI_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
PRECOMPILE_TIMEOUT_S = 120.0
PRECOMPILE_SEED = "1"
POPKIT_EVAL_NAME = "popkit_eval.py"  # popkit's harness, when it replaces a task's own eval
PIPE_END_KEY = "popkit.end"  # popkit's harness writes this record last (see tasks/eval.py's ResultPipe)
_PROTOCOL_EXIT = {
    2: "bad usage or unknown mode",
    110: "CUDA API failure",
    111: "no POPCORN_FD in the environment",
    113: "bad or unreadable cases file",
}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    python: str = sys.executable  # interpreter for the pre-step and every eval
    precompile: bool | None = None  # None: run the pre-step only when it can warm the build cache (prestep.py)
    harness: str = "task"  # "task": the task's own eval; "popkit": popkit's harness in its place
    secret_seeds: tuple[int, ...] = ()  # one secret chain per seed, after the public chain passed
    keep_workdir: bool = False
    chain: bool = True  # leaderboard mode runs test and benchmark first; False runs the mode alone
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for every child
    label: str = ""
    world_size: int | None = None  # run a multi-GPU task's cases at this world_size (scaled down, marked)


# ------------------------------------------------------------------------------------ the pieces


def render_cases(cases: Sequence[Mapping[str, Any]]) -> str:
    """The cases file: one line per case, `key: value` pairs joined by "; " in yaml order.

    Booleans are written True/False and lists as Python lists (Python's own str of the value).
    """
    return "".join("; ".join(f"{k}: {v}" for k, v in case.items()) + "\n" for case in cases)


def parse_pipe(text: str, first_wins: bool = False) -> dict[str, str]:
    """Pipe lines `key: value`, split at the first colon, both sides stripped.

    Later keys win, as on the leaderboard; with `first_wins` (popkit's harness) the first value of a key stands.
    """
    result: dict[str, str] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, value = line.split(":", 1)
        if not (first_wins and key.strip() in result):
            result[key.strip()] = value.strip()
    return result


def sealed_pipe(data: bytes, key: str) -> tuple[bytes, str]:
    """What popkit's harness wrote before its closing record `popkit.end: HMAC`, and what is wrong with it.

    The second value is "" when the record is there and its HMAC (keyed with `key`) matches every byte
    before it; lines after the record are dropped.
    """
    start = 0
    for line in data.splitlines(keepends=True):
        if line.startswith(PIPE_END_KEY.encode() + b":"):
            body = data[:start]
            expected = hmac.new(key.encode(), body, "sha256").hexdigest()
            if hmac.compare_digest(line.split(b":", 1)[1].strip(), expected.encode()):
                return body, ""
            return body, ("result-pipe tampering: the result pipe holds lines popkit's harness did not write "
                          "(another process wrote on it)")
        start += len(line)
    return data, "result pipe: popkit's harness ended without its closing record, so its lines cannot be trusted"


def secret_case_seed(case_seed: int, secret: int) -> int:
    """How the standard eval combines a case seed `a` with the secret seed `b` (docs/protocol-notes.md §4)."""
    a, b = case_seed, secret
    return a + (a + b) * (a + b + 1) // 2


# A secret seed b turns case seed a into a + (a+b)(a+b+1)/2: below 2**31 that stays a 64-bit seed.
MAX_SECRET_SEED = 2**31 - 1


MAX_SECRET_RUNS = 100  # each secret run is a whole chain; more is a typo (`--secret-runs 1000000000` hung)


def random_secret_seeds(count: int) -> tuple[int, ...]:
    rng = random.SystemRandom()
    return tuple(rng.randrange(1, MAX_SECRET_SEED + 1) for _ in range(count))


def read_submission(path: Path, entry_points: Sequence[str] | None = ("custom_kernel",)) -> bytes:
    """The submission's bytes, after the checks a file can fail on its own (see validate_submission).

    `entry_points`: the names the task's eval takes from the submission (popkit.contract); None
    before the task is known.
    """
    return validate_submission(Path(path), read_bytes(path), entry_points)


def validate_submission(path: Path, data: bytes, entry_points: Sequence[str] | None) -> bytes:
    """Not empty, UTF-8, parses (a .py file), and defines every name in `entry_points` at module level."""
    if not data.strip():
        raise SubmissionError(f"{path}: the file is empty", "write the functions the task asks for in it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionError(f"{path}: not UTF-8 (byte {exc.start})", "save the file as UTF-8") from None
    if Path(path).suffix == ".py":
        try:
            tree = ast.parse(text.removeprefix(BOM), filename=str(path))  # Python skips a leading BOM too
        except SyntaxError as exc:
            raise SubmissionError(f"{path}:{exc.lineno}:{exc.offset or 0}: syntax error: {exc.msg}",
                                  "fix the syntax; `python -m py_compile FILE` shows the same") from None
        for name in entry_points or ():
            bound = _bound_to_data(tree, name)
            if bound:
                raise SubmissionError(f"{path}: {name} is not a function (it is bound to {bound})",
                                      f"define `def {name}(data):` returning the output")
        missing = [name for name in entry_points or () if not _defines(tree, name)]
        if missing:
            hint = f"the task's eval takes {', '.join(entry_points)} from the submission"
            if tuple(entry_points) == ("custom_kernel",):
                hint = "define `def custom_kernel(data):` returning the output"
            raise SubmissionError(f"{path}: no `{missing[0]}` defined at module level", hint)
    return data


_NATIVE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hip")
# What marks a submission that builds a CUDA (or HIP) extension: it cannot run without a GPU.
_CUDA_MARKERS = ("cuda_sources", "CUDAExtension", "--offload-arch")
_CUDA_SOURCE_FILE = re.compile(r"""\.cu['"]""")


def needs_gpu(data: bytes) -> bool:
    """Whether the submission builds a CUDA/HIP extension (load_inline with cuda_sources, a .cu source)."""
    text = data.decode("utf-8", "replace")
    return any(m in text for m in _CUDA_MARKERS) or bool(_CUDA_SOURCE_FILE.search(text))


def check_language(task: Task, submission: Path) -> None:
    """A C++/CUDA/HIP source file cannot be a Python task's submission.py (exit 4, before anything runs)."""
    suffix = Path(submission).suffix.lower()
    if task.lang == "py" and suffix in _NATIVE_SUFFIXES:
        raise SubmissionError(
            f"{submission}: a {suffix} source file, but task `{task.name}` runs Python (`lang: py`): the runner "
            "would run it as submission.py and fail with syntax errors",
            f"put the kernel in a .py file that builds it with load_inline(cuda_sources=...); "
            f"`popkit new --target cuda --task {task.name}` writes one")


def check_runnable(task: Task, submission: Path, data: bytes, mode: str) -> None:
    """What must hold before anything runs: a Python file for a Python task, a GPU for a CUDA build."""
    check_language(task, submission)
    if needs_gpu(data) and not system.has_gpu():
        command = "test" if mode == "test" else "bench"
        raise EnvironmentProblem(
            f"this machine has no CUDA GPU: `popkit compile` builds it, `popkit {command}` needs a GPU",
            f"`popkit compile {submission}` checks the build here; run `popkit {command}` on a machine with a GPU "
            "(a pure-PyTorch submission runs on the CPU)")


def with_toolkit(options: RunOptions, data: bytes, progress: Progress) -> RunOptions:
    """A CUDA build gets the toolkit popkit found as CUDA_HOME when torch would guess one that cannot build."""
    if not needs_gpu(data) or "CUDA_HOME" in options.env:
        return options
    home, said = system.toolkit_for_builds(system.cuda_home_problem())
    if not home:
        return options
    progress(said)
    return replace(options, env={**options.env, "CUDA_HOME": home})


def task_spec_for(path: Path, content: bytes, explicit: str | None) -> str:
    """The task to run: --task if given, else the file's `#!POPCORN leaderboard` directive."""
    if explicit:
        return explicit
    text = content.decode("utf-8")
    name = server_directives(text).leaderboard or cli_directives(text).leaderboard
    if not name:
        raise UsageError(f"{path}: no `#!POPCORN leaderboard NAME` directive and no --task",
                         "add `#!POPCORN leaderboard vectoradd` as the file's first line, or pass --task")
    return name


BOM = "\ufeff"  # a UTF-8 byte-order mark, as decoded text


def _bound_to_data(tree: ast.Module, name: str) -> str:
    """`an int at line 3` when the module's last top-level binding of `name` is a literal; else ''."""
    last = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            last = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == name
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            last = node.value
    if isinstance(last, ast.Constant):
        kind = type(last.value).__name__
    elif isinstance(last, (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr)):
        kind = {"JoinedStr": "str"}.get(type(last).__name__, type(last).__name__.lower())
    else:
        return ""
    article = "an" if kind[0] in "aeiou" else "a"
    return f"{article} {kind} at line {last.lineno}"


def _defines(tree: ast.Module, name: str) -> bool:
    """Whether module-level code binds `name` (a def, class, assignment or import, also under if/try/with)."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name) == name for alias in node.names):
            return True
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for attr in ("body", "orelse", "finalbody"):
                pending.extend(getattr(node, attr, []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)
    return False


def prepare_workdir(task: Task, submission: bytes, dest: Path, harness: str = "task") -> str:
    """Write the task's files flat into `dest`; the user's bytes go under the submission name.

    Returns the name of the eval file to run (the task's `config.main`, or popkit's harness).
    """
    if task.lang != "py":
        raise TaskError(f"{task.yml}: `lang: {task.lang}` tasks are not supported",
                        "popkit runs `lang: py` tasks (all public problems are)")
    dest.mkdir(parents=True, exist_ok=True)
    for f in task.files:
        target = dest / f.name
        if f.source == SUBMISSION_SOURCE:
            target.write_bytes(submission)
        else:
            shutil.copyfile(task.path / f.source, target)
    if harness == "popkit":
        shutil.copyfile(data_dir("tasks") / "eval.py", dest / POPKIT_EVAL_NAME)
        return POPKIT_EVAL_NAME
    if harness != "task":
        raise UsageError(f"unknown harness `{harness}`", "use --harness task or --harness popkit")
    return task.main


def run_child(argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout_s: float,
              watch: Callable[[bytes], None] | None = None) -> tuple[int, str, str, float, bool]:
    """Run one child under popkit's watchdog (popkit/proc.py); its whole tree is gone when this returns.

    Returns (exit code, stdout, stderr, seconds, timed out). The exit code is 114 on timeout,
    as the runner sets it; a child killed by a signal reports -signal.
    """
    done = proc.run(argv, cwd, env, timeout_s, watch=watch)
    code = TIMEOUT_EXIT_CODE if done.timed_out else done.code
    return code, done.stdout, done.stderr, done.seconds, done.timed_out


def child_env(options: RunOptions, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("POPCORN_FD", "POPCORN_SEED", "POPCORN_GPUS", "POPKIT_PIPE_KEY")}
    env.update(options.env)
    env.update(extra)
    return env


def precompile(workdir: Path, submission_name: str, options: RunOptions,
               timeout_s: float = PRECOMPILE_TIMEOUT_S) -> CompileStep:
    """`python submission.py` once with POPCORN_SEED=1; it warms the load_inline build cache."""
    env = child_env(options, POPCORN_SEED=PRECOMPILE_SEED)
    code, out, err, secs, timed_out = run_child([options.python, submission_name], workdir, env, timeout_s)
    log = out if "-DTORCH_EXTENSION_NAME" in out else ""
    return CompileStep(exit_code=code, duration_s=secs, timed_out=timed_out, log=log, stdout=out, stderr=err)


def pre_step(workdir: Path, submission_name: str, content: bytes, options: RunOptions, progress: Progress,
             side: str = "", pristine: Mapping[str, bytes] | None = None
             ) -> tuple[CompileStep | None, prestep.Decision, str]:
    """The compile pre-step where it can matter (prestep.decide); a success is recorded in the build-cache index.

    With `pristine` (the task files as written), task files the pre-step changed are put back and named in
    the third value (restore_task_files); such a pre-step is never recorded, so the next run does not skip
    it: harness tampering is found every time.
    """
    what = "compile pre-step" + (f" {side}" if side else "")
    env = child_env(options)
    plan = prestep.decide(content, options.precompile, options.python, env)
    if plan.reason:
        progress(f"{what}: skipped ({plan.reason})")
    if not plan.run:
        return None, plan, ""
    progress(what)
    with timed(progress, what):
        step = precompile(workdir, submission_name, options)
    tampered = restore_task_files(workdir, pristine or {}, "the compile pre-step")
    if step.ok and not tampered:
        prestep.record(plan.key, env)
    return step, plan, tampered


def timed(progress: Progress | None, label: str):
    """The progress printer's elapsed-time spinner around a block (a build), when it has one (the CLI's does)."""
    spinner = getattr(progress, "timed", None)
    return spinner(label) if spinner is not None else contextlib.nullcontext()


class LiveProgress:
    """Live progress of one child from its result pipe as it arrives: step, case i/N and its spec, elapsed.

    Calls `progress.live(text, key)` when the progress printer has one (the CLI's does); `key` changes
    when the step or case does, so a printer for pipes can write a line per case, not per second.
    """

    def __init__(self, progress: Progress | None, label: str, total: int = 0, kind: str = ""):
        self._live = getattr(progress, "live", None)
        self.label, self.total, self.kind = label, total, kind
        self.start = time.monotonic()
        self.index, self.spec = -1, ""
        self._partial = b""

    def __call__(self, data: bytes) -> None:
        if self._live is None:
            return
        if data:
            text = self._partial + data
            lines, _, self._partial = text.rpartition(b"\n")
            for line in lines.decode("utf-8", "replace").splitlines():
                key, _, value = line.partition(":")
                parts = key.strip().split(".")
                if len(parts) == 3 and parts[0] == self.kind and parts[1].isdigit() and parts[2] == "spec":
                    self.index, self.spec = int(parts[1]), value.strip()
        self._live(self.text(), f"{self.label}/{self.index}")

    def text(self) -> str:
        elapsed = f"{time.monotonic() - self.start:.0f} s"
        if self.index >= 0:
            of = f"/{self.total}" if self.total else ""
            return f"{self.label} · case {self.index + 1}{of}: {self.spec} · {elapsed}"
        cases = f" · {self.total} case{'s' if self.total != 1 else ''}" if self.total else ""
        return f"{self.label}{cases} · {elapsed}"


def run_mode(workdir: Path, main: str, mode: str, cases: Sequence[Mapping[str, Any]], *, timeout_s: float,
             options: RunOptions, seed: int | None = None, gpus: int | None = None,
             cases_name: str | None = None, progress: Progress | None = None, label: str = "") -> ModeRun:
    """One eval process: `python <main> MODE CASES` with the result pipe; parse what it wrote.

    Reading stops when the eval exits. popkit's own harness gets a key for its closing record; its
    first value of a key stands, and a run without a valid record does not pass.
    """
    cases_file = workdir / (cases_name or f"{mode}{'-secret' if seed is not None else ''}.txt")
    cases_file.write_text(render_cases(cases))
    extra = {}
    if seed is not None:
        extra["POPCORN_SEED"] = str(seed)
    if gpus is not None:
        extra["POPCORN_GPUS"] = str(gpus)
        extra.update(MULTI_GPU_ENV)
    key = secrets.token_hex(16) if is_popkit_harness(workdir / main) else ""
    if key:
        extra["POPKIT_PIPE_KEY"] = key
    watch = None
    if progress is not None:
        watch = LiveProgress(progress, label or mode, len(cases), "test" if mode == "test" else "benchmark")
    done = proc.run([options.python, main, mode, cases_file.name], workdir, child_env(options, **extra),
                    timeout_s, result_fd_env="POPCORN_FD", watch=watch)
    pipe, pipe_problem = sealed_pipe(done.pipe, key) if key else (done.pipe, "")
    if done.pipe_overflow:
        pipe_problem = f"result pipe: the eval wrote more than {proc.PIPE_BYTES // 2**20} MiB on it"
    raw = parse_pipe(pipe.decode("utf-8", "replace"), first_wins=bool(key))
    code = TIMEOUT_EXIT_CODE if done.timed_out else done.code
    run = ModeRun(mode=mode, secret=seed is not None, seed=seed, exit_code=code, duration_s=done.seconds,
                  timeout_s=timeout_s, timed_out=done.timed_out, check=raw.get("check"),
                  tests=_cases(raw, "test", len(cases)), benchmarks=_cases(raw, "benchmark", len(cases)), raw=raw,
                  stdout=done.stdout, stderr=done.stderr)
    run = judge_physics(run)
    outcome, summary = classify(run)
    if outcome == "passed" or pipe_problem.startswith("result-pipe tampering"):
        if pipe_problem:
            outcome, summary = "failed", f"{pipe_problem}: {_where(run)}"
        elif cases and not run.tests and not run.benchmarks:
            outcome, summary = "failed", (f"check failed: {_where(run)} wrote `check: pass` but no case results "
                                          f"for its {len(cases)} case(s)")
    return replace(run, outcome=outcome, summary=summary)


@functools.lru_cache(maxsize=1)
def _popkit_harness_bytes() -> bytes:
    return (data_dir("tasks") / "eval.py").read_bytes()


def is_popkit_harness(path: Path) -> bool:
    """Whether `path` is popkit's own harness (the bundled tasks' eval, or --harness popkit)."""
    try:
        return path.read_bytes() == _popkit_harness_bytes()
    except OSError:
        return False


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n")


def _number(raw: Mapping[str, str], key: str) -> float | None:
    try:
        return float(raw[key])
    except (KeyError, ValueError):
        return None


MALFORMED = "the eval wrote a malformed result"
# How popkit's harness (tasks/eval.py) starts a case's error when the task's own reference failed.
REFERENCE_FAILURES = ("reference.py failed to import: ", "generate_input failed: ", "ref_kernel failed: ")


def _case_numbers(raw: Mapping[str, str], p: str) -> tuple[dict[str, float | None], tuple[float, ...], str]:
    """One case's timing numbers and samples, and what is malformed among them ('' when nothing is).

    A value that is not a number (or a run count or sample that is not finite) fails the case by name:
    a result popkit cannot read is never a pass, nor a crash of popkit.
    """
    numbers, problems = {}, []
    for key in ("runs", "mean", "std", "err", "best", "worst", "median"):
        value = numbers[key] = _number(raw, p + key)
        if p + key in raw and (value is None or key == "runs" and not math.isfinite(value)):
            numbers[key] = None
            problems.append(f"`{p}{key}` is {raw[p + key][:40]!r}, not a number")
    try:
        samples = tuple(float(s) for s in raw.get(p + "samples", "").split(",") if s.strip())
        if not all(map(math.isfinite, samples)):
            raise ValueError
    except ValueError:
        samples = ()
        problems.append(f"`{p}samples` is {raw[p + 'samples'][:40]!r}, not a list of numbers")
    return numbers, samples, f"{MALFORMED}: {problems[0]}" if problems else ""


def _cases(raw: Mapping[str, str], kind: str, limit: int) -> tuple[CaseResult, ...]:
    """The `kind` cases the eval reported; never more than the `limit` cases it was given."""
    try:
        count = max(0, min(int(raw.get(f"{kind}-count", "0")), limit))
    except ValueError:
        count = 0
    cases = []
    for i in range(count):
        p = f"{kind}.{i}."
        numbers, samples, malformed = _case_numbers(raw, p)
        report = raw.get(p + "report", "")
        if report:
            try:
                # The standard evals encode with the alphabet "+*"; translating "*" also reads plain base64.
                report = base64.b64decode(report, altchars=b"+*").decode("utf-8", "replace")
            except (binascii.Error, ValueError):
                pass
        # A benchmark without a status passed when it has a timing or (profile mode) a report.
        implied = "pass" if kind == "benchmark" and (p + "mean" in raw or report) else ""
        cases.append(CaseResult(
            kind=kind, index=i, spec=raw.get(p + "spec", ""),
            passed=raw.get(p + "status", implied) == "pass" and not malformed,
            error=malformed or _unescape(raw.get(p + "error", "")), message=_unescape(raw.get(p + "message", "")),
            runs=int(numbers["runs"] or 0), mean_ns=numbers["mean"], std_ns=numbers["std"], err_ns=numbers["err"],
            best_ns=numbers["best"], worst_ns=numbers["worst"], median_ns=numbers["median"], samples_ns=samples,
            stop=raw.get(p + "stop", ""), timer=raw.get(p + "timer", ""), report=report,
            bytes=int(raw[p + "bytes"]) if raw.get(p + "bytes", "").isdigit() else None,
        ))
    return tuple(cases)


# Python's words when the eval cannot take a name from the submission module.
_MISSING_ENTRY = re.compile(r"cannot import name '(\w+)' from 'submission'"
                            r"|module 'submission' has no attribute '(\w+)'")


def _where(run: ModeRun) -> str:
    return f"{run.mode}{' (secret seed %d)' % run.seed if run.secret else ''}"


def classify(run: ModeRun) -> tuple[str, str]:
    """The outcome of one eval run and its one categorized line."""
    where = _where(run)
    if run.timed_out:
        return "timed_out", f"timed out: {where} ran past its {run.timeout_s:g} s timeout"
    if run.succeeded:
        # The eval's `check` is the verdict; a case whose numbers popkit cannot read fails it anyway.
        failed = [c for c in run.tests + run.benchmarks
                  if not c.passed and (run.check != "pass" or c.error.startswith(MALFORMED))]
        if failed:
            first = failed[0]
            detail = ((first.error or first.message).splitlines() or ["failed"])[0]
            case = f"{where}, {first.kind} {first.spec or first.index}: {detail}"
            if first.error.startswith(REFERENCE_FAILURES):
                return "bad_task", f"task error: {case} (the task's reference failed)"
            return "failed", f"check failed: {case}"
        if run.check == "pass":
            return "passed", ""
        if run.check is None:
            return "crashed", f"crashed: {where} exited {run.exit_code} without writing a `check` line"
        return "failed", f"check failed: {where}"
    err = run.stderr
    if any(m in err for m in COMPILE_MARKERS):
        return "compile_failed", f"compile failed: {where} could not build the extension"
    missing = _MISSING_ENTRY.search(err)
    if missing:
        name = missing.group(1) or missing.group(2)
        return "bad_submission", f"bad submission: no `{name}` could be imported from the submission"
    if "SyntaxError" in err and "submission.py" in err:
        return "bad_submission", "bad submission: syntax error in the submission"
    if run.exit_code < 0:
        name = signal.Signals(-run.exit_code).name if -run.exit_code in signal.valid_signals() else "?"
        return "crashed", f"crashed: {where} was killed by signal {name} ({-run.exit_code})"
    meaning = _PROTOCOL_EXIT.get(run.exit_code)
    suffix = f" ({meaning})" if meaning else ""
    return "crashed", f"crashed: {where} exited with code {run.exit_code}{suffix}"


# ------------------------------------------------------------------------------------- the chain


def chain_modes(mode: str, chain: bool = True) -> tuple[str, ...]:
    """A leaderboard submission runs test, benchmark, leaderboard, each only if the previous passed."""
    if mode not in MODES:
        raise UsageError(f"unknown mode `{mode}`", "modes: " + ", ".join(MODES))
    return ("test", "benchmark", "leaderboard") if mode == "leaderboard" and chain else (mode,)


def _run_chain(task: Task, workdir: Path, main: str, mode: str, options: RunOptions, seed: int | None,
               gpus: int | None, progress: Progress, probe: "SystemProbe | None" = None,
               pristine: Mapping[str, bytes] | None = None) -> list[ModeRun]:
    """One chain of modes; after each, the task files are checked and restored (harness tampering fails it)."""
    runs: list[ModeRun] = []

    def checked(run: ModeRun) -> ModeRun:
        tampered = restore_task_files(workdir, pristine or {}, f"the {_where(run)} mode")
        return replace(run, outcome="failed", summary=tampered) if tampered else run

    for step in chain_modes(mode, options.chain):
        if step != "test" and probe is not None:
            # The probe may import torch and open a CUDA context; nothing but the submission may touch the GPU
            # while it is timed.
            probe.result()
        if step == "profile":
            # Profile runs once per benchmark line.
            for i, case in enumerate(task.cases_for(step)):
                label = f"{step} {i + 1}/{len(task.cases_for(step))}"
                progress(label)
                runs.append(checked(run_mode(workdir, main, step, [case], timeout_s=task.timeout_for(step),
                                             options=options, seed=seed, gpus=gpus, cases_name=f"profile-{i}.txt",
                                             progress=progress, label=label)))
                if runs[-1].outcome != "passed" and runs[-1].summary.startswith("harness tampering"):
                    break
            continue
        label = f"{step}" + (f" (secret seed {seed})" if seed is not None else "")
        progress(label)
        run = checked(run_mode(workdir, main, step, task.cases_for(step), timeout_s=task.timeout_for(step),
                               options=options, seed=seed, gpus=gpus, progress=progress, label=label))
        runs.append(run)
        if run.outcome != "passed":
            break
    return runs


def checked_submission(task: Task, submission: Path, mode: str, options: RunOptions,
                       content: bytes | None = None) -> bytes:
    """The submission's bytes (`content` replaces the file's) after every check that needs no run:
    readable, the task's entry points defined, runnable here in `mode` (check_runnable)."""
    names = entry_points(task, options.harness)
    data = read_submission(submission, names) if content is None else validate_submission(submission, content, names)
    chain_modes(mode)
    check_runnable(task, submission, data, mode)
    return data


@dataclass(frozen=True)
class Workdir:
    """A working directory ready for evals: the task's files, the eval to run, the pre-step's result."""

    path: Path
    main: str
    precompile: CompileStep | None
    skipped: str = ""  # why the pre-step did not run, if it did not (prestep.Decision.reason)
    pristine: Mapping[str, bytes] = field(default_factory=dict)  # every file but the submission, as written
    tampered: str = ""  # the pre-step changed a task file (restored since): the harness-tampering line

    @property
    def build_failed(self) -> bool:
        return self.precompile is not None and self.precompile.build_failed


def set_up(task: Task, submission: Path, data: bytes, workdir: Path, options: RunOptions,
           progress: Progress, side: str = "") -> Workdir:
    """Steps 1 and 2 of the protocol: the task's files flat in `workdir`, then the compile pre-step (`pre_step`).

    When the extension did not build, the pre-step's compiler messages are placed at lines of the
    submission (`compile_diagnostics`). `side` names the candidate of an A/B in the progress line.
    """
    main = prepare_workdir(task, data, workdir, options.harness)
    pristine = {p.name: p.read_bytes() for p in workdir.iterdir() if p.name != task.submission_name}
    step, plan, tampered = pre_step(workdir, task.submission_name, data, options, progress, side, pristine)
    if step is not None and step.build_failed:
        step = replace(step, diagnostics=compile_diagnostics(step, submission, data))
    return Workdir(workdir, main, step, plan.reason, pristine, tampered)


def changed_task_files(workdir: Path, pristine: Mapping[str, bytes]) -> list[str]:
    """The task files in `workdir` that no longer hold their bytes (changed, replaced by a link, removed)."""
    def same(name: str, data: bytes) -> bool:
        path = workdir / name
        try:
            return not path.is_symlink() and path.is_file() and path.read_bytes() == data
        except OSError:
            return False

    return sorted(name for name, data in pristine.items() if not same(name, data))


def restore_task_files(workdir: Path, pristine: Mapping[str, bytes], during: str) -> str:
    """Put back every task file the submission changed, replaced or removed `during` a step.

    Returns the harness-tampering line naming them, or "" when every file still holds its bytes.
    Nothing of the submission runs between steps (its process tree is gone), so checking after each
    step is checking before the next.
    """
    changed = changed_task_files(workdir, pristine)
    for name in changed:
        path = workdir / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass
        path.write_bytes(pristine[name])
    if not changed:
        return ""
    them = "it" if len(changed) == 1 else "them"
    return (f"harness tampering: the submission modified {', '.join(changed)} during {during}; the leaderboard "
            f"would run the modified file (popkit restored {them})")


def eval_gpus(task: Task, system: Mapping[str, Any] | None, probe: "SystemProbe | None") -> int | None:
    """POPCORN_GPUS for a multi-GPU task: the given system's GPU count, else the probe's; None otherwise."""
    if not task.multi_gpu:
        return None
    gpus = (system or {}).get("gpu_count")
    if gpus is None and probe is not None:
        gpus = probe.result().get("gpu_count")
    return gpus


def run_submission(task: Task, submission: Path, mode: str, options: RunOptions = RunOptions(),
                   progress: Progress | None = None, system: Mapping[str, Any] | None = None,
                   content: bytes | None = None) -> RunReport:
    """Run `submission` on `task` in `mode` exactly as the leaderboard runner would.

    The public chain runs first, then (if it passed) one secret chain per seed in options.secret_seeds.
    The user's file is only read; a fresh working directory holds the copy that runs. `content`
    replaces the file's bytes (the `--baseline reference` run has no file of its own).
    """
    progress = progress or (lambda _msg: None)
    data = checked_submission(task, submission, mode, options, content)
    options = with_toolkit(options, data, progress)
    if mode != "test" and not task.benchmarks:
        raise TaskError(f"{task.yml}: no `benchmarks` to run in {mode} mode", "add benchmark cases to task.yml")
    if mode == "test" and not task.tests:
        raise TaskError(f"{task.yml}: no `tests` to run", "add test cases to task.yml")
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    notes: tuple[str, ...] = ()
    if options.world_size is not None:
        asked = sorted({c["world_size"] for c in task.tests + task.benchmarks if "world_size" in c})
        task = scale_world_size(task, options.world_size)
        notes = (f"world_size scaled to {options.world_size} (the task's cases ask for "
                 f"{', '.join(map(str, asked))}): not leaderboard-faithful",)
    probe = probe_and_preflight(task, options, system)
    with proc.WorkDir("popkit-run-", keep=options.keep_workdir) as workdir:
        if options.keep_workdir:
            progress(f"working directory kept: {workdir}")
        prepared = set_up(task, submission, data, workdir, options, progress)
        main, step = prepared.main, prepared.precompile
        if prepared.build_failed:
            # The runner would go on, and every eval would fail rebuilding the same source; the verdict
            # is the same, so popkit stops here and points the compiler's messages at the submission.
            return _report(task, submission, data, mode, options, started, t0, system, probe, step, [], (),
                           notes=notes)
        if prepared.tampered:
            first = chain_modes(mode, options.chain)[0]
            runs = [ModeRun(mode=first, secret=False, seed=None, exit_code=0, duration_s=0.0,
                            timeout_s=task.timeout_for(first), outcome="failed", summary=prepared.tampered)]
            return _report(task, submission, data, mode, options, started, t0, system, probe, step, runs, (),
                           prepared.skipped, notes=notes)
        gpus = eval_gpus(task, system, probe)
        runs = _run_chain(task, workdir, main, mode, options, None, gpus, progress, probe, prepared.pristine)
        secret_seeds = options.secret_seeds
        if all(r.outcome == "passed" for r in runs):
            for seed in secret_seeds:
                secret_runs = _run_chain(task, workdir, main, mode, options, seed, gpus, progress, probe,
                                         prepared.pristine)
                runs.extend(secret_runs)
                if not all(r.outcome == "passed" for r in secret_runs):
                    break
    return _report(task, submission, data, mode, options, started, t0, system, probe, step, runs, secret_seeds,
                   prepared.skipped, notes=notes)


def _report(task: Task, submission: Path, data: bytes, mode: str, options: RunOptions, started: datetime,
            t0: float, system: Mapping[str, Any] | None, probe: "SystemProbe | None", step: CompileStep | None,
            runs: Sequence[ModeRun], secret_seeds: Sequence[int], skipped: str = "",
            notes: Sequence[str] = ()) -> RunReport:
    return RunReport(
        task=task.name, task_path=str(task.path), leaderboard=task.leaderboard, ranking_by=task.ranking_by,
        submission=str(submission), sha256=hashlib.sha256(data).hexdigest(), mode=mode,
        harness=options.harness, started_at=started.isoformat(timespec="seconds"),
        duration_s=time.monotonic() - t0, system=system if system is not None else probe.result(),
        precompile=step, precompile_skipped=skipped, runs=tuple(runs), secret_seeds=tuple(secret_seeds),
        label=options.label or (f"world_size {options.world_size}, scaled" if options.world_size else ""),
        notes=tuple(notes), world_size=options.world_size,
    )


def compile_diagnostics(step: CompileStep, submission: Path, data: bytes) -> tuple[diagnostics.Diagnostic, ...]:
    """The pre-step's compiler messages, placed at lines of the user's file where they map."""
    text = data.decode("utf-8", "replace")
    raw = diagnostics.parse_log(step.stdout + "\n" + step.stderr)
    found = diagnostics.map_diagnostics(raw, diagnostics.SourceMap(submission, text), None)
    return tuple(d for d in found if d.severity == "error")


def probe_and_preflight(task: Task, options: RunOptions, system: Mapping[str, Any] | None) -> "SystemProbe | None":
    """Start the system probe beside the runs (none when `system` is given), then stop here (exit 11) when
    the task cannot run on this machine (runnable.preflight); both see the environment the evals get."""
    env = child_env(options)
    probe = SystemProbe(options.python, env) if system is None else None
    runnable.preflight(task, options.python, lambda: system if system is not None else probe.result(), env=env)
    return probe


class SystemProbe:
    """Probes the eval's interpreter and environment on a thread while the runs go on (system.probe: tens of
    milliseconds from the driver, or seconds where it must import torch)."""

    def __init__(self, python: str, env: Mapping[str, str] | None = None):
        self._result: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(python, env), daemon=True)
        self._thread.start()

    def _run(self, python: str, env: Mapping[str, str] | None) -> None:
        try:
            self._result = dict(system.probe(python, env=env))
        except Exception as exc:  # the report still stands without a system line
            self._result = {"error": f"{type(exc).__name__}: {exc}"}

    def result(self) -> dict[str, Any]:
        self._thread.join(90)
        return self._result


def reference_submission() -> bytes:
    """A submission that runs the task's own ref_kernel (used by `--baseline reference`)."""
    return (b"# popkit baseline: the task's reference implementation\n"
            b"from reference import ref_kernel\n\n\n"
            b"def custom_kernel(data):\n    return ref_kernel(data)\n")
