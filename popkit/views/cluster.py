"""Results of runs on a Ray cluster (`--cluster`): one JSON line per result as it arrives (`--json-lines`),
one table at the end (or one JSON document with `--json`)."""

from __future__ import annotations

import json
import sys
from typing import Sequence

from popkit.distributed import parity
from popkit.distributed.scheduler import SCHEMA, ClusterRun, Result
from popkit.views.common import console, emit_json, err_console, escape, format_time, table


def result_line(result: Result) -> None:
    """`--json-lines`: one JSON object on one line (schema popkit/cluster-result/1), written when it arrives."""
    doc = {"schema": f"popkit/{SCHEMA}-result/1", **result.to_json()}
    sys.stdout.write(json.dumps(doc, default=str) + "\n")
    sys.stdout.flush()


def _why(result: Result) -> str:
    """The one line that says why a result did not pass ("" when it passed)."""
    if result.failure:
        return result.failure
    if result.report is not None and result.report.failure is not None:
        return result.report.failure.summary or result.report.outcome
    if result.report is not None and result.exit_code:
        return result.report.outcome
    if result.ab is not None and result.ab.failed_side:
        failure = result.ab.failure
        what = failure.summary if failure is not None else "compile failed: its pre-step could not build the extension"
        return f"side {result.ab.failed_side} ({result.ab.path(result.ab.failed_side)}): {what}"
    return ""


def _value(result: Result) -> str:
    """A run's public score, or an A/B's verdict and the score's ratio B / A."""
    if result.report is not None and result.report.score_public_s is not None:
        return format_time(result.report.score_public_s * 1e9)
    if result.ab is not None and result.ab.score is not None and result.ab.score.ratio is not None:
        ratio = result.ab.score.ratio
        interval = f" [{ratio.low:.3f}, {ratio.high:.3f}]" if ratio.defined else ""
        return f"{result.ab.verdict}: B/A {ratio.estimate:.3f}{interval}"
    if result.ab is not None:
        return result.ab.verdict
    return "-"


def _seconds(result: Result) -> str:
    report = result.report or result.ab
    return f"{report.duration_s:.1f} s" if report is not None else "-"


def show_cluster(run: ClusterRun, warnings: Sequence[str] = (), *, json: bool = False) -> None:
    """The end of a cluster run: one row per job in the order given, why each failure failed, the workers."""
    if json:
        emit_json(SCHEMA, {**run.to_json(), "warnings": list(warnings)})
        return
    con = console()
    rows = table(("#", "submission", "worker", "outcome", "score", "time"), right=("#", "score", "time"),
                 show_edge=False)
    for r in run.results:
        rows.add_row(str(r.index + 1), escape(r.job.name), escape(r.worker.where if r.worker else "-"),
                     escape(r.outcome), escape(_value(r)), _seconds(r))
    con.print(rows)
    for r in run.results:
        why = _why(r)
        if why:
            con.print(f"[red]{r.index + 1}. {escape(r.job.name)}: {escape(why)}[/]")
    facts = [r.worker.facts for r in run.results if r.worker is not None]
    where = "a local Ray instance" if run.embedded else f"the Ray cluster at {run.address}"
    passed = sum(1 for r in run.results if not r.exit_code)
    con.print(f"{passed} of {len(run.results)} passed · on {escape(where)} ({run.resources.get('CPU', 0):g} CPU, "
              f"{run.resources.get('GPU', 0):g} GPU)")
    if run.differences:
        con.print(f"[yellow]workers differ ({escape('; '.join(run.differences))}): times from different workers "
                  "are not comparable with each other, and only a worker like the leaderboard's is leaderboard-"
                  "faithful[/]")
    elif facts:
        con.print(f"[dim]every worker: {escape(parity.describe(facts[0]))}[/]")
    show_warnings(warnings)


def show_warnings(warnings: Sequence[str]) -> None:
    """Why a result is not in the history (history.record_run's warning), one line each on stderr."""
    for warning in filter(None, warnings):
        err_console().print(f"warning: {escape(warning)}")
