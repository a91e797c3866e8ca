"""Reports for test, bench and tasks: the leaderboard's report format in a Rich layout, or JSON."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from popkit.documents import TaskChecks, TaskDetail, TaskList
from popkit.model import leaderboards
from popkit.model import stats
from popkit.model.diagnostics import submission_frame
from popkit.model.results import CaseResult, ModeRun, RunReport
from popkit.model.tasks import Skipped, Task, display_path
from popkit.operations.requests import SpreadOutcome
from popkit.operations.workflows import RunOutcome, SpreadRun, speedup_intervals
from popkit.submission.taskhints import other_task_hint
from popkit.views import pictures
from popkit.views.common import (console, emit_json, err_console, escape, fold, format_interval, format_time, keep_whole,
                                  table as common_table)

if TYPE_CHECKING:
    from popkit.measure.ncu import NcuReport
    from rich.table import Table

TAIL_LINES = 25  # lines of a log shown on screen; the JSON keeps the whole log


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    kept = text.rstrip().splitlines()
    if len(kept) <= lines:
        return "\n".join(kept)
    return f"[… {len(kept) - lines} earlier lines; --json has the whole log]\n" + "\n".join(kept[-lines:])


def system_line(system: dict) -> str:
    if not system:
        return "unknown system"
    if system.get("error") and not system.get("torch"):
        return f"unknown system ({system['error']})"
    device = system.get("device") or "cpu"
    parts = [device + (f" ({system['arch']})" if system.get("arch") else "")]
    if system.get("torch"):
        parts.append(f"torch {system['torch']}")
    if system.get("cuda"):
        parts.append(f"CUDA {system['cuda']}")
    if system.get("hip"):
        parts.append(f"ROCm/HIP {system['hip']}")
    return " · ".join(parts)


def gpu_state_line(state: Mapping[str, Any]) -> str:
    """`SM clock up to 1980 MHz (lowest 345) · memory 2619 MHz · up to 47 °C, 350 W · throttled: sw_thermal`."""
    parts = [f"SM clock up to {state['sm_mhz']} MHz (lowest {state['sm_mhz_low']})", f"memory {state['mem_mhz']} MHz",
             f"up to {state['temp_c']} °C, {state['power_w']:.0f} W"]
    if state.get("throttle"):
        parts.append("throttled: " + ", ".join(state["throttle"]))
    return " · ".join(parts)


def _ci95(case: CaseResult) -> str:
    """95% interval of this run's mean, on the log scale (never below zero), in one unit.

    From the raw samples when the eval sent them, else from err and n (stats.positive_mean_interval).
    """
    if len(case.samples_ns) >= 2 and all(s > 0 for s in case.samples_ns):
        ci = stats.positive_mean_ci95(list(case.samples_ns))
    elif case.runs >= 2 and case.err_ns is not None and case.mean_ns:
        ci = stats.positive_mean_interval(case.mean_ns, case.err_ns, case.runs)
    else:
        return ""
    return f"95% CI {format_interval(ci.low, ci.high)}"


def where_it_raised(case: CaseResult, submission: str, name: str = "submission.py") -> str:
    """`at mine.py:6 in helper`: the submission's deepest frame in the case's traceback, at the user's file
    (the eval runs it as `name`); "" when the traceback never entered the submission."""
    frame = submission_frame(case.message, name)
    return f"at {submission or name}:{frame[0]} in {frame[1]}" if frame else ""


def _name_in_workdir(task: Task) -> str:
    """The name the eval gave the user's file (`submission.py` for a task rebuilt from the history)."""
    try:
        return task.submission_name
    except StopIteration:
        return "submission.py"


