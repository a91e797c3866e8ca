"""What `test` and `bench` do, for every front end (the CLI, the MCP server, popkit.api).

A front end builds one request (each file read once into a `Source`), calls one function here and
renders what it returns. Here, once per request: the task is resolved, everything that can be refused
before a run is refused (`preflight`), GPU-sized benchmarks on a CPU are sized (`sizing`), the runs go to
the runner (one file), the A/B (two), one executor per GPU (`--gpus`) or a Ray cluster (`on_cluster`), and
every run is recorded here under one history policy (`keep`): a history problem is a warning beside the
result, never a lost result. The bytes recorded are the bytes that ran. (The runner checks the file again
itself, cheaply, since it is also called directly by popkit.api users and cluster workers.)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from popkit.errors import EnvironmentProblem, PopkitError, UsageError
from popkit.ledger import history
from popkit.machine import gpustate, system
from popkit.measure import ab
from popkit.measure import sizing
from popkit.model import innerloop
from popkit.model import stats
from popkit.model.contract import entry_points
from popkit.model.results import CaseResult, RunReport
from popkit.model.tasks import Task, resolve_task, shadowed_tasks, task_roots
from popkit.progress import Progress
from popkit.run import runner
from popkit.run import sandbox
from popkit.run import warm
from popkit.run.executor import Executor
from popkit.submission.source import Source, check_runnable, reference_submission, task_spec_for

if TYPE_CHECKING:
    from popkit.distributed import scheduler as cluster



@dataclass(frozen=True)
class Request:
    """One `popkit test` / `popkit bench`: the files, the task, the mode and how to run."""

    sources: tuple[Source, ...]
    mode: str = "test"
    task: str | None = None  # --task; default: each file's `#!POPCORN leaderboard` directive
    roots: tuple[Path, ...] = ()  # --tasks-root
    options: runner.RunOptions = field(default_factory=runner.RunOptions)
    baseline: bool = False  # --baseline reference
    allow_cpu: bool = False  # --allow-cpu: a GPU task's benchmarks on the CPU, shapes that fit the timeout
    record: bool = True  # history
    notes: tuple[str, ...] = ()  # said in every report (e.g. --hip-on-cuda)
    rounds: int = ab.DEFAULT_MAX_ROUNDS  # A/B
    budget_s: float = ab.DEFAULT_BUDGET_S  # A/B
    devices: tuple[str, ...] = ()  # --gpus: independent runs spread over these local GPUs (CUDA_VISIBLE_DEVICES values)
    knobs: innerloop.Knobs = innerloop.Knobs()  # --cases/--shape/--timeout: not leaderboard-faithful


@dataclass(frozen=True)
class Resolved:
    task: Task
    notes: tuple[str, ...] = ()  # e.g. a problem-set task that a bundled one of the same name hides


@dataclass(frozen=True)
class RunOutcome:
    """One file's run, its baseline, and what the history said."""

    report: RunReport
    task: Task
    baseline: RunReport | None = None
    warning: str = ""  # the history's, when recording failed
    notes: tuple[str, ...] = ()  # resolution notes (said on stderr by the CLI)

    @property
    def exit_code(self) -> int:
        return int(self.report.exit_code)

    @property
    def speedup(self) -> float | None:
        """Reference score / submission score (public), when both passed."""
        mine = self.report.score_public_s
        ref = self.baseline.score_public_s if self.baseline is not None else None
        return ref / mine if mine and ref else None

    def speedup_interval(self) -> stats.Interval | None:
        """The speed-up's 95% interval from both runs' timed calls (a single process each: how well each
        measured its own mean, not how the next process will differ)."""
        found = speedup_intervals(self.report, self.baseline) if self.baseline is not None else None
        return found[1] if found is not None else None

    def to_json(self) -> dict:
        payload = self.report.to_json()
        if self.baseline is not None:
            payload["baseline"] = self.baseline.to_json()
            if self.speedup is not None:
                payload["speedup"] = self.speedup
                interval = self.speedup_interval()
                if interval is not None and interval.defined:
                    payload["speedup_ci95"] = [interval.low, interval.high]
        if self.warning:
            payload["warning"] = self.warning
        return payload


