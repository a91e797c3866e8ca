"""`popkit tune FILE -o OUT`: time every point of a submission's `#!POPKIT tune` grid and write the fastest.

1. points: the grid the `tune-if` lines keep, or a seeded sample of it (`max_variants`), or optuna's
   ask/tell (`engine="optuna"`, `pip install 'popkit[tune]'`), which proposes points from earlier times;
   each point is a variant file (tunespec.variant_text), a plain submission;
2. build: tuneprobe keys each variant by what it hands the toolchain; each key builds once, the runner's
   compile pre-step in the key's own TORCH_EXTENSIONS_DIR (a file from `popkit new` compiles its whole
   grid into one extension: one build), keys in parallel with MAX_JOBS split among them; a key that does
   not compile drops its variants with the first compiler error;
3. check: every variant's test mode through the backend's run (runner.run_submission: the sealed run, a
   cheat fails as any submission does), in parallel; a wrong variant drops with its first mismatch;
4. race (tunerace): successive halving over benchmark-mode evals until `confirm` finalists are left, each
   confirmed against the incumbent (the input, or `against`) with ab.run_ab; the winner is the finalist
   whose A/B score interval lies below 1 with the smallest ratio, else the incumbent;
5. write: the winner's values frozen (tunefreeze), per shape where the best differs by shape; the file
   written then runs the task's tests once more.
Every eval goes to the history (`record`); with `resume`, a variant whose bytes were already checked or
timed on this task (same harness, same device) is not run again.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import signal
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit.errors import EnvironmentProblem, SubmissionError, UsageError
from popkit.ledger import history
from popkit.measure import ab
from popkit.measure import sizing
from popkit.model import tunespec
from popkit.model import tunetriton
from popkit.model.diagnostics import first_error
from popkit.model.results import CompileStep, RunReport
from popkit.model.tasks import Task
from popkit.progress import Progress, timed
from popkit.resources import popkit_home
from popkit.run import proc
from popkit.run import runner
from popkit.run import sandbox
from popkit.run import warm
from popkit.run.executor import Executor
from popkit.submission.source import Source
from popkit.tuning import ahead
from popkit.tuning import probe as tuneprobe
from popkit.tuning import search as tunesearch
from popkit.tuning.clock import Timekeeping
from popkit.tuning.race import Race, State
from popkit.tuning.result import PER_SHAPE, TuneReport
from popkit.tuning.stats import first_line, race_spec, race_stats

ENGINES = ("grid", "optuna")
OPTUNA_HINT = "pip install 'popkit[tune]'"
MAX_JOBS = 8  # parallel builds and checks by default (fewer on a machine with fewer CPUs)
BUILD_TIMEOUT_S = 600.0  # one build of a grid (`popkit compile`'s default)


@dataclass(frozen=True)
class TuneSettings:
    """How far `popkit tune` searches and how it decides (times in seconds)."""

    engine: str = "grid"  # grid: every point (or a sample); optuna: ask/tell proposals
    max_variants: int = 64  # the most points tried
    seed: int = 0  # of the sample and of optuna's sampler
    budget_s: float = 900.0  # no new check, race round or A/B starts past it (0: no limit)
    confirm: int = 2  # finalists the race leaves for an A/B against the incumbent
    ab_rounds: int = 8  # per A/B (ab.run_ab's max_rounds)
    ab_budget_s: float = 60.0  # per A/B (it never stops before its first look, round 4)
    jobs: int = 0  # parallel builds and checks (0: min(MAX_JOBS, CPUs))
    per_shape: bool = True  # compose a per-shape dispatch where the best differs by shape
    race_decides: bool = True  # the race's own rounds may decide, with no A/B, when they separate the finalists
    resume: bool = False  # reuse checks and race times of the same bytes from the history
    record: bool = True  # record every eval in the history
    warm_race: bool = True  # race evals through warm pairs started ahead, where they can (tuning/ahead.py)


def build_step(task: Task, path: Path, content: bytes, options: runner.RunOptions,
               progress: Progress | None = None) -> tuple[CompileStep | None, str]:
    """One toolchain run: the runner's compile pre-step (`python submission.py`) of `content`, in options'
    TORCH_EXTENSIONS_DIR, with BUILD_TIMEOUT_S rather than the runner's 120 s: it prepares the evals, it is not
    one of them (a build past 120 s is noted; on the leaderboard the first eval would finish it).

    Returns the step (compiler errors placed at lines of `path`) and the harness-tampering line of a
    pre-step that changed a task file ("" when none did)."""
    session = runner.RunSession(task, path, "test", options, content=content, check=False)
    with session.opened("popkit-tune-build-", preflight=False, set_up=False):
        session.place()
        with timed(progress, "build"):
            return session.build(BUILD_TIMEOUT_S)


@dataclass(frozen=True)
class Backend:
    """Where tune's children run. The defaults run them on this machine; another executor (a cluster) passes
    functions with the same signatures: `run` is runner.run_submission's, `compare` ab.run_ab's, `build`
    build_step's, `identities` and `shapes` tuneprobe's."""

    run: Callable[..., RunReport] = runner.run_submission
    compare: Callable[..., ab.ABReport] = ab.run_ab
    build: Callable[..., tuple[CompileStep | None, str]] = build_step
    identities: Callable[..., list[tuneprobe.Identity]] = tuneprobe.build_identities
    shapes: Callable[..., tuple[Any, str]] = tuneprobe.input_shapes


def check_paths(submission: Path, output: Path, against: Path | None, force: bool) -> None:
    """Refuse an output that would overwrite the input (or --against), is not a .py file, or exists (without force)."""
    out = Path(output)
    for name, other in (("the input file", submission), ("the --against file", against)):
        if other is not None and out.resolve() == Path(other).resolve():
            raise UsageError(f"-o {out} is {name}: popkit tune never overwrites it",
                             "write the tuned file elsewhere, e.g. -o tuned.py")
    if out.is_dir():
        raise UsageError(f"-o {out} is a directory", "give a file path, e.g. -o tuned.py")
    if out.suffix != ".py":
        raise UsageError(f"-o {out}: the tuned submission is Python; name it *.py",
                         "the leaderboard picks the language from the extension")
    if out.exists() and not force:
        raise UsageError(f"{out} already exists; not overwriting it", "pass --force to replace it, or choose another -o")


@dataclass(frozen=True)
class _Sizing:
    """What the CPU sizing reads of a run: its mode, options and --allow-cpu."""
    mode: str
    options: runner.RunOptions
    allow_cpu: bool


def sized_task(task: Task, source: Source, options: runner.RunOptions, allow_cpu: bool,
               progress: Progress | None = None, executor: Executor | None = None) -> tuple[Task, tuple[str, ...]]:
    """The task tune races on this machine: on a machine without a GPU, the one CPU sizing `bench` uses
    (measure.sizing: the same shapes for the same task here, remembered); without `allow_cpu` a task whose shapes
    would not fit stops before anything runs (exit 11); popkit's harness asked of a task it cannot judge, exit 2.
    Returns the task and the note naming the shapes left out."""
    warm.refuse_unfit(task, options.harness)
    say = progress or (lambda _msg: None)
    fitted, skipped = sizing.fit(task, source, _Sizing("benchmark", options, allow_cpu),
                                 executor or sandbox.executor_for(options.isolation), say)
    return fitted, ((sizing.skipped_note(skipped, len(task.benchmarks)),) if skipped else ())


def _jobs(settings: TuneSettings) -> int:
    return settings.jobs or max(1, min(MAX_JOBS, os.cpu_count() or 1))


class _Quiet:
    """Progress for the evals tune starts: their step lines would drown its own, their live line is kept."""

    def __init__(self, progress: Progress):
        self._progress = progress

    def __call__(self, _msg: str) -> None:
        return None

    def live(self, text: str, key: str = "") -> None:
        live = getattr(self._progress, "live", None)
        if live is not None:
            live(text, key)


class Tuner(Timekeeping):
    """One `popkit tune`: the state its stages share (variants, builds, notes, the clock)."""

    def __init__(self, task: Task, path: Path, content: bytes, spec: tunespec.TuneSpec, options: runner.RunOptions,
                 settings: TuneSettings, backend: Backend, progress: Progress, clock: Callable[[], float],
                 root: Path, sysinfo: Mapping[str, Any], incumbent: Path, incumbent_content: bytes,
                 devices: Sequence[str] = ()):
        self.task, self.path, self.content, self.spec = task, path, content, spec
        self.text = content.decode("utf-8")
        self.content_sha256 = hashlib.sha256(content).hexdigest()
        self.options, self.settings, self.backend, self.clock = options, settings, backend, clock
        self.root, self.sysinfo = root, dict(sysinfo)
        self.jobs = max(_jobs(settings), len(devices))
        self.devices = tuple(devices)
        self._free: queue.Queue[str] = queue.Queue()
        for gpu in self.devices:
            self._free.put(gpu)
        self._lock = threading.Lock()
        self._say = progress
        self.quiet = _Quiet(progress)
        self.t0 = clock()
        self.states: list[State] = []
        self.identities: dict[str, tuneprobe.Identity] = {}  # sha256 -> identity
        self.built: dict[str, str] = {}  # build key -> "" (built) or why its variants dropped
        self.builds = 0
        self.notes: list[str] = []
        self.stopped = "done"
        self.ahead: warm.Ahead | None = None  # set while a race round runs its evals through warm pairs (ahead.py)
        self.init_time()
        self.ext_root = popkit_home() / "build"
        sha = hashlib.sha256(incumbent_content).hexdigest()
        self.incumbent = State(index=-2, values={}, label="incumbent", path=incumbent, content=incumbent_content,
                               sha256=sha, incumbent=True)

    # ---------------------------------------------------------------------------------- helpers

    def say(self, msg: str) -> None:
        with self._lock:
            self._say(msg)

    def note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)

    def record(self, report: RunReport, content: bytes) -> None:
        if self.settings.record:
            warning = history.record_run(report, content).warning
            if warning:
                self.note(warning)

    def options_for(self, state: State, label: str = "") -> runner.RunOptions:
        """The run options of a variant's evals: its build's extensions folder, no pre-step once it is built."""
        identity = self.identities.get(state.sha256)
        opts = replace(self.options, label=label or f"tune {state.label}", secret_seeds=())
        if identity is None or identity.key is None:
            return opts
        env = {**opts.env, "TORCH_EXTENSIONS_DIR": str(tuneprobe.build_dir(self.ext_root, identity.key))}
        return replace(opts, env=env, precompile=False if self.built.get(identity.key) == "" else None)

    def run(self, state: State, mode: str, options: runner.RunOptions, progress: Any = None) -> RunReport | None:
        """One eval through the backend, recorded; with `devices`, on a GPU no other eval of tune holds meanwhile.
        Its timeout is cut to what is left of the budget: None when that cut stopped it (no verdict, not recorded)."""
        task, cut = self.bounded(self.task)
        started = self.clock()
        report = None
        if self.ahead is not None and mode == "benchmark":  # a race round's, through a warm pair (ahead.py)
            report = self.ahead.run(state.index, state.content, progress or self.quiet)
        if report is None and not self.devices:
            report = self.backend.run(task, state.path, mode, options, progress=progress, system=self.sysinfo)
        elif report is None:
            gpu = self._free.get()
            try:
                options = replace(options, env={**options.env, "CUDA_VISIBLE_DEVICES": gpu})
                report = self.backend.run(task, state.path, mode, options, progress=progress, system=self.sysinfo)
            finally:
                self._free.put(gpu)
        self.count_evals()
        if cut and report.outcome == "timed_out":
            self.stopped = "budget"
            return None
        self.timed(mode, self.clock() - started)
        self.record(report, state.content)
        return report

    def parallel(self, fn: Callable[[State], None], states: Sequence[State], jobs: int | None = None) -> None:
        """`fn` on every state, `jobs` at a time; an interrupt cancels what has not started."""
        if not states:
            return
        from concurrent.futures import ThreadPoolExecutor  # here: it brings logging, which few runs need

        pool = ThreadPoolExecutor(max_workers=max(1, min(jobs or self.jobs, len(states))))
        try:
            for future in [pool.submit(fn, s) for s in states]:
                future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------------------ the variants

    def add(self, points: Sequence[Mapping[str, Any]]) -> list[State]:
        """Variant files for `points` (under the tune's folder), their build identities and resumed results."""
        folder = self.root / "variants"
        folder.mkdir(parents=True, exist_ok=True)
        new = []
        for values in points:
            index = len(self.states) + len(new)
            label = tunespec.label(values)
            content = tunespec.variant_text(self.text, self.spec, values).encode("utf-8")
            name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", label.replace(" ", "_"))[:80]
            path = folder / f"{self.path.stem}.{index:03d}.{name}.py"
            path.write_bytes(content)
            sha = hashlib.sha256(content).hexdigest()
            new.append(State(index=index, values=dict(values), label=label, path=path, content=content, sha256=sha,
                             incumbent=sha == self.incumbent.sha256))
        self.states += new
        unknown = [s for s in new + [self.incumbent] if s.sha256 not in self.identities]
        if unknown:
            with self.phase("probe"):
                found = self.backend.identities(self.task, [s.content for s in unknown], self.options)
            for state, identity in zip(unknown, found):
                self.identities[state.sha256] = identity
                if identity.note:
                    self.note(f"{state.label}: {identity.note}")
        for state in new:
            state.build = (self.identities[state.sha256].key or "")[:16]
            if self.settings.resume:
                self.resume(state)
        return new

    def resume(self, state: State) -> None:
        """The check and race times of these bytes on this task, harness and device, from the history."""
        device = self.sysinfo.get("device")
        for record in history.local_runs(state.sha256, self.task.name):
            report = record.report
            if report is None or report.harness != self.options.harness or (report.system or {}).get("device") != device:
                continue
            if report.mode == "test" and state.resumed_check is None and report.outcome in ("passed", "failed"):
                state.resumed_check = (report.outcome, first_line(report))
            elif report.mode == "benchmark" and report.outcome == "passed" and report.label.startswith("tune"):
                times = race_stats(report, len(self.task.cases_for("benchmark")))
                if not isinstance(times, str):
                    state.resumed_rounds.insert(0, times)

    # ---------------------------------------------------------------------------------- building

    def build(self, states: Sequence[State]) -> None:
        """One compile pre-step per build key not built yet; its variants drop if it does not compile."""
        pending: dict[str, State] = {}
        for state in states:
            key = self.identities[state.sha256].key
            if key is not None and key not in self.built and key not in pending:
                pending[key] = state
        for key in [k for k in pending if built_before(self.ext_root, k)]:
            del pending[key]
            self.built[key] = ""
            self.note("the build of an earlier tune of the same source is reused (nothing to compile)")
        if not pending:
            return
        max_jobs = max(1, (os.cpu_count() or 1) // max(1, min(self.jobs, len(pending))))
        done: dict[str, str] = {}

        def one(state: State) -> None:
            key = self.identities[state.sha256].key or ""
            opts = self.options_for(state)
            opts = replace(opts, env={**opts.env, "MAX_JOBS": opts.env.get("MAX_JOBS", str(max_jobs))})
            self.say(f"build {len(done) + 1}/{len(pending)} (as {state.label})")
            # Compiler messages point at the user's file: a variant has the same lines, only other numbers in them.
            step, tampered = self.backend.build(self.task, self.path, state.content, opts, self.quiet)
            why = tampered
            if step is not None and step.timed_out:
                why = f"compile failed: the build ran past {BUILD_TIMEOUT_S:.0f} s"
            elif step is not None and step.build_failed:
                why = "compile failed: " + first_error(step.diagnostics, f"{step.stderr}\n{step.stdout}")
            elif step is not None and step.duration_s > runner.PRECOMPILE_TIMEOUT_S:
                self.note(f"the build took {step.duration_s:.0f} s, past the leaderboard's "
                          f"{runner.PRECOMPILE_TIMEOUT_S:.0f} s compile step: there the first eval would finish it "
                          "inside its own timeout")
            if not why and step is not None:
                mark_built(self.ext_root, key)
            done[key] = why

        with self.phase("build"):
            self.parallel(one, list(pending.values()))
            self.count_evals(len(pending))
        self.builds += len(pending)
        self.built.update(done)

    # ---------------------------------------------------------------------------------- checking

    def check(self, states: Sequence[State]) -> None:
        """The task's tests on every variant not checked yet (in parallel); a build that failed drops its own."""
        todo = []
        for state in states:
            key = self.identities[state.sha256].key
            failed = self.built.get(key, "") if key is not None else ""
            if failed:
                state.outcome = "failed" if failed.startswith("harness tampering") else "compile_failed"
                state.message = failed
            elif state.resumed_check is not None:
                state.outcome, state.message = state.resumed_check
                state.resumed.append("check")
            elif not state.outcome:
                todo.append(state)
        done = [0]

        def one(state: State) -> None:
            if self.out_of_time():
                state.message = "not checked: the time budget ran out"
                return
            report = self.run(state, "test", self.options_for(state))
            if report is None:
                state.message = "not checked: the time budget ran out"
                return
            message = first_line(report).replace(str(state.path), str(self.path))  # the user's file, same lines
            state.outcome, state.message, state.check_s = report.outcome, message, report.duration_s
            done[0] += 1
            verdict = "passed" if report.outcome == "passed" else state.message
            self.say(f"check {done[0]}/{len(todo)} {state.label}: {verdict}"
                     + self.left_text("test", len(todo) - done[0], self.jobs))

        with self.phase("check"):
            self.parallel(one, todo)

    # ------------------------------------------------------------------------------ the whole run

    def search(self) -> int | None:
        """Steps 1-3 over the grid (or its sample), or over optuna's proposals with their first race round.
        Returns the number of points the constraints keep (None when not enumerated)."""
        if self.settings.engine == "optuna":
            return tunesearch.optuna_search(self, Race(self))
        points = list(self.spec.points())
        if not points:
            raise SubmissionError(f"{self.spec.path}: the tune-if lines leave no point of the grid",
                                  "loosen the `#!POPKIT tune-if` expressions or list more values")
        chosen = tunespec.sample(points, self.settings.max_variants, self.settings.seed, keep=self.spec.default)
        if len(chosen) < len(points):
            self.note(f"{len(chosen)} of the grid's {len(points)} points, sampled with seed {self.settings.seed} "
                      "(--max-variants)")
        states = self.add(chosen)
        self.say(f"{len(states)} variant(s) of {', '.join(self.spec.names)}")
        self.build(states)
        self.check(states)
        return len(points)


BUILT_MARK = ".popkit-tune-built"  # in a build key's folder: its pre-step passed and left a library there


def built_before(root: Path, key: str) -> bool:
    """A build of `key` passed in an earlier tune and its library is still there: nothing to compile."""
    folder = tuneprobe.build_dir(root, key)
    try:
        return (folder / BUILT_MARK).read_text() == key and any(folder.rglob("*.so"))
    except OSError:
        return False


def mark_built(root: Path, key: str) -> None:
    """Mark `key`'s folder as built, when the build left a library there (a cluster's build leaves none here)."""
    folder = tuneprobe.build_dir(root, key)
    if folder.is_dir() and any(folder.rglob("*.so")):
        (folder / BUILT_MARK).write_text(key)


def run_tune(task: Task, submission: Path | str, output: Path | str, options: runner.RunOptions | None = None,
             settings: TuneSettings = TuneSettings(), *, against: Path | str | None = None, force: bool = False,
             progress: Progress | None = None, backend: Backend | None = None, devices: Sequence[str] = (),
             clock: Callable[[], float] = time.monotonic, notes: Sequence[str] = ()) -> TuneReport:
    """Tune `submission`'s `#!POPKIT tune` parameters on `task` and write the winner to `output` (module doc).

    `devices` (CUDA_VISIBLE_DEVICES values) spreads checks and race evals over local GPUs, one eval per GPU at
    a time; the A/Bs run on the first. `backend` replaces where the children run (tests, a cluster)."""
    path, output = Path(submission), Path(output)
    against_path = Path(against) if against is not None else None
    check_paths(path, output, against_path, force)
    devices = tuple(devices or ())
    if settings.engine not in ENGINES:
        raise UsageError(f"unknown engine `{settings.engine}`", "engines: " + ", ".join(ENGINES))
    if settings.engine == "optuna":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise EnvironmentProblem("--engine optuna needs optuna, which is not installed here", OPTUNA_HINT) from None
    if settings.max_variants < 1 or settings.confirm < 1:
        raise UsageError("--max-variants and --confirm must be at least 1", "e.g. --max-variants 32 --confirm 2")
    say = progress or (lambda _msg: None)
    session = runner.RunSession(task, path, "test", options or runner.RunOptions(), progress=say)
    content, options = session.side.data, session.options
    spec = tunetriton.spec_for(content.decode("utf-8"), str(path))
    incumbent = against_path or path
    incumbent_content = content if against_path is None else runner.RunSession(task, against_path, "test",
                                                                               options).side.data
    started = datetime.now(timezone.utc)
    sysinfo = sandbox.probe(options.python, env=session.env(), isolation=options.isolation)
    with proc.WorkDir("popkit-tune-", keep=options.keep_workdir) as root:
        tuner = Tuner(task, path, content, spec, options, settings, backend or Backend(), say, clock, root, sysinfo,
                      incumbent, incumbent_content, devices)
        for line in (*notes, *tunetriton.config_notes(spec)):
            tuner.note(line)
        race, grid_points, signum = Race(tuner), None, 0
        try:
            grid_points = tuner.search()
            outcome = race.run()
        except KeyboardInterrupt as exc:  # Ctrl-C (or SIGTERM/SIGHUP as Interrupted): the best so far is written
            signum = int(getattr(exc, "signum", 0) or signal.SIGINT)
            tuner.stopped = "interrupted"
            outcome = race.so_far()
        with tuner.phase("final check"):
            written = race.write(output, outcome)
    return TuneReport(
        task=task.name, submission=str(path), sha256=hashlib.sha256(content).hexdigest(), incumbent=str(incumbent),
        harness=options.harness, ranking_by=task.ranking_by, engine=settings.engine, parameters=tuple(spec.describe()),
        constraints=tuple(c.text for c in spec.constraints), grid_points=grid_points,
        started_at=started.isoformat(timespec="seconds"), duration_s=clock() - tuner.t0,
        variants=tuple(s.freeze() for s in tuner.states + ([race.composite] if race.composite else [])),
        builds=tuner.builds, race_rounds=race.rounds, winner=outcome.winner, winner_label=outcome.label,
        confirmed=outcome.confirmed, decided_by=outcome.decided_by,
        per_shape=tuple(race.choices if outcome.winner == PER_SHAPE else ()),
        output=written.path, output_sha256=written.sha256, final_check=written.check, stopped=tuner.stopped,
        system=sysinfo, notes=tuple(tuner.notes), signal=signum, phases=tuner.phase_report(),
        build_root=str(tuner.ext_root), benchmarks=tuple(race_spec(c) for c in task.cases_for("benchmark")),
        race_evals=ahead.race_evals(tuner))


__all__ = ["Backend", "ENGINES", "TuneSettings", "Tuner", "build_step", "sized_task", "check_paths", "run_tune"]
