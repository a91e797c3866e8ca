"""The leaderboard's chain, run locally (docs/protocol-notes.md §2).

One workspace per run holds the task's files flat and the user's bytes under the task's submission
name (executor.Workspace). The compile pre-step runs `python submission.py` once; then each mode runs
`python <main> MODE CASES` with the write end of a pipe passed as POPCORN_FD, under the task's timeout
for that mode: test, then benchmark, then leaderboard, each only if the previous passed, public first
and then once per secret seed. Results come only from the pipe (protocol.py), never from stdout. Where
the processes run is the executor's business (executor.py, sandbox.py); this module is the chain.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from popkit.errors import TaskError
from popkit.machine import gpulock
from popkit.machine import runnable
from popkit.machine import system
from popkit.model import diagnostics
from popkit.model.contract import entry_points
from popkit.model.results import TIMEOUT_EXIT_CODE, CompileStep, ModeRun, RunReport, judge_physics
from popkit.model.tasks import Task, scale_world_size
from popkit.progress import Progress, live_of, timed
from popkit.resources import HARNESS_ENTRY, harness_paths
from popkit.run import proc
from popkit.run import protocol
from popkit.run import sandbox
from popkit.run.executor import POPKIT_EVAL_NAME, Executor, Workspace
from popkit.run.protocol import EvalConvention, chain_modes
from popkit.submission.source import check_runnable, needs_gpu, read_submission, validate_submission
from popkit.toolchain import prestep

# NVLink multicast (NVLS) off for multi-GPU evals: NCCL's and torch's symmetric memory's (the GPU hosts require it).
MULTI_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
PRECOMPILE_TIMEOUT_S = 120.0



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
    isolation: str = "auto"  # sandbox.ISOLATION_CHOICES: "auto", "require" (exit 11 without it) or "none"


# ------------------------------------------------------------------------------------ one process


def child_env(options: RunOptions, **extra: str) -> dict[str, str]:
    """popkit's environment less what popkit sets per child (the protocol's variables), plus the run's."""
    reserved = set(protocol.LEADERBOARD.reserved_env() + protocol.POPKIT_HARNESS.reserved_env())
    env = {k: v for k, v in os.environ.items() if k not in reserved}
    env.update(options.env)
    env.update(extra)
    return env


def with_toolkit(options: RunOptions, data: bytes, progress: Progress) -> RunOptions:
    """A CUDA build gets the toolkit popkit found as CUDA_HOME when torch would guess one that cannot build."""
    if not needs_gpu(data) or "CUDA_HOME" in options.env:
        return options
    home, said = system.toolkit_for_builds(system.cuda_home_problem())
    if not home:
        return options
    progress(said)
    return replace(options, env={**options.env, "CUDA_HOME": home})


def precompile(ws: Workspace, options: RunOptions, timeout_s: float = PRECOMPILE_TIMEOUT_S) -> CompileStep:
    """`python submission.py` once with POPCORN_SEED=1; it warms the load_inline build cache."""
    convention = protocol.LEADERBOARD
    env = child_env(options, **{convention.seed_env: convention.prestep_seed})
    done = ws.run(options.python, ws.submission_name, [], env, timeout_s)
    code = TIMEOUT_EXIT_CODE if done.timed_out else done.code
    log = done.stdout if "-DTORCH_EXTENSION_NAME" in done.stdout else ""
    return CompileStep(exit_code=code, duration_s=done.seconds, timed_out=done.timed_out, log=log,
                       stdout=done.stdout, stderr=done.stderr)