@dataclass(frozen=True)
class ABOutcome:
    report: ab.ABReport
    warnings: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return int(self.report.exit_code)

    def to_json(self) -> dict:
        return self.report.to_json()


@dataclass(frozen=True)
class SpreadRun:
    """One file of `--gpus` (or a cluster): its report, or the error that stopped it before it ran."""

    source: Source
    task: Task | None
    gpu: str
    report: RunReport | None = None
    error: PopkitError | None = None
    warning: str = ""
    worker: str = ""  # the cluster worker that ran it ("" locally)

    @property
    def exit_code(self) -> int:
        return int(self.report.exit_code if self.report is not None else self.error.exit_code)  # type: ignore

    def to_json(self) -> dict:
        data: dict[str, Any] = {"submission": str(self.source.path), "gpu": self.gpu}
        if self.worker:
            data["worker"] = self.worker
        data.update({"report": self.report.to_json()} if self.report is not None else {"error": self.error.to_json()})
        if self.warning:
            data["warning"] = self.warning
        return data


def case_summary(case: CaseResult) -> stats.Summary | None:
    """What an interval needs from one case: its raw samples, else runs, mean and std (or err · √runs)."""
    if len(case.samples_ns) >= 2:
        return stats.Summary.of(list(case.samples_ns))
    if not case.mean_ns or case.runs < 2:
        return None
    std = case.std_ns if case.std_ns is not None else (case.err_ns or 0.0) * case.runs ** 0.5
    return stats.Summary(n=case.runs, mean=float(case.mean_ns), std=float(std))


def speedup_intervals(report: RunReport, baseline: RunReport) -> tuple[list[tuple[str, float, float, stats.Interval | None]],
                                                                        stats.Interval | None] | None:
    """Per shape (spec, submission mean, reference mean, speedup interval) and the score's speedup interval:
    time of the reference / time of the submission, 95%, from each run's timed calls (one process each); None
    when either run has no passed timed run."""
    mode = "leaderboard" if report.runs_of("leaderboard") else "benchmark"
    mine = next((r for r in report.runs_of(mode, secret=False) if r.passed), None)
    ref = next((r for r in baseline.runs_of(mode, secret=False) if r.passed), None)
    if mine is None or ref is None:
        return None
    rows, pairs = [], []
    for a, b in zip(mine.benchmarks, ref.benchmarks):
        if a.mean_ns and b.mean_ns:
            sa, sb = case_summary(a), case_summary(b)
            interval = stats.ratio_ci95_summary(sb, sa) if sa and sb else None
            rows.append((a.spec, float(a.mean_ns), float(b.mean_ns), interval))
            if sa and sb:
                pairs.append((sb, sa))
    complete = len(pairs) == len(rows) == len(mine.benchmarks)
    score = stats.score_ratio_ci95(pairs, report.ranking_by) if pairs and complete else None
    return rows, score



def with_notes(report: RunReport, notes: Sequence[str], skipped: Sequence[str], total: int) -> RunReport:
    """`report` with the request's notes, and the shapes a CPU run left out (then not leaderboard-faithful)."""
    extra = tuple(notes) + ((sizing.skipped_note(skipped, total),) if skipped else ())
    if not extra:
        return report
    return replace(report, notes=report.notes + extra, skipped_shapes=tuple(skipped))


def keep(report: RunReport, content: bytes, enabled: bool = True) -> str:
    """The history policy: record `report` with the bytes that ran; a problem is returned as a warning."""
    return history.record_run(report, content).warning if enabled else ""


def resolve(source: Source, spec: str | None, roots: Sequence[Path]) -> Resolved:
    """The task for a file: --task, else its `#!POPCORN leaderboard` directive, looked up under the roots."""
    name = task_spec_for(source.path, source.content, spec)
    search = task_roots(list(roots))
    task = resolve_task(name, search)
    notes = tuple(f"`{name}` is popkit's bundled task; {hidden} (under --tasks-root) has the same leaderboard "
                  f"name: pass --task {hidden} to run that one" for hidden in shadowed_tasks(name, search))
    return Resolved(task, notes)


