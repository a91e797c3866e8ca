"""`popkit test --watch` and `popkit bench --watch`: a verdict after every save, from a warm worker.

Once, at the start: the task is resolved and everything a cold run refuses is refused (workflows.preflight,
the machine's preflight, a GPU task's benchmarks sized on a CPU), popkit's harness is checked to be able to
run the task (exit 11 with the reason when it cannot), the system is probed. Then the file is judged as
it is, and after every save (filewatch.SaveWatcher) by a warm pair (warm.WarmPair) that was started in the
background after the previous verdict: the saved bytes are checked as a cold run checks them (a syntax
error or a missing custom_kernel is a verdict, exit 4), judged, recorded in the history like a test run
(label `warm`), and handed to `on_verdict`. The watch ends when `stop()` says so or Ctrl-C unwinds it; the
pair in hand is discarded either way (its processes killed, its folder removed).

The leaderboard's protocol runs fresh processes: without --watch, `test` and `bench` stay cold, and every
watch verdict says it came from a warm worker (and, for a task whose own eval is not popkit's harness, that
popkit's harness judged it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from popkit.errors import EnvironmentProblem, ExitCode, PopkitError, UsageError
from popkit.measure import sizing
from popkit.model.contract import entry_points
from popkit.model.results import RunReport
from popkit.model.tasks import Task
from popkit.operations import workflows
from popkit.operations.filewatch import POLL_S, SaveWatcher
from popkit.progress import Progress
from popkit.run import runner
from popkit.run import sandbox
from popkit.run import warm
from popkit.run.executor import Executor
from popkit.submission.source import Source, check_runnable, validate_submission

SCHEMA = "popkit/watch/1"
LABEL = "warm"  # the history's label of a watch verdict (its device reads `... [warm]`)
MODES = ("test", "benchmark")
COMMANDS = {"test": "test", "benchmark": "bench"}



def warm_note(mode: str, harness: str) -> str:
    """What every watch verdict says about where it came from."""
    faithful = f"`popkit {COMMANDS[mode]} FILE` without --watch"
    if harness == "popkit":
        return (f"warm worker, popkit's harness: this task's own eval is not popkit's harness, so a warm worker of "
                f"popkit's harness judged this save; the task's own verdict is {faithful}")
    return (f"warm worker: the eval was started before the save (torch, the device, the reference and the inputs "
            f"ready); the leaderboard runs fresh processes, as {faithful} does")


@dataclass(frozen=True)
class Verdict:
    """One verdict of the watch: the report of the run (or the error that stopped the bytes before a run)."""

    index: int  # 0 for the file as it was at the start, then one per save
    trigger: str  # "start" or "save"
    submission: str
    sha256: str
    saved_at: float  # time.time() of the save (the start's time for index 0)
    seconds: float  # from the save to the verdict
    ready_at_save: bool  # the warm pair had finished its start-up when the save was taken
    warmup_s: float | None  # the pair's start-up, seconds (None: it was not ready when its run began)
    harness: str  # "task" (the task's own eval is popkit's harness) or "popkit"
    note: str
    report: RunReport | None = None
    error: PopkitError | None = None
    warning: str = ""  # the history's, when recording failed

    @property
    def outcome(self) -> str:
        if self.report is not None:
            return self.report.outcome
        return ExitCode(self.exit_code).name.lower()  # e.g. bad_submission: the bytes never ran

    @property
    def exit_code(self) -> int:
        return int(self.report.exit_code if self.report is not None else self.error.exit_code)  # type: ignore

    def to_json(self) -> dict[str, Any]:
        """The verdict's JSON line: schema popkit/watch/1, the run's popkit/run/1 document under `report`."""
        saved = datetime.fromtimestamp(self.saved_at, timezone.utc).isoformat(timespec="milliseconds")
        doc: dict[str, Any] = {
            "schema": SCHEMA, "verdict": self.index, "trigger": self.trigger, "submission": self.submission,
            "sha256": self.sha256, "saved_at": saved, "save_to_verdict_s": round(self.seconds, 4),
            "worker": "warm", "harness": self.harness, "ready_at_save": self.ready_at_save,
            "warmup_s": None if self.warmup_s is None else round(self.warmup_s, 3), "note": self.note,
            "outcome": self.outcome, "exit_code": self.exit_code,
            "report": self.report.to_json() if self.report is not None else None,
            "error": self.error.to_json() if self.error is not None else None,
        }
        if self.warning:
            doc["warning"] = self.warning
        return doc


def check_request(request: workflows.Request) -> None:
    """What --watch cannot do (exit 2): it judges one file in test or benchmark mode, public cases, one GPU."""
    def refuse(what: str, hint: str) -> None:
        raise UsageError(f"--watch {what}", hint)

    if len(request.sources) != 1 or request.devices:
        refuse("watches one file on one GPU", "popkit test FILE --watch (drop --gpus and the other files)")
    if request.mode not in MODES:
        refuse(f"runs test or benchmark mode, not {request.mode} mode",
               "the ranked chain and --profile run cold: drop --watch")
    options = request.options
    if options.secret_seeds:
        refuse("runs the public cases only", "secret runs are cold: drop --watch, or --secret-runs/--secret-seed")
    if request.baseline:
        refuse("times the submission only", "drop --baseline, or run it cold without --watch")
    if options.world_size is not None:
        refuse("runs one worker on one GPU", "drop --world-size, or run it cold without --watch")
    if options.keep_workdir:
        refuse("removes each warm worker's folder after its verdict", "drop --keep-workdir, or run it cold")
    if options.label:
        refuse(f"cannot run a {options.label} run", "run it cold without --watch")


@dataclass(frozen=True)
class Setup:
    """What the watch resolved at its start, for every verdict after it."""

    source: Source
    task: Task
    options: runner.RunOptions  # with popkit's harness where the task's own eval is not, label `warm`
    executor: Executor
    system: Mapping[str, Any]
    skipped: tuple[str, ...]  # benchmark shapes a CPU run leaves out (sizing)
    total_shapes: int
    notes: tuple[str, ...]  # the request's and the warm note, said in every report
    names: tuple[str, ...]  # what the submission must define (contract.entry_points, read once)


def set_up(request: workflows.Request, progress: Progress, note: Progress) -> Setup:
    """Resolve, refuse, size and probe once (module doc); raises PopkitError before anything is watched."""
    check_request(request)
    source = request.sources[0]
    found = workflows.resolve(source, request.task, request.roots)
    for line in found.notes:
        note(line)
    task = found.task
    reason = warm.unfit_reason(task)
    if reason:
        raise EnvironmentProblem(f"--watch: popkit's harness cannot run {task.display_name}: {reason}",
                                 f"run it cold: popkit {COMMANDS[request.mode]} {source.path} (the task's own eval)")
    harness = warm.harness_for(task)
    options = replace(request.options, harness=harness, label=LABEL, chain=False)
    workflows.preflight(task, source, request)
    executor = sandbox.executor_for(options.isolation)
    total = len(task.benchmarks)
    task, skipped = sizing.fit(task, source, replace(request, options=options), executor, progress)
    # What this machine cannot run is refused as a cold run of the same request refuses it (the task's own
    # eval's needs: popkit's harness has a CPU path, which would hide a task's GPU-only reference).
    system = runner.RunSession(task, source.path, request.mode, request.options, content=source.content,
                               executor=executor, check=False).preflight()
    notes = (warm_note(request.mode, harness),) + tuple(request.notes)
    return Setup(source, task, options, executor, system, skipped, total, notes, entry_points(task, harness))


class Watch:
    """The watch of one file (module doc): `run()` until `stop()` says so; each verdict goes to `on_verdict`,
    and `on_ready(seconds)` hears when the warm pair for the next save has finished its start-up."""

    def __init__(self, request: workflows.Request, setup: Setup, *, on_verdict: Callable[[Verdict], None],
                 on_ready: Callable[[float], None] = lambda _s: None, progress: Progress | None = None,
                 stop: Callable[[], bool] = lambda: False, poll_s: float = POLL_S):
        self.request, self.setup = request, setup
        self.on_verdict, self.on_ready, self.stop = on_verdict, on_ready, stop
        self.progress = progress or (lambda _msg: None)
        self.watcher = SaveWatcher(setup.source.path, poll_s=poll_s)
        self.pair: warm.WarmPair | None = None
        self.latest = setup.source.content  # the bytes a new pair's workspace starts with

    def run(self) -> int:
        """Judge the file as it is, then every save; returns the number of verdicts."""
        count = 0
        told: list = [None]  # the pair whose readiness on_ready heard last
        try:
            self.pair = self._new_pair()
            content, saved_at, noticed = self.setup.source.content, time.time(), time.monotonic()
            trigger = "start"
            while True:
                self.on_verdict(self.judge(count, trigger, content, saved_at, noticed))
                count += 1
                def tick() -> None:
                    pair = self.pair
                    if pair is not None and pair.ready and pair is not told[0]:
                        told[0] = pair
                        self.on_ready(pair.warmup_s or 0.0)

                save = self.watcher.next_save(self.stop, tick)
                if save is None:
                    return count
                content, saved_at, noticed, trigger = save.content, save.saved_at, save.noticed_at, "save"
        finally:
            if self.pair is not None:
                self.pair.discard()
                self.pair = None

    def _new_pair(self) -> warm.WarmPair:
        s = self.setup
        return warm.WarmPair(s.task, self.request.mode, self.latest, s.options, s.executor, path=s.source.path,
                             system=s.system)

    def judge(self, index: int, trigger: str, content: bytes, saved_at: float, noticed: float) -> Verdict:
        """One verdict on `content`. A pair that judged is discarded and a fresh one started (in the background)."""
        s = self.setup
        path = s.source.path
        source = Source(path, content)
        self.latest = content
        pair = self.pair
        ready, warmup = pair.ready, pair.warmup_s
        base = dict(index=index, trigger=trigger, submission=str(path), sha256=source.sha256, saved_at=saved_at,
                    ready_at_save=ready, warmup_s=warmup, harness=s.options.harness, note=s.notes[0])
        try:  # the checks of a run session's bytes, the task's names read once
            data = validate_submission(path, content, s.names)
            check_runnable(s.task, path, data, self.request.mode)
        except PopkitError as exc:  # bytes a cold run would refuse before running: the pair stays warm
            return Verdict(**base, seconds=time.time() - saved_at, error=exc)
        started = datetime.now(timezone.utc)
        result = pair.go(data, self.progress)
        if result is None:  # it ended before `go` (IDLE_S, or it died): a new one runs this save, from its start
            pair.discard()
            self.pair = pair = self._new_pair()
            result = pair.go(data, self.progress)
            base.update(ready_at_save=False, warmup_s=None)
        pair.discard()
        self.pair = None
        report = pair.session.report(() if result is None else result.runs, started=started, t0=noticed)
        report = workflows.with_notes(report, s.notes, s.skipped, s.total_shapes)
        warning = workflows.keep(report, data, self.request.record)
        verdict = Verdict(**base, seconds=time.time() - saved_at, report=report, warning=warning)
        self.pair = self._new_pair()  # the next save's, warming up while this verdict is shown
        return verdict


def run(request: workflows.Request, *, on_verdict: Callable[[Verdict], None],
        on_ready: Callable[[float], None] = lambda _s: None, on_start: Callable[[Setup], None] = lambda _s: None,
        progress: Progress | None = None, note: Progress | None = None, stop: Callable[[], bool] = lambda: False,
        poll_s: float = POLL_S) -> int:
    """Watch `request`'s file (module doc) until `stop()`; returns the number of verdicts."""
    progress = progress or (lambda _msg: None)
    setup = set_up(request, progress, note or (lambda _msg: None))
    on_start(setup)
    return Watch(request, setup, on_verdict=on_verdict, on_ready=on_ready, progress=progress, stop=stop,
                 poll_s=poll_s).run()


__all__ = ["run", "Watch", "Verdict", "Setup", "set_up", "check_request", "warm_note", "SCHEMA", "LABEL"]
