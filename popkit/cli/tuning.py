"""popkit command that searches a submission's launch parameters: tune."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from popkit.cli.app import app, finite
from popkit.cli.running import KeepOpt, PythonOpt, RootsOpt, TaskOpt, WorldSizeOpt
from popkit.errors import UsageError
from popkit.operations import requests
from popkit.operations import workflows
from popkit.submission.source import Source, check_runnable
from popkit.tuning import workflow as tuner
from popkit.views import common
from popkit.views import tuning as view


SubmissionArg = Annotated[Path, typer.Argument(help="The submission to tune (any name; it is only read).")]


@app.command()
def tune(
    submission: SubmissionArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the tuned submission (a .py file; never the input).")],
    task: TaskOpt = None,
    tasks_root: RootsOpt = None,
    against: Annotated[Optional[Path], typer.Option("--against", help="Confirm the finalists against this file instead of the input with its own values.")] = None,
    engine: Annotated[str, typer.Option("--engine", help="`grid`: every point the `#!POPKIT tune` lines allow (or a sample of --max-variants); `optuna`: optuna proposes points from earlier times (pip install 'popkit[tune]').")] = "grid",
    max_variants: Annotated[int, typer.Option("--max-variants", min=1, max=10_000, help="The most points tried; a larger grid is sampled (--seed).")] = 64,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the grid's sample and of optuna's sampler.")] = 0,
    budget: Annotated[float, typer.Option("--budget", min=0, callback=finite, help="Seconds after which no new check, race round or A/B starts (0: no limit).")] = 900.0,
    confirm: Annotated[int, typer.Option("--confirm", min=1, max=8, help="Finalists the race leaves, each confirmed against the incumbent by an A/B.")] = 2,
    rounds: Annotated[int, typer.Option("--rounds", min=4, help="Most rounds of each A/B (even).")] = 8,
    ab_budget: Annotated[float, typer.Option("--ab-budget", min=0, callback=finite, help="Seconds of each A/B after which no new pair of rounds starts (never before round 4).")] = 60.0,
    jobs: Annotated[int, typer.Option("--jobs", min=0, max=64, help="Builds and checks at once (0: up to 8, one per CPU).")] = 0,
    always_ab: Annotated[bool, typer.Option("--always-ab", help="Confirm the finalists by an A/B even when the race's own rounds separate them (by default those rounds decide, with no A/B).")] = False,
    cold_race: Annotated[bool, typer.Option("--cold-race", help="Run every race eval cold, a fresh eval each, rather than through warm evals started a few at a time ahead (on machines of 8 CPUs or more).")] = False,
    per_shape: Annotated[bool, typer.Option("--per-shape/--no-per-shape", help="Where the best values differ by benchmark shape, also try a file that picks them by the input's shapes.")] = True,
    resume: Annotated[bool, typer.Option("--resume", help="Reuse checks and race times of the same variant bytes on this task, harness and device from the history.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists (never the input).")] = False,
    allow_cpu: Annotated[bool, typer.Option("--allow-cpu", help="Time a GPU task's benchmarks on a machine without a GPU (slow: minutes, may time out).")] = False,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="Spread checks and race evals over these local GPUs (e.g. 0,1), one eval per GPU at a time; A/Bs run on the first. One GPU (e.g. 3): every eval on it, the race through warm pairs.")] = None,
    python: PythonOpt = None,
    harness: Annotated[str, typer.Option("--harness", help="`popkit` (default): popkit's sealed harness judges every variant. `task`: the task's own eval, as open as the leaderboard's.")] = "popkit",
    keep_workdir: KeepOpt = False,
    world_size: WorldSizeOpt = None,
    history: Annotated[bool, typer.Option("--history/--no-history", help="Record every eval in the history database (needed by a later --resume).")] = True,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON document (schema popkit/tune/1) instead of the report.")] = False,
) -> None:
    """Time every launch geometry SUBMISSION's `#!POPKIT tune` lines allow; write the fastest to OUTPUT.

    Each variant is the file with its parameter assignments rewritten: built (variants that hand the
    toolchain the same source share one build), checked on the task's tests (wrong ones dropped),
    raced on the benchmarks (the slower half leaves each round), and the finalists confirmed against
    the incumbent by an A/B. OUTPUT is a plain submission with the winner's values frozen.
    Exit codes: 0 written, 1 no variant passed (or the written file failed its tests; when every variant
    failed the same way, that outcome's code, e.g. 5: none compiled), 2 bad usage, 4 no or bad
    `#!POPKIT tune` lines, 10 history unreadable (--resume), 11 environment.

    \b
    Examples:
      popkit new --task softmax -o softmax.py && popkit tune softmax.py -o softmax_tuned.py
      popkit tune mine.py -o tuned.py --engine optuna --max-variants 40 --budget 600
    """
    common.set_json(json)
    if rounds % 2:
        raise UsageError(f"--rounds {rounds}: the A/B runs rounds in pairs (ABBA)", "give an even number, e.g. --rounds 8")
    options = requests.run_options(python=python, harness=harness, keep_workdir=keep_workdir,
                                   world_size=world_size)
    source = Source.read(submission)
    found = workflows.resolve(source, task, tuple(tasks_root or ())).task
    check_runnable(found, submission, source.content, "benchmark")
    settings = tuner.TuneSettings(engine=engine, max_variants=max_variants, seed=seed, budget_s=budget,
                                  confirm=confirm, ab_rounds=rounds, ab_budget_s=ab_budget, jobs=jobs,
                                  per_shape=per_shape, resume=resume, record=history, race_decides=not always_ab,
                                  warm_race=not cold_race)
    with common.progress_printer(json) as progress:
        found, notes = tuner.sized_task(found, source, options, allow_cpu, progress)
        report = tuner.run_tune(found, submission, output, options, settings, against=against, force=force,
                                progress=progress, devices=workflows.parse_devices(gpus) if gpus else (),
                                notes=notes)
    view.show_tune(report, json=json)
    raise typer.Exit(int(report.exit_code))