def pre_step(ws: Workspace, content: bytes, options: RunOptions, progress: Progress, side: str = ""
             ) -> tuple[CompileStep | None, prestep.Decision, str]:
    """The compile pre-step where it can matter (prestep.decide); a success is recorded in the build-cache index.

    Task files the pre-step changed and modules it planted are put right and named in the third value
    (Workspace.tampered); such a pre-step is never recorded, so the next run does not skip it.
    """
    what = "compile pre-step" + (f" {side}" if side else "")
    env = child_env(options)
    plan = prestep.decide(content, options.precompile, options.python, env,
                          lambda key: ws.executor.holds_build(ws, key))
    if plan.reason:
        progress(f"{what}: skipped ({plan.reason})")
    if not plan.run:
        return None, plan, ""
    progress(what)
    with timed(progress, what):
        step = precompile(ws, options)
    tampered = ws.tampered("the compile pre-step")
    if step.ok and not tampered:
        prestep.record(plan.key, env)
    return step, plan, tampered


class LiveProgress:
    """Live progress of one child from its result pipe as it arrives: step, case i/N and its spec, elapsed.

    Calls `progress.live(text, key)` when the progress printer has one (the CLI's does); `key` changes
    when the step or case does, so a printer for pipes can write a line per case, not per second. Only the
    bytes after the last newline are kept between chunks, and at most LINE_LIMIT of them: a huge line costs
    one scan of each chunk, never a rebuild per chunk (the thread that reads also enforces the timeout).
    """

    LINE_LIMIT = 4096

    def __init__(self, progress: Progress | None, label: str, total: int = 0, kind: str = ""):
        self._live = live_of(progress)
        self.label, self.total, self.kind = label, total, kind
        self.start = time.monotonic()
        self.index, self.spec = -1, ""
        self._partial = bytearray()

    def __call__(self, data: bytes) -> None:
        if self._live is None:
            return
        if data:
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(self._partial) < self.LINE_LIMIT:
                    self._partial += data[:self.LINE_LIMIT - len(self._partial)]
            else:
                lines = bytes(self._partial) + data[:cut]
                self._partial = bytearray(data[cut + 1:cut + 1 + self.LINE_LIMIT])
                for line in lines.split(b"\n"):
                    self._see(line[:self.LINE_LIMIT].decode("utf-8", "replace"))
        self._live(self.text(), f"{self.label}/{self.index}")

    def _see(self, line: str) -> None:
        pair = protocol.pipe_pair(line)
        if pair is None:
            return
        parts = pair[0].split(".")
        if len(parts) == 3 and parts[0] == self.kind and parts[1].isdigit() and parts[2] == "spec":
            self.index, self.spec = int(parts[1]), pair[1]

    def text(self) -> str:
        elapsed = f"{time.monotonic() - self.start:.0f} s"
        if self.index >= 0:
            of = f"/{self.total}" if self.total else ""
            return f"{self.label} · case {self.index + 1}{of}: {self.spec} · {elapsed}"
        cases = f" · {self.total} case{'s' if self.total != 1 else ''}" if self.total else ""
        return f"{self.label}{cases} · {elapsed}"


def convention_of(ws: Workspace, main: str) -> EvalConvention:
    """popkit's harness (sealed record, first value wins) or a leaderboard eval, by the file that runs."""
    return protocol.POPKIT_HARNESS if is_popkit_harness(ws.files / main) else protocol.LEADERBOARD


def run_mode(ws: Workspace, main: str, mode: str, cases: Sequence[Mapping[str, Any]], *, timeout_s: float,
             options: RunOptions, seed: int | None = None, gpu_count: int | None = None,
             cases_name: str | None = None, progress: Progress | None = None, label: str = "") -> ModeRun:
    """One eval process: `python <main> MODE CASES` with the result pipe; what it wrote, decoded and judged.

    Reading stops when the eval exits. popkit's own harness gets a fresh key on a descriptor for its closing
    record; its first value of a key stands, and a run without a valid record does not pass.
    """
    convention = convention_of(ws, main)
    name = cases_name or f"{mode}{'-secret' if seed is not None else ''}.txt"
    ws.write_cases(name, protocol.render_cases(cases))
    extra = convention.env(seed, gpu_count)
    if gpu_count is not None:
        extra.update(MULTI_GPU_ENV)
    key = secrets.token_hex(16) if convention.sealed else ""
    watch = None
    if progress is not None:
        watch = LiveProgress(progress, label or mode, len(cases), protocol.case_kind(mode))
    env = child_env(options, **extra)
    with gpulock.timing(mode, ws.executor.env(env), gpu_count, waiting=progress):
        done = ws.run(options.python, main, [mode, name], env, timeout_s,
                      result_fd_env=convention.result_fd_env, watch=watch,
                      inputs={convention.key_fd_env: key.encode()} if key else None)
    return decode_mode(done, mode, len(cases), timeout_s=timeout_s, convention=convention, key=key, seed=seed)


