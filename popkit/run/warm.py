"""A warm worker: popkit's harness started before the save it will judge (`popkit test --watch`).

A `WarmPair` is one eval of popkit's harness (tasks/eval.py, its parent process and its spawned worker)
started the way a cold eval starts: the same executor (the sandbox's namespaces, uid 65534, read-only
files), a fresh workspace with the task's files, the same command line (`python eval.py MODE CASES`), the
same environment. It gets a control descriptor (POPKIT_CONTROL_FD) instead of the key's: it imports torch
and the reference, sets the device up, generates the cases' inputs, writes `popkit.warm: ready` on the
pipe, and waits. `go()` puts the saved bytes in the workspace (from outside the sandbox: its files folder
is read-only only inside), runs the compile pre-step where a cold run would, writes the cases file anew and
sends `go` with the mode, the cases and a fresh key; the pair imports the submission, runs the mode as a
cold eval runs it and exits. The pair's workspace, pre-step, decoding and tamper check are a run session's
(runner.RunSession: the same code as every cold mode's).

A pair is used once: it is discarded after its verdict (or when the watch stops), its processes killed and
its folder removed, and the watch starts a new one. No process that ran submission code is ever reused.

`Ahead` starts several pairs at once for evals that run one after another (tune's race rounds): their start-ups
overlap, and each eval then pays its `go` alone.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from popkit.errors import UsageError
from popkit.machine import gpulock
from popkit.model.contract import entry_points
from popkit.model.results import CompileStep, ModeRun, RunReport
from popkit.model.tasks import Task
from popkit.progress import Progress
from popkit.run import proc
from popkit.run import protocol
from popkit.run import runner
from popkit.run.beside import LiveProgress
from popkit.run.executor import Executor, Workspace

READY_LINE = b"popkit.warm: ready\n"  # tasks/popkit_protocol.py's WARM_READY_LINE: the one line before `go`, unsealed
IDLE_S = 3600.0  # a pair that gets no `go` within this many seconds ends; the next save starts a new one
REFERENCE_NAMES = ("generate_input", "ref_kernel", "check_implementation")  # what popkit's harness calls
JOIN_S = 15.0  # discard(): the process tree is gone within DEADLINE_POLL_S + 2 x KILL_GRACE_S
AHEAD = 4  # pairs an Ahead keeps starting: each holds a device context and its cases' inputs while it waits



def harness_for(task: Task) -> str:
    """`task` when the task's own eval is popkit's harness (the bundled tasks: a warm verdict is the task's
    own), else `popkit` (popkit's harness in the eval's place, as `--harness popkit` runs it)."""
    main = next((task.path / f.source for f in task.files if f.name == task.main), None)
    return "task" if main is not None and runner.is_popkit_harness(main) else "popkit"


def unfit_reason(task: Task) -> str:
    """Why popkit's harness cannot run `task` in place of its own eval ('' when it can, or when its own eval is
    popkit's harness)."""
    if harness_for(task) == "task":
        return ""
    names = entry_points(task, "task")
    if names and set(names) != {"custom_kernel"}:
        return (f"its eval takes {', '.join(names)} from the submission, and popkit's harness calls "
                "custom_kernel(data)")
    sizes = sorted({int(c["world_size"]) for c in task.tests + task.benchmarks
                    if isinstance(c.get("world_size"), int) and c["world_size"] > 1})
    if task.multi_gpu or sizes:
        return (f"its cases run on several GPUs (world_size {', '.join(map(str, sizes)) or 'given per case'}), and "
                "popkit's harness runs one worker on one GPU")
    reference = next((task.path / f.source for f in task.files if f.name == "reference.py"), None)
    if reference is None:
        return "it has no reference.py, which popkit's harness imports"
    missing = [n for n in REFERENCE_NAMES if n not in module_names(reference)]
    if missing:
        return f"its reference.py defines no {missing[0]}, which popkit's harness calls"
    return ""


def refuse_unfit(task: Task, harness: str) -> None:
    """UsageError when `harness` is `popkit` and popkit's harness cannot judge `task` (unfit_reason): the run
    never falls back to the task's own eval silently."""
    reason = unfit_reason(task) if harness == "popkit" else ""
    if reason:
        raise UsageError(f"popkit's harness cannot judge {task.display_name}: {reason}",
                         "run the task's own eval, as open as the leaderboard's: --harness task (harness=\"task\")")