def _case_lines(case: CaseResult, submission: str = "", name: str = "submission.py") -> list[str]:
    if case.kind == "test":
        mark = "✅" if case.passed else "❌"
        lines = [f"  {mark} {escape(case.spec or f'case {case.index + 1}')}"]
        if not case.passed:
            detail = case.error or case.message
            lines += [f"     [red]{escape(line)}[/]" for line in _tail(detail, 8).splitlines()]
            where = where_it_raised(case, submission, name)
            if where:
                lines.append(f"     [red]{escape(where)}[/]")
        return lines
    lines = [f"  {escape(case.spec or f'case {case.index + 1}')}"]
    profiled = [f"   {escape(line)}" for line in case.report.rstrip().splitlines()]
    if case.passed and case.mean_ns is None and profiled:  # profile mode: a table, no statistics
        return lines + profiled
    if not case.passed or case.mean_ns is None:
        detail = case.error or case.message or "no timing reported"
        where = where_it_raised(case, submission, name)
        return lines + [f"   ❌ [red]{escape(line)}[/]" for line in _tail(detail, 8).splitlines()] + (
            [f"   [red]{escape(where)}[/]"] if where else [])
    lines.append(f"   ⏱ {format_time(case.mean_ns, case.err_ns)}")
    lines.append(f"   ⚡ {format_time(case.best_ns)} 🐌 {format_time(case.worst_ns)}")
    extra = [f"n={case.runs}"]
    if case.median_ns is not None:
        extra.insert(0, f"median {format_time(case.median_ns)}")
    ci = _ci95(case)
    if ci:
        extra.append(ci)
    if case.bandwidth_bytes_per_s:
        extra.append(f"{case.bandwidth_bytes_per_s / 1e9:,.0f} GB/s")
    if case.stop:
        extra.append(f"stop: {case.stop}")
    if case.timer:
        extra.append(f"timer: {case.timer}")
    lines.append("   [dim]" + " · ".join(extra) + "[/]")
    parts = breakdown_line(case)
    if parts:
        lines.append(f"   [dim]{escape(parts)}[/]")
    added = [a for a in case.added_ns if a > 0]
    if added:
        lines.append(f"   [yellow]{len(added)} of {len(case.added_ns)} calls left GPU work on another queue outside "
                     f"their events; timed to their trace (+{format_time(sum(added) / len(case.added_ns))} a call "
                     "on average)[/]")
    return lines + profiled


def breakdown_line(case: CaseResult) -> str:
    """What the call's time is made of by the harness's trace (medians per call), or "" without one."""
    b = case.breakdown
    if not b:
        return ""
    parts = [f"kernels {format_time(b['kernel_ns'])}"]
    if "gap_ns" in b:
        parts.append(f"gaps {format_time(b['gap_ns'])}")
    if "launches" in b:
        parts.append(f"{b['launches']:g} launch{'' if b['launches'] == 1 else 'es'}")
    if "other_ns" in b:
        parts.append(f"launch and event overhead {format_time(max(b['other_ns'], 0.0))}"
                     f" ({b['kernel_share'] * 100:.0f}% of the time in kernels)")
    return "trace: " + " · ".join(parts)


def _run_title(run: ModeRun) -> str:
    who = f"secret seed {run.seed}" if run.secret else "public"
    return f"[bold]{run.mode}[/] · {who} · {run.duration_s:.1f} s"


def _failure_details(report: RunReport, run: ModeRun) -> list[str]:
    lines = [f"[bold red]{escape(run.summary)}[/]"]
    if run.outcome == "compile_failed":
        log = (report.precompile.stderr if report.precompile and report.precompile.stderr else run.stderr)
        lines += _compiler_output(log) + [_compile_hint(log, report.system)]
    elif run.outcome in ("crashed", "bad_submission", "bad_task", "needs_gpu"):
        if run.stderr.strip():
            lines += ["[dim]stderr (last lines):[/]", escape(_tail(run.stderr))]
    elif run.outcome == "timed_out":
        lines.append(f"[dim]the task allows {run.timeout_s:g} s for {run.mode} mode (task.yml)[/]")
        if run.stderr.strip():
            lines += ["[dim]stderr (last lines):[/]", escape(_tail(run.stderr, 10))]
    return lines


_ERROR_LINE = re.compile(r"(^|\s|:)(fatal error|error)\b|nvcc fatal", re.IGNORECASE)


def _compiler_output(log: str) -> list[str]:
    """The compiler's own error lines first (torch puts them deep inside a traceback), then the log's tail."""
    errors = [line.strip() for line in log.splitlines() if _ERROR_LINE.search(line)
              and not line.lstrip().startswith(("Traceback", "File ", "raise ", "RuntimeError: Error building"))]
    lines = ["[dim]compiler errors:[/]", escape("\n".join(dict.fromkeys(errors[:12])))] if errors else []
    return lines + ["[dim]compiler output (last lines):[/]", escape(_tail(log, 40 if not errors else 12))]


