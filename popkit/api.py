"""popkit as Python functions: the one supported import surface for scripts and orchestrators.

Each function does what the `popkit` command of the same name does and returns its frozen result;
`document(result)` is the JSON document `--json` prints for it (`popkit/<kind>/1`) and `exit_code(result)`
the exit code the command gives it. Bad input raises a PopkitError subclass (its `message`, `hint` and
`exit_code` are the CLI's); nothing here prints. A run records itself in the history as the CLI's does
(`record=False`: not). docs/api.md documents every name; tests/test_api.py keeps the names and
signatures stable.

A submission is a path, or `SourceText(text)`: the text is written for the call to a private temporary
folder (removed afterwards, or by a guard process if this process dies) as a file named by the first 16
hex digits of its sha256, which is the name the report and the history record.

Runs (`test`, `bench`, `tune`) are judged by popkit's sealed harness unless told otherwise (`harness="popkit"`:
the verdict is written where the submission cannot reach, docs/sealed-run.md); `harness="task"` runs the
task's own eval, as open as the leaderboard's, which is the CLI's `test` and `bench` default. A task popkit's
harness cannot judge (several GPUs, no reference.py, other entry points) raises UsageError saying why; a
run's or an A/B's document says who judged (`harness`, `judged`).

`progress` arguments take a callable getting one line per step; when it also has `live(text, key)` and
`timed(label)` (views.common.ProgressPrinter, the MCP server's worker), runs report the case being run
and builds their elapsed time. A long call is stopped by KeyboardInterrupt in the calling thread
(Ctrl-C): its child processes are killed and its working folders removed before the exception goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence, Union

from popkit.author import render
from popkit.check import lint
from popkit.ledger import history as ledger
from popkit.ledger import runcompare
from popkit.ledger import submit as submitter
from popkit.machine import runnable
from popkit.machine import system
from popkit.measure import absim, ncu
from popkit.model import stats
from popkit.model.contract import entry_points
from popkit.operations import doctor as checkup
from popkit.operations import evidence as proof
from popkit.operations import requests
from popkit.operations import risk as risks
from popkit.operations import workflows
from popkit.run import compile as compiler
from popkit.run import proc
from popkit.run import sandbox
from popkit.toolchain import hiponcuda
from popkit.tuning import workflow as tuner
from popkit.documents import (HistoryList, RunDetail, TaskChecks, TaskDetail, TaskList, document,
                              exit_code, kind_of)
from popkit.author.render import Catalog, Written
from popkit.check.lint import LintReport
from popkit.errors import PopkitError, UsageError
from popkit.ledger.popcorn import DEFAULT_TIMEOUT_S as SUBMIT_TIMEOUT_S
from popkit.ledger.runcompare import RunComparison
from popkit.ledger.submit import SubmitResult
from popkit.measure.absim import Noise as SimNoise, Outcome as SimOutcome
from popkit.measure.ncu import NcuReport
from popkit.model.results import score_s
from popkit.model.stats import Interval
from popkit.model.tasks import MAX_TIMEOUT_S, list_tasks, resolve_task, task_roots
from popkit.operations.doctor import DoctorReport
from popkit.operations.evidence import VerifyReport
from popkit.operations.requests import SpreadOutcome
from popkit.operations.risk import RiskReport
from popkit.operations.workflows import ABOutcome, RunOutcome
from popkit.progress import Progress
from popkit.resources import popkit_home_source
from popkit.run.compile import CompileReport
from popkit.run.protocol import MAX_SECRET_RUNS, random_secret_seeds
from popkit.run.runner import RunOptions
from popkit.submission.source import Source, check_language_for, check_runnable, validate_submission
from popkit.tuning.result import TuneReport

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class SourceText:
    """A submission given as its text; `suffix` is the file's extension (`.py`; `check` also takes `.cu`...)."""

    text: str
    suffix: str = ".py"


Submission = Union[PathLike, SourceText]
Roots = Sequence[PathLike]


# ----------------------------------------------------------------------------------------- tasks


