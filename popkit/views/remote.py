"""Output of check, submit, history and show: Rich for people, JSON for agents (comparisons: views/comparison.py)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from popkit.check.lint import LintReport
from popkit.check.rules import GUARD_INSTALL, RULES, RULES_SCHEMA
from popkit.documents import HistoryList, RunDetail
from popkit.ledger.history import RunRecord, shown_path
from popkit.ledger.submit import SubmitResult
from popkit.model.results import RemoteResult
from popkit.model.tasks import Task
from popkit.views.common import console, emit_json, escape, format_time, table as common_table
from popkit.views.running import show_run

_MARK = {"error": "[bold red]error[/]", "warning": "[yellow]warning[/]"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _score(seconds: float | None) -> str:
    return format_time(seconds * 1e9) if seconds is not None else "-"


# ------------------------------------------------------------------------------------- check


def _check_lines(report: LintReport, guard_absent_note: bool = True) -> list[str]:
    lines = []
    for f in report.findings:
        where = escape(report.path) + (f":{f.line}" if f.line else "") + (f":{f.column}" if f.line and f.column else "")
        lines.append(f"{where}: {_MARK.get(f.severity, f.severity)} [bold]\\[{f.rule}][/] {escape(f.message)}")
        if f.hint:
            lines.append(f"    [dim]hint:[/] {escape(f.hint)}")
    guard = report.guard
    if guard is None:
        if guard_absent_note:
            lines.append(f"[dim]KernelGuard: not installed (`{escape(GUARD_INSTALL)}` to run the server's"
                         " screening here too)[/]")
    elif guard.error:
        lines.append(f"[yellow]KernelGuard failed:[/] {escape(guard.error)}")
    else:
        color = "red" if guard.should_filter else "green" if guard.classification == "valid" else "yellow"
        lines.append(f"KernelGuard ({guard.via}): [{color}]{escape(guard.classification)}[/]")
        for p in guard.patterns:
            lines.append(f"    {escape(p.pattern)} ({escape(p.severity)}): {escape(p.evidence)}")
    return lines


def show_check(report: LintReport, *, json: bool = False) -> None:
    """The findings, then the leaderboard's compile path of a Python file (`precompile`)."""
    if json:
        emit_json("check", report.to_json())
        return
    con = console()
    target = [f"leaderboard {report.leaderboard or '?'}", f"GPU {report.gpu or '?'}"]
    if report.mode:
        target.append(f"mode {report.mode}")
    con.print(f"[bold]popkit check[/] {escape(report.path)} · {escape(' · '.join(target))} · "
              f"{report.size_bytes:,} bytes · sha256 {report.sha256[:12]}")
    if report.leaderboard and report.offered_gpus is None:
        con.print(f"[dim]GPU list of `{escape(report.leaderboard)}` not known locally: GPU not checked[/]")
    for line in _check_lines(report):
        con.print(line)
    if report.precompile is not None:
        path = report.precompile
        colour = {"compiled": "green", "skipped": "dim"}.get(path.get("status"), "yellow")
        con.print(f"precompile: [{colour}]{path.get('status')}[/] · {escape(str(path.get('reason', '')))}")
        con.print(f"[dim]the ranked run pays: {escape(str(path.get('pays', '')))}[/]")
    errors, warnings = len(report.errors), len(report.warnings)
    if errors:
        con.print(f"[bold red]REFUSED[/]: {_plural(errors, 'error')}, {_plural(warnings, 'warning')}"
                  " — the server would refuse or disqualify this file")
    else:
        con.print("[bold green]OK[/]: no errors" + (f", {_plural(warnings, 'warning')}" if warnings else ""))


def show_rules(*, json: bool = False) -> None:
    """`popkit check --rules`: the rule table (popkit.check.rules), each rule with its fixture in --json."""
    if json:
        emit_json(RULES_SCHEMA.split("/")[1], {"rules": [rule.to_json() for rule in RULES]})
        return
    grid = common_table(["rule", "severity", "finds", "why, what to do"], no_wrap=("rule",))
    for rule in RULES:
        grid.add_row(rule.id, rule.severity, escape(rule.summary), escape(rule.doc))
    con = console()
    con.print(grid)
    con.print(f"{len(RULES)} rules; errors block a submission (exit 8), warnings inform.")