def _compile_hint(log: str, system) -> str:
    """What to do next; a HIP build on a CUDA torch cannot work, whatever the code says."""
    hip_build = any(m in log for m in ("offload-arch", "hip/hip_runtime", "hip_runtime.h", "__hip_"))
    if hip_build and not (system or {}).get("hip"):
        return ("[dim]hint: this is a HIP kernel and this torch is not a ROCm build, so nvcc built it and failed: "
                "`popkit compile FILE` checks the HIP code here, `popkit test --hip-on-cuda FILE` runs it on an "
                "NVIDIA GPU through popkit's HIP-to-CUDA mapping, and an AMD GPU with ROCm torch runs it as is[/]")
    return "[dim]`popkit compile FILE` rebuilds without running anything; --json has the whole log[/]"


def _compile_failure(step, system=None) -> list[str]:
    """The pre-step could not build the extension: its errors at submission lines, else the compiler's lines."""
    lines = ["[bold red]compile failed: the compile pre-step could not build the extension[/]"]
    for d in step.diagnostics:
        lines.append(f"[red]{escape(d.location)}: {d.severity}: {escape(d.message)}[/]")
        if d.source_line:
            lines.append(f"    {escape(d.source_line.strip())}")
        if d.hint:
            lines.append(f"    [dim]hint: {escape(d.hint)}[/]")
    log = step.stderr + "\n" + step.stdout
    if not step.diagnostics:
        lines += _compiler_output(log)
    lines.append(_compile_hint(log, system))
    return lines


def _speedup_text(estimate: float, interval: stats.Interval | None) -> str:
    if interval is None or not interval.defined:
        return f"{estimate:.2f}× [dim](no interval: too few calls)[/]"
    return f"{estimate:.2f}× [{interval.low:.2f}, {interval.high:.2f}]"


def _speedups(report: RunReport, baseline: RunReport) -> Table | None:
    found = speedup_intervals(report, baseline)
    if found is None:
        return None
    rows, score = found
    table = common_table(("shape", "submission", "reference", "speedup (95% CI)"),
                         right=("submission", "reference", "speedup (95% CI)"),
                         title="speedup over the reference: its mean / yours", title_justify="left",
                         show_edge=False)
    for spec, mine, ref, interval in rows:
        table.add_row(escape(spec), format_time(mine), format_time(ref), _speedup_text(ref / mine, interval))
    if report.score_public_s and baseline.score_public_s:
        table.add_row("[bold]score[/]", format_time(report.score_public_s * 1e9),
                      format_time(baseline.score_public_s * 1e9),
                      f"[bold]{_speedup_text(baseline.score_public_s / report.score_public_s, score)}[/]")
    return table


def isolation_line(isolation: Mapping[str, str]) -> str:
    """`namespaces (user, pid, ...)` or `none, no sandbox: reason` (a reason can never read as a level); '' for
    records made before popkit had a sandbox."""
    if isolation.get("level") == "none":
        return f"none, no sandbox: {isolation.get('detail', '')}"
    return f"{isolation['level']} ({isolation.get('detail', '')})" if isolation.get("level") else ""


def show_outcome(outcome: RunOutcome, *, json: bool = False, total_s: float | None = None) -> None:
    """`popkit test` / `popkit bench FILE`: the run and its baseline; `--json` prints the outcome's document."""
    if json:
        emit_json("run", outcome.to_json())
        return
    show_run(outcome.report, outcome.task, baseline=outcome.baseline, warning=outcome.warning, total_s=total_s)
    chart = pictures.terminal_lines(outcome.report) if outcome.report.mode in ("benchmark", "leaderboard") else []
    if len(chart) > 2:  # a picture for two shapes or more
        console().print()
        for line in chart:
            console().print(line, soft_wrap=True)


def judged_by(report: RunReport) -> str:
    """Who wrote the verdict: popkit's sealed harness (docs/sealed-run.md) or an eval as open as the leaderboard's."""
    if report.judged == "sealed":
        return "sealed: judged where the submission cannot reach"
    return "open: the submission runs where it is judged, as on the leaderboard"