def tasks(*, roots: Roots = (), check: bool = False, python: Optional[str] = None) -> TaskList | TaskChecks:
    """`popkit tasks`: bundled tasks and those of problem sets under `roots` (and POPKIT_TASKS_PATH); a set or
    entry that does not load is in `skipped`. `check=True`: whether this machine can run each (`TaskChecks`)."""
    skipped: list = []
    found = tuple(list_tasks(task_roots(list(roots)), skipped))
    if not check:
        return TaskList(found, tuple(skipped))
    python = python or sys.executable
    scripts = sandbox.scripts_for()  # the evals' interpreter runs as the evals do
    probed = system.probe(python, scripts=scripts)
    return TaskChecks(found, tuple(runnable.check_tasks(found, python, probed, scripts)), probed, tuple(skipped))


def task_show(name: str, *, roots: Roots = ()) -> TaskDetail:
    """`popkit tasks show NAME`: a task by name, folder or leaderboard name (TaskError, exit 3, if none)."""
    return TaskDetail(resolve_task(name, task_roots(list(roots))))


# -------------------------------------------------------------------------------------- authoring


def new(task: str, output: PathLike, *, target: str = "cuda", style: str = "inline", gpu: Optional[str] = None,
        arch: Optional[str] = None, force: bool = False, roots: Roots = ()) -> Written:
    """`popkit new`: render a starter submission for `task` to `output` (refuses to overwrite unless `force`)."""
    return render.new_submission(task, Path(output), target=target, style=style, gpu=gpu, arch=arch, force=force,
                                 roots=task_roots(list(roots)))


def templates(*, roots: Roots = ()) -> Catalog:
    """`popkit templates`: template targets and styles, and which tasks have a kernel spec."""
    return render.catalog(task_roots(list(roots)))


def compile(submission: Submission, *, task: Optional[str] = None, clean: bool = False, timeout_s: float = 600.0,
            python: Optional[str] = None, arch: Optional[str] = None, roots: Roots = (),
            progress: Optional[Progress] = None) -> CompileReport:
    """`popkit compile`: build the extension without running a kernel; `timeout_s` bounds one build (1 to 86400)."""
    requests.in_range("timeout_s", timeout_s, 1, MAX_TIMEOUT_S)
    with _paths([submission]) as (path,):
        return compiler.compile_submission(path, task=task, roots=task_roots(list(roots)), clean=clean,
                                           timeout_s=timeout_s, python=requests.interpreter(python), progress=progress,
                                           arch=arch)


def doctor(*, python: Optional[str] = None) -> DoctorReport:
    """`popkit doctor`: the environment's checks, each with a fix (exit_code 11 when one is a problem)."""
    return checkup.doctor(python)


def simulate_ab(trials: int, ratio: float, noise: Optional[SimNoise] = None, *, shapes: int = 4, max_rounds: int = 8,
                budget_s: float = 60.0, eval_s: float = 5.0, seed: int = 0) -> SimOutcome:
    """The A/B's decision rule (`bench A B`) on `trials` simulated A/Bs where B takes `ratio` times A's time:
    how many shape verdicts named a winner, and the right one (docs/timing.md). Seeded, no processes."""
    return absim.simulate(trials, ratio, noise or SimNoise(), shapes=shapes, max_rounds=max_rounds,
                          budget_s=budget_s, eval_s=eval_s, seed=seed)


def hip_on_cuda_env() -> dict[str, str]:
    """The environment entries `test(hip_on_cuda=True)` gives its children (the HIP-to-CUDA headers, and the
    start-up hook on PYTHONPATH): for a script that builds or imports a HIP file on an NVIDIA GPU itself."""
    return hiponcuda.child_env()


# ------------------------------------------------------------------------------------------- runs


