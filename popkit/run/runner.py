"""The leaderboard's chain, run locally (docs/protocol-notes.md §2).

One workspace per run holds the task's files flat and the user's bytes under the task's submission
name (executor.Workspace). The compile pre-step runs `python submission.py` once; then each mode runs
`python <main> MODE CASES` with the write end of a pipe passed as POPCORN_FD, under the task's timeout
for that mode: test, then benchmark, then leaderboard, each only if the previous passed, public first
and then once per secret seed. Results come only from the pipe (protocol.py), never from stdout. Where
the processes run is the executor's business (executor.py, sandbox.py); this module is the chain.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from popkit.errors import TaskError
from popkit.machine import gpulock
from popkit.machine import runnable
from popkit.machine import system
from popkit.model import diagnostics
from popkit.model.contract import entry_points
from popkit.model.results import TIMEOUT_EXIT_CODE, CompileStep, ModeRun, RunReport
from popkit.model.tasks import Task, scale_world_size
from popkit.progress import Progress, timed
from popkit.resources import HARNESS_ENTRY, harness_paths
from popkit.run import proc
from popkit.run import protocol
from popkit.run import sandbox
from popkit.run.executor import POPKIT_EVAL_NAME, Executor, Workspace
from popkit.run.beside import LiveProgress, SystemProbe
from popkit.run.protocol import EvalConvention, chain_modes, decode_mode
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


_HARNESS_BYTES: list[bytes] = []


def is_popkit_harness(path: Path) -> bool:
    """Whether `path` is popkit's own harness (the bundled tasks' eval, or --harness popkit)."""
    if not _HARNESS_BYTES:
        _HARNESS_BYTES.append(harness_paths()[HARNESS_ENTRY].read_bytes())
    try:
        return path.read_bytes() == _HARNESS_BYTES[0]
    except OSError:
        return False


# ------------------------------------------------------------------------------------- the session


def checked_submission(task: Task, submission: Path, mode: str, options: RunOptions,
                       content: bytes | None = None) -> bytes:
    """The submission's bytes (`content` replaces the file's) after every check that needs no run:
    readable, the task's entry points defined, runnable here in `mode` (source.check_runnable)."""
    names = entry_points(task, options.harness)
    data = read_submission(submission, names) if content is None else validate_submission(submission, content, names)
    chain_modes(mode)
    check_runnable(task, submission, data, mode)
    return data


@dataclass
class Side:
    """One submission of a session: its bytes, its workspace, and what setting it up gave."""

    name: str  # "" in a session of one submission; "A" or "B" in an A/B's
    path: Path
    data: bytes
    workspace: Workspace | None = None
    main: str = ""  # the eval that runs (the task's, or popkit's harness in its place)
    precompile: CompileStep | None = None
    skipped: str = ""  # why the pre-step did not run, if it did not (prestep.Decision.reason)
    tampered: str = ""  # the pre-step changed a task file or planted a module (put right since)

    @property
    def build_failed(self) -> bool:
        return self.precompile is not None and self.precompile.build_failed