def show_run(report: RunReport, task: Task, *, baseline: RunReport | None = None, warning: str = "",
             total_s: float | None = None) -> None:
    """The report; the footer's time is `total_s` (the whole command) when given, else the run's."""
    con = console()
    board = f" (leaderboard {task.leaderboard})" if task.leaderboard and task.leaderboard != task.name else ""
    con.print(f"[bold]popkit {report.mode}[/] · task [bold]{escape(task.name)}[/]{escape(board)} · {escape(report.submission)}")
    isolation = isolation_line(report.isolation)
    con.print(f"[dim]system:[/] {escape(system_line(dict(report.system)))} · [dim]harness:[/] {report.harness}"
              + f" ({judged_by(report)})" + (f" · [dim]isolation:[/] {escape(isolation)}" if isolation else ""))
    if report.gpu_state:
        con.print(f"[dim]GPU during the run:[/] {escape(gpu_state_line(report.gpu_state))}")
    for note in report.notes:
        con.print(f"[bold yellow]{escape(note)}[/]")
    if report.precompile is not None:
        step = report.precompile
        state = "ok" if step.ok else ("timed out" if step.timed_out else f"exit {step.exit_code} (not fatal)")
        con.print(f"[dim]compile pre-step:[/] {state}, {step.duration_s:.1f} s")
        if step.build_failed and not report.runs:
            con.print()
            for line in _compile_failure(step, report.system):
                con.print(line)
    elif report.precompile_skipped:
        con.print(f"[dim]compile pre-step:[/] skipped ({escape(report.precompile_skipped)})")
    for run in report.runs:
        con.print()
        con.print(_run_title(run))
        for case in run.tests + run.benchmarks:
            for line in _case_lines(case, report.submission, _name_in_workdir(task)):
                con.print(line)
        if run.outcome != "passed":
            con.print()
            for line in _failure_details(report, run):
                con.print(line)
    other_task = other_task_hint(report, task.name, task.bundled)
    if other_task:
        con.print(f"[yellow]hint:[/] {escape(other_task)}")
    con.print()
    if report.score_public_s is not None and report.mode in ("benchmark", "leaderboard"):
        label = "score" if report.mode == "leaderboard" else "benchmark score"
        con.print(f"[bold]{label}[/] ({report.ranking_by}, public): [bold]{format_time(report.score_public_s * 1e9)}[/]")
        for seed, score in zip(report.secret_seeds, report.scores_secret_s):
            state = f"passed, {format_time(score * 1e9)}" if score is not None else "did not pass"
            con.print(f"  secret seed {seed}: {state}")
    if baseline is not None:
        table = _speedups(report, baseline)
        if table is None:
            con.print(f"[yellow]no speedup: the reference run did not pass ({escape(baseline.outcome)})[/]")
        else:
            con.print(table)
    for text in report.folded_warnings + ((warning,) if warning else ()):
        con.print(f"[yellow]warning:[/] {escape(text)}")
    verdict = "[bold green]PASSED[/]" if report.outcome == "passed" else f"[bold red]{report.outcome.upper().replace('_', ' ')}[/]"
    con.print(f"{verdict} in {total_s if total_s is not None else report.duration_s:.1f} s")


TASK_TABLE_OTHERS = 76  # what a readable task row needs beside its name: standing, gpus, ranking, tests, benchmarks, folder


def task_folder(task: Task) -> str:
    """Where a task lives, short: `bundled`, or its problem set's folder and its own (`pmpp_v2/grayscale_py`);
    --json has the whole path."""
    return "bundled" if task.bundled else f"{task.path.parent.name}/{task.path.name}"


def show_task_list(tasks: Sequence[Task], skipped: Sequence[Skipped] = (), *, json: bool = False) -> None:
    """One row per task, named by what `--task` takes (the leaderboard name), never cut: where the longest name
    leaves no room for a table, each task gets three lines instead (name; standing, GPUs and cases; folder)."""
    if json:
        emit_json("tasks", TaskList(tuple(tasks), tuple(skipped)).to_json())
        return
    show_skipped(skipped)
    con = console()
    names = [t.display_name for t in tasks]
    if names and max(map(len, names)) + TASK_TABLE_OTHERS > con.width:
        for t, name in zip(tasks, names):
            con.print(f"[bold]{escape(name)}[/]", soft_wrap=True)
            con.print(f"    {_standing(t)} · {escape(', '.join(t.gpus) or '-')} · {t.ranking_by} · {len(t.tests)} tests · "
                      f"{len(t.benchmarks)} benchmarks")
            con.print(f"    {escape(task_folder(t))}", soft_wrap=True)
        return
    table = common_table(("task", "leaderboard", "gpus", "ranking", "tests", "benchmarks", "folder"), show_edge=False)
    keep_whole(table, {"task": names})
    fold(table, "folder")
    for t, name in zip(tasks, names):
        table.add_row(escape(name), _standing(t), escape(", ".join(t.gpus) or "-"), t.ranking_by, str(len(t.tests)),
                      str(len(t.benchmarks)), escape(task_folder(t)))
    con.print(table)
    con.print("[dim]task: the name --task takes (a problem set's leaderboard name); --json has every path[/]")
    if any(t.bundled for t in tasks):
        con.print("[dim]practice: popkit's own tasks and cases, on no leaderboard; the public problem sets "
                  f"({escape(leaderboards.PUBLIC_SETS)}) say which leaderboards are open today[/]")