def test(*submissions: Submission, task: Optional[str] = None, roots: Roots = (), secret_seeds: Sequence[int] = (),
         secret_runs: int = 0, harness: str = "popkit", python: Optional[str] = None,
         precompile: Optional[bool] = None, keep_workdir: bool = False, world_size: Optional[int] = None,
         hip_on_cuda: bool = False, device: Optional[str] = None, devices: Optional[Sequence[str]] = None,
         require_isolation: bool = False, record: bool = True,
         progress: Optional[Progress] = None) -> RunOutcome | SpreadOutcome:
    """`popkit test`: the task's tests in test mode, then one secret chain per seed (`secret_seeds`, plus
    `secret_runs` random ones, at most 100). `device` pins the run to one GPU index; several files need `devices`
    (independent runs spread over those GPUs, a SpreadOutcome)."""
    requests.in_range("secret_runs", secret_runs, 0, MAX_SECRET_RUNS)
    seeds = requests.secret_seeds(secret_seeds) + random_secret_seeds(secret_runs)
    options = requests.run_options(python=python, precompile=precompile, harness=harness, seeds=seeds,
                                   keep_workdir=keep_workdir, world_size=world_size, require_isolation=require_isolation)
    if len(submissions) != 1 and devices is None:
        raise UsageError("test takes one submission", "several independent runs: popkit test a.py b.py --gpus 0,1")
    with _paths(submissions) as paths:
        sources = tuple(Source.read(p) for p in paths)
        notes: tuple[str, ...] = ()
        if hip_on_cuda:
            text, name = sources[0].text, str(sources[0].path)
            hiponcuda.require_hip(text, name)
            options = replace(options, env={**options.env, **hiponcuda.child_env()}, label=hiponcuda.LABEL)
            notes = hiponcuda.notes_for(text, name)
        request = workflows.Request(sources, "test", task, _roots(roots), options, record=record, notes=notes)
        return requests.dispatch(request, device=device, devices=devices, progress=progress)


def bench(*submissions: Submission, task: Optional[str] = None, roots: Roots = (), leaderboard: bool = False,
          profile: bool = False, profiler: str = "torch", secret_seeds: Sequence[int] = (), secret_runs: int = 1,
          baseline: Optional[str] = None, rounds: int = 8, budget_s: float = 60.0, allow_cpu: bool = False,
          harness: str = "popkit", python: Optional[str] = None, precompile: Optional[bool] = None,
          keep_workdir: bool = False, world_size: Optional[int] = None, device: Optional[str] = None,
          devices: Optional[Sequence[str]] = None, require_isolation: bool = False, record: bool = True,
          progress: Optional[Progress] = None, alone: bool = False, env: Optional[Mapping[str, str]] = None,
          label: str = "") -> RunOutcome | ABOutcome | SpreadOutcome | NcuReport:
    """`popkit bench`: one file in benchmark mode (`leaderboard=True`: the ranked chain, public then
    `secret_runs` secret chains or `secret_seeds`; `profile=True`: profile mode, `profiler="ncu"` Nsight
    Compute), or two files as an A/B (ABOutcome: counterbalanced rounds, at most `rounds` (even, >= 4),
    no new pair after `budget_s` seconds, 0 for none). `baseline="reference"` also times the task's
    reference. `device` pins the run to one GPU; several files with `devices` are independent runs.
    For measurements (scripts/): `alone=True` runs the mode without the chain before it (leaderboard mode
    alone, as the leaderboard never does: not a verdict), `env` adds variables to every child's environment,
    `label` names the run in its report."""
    if profiler not in ("torch", "ncu"):
        raise UsageError(f"unknown profiler `{profiler}`", "use --profiler torch or --profiler ncu")
    requests.in_range("secret_runs", secret_runs, 0, MAX_SECRET_RUNS)
    requests.in_range("rounds", rounds, 4, None)
    requests.in_range("budget_s", budget_s, 0, None)
    if profile and profiler == "ncu":
        if len(submissions) != 1 or devices or leaderboard or baseline:
            raise UsageError("--profiler ncu profiles one submission", "popkit bench FILE --profile ncu")
        return _ncu(submissions[0], task, roots, python)
    if len(submissions) > 2 and devices is None:
        raise UsageError("bench takes one submission, or two for an A/B comparison",
                         "popkit bench A.py B.py; several independent runs: popkit bench a.py b.py c.py --gpus 0,1")
    if not submissions:
        raise UsageError("bench takes one submission, or two for an A/B comparison", "popkit bench FILE")
    mode = workflows.bench_mode(len(submissions), leaderboard=leaderboard, profile=profile, baseline=baseline,
                                world_size=world_size, rounds=rounds, spread=devices is not None)
    seeds = requests.secret_seeds(secret_seeds)
    if leaderboard and not seeds:
        seeds = random_secret_seeds(secret_runs)
    options = requests.run_options(python=python, precompile=precompile, harness=harness, seeds=seeds,
                                   keep_workdir=keep_workdir, world_size=world_size, require_isolation=require_isolation)
    options = replace(options, chain=not alone, env=dict(env or {}), label=label)
    with _paths(submissions) as paths:
        sources = tuple(Source.read(p) for p in paths)
        request = workflows.Request(sources, mode, task, _roots(roots), options, baseline=baseline is not None,
                                    allow_cpu=allow_cpu, record=record, rounds=rounds, budget_s=budget_s)
        return requests.dispatch(request, device=device, devices=devices, progress=progress)


