"""popkit commands around the leaderboard and the run history: check, submit, history, show, compare."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from popkit.check import lint
from popkit.cli.app import app, finite
from popkit.errors import ExitCode, UsageError
from popkit.ledger import history as ledger
from popkit.ledger import popcorn
from popkit.ledger import runcompare
from popkit.ledger import submit as workflow
from popkit.model.tasks import MAX_TIMEOUT_S, task_roots
from popkit.resources import popkit_home_source
from popkit.submission.source import check_language_for
from popkit.views import common, pictures
from popkit.views import comparison as comparison_view
from popkit.views import remote as view

SubmissionArg = Annotated[Path, typer.Argument(help="The submission file, exactly as it would be submitted.")]
LeaderboardOpt = Annotated[Optional[str], typer.Option("--leaderboard", "-l", help="Leaderboard name (default: the file's `#!POPCORN leaderboard` directive).")]
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPU to run on (default: the file's `#!POPCORN gpu` directive).")]
RootsOpt = Annotated[Optional[List[Path]], typer.Option("--tasks-root", help="Folder or problem-set yaml to look up leaderboards and their GPUs in (repeatable; also POPKIT_TASKS_PATH).")]
GuardOpt = Annotated[bool, typer.Option("--guard/--no-guard", help="Also run KernelGuard when it is installed.")]


def _json_opt(kind: str):
    return Annotated[bool, typer.Option("--json", help=f"Print one JSON document (schema popkit/{kind}/1).")]


@app.command()
def check(
    submission: Annotated[Optional[Path], typer.Argument(help="The submission file, exactly as it would be submitted.")] = None,
    leaderboard: LeaderboardOpt = None,
    gpu: GpuOpt = None,
    mode: Annotated[Optional[str], typer.Option("--mode", "-m", help="Mode to check: test, benchmark, leaderboard or profile.")] = None,
    tasks_root: RootsOpt = None,
    guard: GuardOpt = True,
    rules: Annotated[bool, typer.Option("--rules", "--list-rules", help="Print every rule (id, severity, what it finds, why) instead of checking a file (--json: schema popkit/rules/1).")] = False,
    json: _json_opt("check") = False,
) -> None:
    """Check SUBMISSION for everything the leaderboard server refuses, and for reward-hack patterns.

    Errors (exit 8) mean the server would refuse or disqualify the file; warnings inform.
    `--rules` lists the rules instead.

    Example: popkit check submissions/vectoradd/cuda.py --gpu H100
    """
    common.set_json(json)
    if rules:
        view.show_rules(json=json)
        raise typer.Exit(int(ExitCode.OK))
    if submission is None:
        raise UsageError("missing the submission file to check", "popkit check FILE (or `popkit check --rules`)")
    roots = task_roots(tasks_root or [])
    report = lint.check_file(submission, leaderboard=leaderboard, gpu=gpu, mode=mode, roots=roots, guard=guard)
    check_language_for(submission, report.leaderboard, roots)
    view.show_check(report, json=json)
    raise typer.Exit(int(ExitCode.OK if report.ok else ExitCode.REFUSED))


@app.command()
def submit(
    submission: SubmissionArg,
    mode: Annotated[str, typer.Option("--mode", "-m", help="test, benchmark, leaderboard or profile.")] = "leaderboard",
    gpu: GpuOpt = None,
    leaderboard: LeaderboardOpt = None,
    gate: Annotated[str, typer.Option("--gate", help="Run locally first and submit only if it passes: none, test, or leaderboard (the ranked chain with a secret run).")] = "none",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check, stage the copy and print the exact popcorn-cli command; send nothing.")] = False,
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="Task for the local gate (default: the leaderboard name).")] = None,
    tasks_root: RootsOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, callback=finite, max=MAX_TIMEOUT_S, help="Seconds to wait for popcorn-cli.")] = popcorn.DEFAULT_TIMEOUT_S,
    guard: GuardOpt = True,
    json: _json_opt("submit") = False,
) -> None:
    """Check SUBMISSION, then hand the exact checked bytes to popcorn-cli and record the result.

    popcorn-cli is POPKIT_POPCORN, else `popcorn-cli` or `popcorn` on PATH.

    \b
    Examples:
      popkit submit v7.py --dry-run
      popkit submit v7.py --gpu H100 --gate test
    """
    common.set_json(json)
    with common.progress_printer(json) as progress:
        result = workflow.submit(submission, mode=mode, gpu=gpu, leaderboard=leaderboard, gate=gate,
                                 dry_run=dry_run, task=task, roots=task_roots(tasks_root or []), timeout_s=timeout,
                                 guard=guard, progress=progress)
    view.show_submit(result, json=json)
    raise typer.Exit(int(result.exit_code))


@app.command()
def history(
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="Only runs of this task or leaderboard.")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Only runs of this submission file, or of every file under this folder.")] = None,
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, help="How many runs, newest first.")] = 20,
    html: Annotated[Optional[Path], typer.Option("--html", help="With --file: also write the file's score over its versions as one self-contained HTML page.")] = None,
    json: _json_opt("history") = False,
) -> None:
    """List recorded test, bench and submit runs (your per-user ledger, or POPKIT_HOME, or ./.popkit where it exists).

    Paths are shown relative to the current folder (under ~ otherwise); --json has them whole.

    \b
    Examples:
      popkit history --task vectoradd -n 5
      popkit history --file kernels/          (every file under kernels/)
    """
    common.set_json(json)
    if html is not None and file is None:
        raise UsageError("--html draws one file's score over its versions", "add --file FILE")
    db = ledger.History()
    records = db.list_runs(task, limit, file)
    view.show_history(records, db.path, json=json, source=popkit_home_source(), filtered=_filter_words(task, file))
    if file is not None and not json:
        for line in pictures.history_lines(records):
            common.console().print(line, soft_wrap=True)
    if html is not None:
        written = pictures.write_html(html, pictures.history_html(records, f"popkit history · {file}"))
        common.err_console().print(f"report: {common.escape(str(written))} (open it in a browser; it needs no network)")


def _filter_words(task: Optional[str], file: Optional[Path]) -> str:
    said = [f"task {task}"] if task else []
    if file is not None:
        said.append(f"{'files under' if file.is_dir() else 'file'} {file}")
    return " and ".join(said)


@app.command()
def show(
    run: Annotated[int, typer.Argument(help="Run id, as `popkit history` lists it.")],
    source: Annotated[bool, typer.Option("--source", help="Print the exact submission bytes that ran.")] = False,
    json: _json_opt("history-run") = False,
) -> None:
    """Show one recorded run: the stored report, or the remote result of a submission.

    Example: popkit show 12
    """
    common.set_json(json)
    db = ledger.History()
    record = db.get_run(run)
    view.show_record(record, source=db.content(run) if source else None, json=json)


@app.command()
def compare(
    run_a: Annotated[int, typer.Argument(help="Run id of A.")],
    run_b: Annotated[int, typer.Argument(help="Run id of B.")],
    json: _json_opt("compare") = False,
) -> None:
    """Compare two recorded bench runs shape by shape: B / A time ratio with 95% intervals.

    Both runs are compared in one mode (leaderboard mode when both timed it, else benchmark mode), each
    shape by its mean, the score as `popkit history` shows it. Two runs of identical bytes get no winner.
    For a fair A/B on one machine in one session, prefer `popkit bench A.py B.py`.

    Example: popkit compare 12 15
    """
    common.set_json(json)
    comparison_view.show_compare(runcompare.compare_runs(run_a, run_b), json=json)