def preflight(task: Task, source: Source, request: Request) -> None:
    """Everything refused before a run: a C++ file for a Python task and a CUDA build without a GPU (exit 4,
    11), a baseline the task cannot take or popkit's harness asked of a task it cannot judge (exit 2). The CPU
    sizing of GPU-sized benchmarks is `sizing`'s."""
    check_runnable(task, source.path, source.content, request.mode)
    warm.refuse_unfit(task, request.options.harness)
    if request.baseline and "custom_kernel" not in (entry_points(task, request.options.harness) or ("custom_kernel",)):
        names = ", ".join(entry_points(task, request.options.harness))
        raise UsageError(f"--baseline reference needs a task whose submissions define custom_kernel "
                         f"({task.name} asks for {names})", "time the reference as a submission of its own instead")


def run(request: Request, progress: Progress | None = None, executor: Executor | None = None,
        note: Progress | None = None) -> RunOutcome:
    """One file: its chain (and the reference's, with a baseline, only when the file's chain passed). `note`
    gets the task resolution's notes as soon as they are known (they are in the outcome too)."""
    progress = progress or (lambda _msg: None)
    source = request.sources[0]
    found = resolve(source, request.task, request.roots)
    for line in found.notes:
        (note or (lambda _msg: None))(line)
    task, changed = innerloop.apply(found.task, request.knobs)
    preflight(task, source, request)
    executor = executor or sandbox.executor_for(request.options.isolation)
    full = len(task.benchmarks)
    task, skipped = sizing.fit(task, source, request, executor, progress)
    with gpustate.Sampler(runner.child_env(request.options)) as watch:  # the clocks it ran at, where NVML is
        report = with_notes(runner.run_submission(task, source.path, request.mode, request.options, progress=progress,
                                                  content=source.content, executor=executor),
                            request.notes + ((innerloop.note(changed),) if changed else ()), skipped, full)
    if watch.state is not None:
        report = replace(report, gpu_state=watch.state.to_json())
    report = replace(report, changed=changed) if changed else report
    base = None
    if request.baseline and report.outcome == "passed":
        # The reference is timed in the same mode, without the chain before it: it is the yardstick.
        options = runner.RunOptions(python=request.options.python, precompile=False, harness=request.options.harness,
                                    chain=False, label="reference", world_size=request.options.world_size,
                                    isolation=request.options.isolation, env=request.options.env)
        progress("baseline: the task's reference")
        base = runner.run_submission(task, Path("reference"), request.mode, options, progress=progress,
                                     system=report.system, content=reference_submission(), executor=executor)
    warning = keep(report, source.content, request.record)
    return RunOutcome(report, task, base, warning, found.notes)


AB_FIRST_LOOK = 4  # rounds an A/B always runs (ab.py: never stops before its first look)


def ab_estimate(task: Task, sources: Sequence[Source], rounds: int, budget_s: float) -> str:
    """How long the A/B may take, said before it starts: each round is one benchmark-mode eval per side, at the
    time the history's newest benchmark-mode runs of either file on this task took (the slower side)."""
    took = []
    for source in sources:
        try:
            records = history.local_runs(source.sha256, task.name, 10)
        except PopkitError:
            records = []
        took += [r.duration_s for rec in records if rec.report for r in rec.report.runs_of("benchmark") if r.passed]
    evals = f"up to {rounds} rounds of 2 evals (one per side; at least {AB_FIRST_LOOK} rounds"
    evals += f", no new pair after {budget_s:g} s)" if budget_s else ")"
    if not took:
        return f"A/B: {evals}; neither file has a recorded benchmark run here, so the first round tells the time"
    each = max(took[:4])
    least = AB_FIRST_LOOK * 2 * each
    most = rounds * 2 * each
    if budget_s:
        most = min(most, max(least, budget_s + 2 * 2 * each))
    return (f"A/B: {evals}; a benchmark eval of these files took about {each:.0f} s here, so expect "
            f"{least:.0f}" + (f"-{most:.0f}" if most > least else "") + " s")