def tune(submission: Submission, output: PathLike, *, task: Optional[str] = None, roots: Roots = (),
         against: Optional[Submission] = None, engine: str = "grid", max_variants: int = 64, seed: int = 0,
         budget_s: float = 900.0, confirm: int = 2, rounds: int = 8, ab_budget_s: float = 60.0, jobs: int = 0,
         per_shape: bool = True, resume: bool = False, force: bool = False, allow_cpu: bool = False,
         devices: Optional[Sequence[str]] = None, python: Optional[str] = None, harness: str = "popkit",
         keep_workdir: bool = False, world_size: Optional[int] = None, record: bool = True,
         progress: Optional[Progress] = None, always_ab: bool = False, cold_race: bool = False) -> TuneReport:
    """`popkit tune`: every launch geometry the file's `#!POPKIT tune` lines allow, built, checked, raced and the
    finalists confirmed by A/Bs against the incumbent (`against`, default the file); the fastest is written to
    `output` (never the input; `force` replaces an existing file). `budget_s` stops new work (0: none);
    `rounds`/`ab_budget_s` bound each A/B; `devices` spreads checks and race evals over local GPUs; `always_ab`
    confirms by A/B even when the race's own rounds separate the finalists; `cold_race` runs every race eval cold
    rather than through warm pairs started a few at a time ahead (docs/tune.md)."""
    for name, value, low, high in (("max_variants", max_variants, 1, 10_000), ("seed", seed, 0, None),
                                   ("budget_s", budget_s, 0, None), ("confirm", confirm, 1, 8),
                                   ("rounds", rounds, 4, None), ("ab_budget_s", ab_budget_s, 0, None),
                                   ("jobs", jobs, 0, 64)):
        requests.in_range(name, value, low, high)
    if rounds % 2:
        raise UsageError(f"--rounds {rounds}: the A/B runs rounds in pairs (ABBA)",
                         "give an even number, e.g. --rounds 8")
    options = requests.run_options(python=python, harness=harness, keep_workdir=keep_workdir, world_size=world_size)
    settings = tuner.TuneSettings(engine=engine, max_variants=max_variants, seed=seed, budget_s=budget_s,
                                  confirm=confirm, ab_rounds=rounds, ab_budget_s=ab_budget_s, jobs=jobs,
                                  per_shape=per_shape, resume=resume, record=record, race_decides=not always_ab,
                                  warm_race=not cold_race)
    files = [submission] + ([against] if against is not None else [])
    with _paths(files) as paths:
        source = Source.read(paths[0])
        found = workflows.resolve(source, task, _roots(roots)).task
        check_runnable(found, paths[0], source.content, "benchmark")
        found, notes = tuner.sized_task(found, source, options, allow_cpu, progress)
        spread = workflows.parse_devices(",".join(str(d) for d in devices)) if devices else ()
        return tuner.run_tune(found, paths[0], Path(output), options, settings,
                              against=paths[1] if against is not None else None, force=force, progress=progress,
                              devices=spread, notes=notes)