# ------------------------------------------------------------------------------------ submit


def _remote_lines(remote: RemoteResult) -> list[str]:
    lines = [f"submission [bold]{remote.submission_id}[/] · leaderboard {escape(remote.leaderboard or '?')} · "
             f"{escape(remote.file_name or '')} · {'done' if remote.done else '[yellow]not done[/]'}"]
    for run in remote.runs:
        mark = "✅" if run.passed else "❌"
        who = "secret" if run.secret else "public"
        lines.append(f"  {mark} {escape(run.mode)} · {who} · {escape(run.runner)} · {_score(run.score)}")
    gpu = f" on {escape(remote.score_gpu)}" if remote.score_gpu else ""
    if remote.score_public_s is not None:
        lines.append(f"[bold]score (public){gpu}: {_score(remote.score_public_s)}[/]")
    if remote.score_secret_s is not None:
        lines.append(f"score (secret){gpu}: {_score(remote.score_secret_s)}")
    return lines


def _local_line(local: RunRecord | None) -> str:
    if local is None:
        return "[dim]no local run of these exact bytes in history (`popkit bench FILE` records one)[/]"
    where = local.device or "unknown device"
    return (f"local run {local.id} ({local.kind}, {escape(local.created_at)}, {escape(where)}): "
            f"{escape(local.outcome or '?')}, score {_score(local.score_s)}")


def show_submit(result: SubmitResult, *, json: bool = False) -> None:
    if json:
        emit_json("submit", result.to_json())
        return
    con = console()
    plan = result.plan
    con.print(f"[bold]popkit submit[/] {escape(plan.path)} → leaderboard [bold]{escape(plan.leaderboard)}[/] · "
              f"GPU [bold]{escape(plan.gpu)}[/] · mode {escape(plan.mode)} · sha256 {plan.sha256[:12]}")
    warnings = len(plan.check.warnings)
    con.print("check: [green]no errors[/]" + (f", {_plural(warnings, 'warning')}" if warnings else ""))
    for line in _check_lines(plan.check, guard_absent_note=False):
        con.print(line)
    gate = result.gate_report
    if gate is not None:
        state = "[green]passed[/]" if gate.outcome == "passed" else f"[red]{escape(gate.outcome)}[/]"
        con.print(f"local gate ({escape(plan.gate)}): {state}")
        if gate.failure is not None:
            con.print(f"  [red]{escape(gate.failure.summary or gate.failure.outcome)}[/]")
            con.print("[bold red]NOT SUBMITTED[/]: the local gate failed (`popkit test FILE` shows the details)"
                      if not result.dry_run else
                      "[bold red]would not be submitted[/]: the local gate failed (`popkit test FILE` shows the details)")
    if result.dry_run:
        con.print("[bold]dry run[/]: nothing was sent. The command:")
        con.print(escape(shlex.join(plan.argv)), soft_wrap=True)
        con.print(f"[dim]popcorn-cli gets a byte-identical copy (sha256 {plan.sha256[:12]}) staged at "
                  f"{escape(plan.staged)}; a dry run removes it, a real submit stages it afresh[/]")
        con.print(_local_line(result.local))
    elif result.remote is not None:
        for line in _remote_lines(result.remote):
            con.print(line)
        con.print(_local_line(result.local))
        local_score = result.local.score_s if result.local is not None else None
        if local_score and result.remote.score_public_s:
            con.print(f"remote / local: {result.remote.score_public_s / local_score:.2f}×")
        verdict = "[bold green]PASSED[/]" if result.remote.passed else "[bold red]FAILED[/]"
        recorded = f" · recorded as run {result.history_id}" if result.history_id else ""
        con.print(f"{verdict}{recorded}")
    for warning in result.warnings:
        con.print(f"[yellow]warning:[/] {escape(warning)}")


# ----------------------------------------------------------------------------------- history