def decode_mode(done: proc.Finished, mode: str, cases: int, *, timeout_s: float, convention: EvalConvention,
                key: str = "", seed: int | None = None, seconds: float | None = None) -> ModeRun:
    """The ModeRun of a finished eval of `cases` cases: its pipe (checked against `key`'s closing record when
    the eval is sealed), decoded and judged. `seconds` replaces the process's own time (a warm start's run is
    timed from its `go`)."""
    pipe, pipe_problem = protocol.sealed_pipe(done.pipe, key) if key else (done.pipe, "")
    if done.pipe_overflow:
        pipe_problem = f"result pipe: the eval wrote more than {proc.PIPE_BYTES // 2**20} MiB on it"
    raw = protocol.parse_pipe(pipe.decode("utf-8", "replace"), first_wins=convention.first_wins)
    run = ModeRun(mode=mode, secret=seed is not None, seed=seed,
                  exit_code=TIMEOUT_EXIT_CODE if done.timed_out else done.code,
                  duration_s=done.seconds if seconds is None else seconds,
                  timeout_s=timeout_s, timed_out=done.timed_out, check=raw.get("check"),
                  tests=protocol.decode_cases(raw, "test", cases),
                  benchmarks=protocol.decode_cases(raw, "benchmark", cases), raw=raw,
                  stdout=done.stdout, stderr=done.stderr)
    return protocol.judge(judge_physics(run), cases, pipe_problem)


_HARNESS_BYTES: list[bytes] = []


def is_popkit_harness(path: Path) -> bool:
    """Whether `path` is popkit's own harness (the bundled tasks' eval, or --harness popkit)."""
    if not _HARNESS_BYTES:
        _HARNESS_BYTES.append(harness_paths()[HARNESS_ENTRY].read_bytes())
    try:
        return path.read_bytes() == _HARNESS_BYTES[0]
    except OSError:
        return False


# ------------------------------------------------------------------------------------- the chain


def run_chain(task: Task, prepared: "Prepared", mode: str, options: RunOptions, seed: int | None,
              gpu_count: int | None, progress: Progress, probe: "SystemProbe | None" = None) -> list[ModeRun]:
    """One chain of modes; after each, the workspace is checked and put right (harness tampering fails it)."""
    ws, main, runs = prepared.workspace, prepared.main, []

    def checked(run: ModeRun) -> ModeRun:
        tampered = ws.tampered(f"the {protocol.where(run)} mode")
        return replace(run, outcome="failed", summary=tampered) if tampered else run

    for step in chain_modes(mode, options.chain):
        if step != "test" and probe is not None:
            # The probe may import torch and open a CUDA context; nothing but the submission may touch the GPU
            # while it is timed.
            probe.result()
        if step == "profile":  # profile runs once per benchmark line
            cases = task.cases_for(step)
            for i, case in enumerate(cases):
                label = f"{step} {i + 1}/{len(cases)}"
                progress(label)
                runs.append(checked(run_mode(ws, main, step, [case], timeout_s=task.timeout_for(step),
                                             options=options, seed=seed, gpu_count=gpu_count, cases_name=f"profile-{i}.txt",
                                             progress=progress, label=label)))
                if runs[-1].summary.startswith("harness tampering"):
                    break
            continue
        label = f"{step}" + (f" (secret seed {seed})" if seed is not None else "")
        progress(label)
        run = checked(run_mode(ws, main, step, task.cases_for(step), timeout_s=task.timeout_for(step),
                               options=options, seed=seed, gpu_count=gpu_count, progress=progress, label=label))
        runs.append(run)
        if run.outcome != "passed":
            break
    return runs