# ---------------------------------------------------------------------------- checks and the server


def check(submission: Submission, *, leaderboard: Optional[str] = None, gpu: Optional[str] = None,
          mode: Optional[str] = None, roots: Roots = (), guard: bool = True) -> LintReport:
    """`popkit check`: what the leaderboard server refuses, and the reward-hack lint (exit_code 8 on errors).
    A C++/CUDA source file for a Python task raises SubmissionError (exit 4)."""
    search = task_roots(list(roots))
    with _paths([submission]) as (path,):
        report = lint.check_file(path, leaderboard=leaderboard, gpu=gpu, mode=mode, roots=search, guard=guard)
        check_language_for(path, report.leaderboard, search)
    return report


def risk(submission: Submission, *, task: Optional[str] = None, roots: Roots = (), repeats: int = 3, seeds: int = 2,
         secret_seeds: Sequence[int] = (), benchmarks: Optional[bool] = None, python: Optional[str] = None,
         require_isolation: bool = False, progress: Optional[Progress] = None) -> RiskReport:
    """`popkit risk`: each case's margin to the task's tolerance and determinism, on the public cases, `seeds`
    random secret seeds (or `secret_seeds`) and shapes next to the grid; `level` low/medium/high (exit_code 1: high)."""
    requests.in_range("repeats", repeats, 2, 20)
    requests.in_range("seeds", seeds, 0, 20)
    with _paths([submission]) as (path,):
        source = Source.read(path)
        found = workflows.resolve(source, task, _roots(roots))
        names = entry_points(found.task)
        if "custom_kernel" not in (names or ("custom_kernel",)):
            raise UsageError(f"popkit risk calls custom_kernel; {found.task.name} asks for {', '.join(names)}",
                             "use popkit bench --leaderboard --secret-runs N")
        validate_submission(path, source.content, names)
        check_runnable(found.task, path, source.content, "test")
        options = RunOptions(python=requests.interpreter(python), isolation="require" if require_isolation else "auto")
        chosen = tuple(secret_seeds) or random_secret_seeds(seeds)
        return risks.assess(found.task, source, options, repeats=repeats, secret_seeds=chosen, benchmarks=benchmarks,
                            progress=progress)


def verify(evidence_file: PathLike, *, task: Optional[str] = None, roots: Roots = (),
           tolerance: float = proof.DEFAULT_TOLERANCE, python: Optional[str] = None,
           progress: Optional[Progress] = None) -> VerifyReport:
    """`popkit verify`: re-run an evidence file here, shape by shape (exit_code 1: a shape does not reproduce);
    a tampered file fails first (exit 1), another GPU model is refused (11), other task files too (3)."""
    requests.in_range("tolerance", tolerance, 0.0, 1.0)
    return proof.verify(Path(evidence_file), tolerance=tolerance, task=task, roots=_roots(roots),
                        python=requests.interpreter(python) if python else None, progress=progress)


def submit(submission: Submission, *, mode: str = "leaderboard", gpu: Optional[str] = None,
           leaderboard: Optional[str] = None, gate: str = "none", dry_run: bool = False, task: Optional[str] = None,
           roots: Roots = (), timeout_s: float = SUBMIT_TIMEOUT_S, guard: bool = True, harness: str = "popkit",
           progress: Optional[Progress] = None) -> SubmitResult:
    """`popkit submit`: check, the local `gate` (none, test, leaderboard), then popcorn-cli; `dry_run` sends
    nothing and returns the exact command (the gate still runs). `timeout_s` waits for popcorn-cli. The gate is
    judged by `harness`: popkit's sealed harness by default here, as for every run of the API."""
    requests.in_range("timeout_s", timeout_s, 1, MAX_TIMEOUT_S)
    options = requests.run_options(harness=harness)
    with _paths([submission]) as (path,):
        return submitter.submit(path, mode=mode, gpu=gpu, leaderboard=leaderboard, gate=gate, dry_run=dry_run,
                                task=task, roots=task_roots(list(roots)), timeout_s=timeout_s, guard=guard,
                                run_options=options, progress=progress)