def _record_row(r: RunRecord, path_width: int = 1000) -> list[str]:
    where = r.device or (f"remote {r.gpu}" if r.gpu else "-")
    outcome = r.outcome or "-"
    color = "green" if outcome == "passed" else "red"
    what = f"{r.kind} {r.mode}" if r.kind == "submit" or r.mode not in (r.kind, "benchmark") else r.kind
    if r.remote_id is not None:
        what += f" #{r.remote_id}"
    return [str(r.id), escape(r.created_at.replace("T", " ")[:16]), escape(what), escape(r.task or "-"),
            f"[{color}]{escape(outcome)}[/]", _score(r.score_s) + ("*" if r.faithful is False else ""), escape(where),
            escape(_path_cell(r.submission, path_width))]


_LEDGER_SOURCE = {
    "POPKIT_HOME": "POPKIT_HOME",
    "working directory": "the .popkit folder in this directory; without it popkit uses your per-user ledger",
    "per-user": "per-user",
}


HISTORY_OTHERS = 66  # columns the history's other cells take at 80 (when and device wrapped), separators included


def _path_cell(stored: str, width: int) -> str:
    """The submission relative to the current folder; one too long for `width` keeps its end (`…ls/v7.py`), the
    file's name first of all (--json has it whole)."""
    shown = shown_path(stored)
    return shown if len(shown) <= width else "…" + shown[-(width - 1):]


def show_history(records: Sequence[RunRecord], path: Path, *, json: bool = False, source: str = "",
                 filtered: str = "") -> None:
    if json:
        emit_json("history", HistoryList(tuple(records), path, source).to_json())
        return
    con = console()
    if source:
        con.print(f"ledger: {escape(str(path))} ({escape(_LEDGER_SOURCE.get(source, source))})", soft_wrap=True)
    if not records:
        which = f" of {escape(filtered)}" if filtered else ""
        con.print(f"no runs{which} recorded in {escape(str(path))} (`popkit test` and `popkit bench` record them)")
        return
    table = common_table(("run", "when (UTC)", "what", "task", "outcome", "score", "device", "submission"),
                         right=("run", "score"), no_wrap=("run", "outcome", "score"), box=None, header_style="bold")
    width = max(14, (con.width - HISTORY_OTHERS) // 2 + 7)  # the rest of a wider screen goes to the other cells
    table.columns[1].min_width = len("2026-11-02")  # the date stays whole; the time wraps under it
    rows = [_record_row(r, width) for r in records]
    table.columns[-1].min_width = max(len(row[-1]) for row in rows)
    table.columns[-1].no_wrap = True
    for row in rows:
        table.add_row(*row)
    con.print(table)
    if any(r.faithful is False for r in records):
        con.print("[dim]*: not leaderboard-faithful (some shapes or cases: the CPU sizing, --cases, --shape, "
                  "--timeout, --world-size); its score does not rank against a full run's[/]")
    con.print(f"[dim]{escape(str(path))}: `popkit show RUN` for one run, `popkit compare A B` for two[/]")


def show_record(record: RunRecord, *, source: bytes | None = None, json: bool = False) -> None:
    if json:
        emit_json("history-run", RunDetail(record, source).to_json())
        return
    con = console()
    con.print(f"[bold]run {record.id}[/] · {record.kind} · recorded {escape(record.created_at)} · "
              f"sha256 {record.sha256[:12]}")
    if source is not None:
        con.print(escape(source.decode("utf-8", errors="replace")), soft_wrap=True)
        return
    if record.report is not None:
        report = record.report
        task = Task(name=report.task, path=Path(report.task_path), files=(), lang="py", description="", main="",
                    leaderboard=report.leaderboard)
        show_run(report, task)
        return
    con.print(f"{escape(record.submission)} → leaderboard {escape(record.leaderboard or '?')} · GPU "
              f"{escape(record.gpu or '?')} · mode {escape(record.mode)}")
    if record.remote is not None:
        for line in _remote_lines(record.remote):
            con.print(line)
    if record.error:
        con.print(f"[red]{escape(record.error)}[/]")