def compare(request: Request, progress: Progress | None = None, executor: Executor | None = None) -> ABOutcome:
    """Two files: the counterbalanced A/B (ab.py); each side goes to the history as a bench run."""
    a, b = request.sources
    found = resolve(a, request.task, request.roots)
    task = found.task
    for source in (a, b):
        preflight(task, source, request)
    executor = executor or sandbox.executor_for(request.options.isolation)
    task, skipped = sizing.fit(task, a, replace(request, mode="benchmark"), executor, progress or (lambda _m: None))
    (progress or (lambda _m: None))(ab_estimate(task, (a, b), request.rounds, request.budget_s))
    report = ab.run_ab(task, a.path, b.path, request.options, max_rounds=request.rounds, budget_s=request.budget_s,
                       progress=progress, contents={"A": a.content, "B": b.content}, executor=executor)
    warnings = []
    for side, source in zip(ab.SIDES, (a, b)):  # a failed side with the run that failed
        side_report = ab.side_report(report, side, task)
        if side_report is not None:
            warnings.append(keep(side_report, source.content, request.record))
    return ABOutcome(report, tuple(w for w in warnings if w))


def spread(request: Request, progress: Progress | None = None, executor: Executor | None = None) -> list[SpreadRun]:
    """Independent runs over local GPUs: run j on GPU j mod n, one process per GPU at a time; each recorded as
    a single run would be. Every file and its task is checked before anything runs."""
    say = progress or (lambda _msg: None)
    check_devices(request.devices)
    base = executor or sandbox.executor_for(request.options.isolation)
    jobs = []
    for source in request.sources:
        task = resolve(source, request.task, request.roots).task
        preflight(task, source, request)
        jobs.append((source, task))
    devices = request.devices

    def worker(index: int) -> list[tuple[int, SpreadRun]]:
        gpu, done = devices[index], []
        pinned = base.on_gpu(gpu)
        for j in range(index, len(jobs), len(devices)):
            source, task = jobs[j]
            tell = (lambda msg, name=source.path.name: say(f"[gpu {gpu}] {name}: {msg}"))
            try:
                fitted, skipped = sizing.fit(task, source, request, pinned, tell)
                report = with_notes(runner.run_submission(fitted, source.path, request.mode, request.options,
                                                          progress=tell, content=source.content, executor=pinned),
                                    request.notes, skipped, len(task.benchmarks))
                done.append((j, SpreadRun(source, task, gpu, report=report,
                                          warning=keep(report, source.content, request.record))))
            except PopkitError as exc:
                done.append((j, SpreadRun(source, task, gpu, error=exc)))
        return done

    from concurrent.futures import ThreadPoolExecutor  # here: it brings logging, which few runs need

    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        finished = [item for share in pool.map(worker, range(min(len(devices), len(jobs)))) for item in share]
    return [outcome for _, outcome in sorted(finished, key=lambda item: item[0])]