class RunSession:
    """One task's run of a submission (or of an A/B's two), prepared once: what ab, warm, tune and the cluster
    share with `run_submission` (docs/design.md, "The run session").

    Made from (task, submission, mode, options): the bytes checked as a run checks them (`check` False: the caller
    did, or runs bytes it made, a tune variant's), the CUDA toolkit found for a CUDA build (with_toolkit), the
    executor chosen (default: sandbox.executor_for the isolation), a multi-GPU task's cases scaled to
    options.world_size. `submission` maps side names to paths for an A/B ({"A": a, "B": b}, `content` likewise).

    `with session:` stops where the machine cannot run the task (runnable.preflight) and starts the system probe,
    makes one workspace per side (removed at the end unless options.keep_workdir) and sets each side up (the
    task's files, the compile pre-step); `opened(...)` does a part of that. Then `run` runs one eval of a mode,
    checked for tampering; `chain` the leaderboard's chain of modes; `chains` the public chain and the secret
    ones; `report` makes the RunReport. `run_eval` stands in for run_mode (tests).
    """

    def __init__(self, task: Task, submission: Path | str | Mapping[str, Path | str] | None, mode: str = "test",
                 options: RunOptions = RunOptions(), *, content: bytes | Mapping[str, bytes | None] | None = None,
                 executor: Executor | None = None, system: Mapping[str, Any] | None = None,
                 progress: Progress | None = None, check: bool = True, run_eval: Callable[..., ModeRun] | None = None):
        self.mode, self.system, self.run_eval = mode, system, run_eval
        self.progress: Progress = progress or (lambda _msg: None)
        paths = dict(submission) if isinstance(submission, Mapping) else {"": submission or task.submission_name}
        given = content if isinstance(content, Mapping) else {"": content}
        self.sides: dict[str, Side] = {}
        for name, path in paths.items():
            data = given.get(name)
            if check:
                data = checked_submission(task, Path(path), mode, options, data)
            self.sides[name] = Side(name, Path(path), Path(path).read_bytes() if data is None else data)
        self.executor = executor or sandbox.executor_for(options.isolation)
        for side in self.sides.values():
            options = with_toolkit(options, side.data, self.progress)
        self.options, self.task, self.notes = options, task, ()
        if options.world_size is not None:
            asked = sorted({c["world_size"] for c in task.tests + task.benchmarks if "world_size" in c})
            self.task = scale_world_size(task, options.world_size)
            self.notes = (f"world_size scaled to {options.world_size} (the task's cases ask for "
                          f"{', '.join(map(str, asked))}): not leaderboard-faithful",)
        self.started, self.t0 = datetime.now(timezone.utc), time.monotonic()
        self.probe: SystemProbe | None = None
        self._open: Any = None

    @property
    def side(self) -> Side:
        """The one side of a session of one submission."""
        return self.sides[""]

    @property
    def workspace(self) -> Workspace:
        return self.side.workspace  # type: ignore[return-value]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment every child of this session gets (child_env of its options), plus `extra`."""
        return child_env(self.options, **extra)

    def preflight(self) -> Mapping[str, Any]:
        """Stop here (exit 11) where this machine cannot run the task; else the system the evals see."""
        probe = probe_and_preflight(self.task, self.options, self.system, self.executor)
        return self.system if probe is None else probe.result()  # type: ignore[return-value]

    # ------------------------------------------------------------------------------- the workspaces

    def __enter__(self) -> "RunSession":
        self._open = self.opened()
        return self._open.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        opened, self._open = self._open, None
        return opened.__exit__(*exc)

    @contextlib.contextmanager
    def opened(self, prefix: str = "", *, preflight: bool = True, set_up: bool = True) -> Iterator["RunSession"]:
        """The session's workspaces for the block (`prefix`: their folder's name; default popkit-run- or
        popkit-ab-), after the preflight and with the probe (`preflight`), each side set up (`set_up`)."""
        keep = self.options.keep_workdir
        if preflight:
            # A chain that starts with test mode starts the probe beside its first process (on a busy CPU, a probe
            # started before it delays it); any other mode starts it now, and waits for it before it runs (`chain`).
            first = chain_modes(self.mode, self.options.chain)[0]
            self.probe = probe_and_preflight(self.task, self.options, self.system, self.executor,
                                             start=first != "test")
        with contextlib.ExitStack() as stack:
            if list(self.sides) == [""]:
                ws = self.side.workspace = stack.enter_context(self.executor.workspace(prefix or "popkit-run-", keep))
                if self.probe is not None:
                    ws.after_start(self.probe.start)
                if keep:
                    self.progress(f"working directory kept: {ws.root}")
            else:
                root = stack.enter_context(proc.WorkDir(prefix or "popkit-ab-", keep=keep))
                if keep:
                    self.progress(f"working directories kept: {root}")
                for side in self.sides.values():
                    side.workspace = self.executor.new_workspace(root / side.name)
            if set_up:
                self.set_up()
            yield self

    def set_up(self) -> None:
        """Steps 1 and 2 of the protocol on every side: the task's files flat in the workspace, then the compile
        pre-step (an A/B's two at once: nothing is timed yet). Where the extension did not build, the compiler's
        messages are placed at lines of the submission (compile_diagnostics)."""
        if len(self.sides) == 1:
            self._set_up(next(iter(self.sides.values())))
            return
        from concurrent.futures import ThreadPoolExecutor  # here: it brings logging, which few runs need

        with ThreadPoolExecutor(len(self.sides)) as pool:
            for job in [pool.submit(self._set_up, side) for side in self.sides.values()]:
                job.result()

    def _set_up(self, side: Side) -> None:
        self.place(later=True, side=side.name)
        step = self.pre_step(side=side.name)
        if step is not None and step.build_failed:
            side.precompile = replace(step, diagnostics=compile_diagnostics(step, side.path, side.data))

    def place(self, later: bool = False, side: str = "") -> str:
        """The task's files and the side's bytes in its workspace (`later`: the files' read-only seal after the
        pre-step, Workspace.prepare); returns the eval that runs."""
        s = self.sides[side]
        s.main = s.workspace.prepare(self.task, s.data, self.options.harness, later=later)
        return s.main

    def replace(self, content: bytes, side: str = "") -> None:
        """New bytes for the side, in place of the ones in its workspace (a warm worker's save)."""
        s = self.sides[side]
        s.workspace.replace_submission(content)
        s.data = content

    def pre_step(self, progress: Progress | None = None, side: str = "") -> CompileStep | None:
        """The compile pre-step of the side's bytes where it can matter (`pre_step`); kept on the side."""
        s = self.sides[side]
        step, plan, s.tampered = pre_step(s.workspace, s.data, self.options, progress or self.progress, side)
        s.precompile, s.skipped = step, plan.reason
        return step

    def build(self, timeout_s: float, side: str = "") -> tuple[CompileStep, str]:
        """The compile step alone with its own timeout (a build that prepares evals, not one of them): the step,
        its compiler errors placed at lines of the submission, and the harness-tampering line ("" when none)."""
        s = self.sides[side]
        step = precompile(s.workspace, self.options, timeout_s=timeout_s)
        tampered = s.workspace.tampered("the compile pre-step")
        if step.build_failed:
            step = replace(step, diagnostics=compile_diagnostics(step, s.path, s.data))
        return step, tampered

    def script(self, name: str, source: bytes, args: Sequence[str], timeout_s: float, side: str = "") -> proc.Finished:
        """A helper script of popkit's (`source`, written as `name`) run in the side's workspace as its evals run,
        sharing the GPU as a test-mode eval does (it runs the submission or the task's code, timing nothing)."""
        ws = self.sides[side].workspace
        ws.add(name, source)
        env = self.env()
        with gpulock.timing("test", ws.executor.env(env)):
            return ws.run(self.options.python, name, list(args), env, timeout_s)

    # ------------------------------------------------------------------------------------ the runs

    @functools.cached_property
    def gpu_count(self) -> int | None:
        """POPCORN_GPUS for a multi-GPU task: the given system's GPU count, else the probe's; None otherwise."""
        if not self.task.multi_gpu:
            return None
        count = (self.system or {}).get("gpu_count")
        return self.probe.result().get("gpu_count") if count is None and self.probe is not None else count

    def run(self, mode: str, cases: Sequence[Mapping[str, Any]] | None = None, *, side: str = "",
            seed: int | None = None, cases_name: str | None = None, label: str = "", live: bool = True) -> ModeRun:
        """One eval of `mode` on the side (`cases`: default the task's), then its workspace checked and put right:
        tampering, in it or in the pre-step, fails it. `live`: the child's progress is shown as it runs."""
        s = self.sides[side]
        cases = self.task.cases_for(mode) if cases is None else cases
        shown = dict(progress=self.progress, label=label or mode) if live else {}
        run = (self.run_eval or run_mode)(s.workspace, s.main, mode, cases, timeout_s=self.task.timeout_for(mode),
                                          options=self.options, seed=seed, gpu_count=self.gpu_count,
                                          cases_name=cases_name, **shown)
        return self._checked(run, s)

    def judged(self, done: proc.Finished, mode: str, *, convention: EvalConvention, key: str, seconds: float,
               side: str = "", count: int | None = None) -> ModeRun:
        """The ModeRun of an eval of `count` cases (default: the task's for `mode`) that ran outside `run` (a warm
        worker's), decoded, judged and checked for tampering as `run` checks its own."""
        count = len(self.task.cases_for(mode)) if count is None else count
        run = decode_mode(done, mode, count, timeout_s=self.task.timeout_for(mode),
                          convention=convention, key=key, seconds=seconds)
        return self._checked(run, self.sides[side])

    def _checked(self, run: ModeRun, s: Side) -> ModeRun:
        where = f"the {protocol.where(run)} mode" + (f" of side {s.name}" if s.name else "")
        tampered = s.tampered or s.workspace.tampered(where)
        return replace(run, outcome="failed", summary=tampered) if tampered else run

    def chain(self, seed: int | None = None) -> list[ModeRun]:
        """The session's mode as the leaderboard chains it (test, benchmark, leaderboard, each only if the one
        before passed); profile mode once per benchmark line."""
        runs: list[ModeRun] = []
        for step in chain_modes(self.mode, self.options.chain):
            if step != "test" and self.probe is not None:
                # The probe may import torch and open a CUDA context; nothing but the submission may touch the GPU
                # while it is timed.
                self.probe.result()
            if step == "profile":
                cases = self.task.cases_for(step)
                for i, case in enumerate(cases):
                    label = f"{step} {i + 1}/{len(cases)}"
                    self.progress(label)
                    runs.append(self.run(step, [case], seed=seed, cases_name=f"profile-{i}.txt", label=label))
                    if runs[-1].summary.startswith("harness tampering"):
                        break
                continue
            label = f"{step}" + (f" (secret seed {seed})" if seed is not None else "")
            self.progress(label)
            runs.append(self.run(step, seed=seed, label=label))
            if runs[-1].outcome != "passed":
                break
        return runs

    def chains(self) -> list[ModeRun]:
        """The public chain, then (while each passes) one secret chain per seed in options.secret_seeds. Nothing when
        the build failed: the runner would go on, and every eval would fail rebuilding the same source; the verdict
        is the same, so popkit stops there and points the compiler's messages at the submission."""
        s = self.side
        if s.build_failed:
            return []
        if s.tampered:
            first = chain_modes(self.mode, self.options.chain)[0]
            return [ModeRun(mode=first, secret=False, seed=None, exit_code=0, duration_s=0.0,
                            timeout_s=self.task.timeout_for(first), outcome="failed", summary=s.tampered)]
        runs = self.chain()
        if all(r.outcome == "passed" for r in runs):
            for seed in self.options.secret_seeds:
                secret_runs = self.chain(seed)
                runs.extend(secret_runs)
                if not all(r.outcome == "passed" for r in secret_runs):
                    break
        return runs

    def report(self, runs: Sequence[ModeRun], *, started: datetime | None = None, t0: float | None = None
               ) -> RunReport:
        """The RunReport of the side's runs (secret seeds named once a chain ran); `started` and `t0` (monotonic)
        replace the session's own start (a warm verdict is timed from its save)."""
        s, options = self.side, self.options
        seeds = options.secret_seeds if runs and not s.tampered else ()
        return RunReport(
            task=self.task.name, task_path=str(self.task.path), leaderboard=self.task.leaderboard,
            ranking_by=self.task.ranking_by, submission=str(s.path), sha256=hashlib.sha256(s.data).hexdigest(),
            mode=self.mode, harness=options.harness,
            started_at=(started or self.started).isoformat(timespec="seconds"),
            duration_s=time.monotonic() - (self.t0 if t0 is None else t0),
            system=self.system if self.system is not None else self.probe.result(),  # type: ignore[union-attr]
            precompile=s.precompile, precompile_skipped=s.skipped, runs=tuple(runs),
            secret_seeds=tuple(seeds),
            label=options.label or (f"world_size {options.world_size}, scaled" if options.world_size else ""),
            notes=tuple(self.notes), world_size=options.world_size, isolation=self.executor.isolation.to_json())