def checked_submission(task: Task, submission: Path, mode: str, options: RunOptions,
                       content: bytes | None = None) -> bytes:
    """The submission's bytes (`content` replaces the file's) after every check that needs no run:
    readable, the task's entry points defined, runnable here in `mode` (source.check_runnable)."""
    names = entry_points(task, options.harness)
    data = read_submission(submission, names) if content is None else validate_submission(submission, content, names)
    chain_modes(mode)
    check_runnable(task, submission, data, mode)
    return data


@dataclass(frozen=True)
class Prepared:
    """A workspace ready for evals: the task's files, the eval to run, the pre-step's result."""

    workspace: Workspace
    main: str
    precompile: CompileStep | None
    skipped: str = ""  # why the pre-step did not run, if it did not (prestep.Decision.reason)
    tampered: str = ""  # the pre-step changed a task file or planted a module (put right since)

    @property
    def build_failed(self) -> bool:
        return self.precompile is not None and self.precompile.build_failed


def set_up(task: Task, submission: Path, data: bytes, ws: Workspace, options: RunOptions,
           progress: Progress, side: str = "") -> Prepared:
    """Steps 1 and 2 of the protocol: the task's files flat in the workspace, then the compile pre-step.

    When the extension did not build, the pre-step's compiler messages are placed at lines of the
    submission (`compile_diagnostics`). `side` names the candidate of an A/B in the progress line.
    """
    main = ws.prepare(task, data, options.harness, later=True)
    step, plan, tampered = pre_step(ws, data, options, progress, side)
    if step is not None and step.build_failed:
        step = replace(step, diagnostics=compile_diagnostics(step, submission, data))
    return Prepared(ws, main, step, plan.reason, tampered)


def eval_gpu_count(task: Task, system: Mapping[str, Any] | None, probe: "SystemProbe | None") -> int | None:
    """POPCORN_GPUS for a multi-GPU task: the given system's GPU count, else the probe's; None otherwise."""
    if not task.multi_gpu:
        return None
    count = (system or {}).get("gpu_count")
    if count is None and probe is not None:
        count = probe.result().get("gpu_count")
    return count


def run_submission(task: Task, submission: Path, mode: str, options: RunOptions = RunOptions(),
                   progress: Progress | None = None, system: Mapping[str, Any] | None = None,
                   content: bytes | None = None, executor: Executor | None = None) -> RunReport:
    """Run `submission` on `task` in `mode` exactly as the leaderboard runner would.

    The public chain runs first, then (if it passed) one secret chain per seed in options.secret_seeds.
    The user's file is only read; a fresh workspace of `executor` (default: sandbox.executor_for the run's
    isolation) holds the copy that runs. `content` replaces the file's bytes (the `--baseline reference`
    run has no file of its own).
    """
    progress = progress or (lambda _msg: None)
    data = checked_submission(task, submission, mode, options, content)
    executor = executor or sandbox.executor_for(options.isolation)
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
    # A chain that starts with test mode starts the probe beside its first process (on a busy CPU, a probe
    # started before it delays it); any other mode waits for the probe before it runs (run_chain).
    first = chain_modes(mode, options.chain)[0]
    probe = probe_and_preflight(task, options, system, executor, start=first != "test")
    report = reporter(task, submission, data, mode, options, started, t0, system, probe, notes,
                                      executor)
    with executor.workspace("popkit-run-", keep=options.keep_workdir) as ws:
        if probe is not None:
            ws.after_start(probe.start)
        if options.keep_workdir:
            progress(f"working directory kept: {ws.root}")
        prepared = set_up(task, submission, data, ws, options, progress)
        step = prepared.precompile
        if prepared.build_failed:
            # The runner would go on, and every eval would fail rebuilding the same source; the verdict
            # is the same, so popkit stops here and points the compiler's messages at the submission.
            return report(step, [], ())
        if prepared.tampered:
            runs = [ModeRun(mode=first, secret=False, seed=None, exit_code=0, duration_s=0.0,
                            timeout_s=task.timeout_for(first), outcome="failed", summary=prepared.tampered)]
            return report(step, runs, (), prepared.skipped)
        gpu_count = eval_gpu_count(task, system, probe)
        runs = run_chain(task, prepared, mode, options, None, gpu_count, progress, probe)
        if all(r.outcome == "passed" for r in runs):
            for seed in options.secret_seeds:
                secret_runs = run_chain(task, prepared, mode, options, seed, gpu_count, progress, probe)
                runs.extend(secret_runs)
                if not all(r.outcome == "passed" for r in secret_runs):
                    break
    return report(step, runs, options.secret_seeds, prepared.skipped)