def _standing(task: Task) -> str:
    """`open to 2100-12-31` in green, `closed 2025-06-30` in red (the day; --json has the hour), `practice` dim."""
    board = leaderboards.of_task(task)
    color = {leaderboards.OPEN: "green", leaderboards.CLOSED: "red"}.get(board.state, "dim")
    words = {leaderboards.OPEN: f"open to {board.deadline[:10]}" if board.deadline else "open",
             leaderboards.CLOSED: f"closed {board.deadline[:10]}"}.get(board.state, board.state)
    return f"[{color}]{escape(words)}[/]"


def show_skipped(skipped: Sequence[Skipped]) -> None:
    """Problem sets or entries that did not load, one warning line each on stderr (stdout keeps its document)."""
    con = err_console()
    for s in skipped:
        what = "a problem set" if s.leaderboard is None else f"`{s.leaderboard}` of {display_path(s.problem_set)}"
        con.print(f"warning: skipped {escape(what)}: {escape(s.error.message)}")


def show_task(task: Task, *, json: bool = False) -> None:
    if json:
        emit_json("task", TaskDetail(task).to_json())
        return
    con = console()
    con.print(f"[bold]{escape(task.name)}[/]" + (f" · leaderboard {escape(task.leaderboard)}" if task.leaderboard else ""))
    con.print(f"[dim]{escape(str(task.path))}[/]")
    con.print()
    con.print(escape(task.description.rstrip()), soft_wrap=True)  # the author's line breaks, not Rich's re-wrap
    con.print()
    con.print(f"ranking: {task.ranking_by} · GPUs: {escape(', '.join(task.gpus) or '-')} · "
              f"timeouts: test {task.test_timeout:g} s, benchmark {task.benchmark_timeout:g} s, "
              f"ranked {task.ranked_timeout:g} s")
    for title, cases in (("tests", task.tests), ("benchmarks", task.benchmarks)):
        con.print(f"\n[bold]{title}[/] ({len(cases)})")
        for case in cases:
            con.print("  " + escape("; ".join(f"{k}: {v}" for k, v in case.items())))
    if task.ranking_by == "last" and task.benchmarks:
        con.print("[dim]  ranked runs use only the last benchmark (ranking_by: last)[/]")



def show_task_check(tasks: Sequence[Task], verdicts: Sequence, system: dict, *, json: bool = False) -> None:
    """`popkit tasks --check`: one row per task, runnable here or the reasons it is not."""
    if json:
        emit_json("tasks", TaskChecks(tuple(tasks), tuple(verdicts), system).to_json())
        return
    con = console()
    con.print(f"[dim]this machine:[/] {escape(system_line(system))}")
    table = common_table(("task", "PyTorch file", "CUDA/HIP build", "why not"), show_edge=False)
    keep_whole(table, {"task": [t.display_name for t in tasks]})
    for t, v in zip(tasks, verdicts):
        why = list(v.reasons) or list(v.notes)
        why += [r for r in v.build_reasons if r not in v.reasons]
        table.add_row(escape(t.display_name), _yes(v.runnable), _yes(v.build_runnable), escape("; ".join(why)))
    con.print(table)
    plain, built = sum(v.runnable for v in verdicts), sum(v.build_runnable for v in verdicts)
    con.print(f"{plain} of {len(verdicts)} tasks can run a PyTorch file here, {built} a file that builds a CUDA or "
              "HIP kernel (load_inline)")


def _yes(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]no[/]"


