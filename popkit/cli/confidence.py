"""popkit commands that say how far a result can be trusted: risk (before submitting), verify (evidence)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from popkit import api
from popkit.cli.app import app
from popkit.operations import evidence
from popkit.run.protocol import MAX_SECRET_SEED
from popkit.views import common
from popkit.views import confidence as view


@app.command("risk")
def risk_command(
    submission: Annotated[Path, typer.Argument(help="The submission file.")],
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="Bundled task name, task directory, or leaderboard name. Default: the file's `#!POPCORN leaderboard` directive.")] = None,
    tasks_root: Annotated[Optional[List[Path]], typer.Option("--tasks-root", help="Folder or problem-set yaml to look up leaderboard names in (repeatable).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=2, max=20, help="Calls of custom_kernel per case (determinism compares their bytes).")] = 3,
    seeds: Annotated[int, typer.Option("--seeds", min=0, max=20, help="Extra random secret seeds, each combined with every public case's seed as a secret run does.")] = 2,
    secret_seed: Annotated[Optional[List[int]], typer.Option("--secret-seed", min=0, max=MAX_SECRET_SEED, help="Use these secret seeds instead of random ones (repeatable).")] = None,
    benchmarks: Annotated[Optional[bool], typer.Option("--benchmarks/--no-benchmarks", help="Include the benchmark shapes (default: only where a GPU is visible; on a CPU they are GPU-sized).")] = None,
    python: Annotated[Optional[str], typer.Option("--python", help="Interpreter for both processes (default: the one running popkit).")] = None,
    require_isolation: Annotated[bool, typer.Option("--require-isolation", help="Stop (exit 11) unless the submission's process can be sandboxed.")] = False,
    every: Annotated[bool, typer.Option("--all", help="List every case, not only the failing, varying and closest ones.")] = False,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON document (schema popkit/risk/1) with every number.")] = False,
) -> None:
    """Say how likely SUBMISSION is to fail the ranked run's secret seeds: low, medium or high risk.

    Per case: the margin to the task's tolerance (worst error over tolerance, 100% = at the limit), whether
    repeated calls give the same bits, on the public cases, on extra secret seeds and on shapes next to the
    public grid. High (exit 1): a case fails, or sits at 90% of its tolerance or more. Medium: 50% or more, or
    an output that changes between calls. The submission runs sandboxed; a separate process that never
    imports it judges the outputs with the task's own check.

    \b
    Examples:
      popkit risk submissions/vectorsum/pytorch.py
      popkit risk mine.py --task vectoradd --seeds 4 --json
    """
    common.set_json(json)
    with common.progress_printer(json) as progress:
        report = api.risk(submission, task=task, roots=tuple(tasks_root or ()), repeats=repeats, seeds=seeds,
                          secret_seeds=tuple(secret_seed or ()), benchmarks=benchmarks, python=python,
                          require_isolation=require_isolation, progress=progress)
    view.show_risk(report, json=json, every=every)
    raise typer.Exit(report.exit_code)


@app.command("verify")
def verify_command(
    evidence_file: Annotated[Path, typer.Argument(help="The evidence file `popkit bench FILE --evidence OUT` wrote.")],
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="The task to run (default: the recorded task's name, looked up as popkit test does).")] = None,
    tasks_root: Annotated[Optional[List[Path]], typer.Option("--tasks-root", help="Folder or problem-set yaml to look up leaderboard names in (repeatable).")] = None,
    tolerance: Annotated[float, typer.Option("--tolerance", min=0.0, max=1.0, help="A shape whose time here / recorded is known to lie within this fraction of 1 reproduces (as does one with no significant difference).")] = evidence.DEFAULT_TOLERANCE,
    python: Annotated[Optional[str], typer.Option("--python", help="Interpreter for the eval (default: the one running popkit).")] = None,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON document (schema popkit/verify/1).")] = False,
) -> None:
    """Re-run an evidence file here and say, shape by shape, whether its result reproduces within the noise.

    Refused before running: a file changed after it was written (digest or bytes, exit 1), another GPU model
    (exit 11), task files that differ from the recorded hashes (exit 3). Then exit 0 when every timed shape
    reproduces (the 95% interval of time here / recorded spans 1, or lies within --tolerance of it, and every
    verdict is the same), 1 otherwise.

    \b
    Example:
      popkit bench mine.py --leaderboard --harness popkit --evidence mine.evidence.json
      popkit verify mine.evidence.json     (on another machine with the same GPU)
    """
    common.set_json(json)
    with common.progress_printer(json) as progress:
        report = api.verify(evidence_file, tolerance=tolerance, task=task, roots=tuple(tasks_root or ()),
                            python=python, progress=progress)
    view.show_verify(report, json=json)
    raise typer.Exit(report.exit_code)
