"""popkit commands for writing submissions: new, templates, compile, doctor."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from popkit.author import render
from popkit.cli.app import app, finite
from popkit.errors import ExitCode
from popkit.model.tasks import MAX_TIMEOUT_S, task_roots
from popkit.operations import doctor as environment, timingcheck
from popkit.run import compile as compiler
from popkit.views import authoring as view
from popkit.views import common

RootsOpt = Annotated[Optional[List[Path]], typer.Option("--tasks-root", help="Folder or problem-set yaml to look up leaderboard names in (repeatable; also POPKIT_TASKS_PATH).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of the report.")]


def _roots(roots: Optional[List[Path]]) -> list[Path]:
    return task_roots(roots or [])


@app.command()
def new(
    task: Annotated[str, typer.Option("--task", "-t", help="Bundled task name, task directory, or leaderboard name.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the submission (a .py file).")] = Path("submission.py"),
    target: Annotated[str, typer.Option("--target", help="`cuda` or `hip`.")] = "cuda",
    style: Annotated[str, typer.Option("--style", help="`inline` (load_inline + functions=) or `library` (a torch.library operator that also works under torch.compile).")] = "inline",
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU for the `#!POPCORN gpu` directive (default: the task's first GPU of the target's vendor).")] = None,
    arch: Annotated[Optional[str], typer.Option("--arch", help="HIP only: offload architecture, e.g. gfx950 (default: the GPU's, gfx942 for MI300).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUTPUT if it exists.")] = False,
    tasks_root: RootsOpt = None,
    json: JsonOpt = False,
) -> None:
    """Render a starter submission for a task: a simple, correct kernel from the task's kernel.yml.

    Tasks without a kernel.yml get a skeleton that compiles and says what to fill in.

    Examples: popkit new --task vectoradd -o vectoradd.py
              popkit new --task softmax --target hip --arch gfx950 --gpu MI355X -o softmax_hip.py
    """
    common.set_json(json)
    written = render.new_submission(task, output, target=target, style=style, gpu=gpu, arch=arch, force=force,
                                    roots=_roots(tasks_root))
    view.show_written(written, json)


@app.command()
def templates(tasks_root: RootsOpt = None, json: JsonOpt = False) -> None:
    """List the template targets and styles, and which tasks have a kernel spec (kernel.yml).

    Example: popkit templates --json
    """
    common.set_json(json)
    view.show_catalog(render.catalog(_roots(tasks_root)), json)


@app.command(name="compile")
def compile_(
    submission: Annotated[Path, typer.Argument(help="The submission file to build.")],
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="Task (for its files and test_timeout). Default: the file's `#!POPCORN leaderboard` directive.")] = None,
    clean: Annotated[bool, typer.Option("--clean", help="Delete this submission's build folder (and stale build locks) and build from scratch.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, callback=finite, max=MAX_TIMEOUT_S, help="Seconds one build may take.")] = 600.0,
    python: Annotated[Optional[str], typer.Option("--python", help="Interpreter to build with (default: the one running popkit).")] = None,
    arch: Annotated[Optional[str], typer.Option("--arch", help="HIP without ROCm: the AMD architecture to build the kernels for (default: the file's --offload-arch, else gfx942).")] = None,
    tasks_root: RootsOpt = None,
    json: JsonOpt = False,
) -> None:
    """Build SUBMISSION's extension without running any kernel (no GPU needed) and explain errors.

    Imports the file in a fresh interpreter, cold then warm, and maps compiler messages to lines of
    your file. A HIP file on a machine without ROCm: its DEVICE_SRC kernels are built for the AMD GPU
    with clang, and their registers, LDS, spills and occupancy shown.
    Exit codes: 0 built, 5 compile failed, 4 bad submission, 11 environment.

    Example: popkit compile vectoradd.py
    """
    common.set_json(json)
    with common.progress_printer(json) as progress:
        report = compiler.compile_submission(submission, task=task, roots=_roots(tasks_root), clean=clean,
                                             timeout_s=timeout, python=python or sys.executable,
                                             progress=progress, arch=arch)
    view.show_compile(report, json)
    raise typer.Exit(report.exit_code)


@app.command()
def doctor(
    python: Annotated[Optional[str], typer.Option("--python", help="Interpreter to check (default: the one running popkit).")] = None,
    timing: Annotated[bool, typer.Option("--timing", help="Measure what timing costs here instead (about 30 s on a "
                                         "GPU): launch floor, event pair, copy bandwidth, timer, clocks.")] = False,
    json: JsonOpt = False,
) -> None:
    """Check the environment for building and running kernels, with a fix for each problem.

    Example: popkit doctor, popkit doctor --timing
    """
    common.set_json(json)
    if timing:
        measured = timingcheck.measure(python)
        view.show_timing(measured, json)
        raise typer.Exit(0 if measured.ok else int(ExitCode.ENVIRONMENT))
    report = environment.doctor(python)
    view.show_doctor(report, json)
    raise typer.Exit(0 if report.ok else int(ExitCode.ENVIRONMENT))