def show_taskcheck(result, *, json: bool = False) -> None:
    """`popkit tasks check DIR`: the folder's problems, the reference's time per mode, the checker probes."""
    if json:
        emit_json("taskcheck", result.to_json())
        return
    con = console()
    con.print(f"[bold]popkit tasks check[/] · {escape(result.task)} · [dim]{escape(result.path)}[/]")
    for error in result.errors:
        con.print(f"  ❌ [red]{escape(error)}[/]")
    if result.modes:
        table = common_table(("mode", "outcome", "time", "timeout", "share"), right=("time", "timeout", "share"),
                             title="the reference as the submission", title_justify="left", show_edge=False)
        for m in result.modes:
            table.add_row(m.mode, m.outcome if m.outcome == "passed" else f"[red]{escape(m.summary or m.outcome)}[/]",
                          f"{m.seconds:.1f} s", f"{m.timeout_s:g} s", f"{m.seconds / m.timeout_s:.0%}")
        con.print(table)
    for label, verdict in result.lax.items():
        mark = "✅" if verdict == "rejected" else "❌" if verdict == "passed" else "–"
        says = ("the checker rejects it" if verdict == "rejected" else
                "[red]the checker passes it: too lax[/]" if verdict == "passed" else escape(verdict))
        con.print(f"  {mark} {label}: {says}")
    if result.skipped:
        con.print(f"[yellow]{escape(result.skipped)}[/]")
    if result.environment:
        con.print(f"[yellow]{escape(result.environment)}[/]")
    for text in result.warnings:
        con.print(f"[yellow]warning:[/] {escape(text)}")
    verdict = "[bold red]PROBLEMS FOUND[/]" if not result.ok else (
        "[bold yellow]FOLDER OK, NOT RUN HERE[/]" if result.skipped else "[bold green]OK[/]")
    con.print(verdict)


def show_spread(runs: Sequence[SpreadRun], *, json: bool = False) -> None:
    """`popkit bench a.py b.py --gpus 0,1`: each run's report, then one line per run."""
    if json:
        emit_json("runs", SpreadOutcome(tuple(runs)).to_json())
        return
    con = console()
    for r in runs:
        where = f" · worker {escape(r.worker)}" if r.worker else ""
        con.print(f"[bold]── {escape(str(r.source.path))} · GPU {r.gpu}{where}[/]")
        if r.report is not None and r.task is not None:
            show_run(r.report, r.task, warning=r.warning)
        else:
            con.print(f"[red]{escape(r.error.message if r.error else 'not run')}[/]")
        con.print()
    table = common_table(("submission", "GPU", "outcome", "score"), right=("score",), show_edge=False)
    for r in runs:
        score = r.report.score_public_s if r.report is not None else None
        state = r.report.outcome if r.report is not None else f"not run (exit {r.exit_code})"
        table.add_row(escape(str(r.source.path)), r.gpu, escape(state),
                      format_time(score * 1e9) if score is not None else "-")
    con.print(table)


def show_ncu(report: NcuReport, *, json: bool = False) -> None:
    """`--profile ncu`: one row per kernel of one call, from Nsight Compute."""
    if json:
        emit_json("ncu", report.to_json())
        return
    con = console()
    case = "; ".join(f"{k}: {v}" for k, v in report.case.items())
    con.print(f"[bold]popkit bench --profile ncu[/] · task [bold]{escape(report.task)}[/] · {escape(report.submission)}")
    con.print(f"[dim]one call of custom_kernel (after a warm-up call) on:[/] {escape(case)}")
    selected = " ".join(report.request.ncu_args())
    if selected:
        con.print(f"[dim]kernels selected:[/] {escape(selected)}")
    for line in report.warnings:
        con.print(f"[yellow]warning:[/] {escape(line)}")
    from rich.table import Table  # here, not at the top: views.common says why

    table = Table(show_edge=False)
    for col in ("kernel", "time", "DRAM", "DRAM % peak", "SM % peak", "regs", "occupancy"):
        table.add_column(col, justify="left" if col == "kernel" else "right", overflow="fold")

    def pct(value):
        return f"{value:.1f}%" if value is not None else "-"

    for k in report.kernels:
        table.add_row(escape(k.name.split("(")[0][:60]), format_time(k.duration_ns) if k.duration_ns else "-",
                      f"{k.dram_bytes_per_s / 1e9:,.0f} GB/s" if k.dram_bytes_per_s is not None else "-",
                      pct(k.dram_pct), pct(k.sm_pct), f"{k.registers:.0f}" if k.registers is not None else "-",
                      pct(k.occupancy_pct))
    con.print(table)