def ahead_depth(cpus: int | None = None) -> int:
    """Warm pairs started at once ahead of their evals (Ahead): one per 4 CPUs, at most AHEAD, and 0 (cold evals)
    below 2. A pair's start-up is two processes importing torch; on too few CPUs the start-ups queue and a warm
    round costs more than a cold one (a 2-core machine: 28.5 s against 24.6 s for the 9 race evals of tune's
    chunksum fixture, each warm `go` 0.5-0.6 s against 2.7 s for a cold eval)."""
    depth = min(AHEAD, (os.cpu_count() or 1 if cpus is None else cpus) // 4)
    return depth if depth >= 2 else 0


def cold_reason(task: Task, options: runner.RunOptions, depth: int) -> str:
    """Why evals of `task` with `options` cannot go through warm pairs started `depth` ahead ('' when they can):
    a warm pair is popkit's harness, the eval a cold run with the same options gets, on one GPU."""
    if options.harness != "popkit" and harness_for(task) != "task":
        return "the task's own eval judges it, not popkit's harness"
    if options.world_size is not None or options.keep_workdir:
        return "a scaled world size or a kept working folder runs cold"
    if not depth:
        return "this machine has too few CPUs for start-ups side by side"
    return unfit_reason(task)


def module_names(path: Path) -> set[str]:
    """Names bound at the top level of a Python file (defs, classes, assignments, imports); a file that does not
    parse, or has `from x import *`, binds every name as far as this can tell (REFERENCE_NAMES then)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return set(REFERENCE_NAMES)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return set(REFERENCE_NAMES)
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@dataclass(frozen=True)
class Result:
    """What one `go` gave: the pre-step (when it ran), why it was skipped, the mode's run (none when the build
    failed), and how warm the pair was."""

    precompile: CompileStep | None
    precompile_skipped: str
    runs: tuple[ModeRun, ...]
    ready_at_go: bool  # the pair had finished its start-up when `go` was asked for
    warmup_s: float | None  # seconds from the pair's start to `popkit.warm: ready` (None: never ready)


class _Hold:
    """A lock's `with` block held from `take()` to the first `release()`, which any thread may call (the pair's
    thread, or the pipe's reader when the ready line comes); `over` is set by every `release()`."""

    def __init__(self, block: contextlib.AbstractContextManager, over: threading.Event):
        self._block, self._held, self._lock, self.over = block, False, threading.Lock(), over

    def take(self) -> None:
        with self._lock:
            self._block.__enter__()
            self._held = True

    def release(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._block.__exit__(None, None, None)
        self.over.set()


class _PipeWatch:
    """proc.run's `watch` for a pair: notices the ready line, then passes the run's pipe on (live progress)."""

    def __init__(self):
        self.head = bytearray()
        self.looking = True
        self.ready = threading.Event()
        self.ready_at: float | None = None
        self.live = None  # beside.LiveProgress, set at `go`
        self.on_ready: Callable[[], None] | None = None  # called once, when the ready line has come

    def __call__(self, data: bytes) -> None:
        if self.looking and data:
            self.head += data
            if len(self.head) < len(READY_LINE) and READY_LINE.startswith(bytes(self.head)):
                return
            self.looking = False
            if self.head.startswith(READY_LINE):
                self.ready_at = time.monotonic()
                self.ready.set()
                if self.on_ready is not None:
                    self.on_ready()
            data = bytes(self.head[len(READY_LINE):] if self.ready.is_set() else self.head)
        live = self.live
        if live is not None:
            live(data)


class WarmPair:
    """One warm eval of `task` in `mode`, started at once on its own thread (module doc). Use it once:
    `go(content)`, then `discard()`; `discard()` alone ends one that is not needed."""

    def __init__(self, task: Task, mode: str, content: bytes, options: runner.RunOptions, executor: Executor, *,
                 path: Path | None = None, system: Mapping[str, Any] | None = None,
                 cases: Sequence[Mapping[str, Any]] | None = None):
        # The bytes are checked by the watch (a save that would not run never reaches a pair); `path` and `system`
        # are what the session's report says; `cases` (default: the task's for `mode`) what the start-up prepares
        # and `go` runs unless it is given others.
        self.session = runner.RunSession(task, path, mode, options, content=content, executor=executor, system=system,
                                         check=False)
        self.task, self.mode, self.options, self.executor = task, mode, self.session.options, executor
        self.cases = list(task.cases_for(mode) if cases is None else cases)
        self.cases_name = f"{mode}.txt"  # the name a cold eval's cases file has
        self.timeout_s = task.timeout_for(mode)
        self.started = time.monotonic()
        self._watch = _PipeWatch()
        self._stack = contextlib.ExitStack()
        self._go_at: float | None = None
        self._kill = False
        self._start_up_over = threading.Event()  # the start-up's shared hold on the GPU has ended (_run)
        self._done: proc.Finished | None = None
        self._error: BaseException | None = None
        self._control = -1
        self._thread: threading.Thread | None = None
        self._stack.enter_context(self.session.opened("popkit-warm-", preflight=False, set_up=False))
        self.workspace: Workspace = self.session.workspace
        try:
            self.main = self.session.place()
            self.workspace.write_cases(self.cases_name, protocol.render_cases(self.cases))
            read, self._control = os.pipe()
            self._thread = threading.Thread(target=self._run, args=(read,), name="popkit-warm-pair", daemon=True)
            self._thread.start()
        except BaseException:
            self.discard()
            raise

    @property
    def ready(self) -> bool:
        """Whether the pair finished its start-up and waits for `go`."""
        return self._watch.ready.is_set()

    @property
    def warmup_s(self) -> float | None:
        return None if self._watch.ready_at is None else self._watch.ready_at - self.started

    @property
    def alive(self) -> bool:
        """Whether the pair's eval still runs (one that ended before `go`, at IDLE_S or by a crash, cannot judge)."""
        return self._thread is not None and self._thread.is_alive()

    def _deadline(self) -> float | None:
        if self._kill:
            return 0.0
        return None if self._go_at is None else self._go_at + self.timeout_s

    def _run(self, control_read: int) -> None:
        convention = protocol.POPKIT_HARNESS
        env = self.session.env(**convention.env(None, None))
        # The start-up uses the GPU (its context, the cases' inputs, the flush buffer), so it holds the GPU as a
        # test-mode eval does until `ready`: it never runs beside another eval's timed calls. `go` locks anew.
        start_up = _Hold(gpulock.timing("test", self.workspace.executor.env(env), stop=lambda: self._kill),
                         self._start_up_over)
        self._watch.on_ready = start_up.release
        try:
            start_up.take()
        except BaseException as exc:  # a GPU held past gpulock.WAIT_S, or the pair ended: the verdict says so
            os.close(control_read)
            self._error = exc
            start_up.release()
            return
        try:
            self._done = self.workspace.run(
                self.options.python, self.main, [self.mode, self.cases_name], env, IDLE_S,
                result_fd_env=convention.result_fd_env, watch=self._watch,
                inputs={convention.control_fd_env: control_read}, deadline=self._deadline)
        except BaseException as exc:  # an interpreter that cannot start: the verdict says so
            self._error = exc
        finally:
            start_up.release()

    def go(self, content: bytes, progress: Progress, cases: Sequence[Mapping[str, Any]] | None = None) -> Result | None:
        """Judge `content`: into the workspace, the pre-step where a cold run has one, then `go` and the run's
        verdict, on `cases` (default: the pair's; others are generated when asked for, as a cold eval makes them).
        None when the pair ended before `go` (the caller starts a new one)."""
        cases = self.cases if cases is None else list(cases)
        ready = self.ready
        if not self.alive:
            if self._error is not None:
                raise self._error
            return None
        ws = self.workspace
        self.session.replace(content)
        step = self.session.pre_step(progress)
        skipped, tampered = self.session.side.skipped, self.session.side.tampered
        if step is not None and step.build_failed:
            return Result(step, skipped, (), ready, self.warmup_s)
        if tampered:
            run = ModeRun(mode=self.mode, secret=False, seed=None, exit_code=0, duration_s=0.0,
                          timeout_s=self.timeout_s, outcome="failed", summary=tampered)
            return Result(step, skipped, (run,), ready, self.warmup_s)
        ws.write_cases(self.cases_name, protocol.render_cases(cases))
        key = secrets.token_hex(16)
        line = json.dumps({"mode": self.mode, "cases": protocol.render_cases(cases), "key": key})
        progress(self.mode)
        self._watch.live = LiveProgress(progress, self.mode, len(cases), protocol.case_kind(self.mode))
        env = ws.executor.env(self.session.env(**protocol.POPKIT_HARNESS.env(None, None)))
        # The mode's own hold on the GPU waits for the start-up's to end: taken first, it would wait for a start-up
        # that waits for it. A start-up still holding the GPU after the mode's timeout is ended, and the run says so.
        if not self._start_up_over.wait(self.timeout_s):
            self._kill = True
        with gpulock.timing(self.mode, env, waiting=progress):  # one timed eval per GPU (machine/gpulock.py)
            self._go_at = time.monotonic()
            try:
                os.write(self._control, f"go {line}\n".encode())
            except OSError:  # the eval is gone: its verdict (crashed) comes from what it left
                pass
            self._close_control()
            self._thread.join()
        seconds = time.monotonic() - self._go_at
        return Result(step, skipped, (self._decode(key, seconds, len(cases)),), ready, self.warmup_s)

    def _decode(self, key: str, seconds: float, count: int) -> ModeRun:
        if self._error is not None:
            raise self._error
        done = self._done
        pipe = done.pipe[len(READY_LINE):] if done.pipe.startswith(READY_LINE) else done.pipe
        done = replace(done, pipe=pipe)
        return self.session.judged(done, self.mode, convention=protocol.POPKIT_HARNESS, key=key, seconds=seconds,
                                   count=count)

    def _close_control(self) -> None:
        if self._control >= 0:
            os.close(self._control)
            self._control = -1

    def discard(self) -> None:
        """End the pair: its processes killed (a pair waiting for `go` never ran submission code; one that ran
        it is over already), its thread joined, its folder removed."""
        self._kill = True
        self._close_control()
        if self._thread is not None:
            self._thread.join(JOIN_S)
        self._stack.close()


class Ahead:
    """Warm pairs started ahead of their `go`, for evals that run one after another (tune's race rounds): while one
    is judged, the next ones are starting, so their start-ups (a process tree, torch's import, the device, the
    inputs) overlap one another instead of each eval paying its own. Each start-up holds its GPU shared and each
    `go` exclusively (machine/gpulock.py), so no start-up runs beside a timed eval. Keys name the evals; every pair
    is used once (`run`) or discarded (`close`)."""

    def __init__(self, make: Callable[[Any], WarmPair], depth: int = AHEAD):
        self._make, self.depth = make, max(1, depth)
        self._pairs: dict[Any, WarmPair] = {}

    def refill(self, keys: Sequence[Any]) -> None:
        """Once every started pair has been used, start the pairs of the next `depth` of `keys` (the evals to come,
        in order) together. Not one at a time: a start-up holds the GPU shared, so a `go` waits for every start-up
        under way, and a pair started after each `go` would make each eval wait for a whole start-up again."""
        if not self._pairs:
            for key in keys[:self.depth]:
                self._pairs[key] = self._make(key)

    @contextlib.contextmanager
    def _used(self, key: Any) -> Iterator[WarmPair]:
        """The key's pair (started now if it was not), discarded once used."""
        pair = self._pairs.pop(key, None) or self._make(key)
        try:
            yield pair
        finally:
            pair.discard()

    def run(self, key: Any, content: bytes, progress: Progress) -> RunReport | None:
        """The verdict of `content` through the key's pair, as a cold eval of the same session reports it; None when
        the pair ended before `go` (the caller runs the eval cold)."""
        with self._used(key) as pair:
            started, t0 = datetime.now(timezone.utc), time.monotonic()
            result = pair.go(content, progress)
            return None if result is None else pair.session.report(result.runs, started=started, t0=t0)

    def mode_run(self, key: Any, content: bytes, cases: Sequence[Mapping[str, Any]]) -> ModeRun | None:
        """The mode's run of `content` on `cases` through the key's pair, as a cold eval gives it (runner.RunSession.
        run); None when the pair ended before `go` or its pre-step failed (the caller runs the eval cold)."""
        with self._used(key) as pair:
            result = pair.go(content, lambda _msg: None, cases)
        return result.runs[0] if result is not None and result.runs else None

    def close(self) -> None:
        """End every pair not used (their start-ups ran no submission code)."""
        pairs, self._pairs = list(self._pairs.values()), {}
        for pair in pairs:
            pair.discard()

    def __enter__(self) -> "Ahead":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["WarmPair", "Ahead", "Result", "ahead_depth", "cold_reason", "harness_for", "unfit_reason", "refuse_unfit", "READY_LINE", "IDLE_S",
           "AHEAD"]
