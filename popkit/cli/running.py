"""popkit commands that run submissions locally: test, bench, tasks."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, List, Optional

import typer

# What only some options use (--watch, --hip-on-cuda, --cluster, ncu, tasks check) is imported where they
# run: `popkit test FILE` pays for none of it.
from popkit.cli.app import app, finite
from popkit.errors import ExitCode, UsageError
from popkit.machine import runnable
from popkit.machine import system
from popkit.model import innerloop
from popkit.model.contract import entry_points
from popkit.model.tasks import MAX_TIMEOUT_S, list_tasks, resolve_task, task_roots
from popkit.operations import requests
from popkit.operations import workflows
from popkit.run import sandbox
from popkit.run.protocol import MAX_SECRET_RUNS, MAX_SECRET_SEED, random_secret_seeds
from popkit.submission.source import Source, validate_submission
from popkit.views import common, pictures
from popkit.views import running as view
from popkit.views.common import escape

TaskOpt = Annotated[Optional[str], typer.Option("--task", "-t", help="Bundled task name, task directory, or leaderboard name. Default: the file's `#!POPCORN leaderboard` directive.")]
RootsOpt = Annotated[Optional[List[Path]], typer.Option("--tasks-root", help="Folder or problem-set yaml to look up leaderboard names in (repeatable; also POPKIT_TASKS_PATH).")]
PythonOpt = Annotated[Optional[str], typer.Option("--python", help="Interpreter for the eval (default: the one running popkit).")]
PrecompileOpt = Annotated[Optional[bool], typer.Option("--precompile/--no-precompile", help="Force or skip the compile pre-step (`python submission.py`). Default: run it unless there is nothing to build or the build cache already holds this source.")]
HarnessOpt = Annotated[str, typer.Option("--harness", help="`task` (default): the task's own eval, as open as the leaderboard's (fidelity). `popkit`: popkit's sealed harness judges, where the submission cannot reach (the default of tune, MCP and popkit.api).")]
TimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", min=0.001, max=MAX_TIMEOUT_S, help="Inner loop: seconds each mode's eval may take, instead of the task's; the run is marked not leaderboard-faithful.")]
SeedOpt = Annotated[Optional[List[int]], typer.Option("--secret-seed", min=0, max=MAX_SECRET_SEED, help="Secret seed for a secret run, 0 to 2147483647 (repeatable).")]
KeepOpt = Annotated[bool, typer.Option("--keep-workdir", help="Keep the working directory and print where it is.")]
HistoryOpt = Annotated[bool, typer.Option("--history/--no-history", help="Record the run in the history database.")]
WorldSizeOpt = Annotated[Optional[int], typer.Option("--world-size", min=1, help="Multi-GPU tasks: run every case at this world_size, for a machine with fewer GPUs than the task asks for (scaled down: marked not leaderboard-faithful).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document (schema popkit/run/1) instead of the report.")]
GpusOpt = Annotated[Optional[str], typer.Option("--gpus", help="Independent runs of every file spread over these local GPUs (e.g. 0,1), one process per GPU; two files are then two runs, not an A/B.")]


IsolationOpt = Annotated[bool, typer.Option("--require-isolation", help="Stop (exit 11) unless every process of the run can be sandboxed (Linux namespaces); without it a run where they are unavailable goes on, and its report says `isolation: none (reason)`.")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", help="Run every file on Ray: `ray` starts a local Ray instance over this machine's GPUs (or CPUs) and stops it after; `ray:HOST:PORT` (or RAY_ADDRESS) joins a running cluster. One GPU per run; results stream in. Needs pip install 'popkit[ray]'.")]
RequireGpuOpt = Annotated[Optional[str], typer.Option("--require-gpu", help="With --cluster: only workers with this GPU kind (e.g. H100) may run; a run on another kind fails as `parity mismatch`.")]
JsonLinesOpt = Annotated[bool, typer.Option("--json-lines", help="With --cluster: print one JSON line (schema popkit/cluster-result/1) per result as it arrives.")]

WatchOpt = Annotated[bool, typer.Option("--watch", help="Judge the file now and after every save, each time by a warm worker started in the sandbox before the save (the verdict says so; --json: one line per verdict, schema popkit/watch/1). Ctrl-C stops. Without it every run is fresh processes, as on the leaderboard.")]


def _say(notes) -> None:
    for note in notes:
        common.err_console().print(f"note: {escape(note)}")


def _watch(request: workflows.Request, json: bool) -> None:
    """--watch: verdicts until Ctrl-C (exit 130); an error before the first verdict exits with its code."""
    from popkit.operations import watch as watching
    from popkit.views import watching as watch_view

    with common.progress_printer(json) as progress:
        def verdict(v: watching.Verdict) -> None:
            progress.close()
            watch_view.show_verdict(v, task_of[0], request.mode, json_lines=json)

        task_of: list = [None]

        def start(setup: watching.Setup) -> None:
            task_of[0] = setup.task
            watch_view.show_start(setup, request.mode)

        watching.run(request, on_verdict=verdict, on_ready=watch_view.show_ready, on_start=start,
                     progress=progress, note=lambda line: _say([line]))
    raise typer.Exit(0)


@app.command()
def test(
    submissions: Annotated[List[Path], typer.Argument(help="Your submission file (any name; it runs as the task's submission.py). Several files with --gpus.")],
    task: TaskOpt = None,
    tasks_root: RootsOpt = None,
    python: PythonOpt = None,
    precompile: PrecompileOpt = None,
    harness: HarnessOpt = "task",
    secret_seed: SeedOpt = None,
    secret_runs: Annotated[int, typer.Option("--secret-runs", min=0, max=MAX_SECRET_RUNS, help="Also run the tests under K random secret seeds (each printed), after the public run.")] = 0,
    keep_workdir: KeepOpt = False,
    world_size: WorldSizeOpt = None,
    hip_on_cuda: Annotated[bool, typer.Option("--hip-on-cuda", help="A HIP file on an NVIDIA GPU: build its kernels with nvcc through popkit's HIP-to-CUDA mapping and run the tests. A logic check, not AMD timing; code that depends on 64-lane wavefronts is flagged.")] = False,
    gpus: GpusOpt = None,
    require_isolation: IsolationOpt = False,
    watch: WatchOpt = False,
    history: HistoryOpt = True,
    cluster: ClusterOpt = None,
    require_gpu: RequireGpuOpt = None,
    json_lines: JsonLinesOpt = False,
    cases: Annotated[str, typer.Option("--cases", help="Inner loop: only these test cases, 1-based (`1,3` or `2-4`); the run is marked not leaderboard-faithful.")] = "",
    timeout: TimeoutOpt = None,
    json: JsonOpt = False,
) -> None:
    """Run the task's tests on SUBMISSION, the way the leaderboard's `test` mode does.

    \b
    Examples:
      popkit test submissions/vectoradd/pytorch.py --secret-runs 1
      popkit test submissions/softmax/hip.py --hip-on-cuda
      popkit test v1.py v2.py v3.py --cluster ray     (every file on a local Ray instance)
      popkit test mine.py --watch     (a verdict after every save, from a warm worker)
    """
    common.set_json(json)
    seeds = tuple(secret_seed or ()) + random_secret_seeds(secret_runs)
    options = requests.run_options(python=python, precompile=precompile, harness=harness, seeds=seeds,
                                   keep_workdir=keep_workdir, world_size=world_size,
                                   require_isolation=require_isolation)
    if (cases or timeout) and (len(submissions) > 1 or gpus is not None or cluster or watch):
        raise UsageError("--cases and --timeout narrow one file's run here",
                         "popkit test FILE --cases 1,3 --timeout 30")
    sources = tuple(Source.read(path) for path in submissions)
    request = workflows.Request(sources, "test", task, tuple(tasks_root or ()), options, record=history,
                                knobs=innerloop.Knobs(cases=cases, timeout_s=timeout))
    _on_cluster(request, cluster, require_gpu, json_lines, json,
                local_only=((hip_on_cuda, "--hip-on-cuda"), (gpus is not None, "--gpus"), (watch, "--watch")))
    if len(sources) > 1 and gpus is None:
        raise UsageError(f"test takes one submission ({len(sources)} given); several run with --gpus or --cluster",
                         "popkit test a.py b.py --gpus 0,1, or --cluster ray")
    notes: tuple[str, ...] = ()
    if hip_on_cuda:
        from popkit.toolchain import hiponcuda

        text = sources[0].text
        hiponcuda.require_hip(text, str(sources[0].path))
        options = replace(options, env={**options.env, **hiponcuda.child_env()}, label=hiponcuda.LABEL)
        notes = hiponcuda.notes_for(text, str(sources[0].path))
    request = replace(request, options=options, notes=notes)
    if watch:
        _watch(replace(request, devices=workflows.parse_devices(gpus) if gpus else ()), json)
    _run(request, json, devices=gpus)


@app.command()
def bench(
    submissions: Annotated[List[Path], typer.Argument(help="One submission, or two (A B) for an interleaved A/B comparison.")],
    task: TaskOpt = None,
    tasks_root: RootsOpt = None,
    leaderboard: Annotated[bool, typer.Option("--leaderboard", help="Run the ranked chain (test, benchmark, leaderboard), public then secret, and print the score.")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="Run profile mode (one profiler table per benchmark).")] = False,
    secret_seed: SeedOpt = None,
    secret_runs: Annotated[int, typer.Option("--secret-runs", min=0, max=MAX_SECRET_RUNS, help="With --leaderboard: number of secret runs with random seeds (each printed).")] = 1,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="`reference`: also time the task's ref_kernel and show the speedup.")] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=4, help="A/B only: most rounds (even; one fresh eval per side each, in ABBA order).")] = 8,
    budget: Annotated[float, typer.Option("--budget", min=0, callback=finite, help="A/B only: seconds after which no new pair of rounds starts (0: no limit; never before round 4).")] = 60.0,
    allow_cpu: Annotated[bool, typer.Option("--allow-cpu", help="On a machine without a GPU: run the benchmark shapes that fit the timeout (timed from the smallest; the others are named and skipped, and the run is marked not leaderboard-faithful).")] = False,
    python: PythonOpt = None,
    precompile: PrecompileOpt = None,
    harness: HarnessOpt = "task",
    keep_workdir: KeepOpt = False,
    world_size: WorldSizeOpt = None,
    profiler: Annotated[str, typer.Option("--profiler", help="With --profile: `torch` (the eval's profile mode) or `ncu` (Nsight Compute on the last benchmark case: per kernel time, DRAM and SM % of peak, registers, occupancy). `--profile ncu` works too.")] = "torch",
    gpus: GpusOpt = None,
    benchmark_index: Annotated[Optional[int], typer.Option("--benchmark-index", help="With --profile ncu: the benchmark case to profile (0-based; default the last), as a hosted profile request's benchmark_index.")] = None,
    ncu_kernel_name: Annotated[Optional[str], typer.Option("--ncu-kernel-name", help="With --profile ncu: profile only kernels of this name (1-1024 characters), as the server takes ncu_kernel_name.")] = None,
    ncu_kernel_name_base: Annotated[Optional[str], typer.Option("--ncu-kernel-name-base", help="With --ncu-kernel-name: which name it matches: function, demangled or mangled (default function).")] = None,
    ncu_launch_count: Annotated[Optional[int], typer.Option("--ncu-launch-count", help="With --profile ncu: profile at most this many kernel launches (1 or more).")] = None,
    evidence: Annotated[Optional[Path], typer.Option("--evidence", help="Write the run to this JSON file as evidence another machine can re-check with `popkit verify FILE`: the file's bytes and sha256, the task files' hashes, popkit's version, the machine, seeds, every case and sample, verdicts and score, and a digest over it all.")] = None,
    require_isolation: IsolationOpt = False,
    watch: WatchOpt = False,
    history: HistoryOpt = True,
    cluster: ClusterOpt = None,
    require_gpu: RequireGpuOpt = None,
    json_lines: JsonLinesOpt = False,
    pairs: Annotated[bool, typer.Option("--pairs", help="With --cluster: take the files two by two (A B A B ...), each pair an A/B on one GPU of one worker; without it every file is an independent run.")] = False,
    shape: Annotated[str, typer.Option("--shape", help="Inner loop: only these benchmark shapes, 1-based (`4` or `1,3`); the run is marked not leaderboard-faithful.")] = "",
    timeout: TimeoutOpt = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write the run's report as one self-contained HTML page (per-shape bars with 95% intervals, bandwidth against the GPU's peak) to this file.")] = None,
    json: JsonOpt = False,
) -> None:
    """Time SUBMISSION on the task's benchmarks, the way the leaderboard's `benchmark` mode does.

    \b
    Examples:
      popkit bench submissions/vectoradd/pytorch.py --leaderboard --baseline reference
      popkit bench v6.py v7.py     (A/B: counterbalanced rounds, ratios with 95% intervals over rounds)
      popkit bench v1.py v2.py v3.py --gpus 0,1     (independent runs, one process per GPU)
      popkit bench v*.py --cluster ray:10.0.0.5:6379     (independent runs on a Ray cluster, one GPU each)
      popkit bench mine.py --watch     (benchmark mode after every save, from a warm worker)
    """
    common.set_json(json)
    if profile and len(submissions) > 1 and submissions[-1] == Path("ncu") and not submissions[-1].exists():
        profiler, submissions = "ncu", submissions[:-1]  # `--profile ncu`, as the hosted --profile is spelled
    if watch and (leaderboard or profile):
        raise UsageError("--watch runs benchmark mode, not the ranked chain or profile mode",
                         "the ranked chain and --profile run cold: drop --watch")
    if profiler not in ("torch", "ncu"):
        raise UsageError(f"unknown profiler `{profiler}`", "use --profiler torch or --profiler ncu")
    request_fields = {"--benchmark-index": benchmark_index, "--ncu-kernel-name": ncu_kernel_name,
                      "--ncu-kernel-name-base": ncu_kernel_name_base, "--ncu-launch-count": ncu_launch_count}
    if not (profile and profiler == "ncu"):
        for flag, value in request_fields.items():
            if value is not None:
                raise UsageError(f"{flag} is a field of an ncu profile request", f"popkit bench FILE --profile ncu {flag} ...")
    if profile and profiler == "ncu":
        if len(submissions) != 1 or gpus or leaderboard or baseline or cluster:
            raise UsageError("--profiler ncu profiles one submission", "popkit bench FILE --profile ncu")
        from popkit.measure.ncu import ProfileRequest

        _ncu(submissions[0], task, tasks_root, python, json,
             ProfileRequest(benchmark_index, ncu_kernel_name, ncu_kernel_name_base, ncu_launch_count))
        return
    if evidence is not None and (len(submissions) != 1 or gpus or cluster or watch or profile):
        raise UsageError("--evidence records one file's run (benchmark mode or --leaderboard)",
                         "popkit bench FILE --leaderboard --evidence run.json")
    if len(submissions) > 2 and gpus is None and cluster is None:
        raise UsageError("bench takes one submission, or two for an A/B comparison",
                         "popkit bench A.py B.py; several independent runs: popkit bench a.py b.py c.py --gpus 0,1")
    mode = workflows.bench_mode(len(submissions), leaderboard=leaderboard, profile=profile, baseline=baseline,
                                world_size=world_size, rounds=rounds, spread=gpus is not None, ab=cluster is None)
    seeds = tuple(secret_seed or ())
    if leaderboard and not seeds:
        seeds = random_secret_seeds(secret_runs)
    options = requests.run_options(python=python, precompile=precompile, harness=harness, seeds=seeds,
                                   keep_workdir=keep_workdir, world_size=world_size,
                                   require_isolation=require_isolation)
    if (shape or timeout) and (len(submissions) != 1 or watch or gpus is not None or cluster):
        raise UsageError("--shape and --timeout narrow one file's run here (an A/B times every shape)",
                         "popkit bench FILE --shape 4 --timeout 60")
    if html is not None and (len(submissions) > 2 or watch or gpus is not None or profile or cluster):
        raise UsageError("--html writes the report of one file's bench run or of an A/B, on this machine",
                         "popkit bench FILE --html report.html, or popkit bench A B --html ab.html")
    sources = tuple(Source.read(path) for path in submissions)
    request = workflows.Request(sources, mode, task, tuple(tasks_root or ()), options, baseline=baseline is not None,
                                allow_cpu=allow_cpu, record=history, rounds=rounds, budget_s=budget,
                                knobs=innerloop.Knobs(shapes=shape, timeout_s=timeout))
    _on_cluster(request, cluster, require_gpu, json_lines, json, pairs=pairs,
                local_only=((gpus is not None, "--gpus"), (bool(baseline), "--baseline"), (watch, "--watch")))
    if watch:
        _watch(replace(request, devices=workflows.parse_devices(gpus) if gpus else ()), json)
    _run(request, json, devices=gpus, html=html, evidence=evidence)


def _on_cluster(request: workflows.Request, spec: Optional[str], require_gpu: Optional[str], json_lines: bool,
                json: bool, *, pairs: bool = False, local_only: tuple = ()) -> None:
    """--cluster: every file runs on Ray (workflows.on_cluster), each result recorded as it arrives, then exit.
    Without it, nothing happens here (and the cluster's own flags are refused)."""
    if spec is None:
        for flag, given in (("--require-gpu", require_gpu), ("--json-lines", json_lines), ("--pairs", pairs)):
            if given:
                raise UsageError(f"{flag} goes with --cluster", "add --cluster ray (a local Ray instance over this "
                                 "machine's GPUs) or --cluster ray:HOST:PORT")
        return
    for given, flag in local_only:
        if given:
            raise UsageError(f"{flag} does not run on a cluster", f"drop {flag} with --cluster")
    if json and json_lines:
        raise UsageError("--json and --json-lines are two output formats", "pick one")
    if require_gpu is not None and not require_gpu.strip():
        raise UsageError("--require-gpu needs a GPU kind", "e.g. --require-gpu H100")
    if request.options.keep_workdir:
        raise UsageError("--keep-workdir would keep the folder on the worker", "drop --keep-workdir with --cluster")
    files = len(request.sources)
    if pairs and (files % 2 or request.mode != "benchmark" or request.options.world_size or request.rounds % 2):
        raise UsageError(f"--pairs runs A/Bs in benchmark mode on files taken two by two ({files} given), in "
                         "an even number of --rounds", "popkit bench a1.py b1.py a2.py b2.py --pairs --cluster ray")
    from popkit.distributed import ray_session
    from popkit.views import cluster as cluster_view

    address = ray_session.address_of(spec)
    with common.progress_printer(json) as progress:
        run, warnings = workflows.on_cluster(request, address, require_gpu=require_gpu, pairs=pairs, progress=progress,
                                             on_result=cluster_view.result_line if json_lines else None)
    if json_lines:
        cluster_view.show_warnings(warnings)
    else:
        cluster_view.show_cluster(run, warnings, json=json)
    raise typer.Exit(run.exit_code)


def _ncu(submission: Path, task_spec: Optional[str], roots: Optional[List[Path]], python: Optional[str],
         json: bool, request) -> None:
    source = Source.read(submission)
    found = workflows.resolve(source, task_spec, tuple(roots or ()))
    _say(found.notes)
    if "custom_kernel" not in (entry_points(found.task) or ("custom_kernel",)):
        raise UsageError(f"--profiler ncu calls custom_kernel; {found.task.name} asks for "
                         f"{', '.join(entry_points(found.task))}", "profile with --profiler torch")
    validate_submission(submission, source.content, entry_points(found.task))
    from popkit.measure import ncu

    report = ncu.profile(found.task, submission, source.content, python or sys.executable, request=request)
    view.show_ncu(report, json=json)


def _run(request: workflows.Request, json: bool, *, devices: Optional[str] = None, html: Optional[Path] = None,
         evidence: Optional[Path] = None) -> None:
    """The request through requests.dispatch (as popkit.api and the MCP tools send it), then its report."""
    started = time.monotonic()  # the footer counts all of it: resolving, the run, the baseline, the ledger
    with common.progress_printer(json) as progress:
        outcome = requests.dispatch(request, devices=devices.split(",") if devices is not None else None,
                                    progress=progress, note=lambda line: _say([line]))
    if isinstance(outcome, requests.SpreadOutcome):
        view.show_spread(outcome.runs, json=json)
    elif isinstance(outcome, workflows.ABOutcome):
        from popkit.views import comparison as comparison_view

        comparison_view.show_ab(outcome.report, json=json)
        for warning in outcome.warnings:
            common.err_console().print(f"warning: {escape(warning)}")
    else:
        view.show_outcome(outcome, json=json, total_s=time.monotonic() - started)
    if html is not None:
        page = (pictures.ab_html(outcome.report, f"popkit bench A/B · {outcome.report.task}")
                if isinstance(outcome, workflows.ABOutcome) else
                pictures.run_html(outcome.report, f"popkit bench · {outcome.task.display_name}"))
        written = pictures.write_html(html, page)
        common.err_console().print(f"report: {escape(str(written))} (open it in a browser; it needs no network)")
    if evidence is not None and isinstance(outcome, workflows.RunOutcome):
        from popkit.operations import evidence as proof

        _say([f"evidence written to {proof.write(outcome, request, evidence)} (popkit verify checks it)"])
    raise typer.Exit(outcome.exit_code)

@app.command(name="watch")
def watch_command(
    submission: Annotated[Path, typer.Argument(help="Your submission file: a verdict after every save.")],
    task: TaskOpt = None,
    tasks_root: RootsOpt = None,
    python: PythonOpt = None,
    precompile: PrecompileOpt = None,
    harness: HarnessOpt = "task",
    gpus: GpusOpt = None,
    history: HistoryOpt = True,
    json: JsonOpt = False,
) -> None:
    """`popkit test FILE --watch` by its own name: the task's tests after every save, from a warm worker.

    Example: popkit watch mine.py     (Ctrl-C stops it; `popkit bench FILE --watch` times each save instead)
    """
    test([submission], task=task, tasks_root=tasks_root, python=python, precompile=precompile, harness=harness,
         gpus=gpus, watch=True, history=history, json=json)


tasks_app = typer.Typer(no_args_is_help=False)  # help: tasks_list's docstring
app.add_typer(tasks_app, name="tasks")


@tasks_app.callback(invoke_without_command=True)
def tasks_list(
    ctx: typer.Context,
    tasks_root: RootsOpt = None,
    check: Annotated[bool, typer.Option("--check", help="Say for each task whether this machine can run it, and if not why.")] = False,
    python: PythonOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Print JSON (schema popkit/tasks/1).")] = False,
) -> None:
    """List bundled tasks and those of problem sets under --tasks-root / POPKIT_TASKS_PATH.

    Examples: popkit tasks --tasks-root ~/reference-kernels/problems
              popkit tasks --check --tasks-root ~/reference-kernels/problems
    """
    if ctx.invoked_subcommand is not None:
        return
    common.set_json(json)
    skipped: list = []
    tasks = list_tasks(task_roots(tasks_root or []), skipped)
    if not check:
        view.show_task_list(tasks, skipped, json=json)
        return
    view.show_skipped(skipped)
    python = python or sys.executable
    scripts = sandbox.scripts_for()  # the evals' interpreter runs as the evals do
    probed = system.probe(python, scripts=scripts)
    view.show_task_check(tasks, runnable.check_tasks(tasks, python, probed, scripts), probed, json=json)


@tasks_app.command("show")
def tasks_show(
    name: Annotated[str, typer.Argument(help="Task name, directory or leaderboard name.")],
    tasks_root: RootsOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Print JSON (schema popkit/task/1).")] = False,
) -> None:
    """Show a task's description, cases and timeouts.

    Example: popkit tasks show vectoradd
    """
    common.set_json(json)
    view.show_task(resolve_task(name, task_roots(tasks_root or [])), json=json)


@tasks_app.command("check")
def tasks_check(
    directory: Annotated[Path, typer.Argument(help="The task folder (holding task.yml) to check.")],
    root: Annotated[Optional[Path], typer.Option("--root", help="Problem-set root the task's sources must stay inside (default: the folder of a problem-set yaml beside DIR or one level up that names it, else DIR's parent).")] = None,
    run: Annotated[bool, typer.Option("--run/--no-run", help="Run the reference through test, benchmark, leaderboard and probe the checker (default), or only validate the folder.")] = True,
    python: PythonOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Print JSON (schema popkit/taskcheck/1).")] = False,
) -> None:
    """For problem authors: check a task folder the way the runner will use it.

    Validates task.yml, its files and a submission template; runs the reference as the submission
    through test, benchmark and leaderboard (each mode's time against its timeout); flags a checker
    that passes a zero output or the unmodified input. Exit codes: 0 good, 1 a finding, 3 bad task,
    11 this machine cannot run the task (the folder checks still ran).

    Example: popkit tasks check ~/reference-kernels/problems/pmpp_v2/vectoradd_py
    """
    common.set_json(json)
    from popkit.author import taskcheck

    with common.progress_printer(json) as progress:
        result = taskcheck.check_task_dir(directory, root=root, python=python, run=run, progress=progress)
    view.show_taskcheck(result, json=json)
    code = ExitCode.BAD_TASK if result.errors else ExitCode.ENVIRONMENT if result.environment else (
        ExitCode.OK if result.ok else ExitCode.FAILED)
    raise typer.Exit(int(code))