# ----------------------------------------------------------------------------------------- history


def history(*, task: Optional[str] = None, limit: int = 20) -> HistoryList:
    """`popkit history`: the `limit` newest recorded runs (of `task` or leaderboard, when given)."""
    requests.in_range("limit", limit, 1, None)
    db = ledger.History()
    return HistoryList(tuple(db.list_runs(task, limit)), db.path, popkit_home_source())


def show(run: int, *, source: bool = False) -> RunDetail:
    """`popkit show RUN`: one recorded run; `source=True` adds the exact bytes that ran."""
    db = ledger.History()
    return RunDetail(db.get_run(run), db.content(run) if source else None)


def compare(run_a: int, run_b: int) -> RunComparison:
    """`popkit compare A B`: two recorded bench runs shape by shape (time B / time A, 95% intervals)."""
    return runcompare.compare_runs(run_a, run_b)


# ---------------------------------------------------------------------------------------- helpers


def score(means_ns: Sequence[float], ranking_by: str) -> Optional[float]:
    """A task's score in seconds from its shapes' mean times (ns), combined by `ranking_by` (last, mean, geom)."""
    return score_s(list(means_ns), ranking_by)


def ratio_interval(ratios: Sequence[float]) -> Interval:
    """The 95% interval of a typical ratio from independent paired ratios (one per round, as the A/B's)."""
    return stats.paired_ratio_interval(list(ratios))


def _ncu(submission: Submission, task_spec: Optional[str], roots: Roots, python: Optional[str]) -> NcuReport:
    with _paths([submission]) as (path,):
        source = Source.read(path)
        found = workflows.resolve(source, task_spec, _roots(roots))
        if "custom_kernel" not in (entry_points(found.task) or ("custom_kernel",)):
            raise UsageError(f"--profiler ncu calls custom_kernel; {found.task.name} asks for "
                             f"{', '.join(entry_points(found.task))}", "profile with --profiler torch")
        validate_submission(path, source.content, entry_points(found.task))
        return ncu.profile(found.task, path, source.content, requests.interpreter(python))


def _roots(roots: Roots) -> tuple[Path, ...]:
    return tuple(Path(r) for r in roots)


_SUFFIX = re.compile(r"^\.[A-Za-z0-9]{1,8}$")


@contextlib.contextmanager
def _paths(submissions: Sequence[Submission]) -> Iterator[list[Path]]:
    """The files of `submissions`: paths as given; each SourceText written to a private folder for the block."""
    texts = [s for s in submissions if isinstance(s, SourceText)]
    if not texts:
        yield [Path(s) for s in submissions]  # type: ignore[arg-type]
        return
    for text in texts:
        if not _SUFFIX.match(text.suffix):
            raise UsageError(f"source suffix {text.suffix!r}: not a file extension", "give one like `.py`")
    with proc.WorkDir("popkit-source-") as folder:  # mkdtemp: only this user can enter it
        paths = []
        for s in submissions:
            if isinstance(s, SourceText):
                data = s.text.encode("utf-8")
                path = folder / (hashlib.sha256(data).hexdigest()[:16] + s.suffix)
                path.write_bytes(data)
                paths.append(path)
            else:
                paths.append(Path(s))
        yield paths


__all__ = [
    "SourceText", "Submission", "Progress", "PopkitError",
    "tasks", "task_show", "new", "templates", "compile", "doctor", "hip_on_cuda_env", "test", "bench", "tune",
    "check", "submit",
    "history", "show", "compare", "document", "exit_code", "kind_of", "score", "ratio_interval", "Interval",
    "TaskList", "TaskChecks", "TaskDetail", "HistoryList", "RunDetail", "RunComparison", "SpreadOutcome",
    "RunOutcome", "ABOutcome", "NcuReport", "CompileReport", "LintReport", "SubmitResult", "DoctorReport",
    "Written", "Catalog", "TuneReport", "simulate_ab", "SimNoise", "SimOutcome",
]