def run_submission(task: Task, submission: Path, mode: str, options: RunOptions = RunOptions(),
                   progress: Progress | None = None, system: Mapping[str, Any] | None = None,
                   content: bytes | None = None, executor: Executor | None = None) -> RunReport:
    """Run `submission` on `task` in `mode` exactly as the leaderboard runner would: one RunSession's chains.

    The public chain runs first, then (if it passed) one secret chain per seed in options.secret_seeds.
    The user's file is only read; a fresh workspace of `executor` (default: sandbox.executor_for the run's
    isolation) holds the copy that runs. `content` replaces the file's bytes (the `--baseline reference`
    run has no file of its own).
    """
    session = RunSession(task, submission, mode, options, content=content, executor=executor, system=system,
                         progress=progress)
    if mode != "test" and not task.benchmarks:
        raise TaskError(f"{task.yml}: no `benchmarks` to run in {mode} mode", "add benchmark cases to task.yml")
    if mode == "test" and not task.tests:
        raise TaskError(f"{task.yml}: no `tests` to run", "add test cases to task.yml")
    with session:
        runs = session.chains()
        if session.side.build_failed or session.side.tampered:
            return session.report(runs)  # timed without the workspace's removal, as it stopped inside it
    return session.report(runs)


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
    machine (runnable.preflight); both see the environment the evals get, and run what they must run of the
    evals' interpreter in the evals' sandbox (sandbox.scripts)."""
    executor = executor or sandbox.executor_for(options.isolation)
    env = executor.env(child_env(options))
    probe = SystemProbe(options.python, env, start=start, executor=executor) if system is None else None
    runnable.preflight(task, options.python, lambda: system if system is not None else probe.result(), env=env,
                       harness=options.harness, scripts=sandbox.scripts(executor))
    return probe


__all__ = ["RunOptions", "RunSession", "Side", "run_submission", "run_mode", "child_env", "POPKIT_EVAL_NAME"]
