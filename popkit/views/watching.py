"""`popkit test --watch` / `bench --watch`: a report per verdict, or one JSON line per verdict (popkit/watch/1).

stdout carries the verdicts only; what the watch says between them (watching, a warm worker ready) goes
to stderr, in JSON mode too, so an agent reading stdout gets exactly one line per verdict.
"""

from __future__ import annotations

import json
import sys
import time

from popkit.model.tasks import Task
from popkit.operations.watch import COMMANDS, Setup, Verdict
from popkit.views.common import console, err_console, escape
from popkit.views.running import show_run

READY_PREFIX = "watch: ready"  # the stderr line scripts wait for before a timed save


def show_start(setup: Setup, mode: str) -> None:
    """One stderr line: what is watched, how, and how to stop."""
    s = setup
    how = "popkit's harness" if s.options.harness == "popkit" else "the task's eval (popkit's harness)"
    err_console().print(f"watch: {escape(str(s.source.path))} · task {escape(s.task.name)} · {mode} mode · "
                        f"a warm worker of {how} per save · Ctrl-C stops")


def show_ready(seconds: float) -> None:
    """The warm worker for the next save has finished its start-up (stderr, in JSON mode too)."""
    err_console().print(f"{READY_PREFIX} (warm worker started in {seconds:.1f} s): save the file to judge it")


def show_verdict(verdict: Verdict, task: Task, mode: str, *, json_lines: bool = False) -> None:
    """The verdict: its report (or the error that stopped the bytes before a run) and the save-to-verdict
    time; with `json_lines`, one JSON line on stdout."""
    if json_lines:
        sys.stdout.write(json.dumps(verdict.to_json(), default=str) + "\n")
        sys.stdout.flush()
        return
    con = console()
    when = time.strftime("%H:%M:%S", time.localtime(verdict.saved_at))
    what = "the file at the start" if verdict.trigger == "start" else f"save at {when}"
    warmth = "warm worker ready" if verdict.ready_at_save else "warm worker still starting"
    con.rule(f"verdict {verdict.index} · {what} · {warmth}", style="dim")
    if verdict.report is not None:
        show_run(verdict.report, task, warning=verdict.warning, total_s=verdict.seconds)
    elif verdict.error is not None:  # the reason in the report itself (it went to stderr alone)
        outcome = verdict.outcome.upper().replace("_", " ")
        con.print(f"[bold red]{outcome}[/] (exit {verdict.exit_code}): nothing ran: {escape(verdict.error.message)}",
                  soft_wrap=True)
        if verdict.error.hint:
            con.print(f"[dim]hint: {escape(verdict.error.hint)}[/]", soft_wrap=True)
    con.print(f"[dim]save to verdict: {verdict.seconds:.2f} s · the faithful verdict: "
              f"`popkit {COMMANDS[mode]} {escape(verdict.submission)}` (fresh processes)[/]")
    sys.stdout.flush()