def reporter(task: Task, submission: Path, data: bytes, mode: str, options: RunOptions,
                             started: datetime, t0: float, system: Mapping[str, Any] | None,
                             probe: "SystemProbe | None", notes: Sequence[str], executor: Executor):
    """The RunReport of this run, given what ran: (pre-step, runs, secret seeds, why the pre-step was skipped)."""

    def report(step: CompileStep | None, runs: Sequence[ModeRun], secret_seeds: Sequence[int],
               skipped: str = "") -> RunReport:
        return RunReport(
            task=task.name, task_path=str(task.path), leaderboard=task.leaderboard, ranking_by=task.ranking_by,
            submission=str(submission), sha256=hashlib.sha256(data).hexdigest(), mode=mode,
            harness=options.harness, started_at=started.isoformat(timespec="seconds"),
            duration_s=time.monotonic() - t0, system=system if system is not None else probe.result(),
            precompile=step, precompile_skipped=skipped, runs=tuple(runs), secret_seeds=tuple(secret_seeds),
            label=options.label or (f"world_size {options.world_size}, scaled" if options.world_size else ""),
            notes=tuple(notes), world_size=options.world_size, isolation=executor.isolation.to_json(),
        )

    return report


def compile_diagnostics(step: CompileStep, submission: Path, data: bytes) -> tuple[diagnostics.Diagnostic, ...]:
    """The pre-step's compiler messages, placed at lines of the user's file where they map."""
    text = data.decode("utf-8", "replace")
    raw = diagnostics.parse_log(step.stdout + "\n" + step.stderr)
    found = diagnostics.map_diagnostics(raw, diagnostics.SourceMap(submission, text), None)
    return tuple(d for d in found if d.severity == "error")


def probe_and_preflight(task: Task, options: RunOptions, system: Mapping[str, Any] | None,
                        executor: Executor | None = None, start: bool = True) -> "SystemProbe | None":
    """The system probe to run beside the runs (none when `system` is given; started now, or with `start`
    False by its start() or first result()), after stopping here (exit 11) when the task cannot run on this
    machine (runnable.preflight); both see the environment the evals get."""
    env = (executor or Executor()).env(child_env(options))
    probe = SystemProbe(options.python, env, start=start) if system is None else None
    runnable.preflight(task, options.python, lambda: system if system is not None else probe.result(), env=env,
                       harness=options.harness)
    return probe


class SystemProbe:
    """Probes the eval's interpreter and environment on a thread while the runs go on (system.probe: tens of
    milliseconds from the driver, or seconds where it must import torch), from start() or the first result()."""

    def __init__(self, python: str, env: Mapping[str, str] | None = None, start: bool = True):
        self._result: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(python, env), daemon=True)
        self._lock = threading.Lock()
        if start:
            self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread.ident is None:
                self._thread.start()

    def _run(self, python: str, env: Mapping[str, str] | None) -> None:
        try:
            self._result = dict(system.probe(python, env=env))
        except Exception as exc:  # the report still stands without a system line
            self._result = {"error": f"{type(exc).__name__}: {exc}"}

    def result(self) -> dict[str, Any]:
        self.start()
        self._thread.join(90)
        return self._result


__all__ = ["RunOptions", "run_submission", "run_mode", "run_chain", "set_up", "Prepared", "POPKIT_EVAL_NAME"]