def on_cluster(request: Request, address: str | None, *, require_gpu: str | None = None, pairs: bool = False,
               progress: Progress | None = None, on_result: Callable[[Any], None] | None = None
               ) -> tuple[cluster.ClusterRun, list[str]]:
    """Every file (or, with `pairs`, every two files as one A/B) on Ray at `address` (None: a local instance);
    results are recorded here, the only history writer, as they arrive. Returns the run and the history's
    warnings."""
    from popkit.distributed import scheduler as cluster

    groups = ([request.sources[i:i + 2] for i in range(0, len(request.sources), 2)] if pairs
              else [(s,) for s in request.sources])
    jobs = []
    sized: dict[int, tuple[tuple[str, ...], int]] = {}  # job index -> (shapes the CPU sizing left out, of how many)
    for group in groups:  # every file and its task is checked before anything runs
        task = resolve(group[0], request.task, request.roots).task
        for source in group:
            preflight(task, source, request)
        if address is None:  # a local instance runs on this machine: the same CPU sizing as `bench` here
            full = len(task.benchmarks)
            task, skipped = sizing.fit(task, group[0], replace(request, mode="benchmark") if pairs else request,
                                       sandbox.executor_for(request.options.isolation), progress or (lambda _m: None))
            sized[len(jobs)] = (tuple(skipped), full)
        jobs.append(cluster.Job(tuple(s.path for s in group), tuple(s.content for s in group), task))
    warnings: list[str] = []

    def arrived(result: cluster.Result) -> None:
        skipped, full = sized.get(result.index, ((), 0))
        warnings.extend(keep(with_notes(report, (), skipped, full), content, request.record)
                        for report, content in result.history_reports())
        if on_result is not None:
            on_result(result)

    run = cluster.run_jobs(jobs, request.mode, request.options, address, require_gpu=require_gpu,
                           allow_cpu=request.allow_cpu, max_rounds=request.rounds, budget_s=request.budget_s,
                           progress=progress, on_result=arrived)
    return run, [w for w in warnings if w]


def parse_devices(spec: str) -> tuple[str, ...]:
    """`0,1,3` -> ("0", "1", "3"): distinct device indices as CUDA_VISIBLE_DEVICES takes them."""
    devices = tuple(part.strip() for part in spec.split(","))
    if not devices or not all(g.isdigit() for g in devices):
        raise UsageError(f"--gpus {spec!r}: give device indices separated by commas", "e.g. --gpus 0,1")
    if len(set(devices)) != len(devices):
        raise UsageError(f"--gpus {spec!r}: a GPU appears twice", "one process per GPU: list each GPU once")
    return devices


def bench_mode(files: int, *, leaderboard: bool, profile: bool, baseline: str | None, world_size: int | None,
               rounds: int, spread: bool = False, ab: bool = True) -> str:
    """The mode of `popkit bench` and what its options cannot do together (UsageError, exit 2), for the CLI and
    popkit.api alike. `spread`: the files run independently (`--gpus`); `ab`: two files would be an A/B."""
    if leaderboard and profile:
        raise UsageError("--leaderboard and --profile are different modes", "pick one")
    if baseline is not None and baseline != "reference":
        raise UsageError(f"unknown baseline `{baseline}`", "the only baseline is `reference`: --baseline reference")
    if ab and not spread and files == 2:
        if leaderboard or profile or baseline or world_size:
            raise UsageError("an A/B comparison runs the task's own benchmarks in benchmark mode only",
                             "drop --leaderboard/--profile/--baseline/--world-size for A/B")
        if rounds % 2:
            raise UsageError(f"--rounds {rounds}: the A/B runs rounds in pairs (ABBA)",
                             "give an even number, e.g. --rounds 8")
    if spread and baseline:
        raise UsageError("--baseline reference runs with one submission", "drop --baseline with --gpus")
    return "leaderboard" if leaderboard else "profile" if profile else "benchmark"


def check_devices(devices: Sequence[str]) -> None:
    """Every GPU index of `--gpus` exists here (exit 11 naming the first that does not), where that is known."""
    count = system.gpu_count()
    missing = [g for g in devices if count is not None and int(g) >= count]
    if missing:
        here = f"GPUs here: {', '.join(map(str, range(count)))}" if count else "this machine has no GPU"
        raise EnvironmentProblem(f"--gpus {','.join(devices)}: there is no GPU {missing[0]} ({here})",
                                 "list GPUs that exist (`nvidia-smi -L` names them), or drop --gpus")


def first_failure(codes: Sequence[int]) -> int:
    """The exit code of a many-file run: that of the first run that did not pass."""
    return next((code for code in codes if code), 0)


__all__ = ["Request", "RunOutcome", "ABOutcome", "SpreadRun", "run", "compare", "spread", "keep", "resolve",
           "preflight", "parse_devices", "on_cluster"]
