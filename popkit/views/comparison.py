"""Comparison tables: the A/B of `popkit bench A B` and `popkit compare A B` (Rich for people, JSON for agents)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from popkit.ledger.runcompare import SAME_BYTES, RunComparison
from popkit.measure.ab import ABReport, Series
from popkit.measure.shapes import A_FASTER, B_FASTER, INCOMPLETE, SAME, Comparison, verdict
from popkit.model import stats
from popkit.model.stats import Interval
from popkit.views import pictures
from popkit.views.common import console, emit_json, escape, format_time, table as common_table
from popkit.views.running import isolation_line, system_line

if TYPE_CHECKING:
    from rich.table import Table


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _score(seconds: float | None) -> str:
    return format_time(seconds * 1e9) if seconds is not None else "-"


def _interval(ci: Interval) -> str:
    if not ci.defined:
        return f"{ci.estimate:.3f}× [dim](no interval: too few samples)[/]"
    return f"{ci.estimate:.3f}× [{ci.low:.3f}, {ci.high:.3f}]"


def _verdict_text(code: str, a_label: str, b_label: str) -> str:
    if code == B_FASTER:
        return f"[green]{escape(b_label)} faster[/]"
    if code == A_FASTER:
        return f"[red]{escape(a_label)} faster[/]"
    if code == SAME:
        return "no significant difference"
    if code == SAME_BYTES:
        return "same bytes: no winner"
    if code == INCOMPLETE:
        return "[yellow]incomplete[/]"
    return "[dim]too few samples to tell[/]"


def _comparison_table(comparison: Comparison, verdict_of=lambda code: code,
                      scores: tuple[float | None, float | None] | None = None, score_name: str = "geomean",
                      statistic: str = "") -> Table:
    a, b = comparison.a_label, comparison.b_label
    suffix = f" {statistic}" if statistic else ""
    table = common_table(("shape", f"A{suffix}", f"B{suffix}", "B / A (95% CI)", "verdict", "n (A/B)"),
                         right=(f"A{suffix}", f"B{suffix}", "B / A (95% CI)", "n (A/B)"), show_edge=False)
    for s in comparison.shapes:
        n = f"{s.a.n}/{s.b.n}" + ("" if s.from_samples else "*")
        table.add_row(escape(s.spec), format_time(s.a.mean), format_time(s.b.mean), _interval(s.ratio),
                      _verdict_text(verdict_of(s.verdict), a, b), n)
    if comparison.score is not None:
        a_score, b_score = scores or (None, None)
        table.add_row(f"[bold]score ({escape(score_name)})[/]", _score(a_score) if scores else "",
                      _score(b_score) if scores else "", f"[bold]{_interval(comparison.score)}[/]",
                      _verdict_text(verdict_of(comparison.verdict), a, b), "")
    return table


def _comparison_footer(comparison: Comparison) -> list[str]:
    lines = [f"[dim]A = {escape(comparison.a_label)}, B = {escape(comparison.b_label)}; B / A below 1 means B"
             " takes less time[/]"]
    if any(not s.from_samples for s in comparison.shapes):
        lines.append("[dim]* no raw samples reported (task's own eval, or an A/B side: its rounds' means): interval "
                     "from runs/mean/std; --harness popkit keeps every sample[/]")
    if comparison.missing:
        lines.append("[yellow]incomplete:[/] timed in one run only, left out of the score: "
                     + escape(", ".join(comparison.missing)))
    lines.append("[dim]intervals from the calls of one process per side: the spread between processes is not in"
                 " them; `popkit bench A B` gives a verdict over rounds[/]")
    return lines


def show_compare(rc: RunComparison, *, json: bool = False) -> None:
    if json:
        emit_json("compare", rc.to_json())
        return
    con = console()
    for label, r in (("A", rc.a), ("B", rc.b)):
        con.print(f"{label}: run {r.id} · {escape(r.submission)} · {escape(r.created_at)} · "
                  f"{escape(r.device or '-')} · sha256 {r.sha256[:8]}")
    if not rc.same_device:
        con.print(f"[yellow]warning:[/] the runs were on different devices ({escape(rc.a_device or '?')}, "
                  f"{escape(rc.b_device or '?')}); the ratio mixes code and hardware")
    con.print(f"{rc.mode} mode on both sides; each shape: the {rc.statistic} of its timed calls (what the leaderboard "
              f"ranks); score: {escape(rc.ranking_by)} of those means, as `popkit history` shows it")
    con.print(_comparison_table(rc.comparison, rc.shape_verdict, (rc.a_score_s, rc.b_score_s),
                                _RANKING_NAME.get(rc.ranking_by, rc.ranking_by), rc.statistic))
    for line in _comparison_footer(rc.comparison):
        con.print(line)
    if rc.same_bytes:
        con.print("[yellow]same bytes:[/] both runs are of the same file (sha256 "
                  f"{rc.a.sha256[:8]}); their difference is the machine's run-to-run spread, not the code's")
    for note in rc.notes:
        con.print(f"[dim]note: {escape(note)}[/]")


_RANKING_NAME = {"geom": "geomean", "mean": "mean", "last": "last shape"}


_STOPPED = {"settled": "every verdict settled", "max_rounds": "out of rounds", "budget": "time budget reached",
            "failed": "a run failed"}


def _series_verdict(s: Series, report: ABReport) -> str:
    if s.status == INCOMPLETE:
        return f"[yellow]incomplete[/]: {_plural(len(s.missing), 'shape')} not compared"
    if s.status != "ok":
        return f"[red]{escape(s.status.replace('_', ' '))} on {s.status_side}[/]"
    text = _verdict_text(s.verdict, report.a_path, report.b_path)
    if s.held and s.ratio is not None and verdict(s.ratio) in (A_FASTER, B_FASTER):
        text = "[yellow]no winner named: GPU state (below)[/]"
    if s.ratio is not None and not s.ratio.defined:
        text = "[dim]too few rounds to tell[/]"
    return text


AB_FOOTER = ("A = {a}, B = {b}. A and B columns: per shape, the median over rounds of the statistic the column names "
             "(each eval's median of its timed calls, or its mean where the eval reports no median); B / A below 1 "
             "means B takes less time. Intervals: Student t over rounds on log ratios, 95% wherever the A/B stopped, "
             "over the rounds no host stall slowed; `means B / A`: the ratio of the rounds' eval means, every round "
             "included, what the leaderboard ranks (docs/timing.md)")  # one wording for every A/B: only the column headers name the statistic


def _rounds(s: Series) -> str:
    stalled = len(s.stalled or {})
    return f"{s.rounds} ({stalled} stalled)" if stalled else str(s.rounds)


def _ab_table(report: ABReport) -> Table:
    a_col, b_col = f"A ({report.statistic})", f"B ({report.statistic})"
    table = common_table(("shape", a_col, b_col, "B / A [95% CI]", "verdict", "means B / A", "rounds"),
                         right=(a_col, b_col, "B / A [95% CI]", "means B / A", "rounds"), show_edge=False)
    rows = list(report.shapes) + ([report.score] if report.score is not None else [])
    for s in rows:
        name = f"[bold]score ({escape(report.ranking_by)})[/]" if s is report.score else escape(s.spec)
        a = format_time(stats.median(s.a_ns)) if s.a_ns else "-"
        b = format_time(stats.median(s.b_ns)) if s.b_ns else "-"
        ratio = _interval(s.ratio) if s.ratio is not None else "[dim]-[/]"
        means = f"{s.mean_ratio:.3f}×" if s.mean_ratio is not None else "-"
        table.add_row(name, a, b, ratio, _series_verdict(s, report), means, _rounds(s))
    return table


def _ab_notes(report: ABReport) -> list[str]:
    """Which rounds a stall left out, and why no winner was named from clocks that differed."""
    lines = []
    left_out: dict[int, list[tuple[str, str]]] = {}  # round -> (series, why): a stalled eval hits all its shapes
    for s in list(report.shapes) + ([report.score] if report.score is not None else []):
        for j, why in (s.stalled or {}).items():
            left_out.setdefault(j, []).append((s.spec, why))
    for j, hits in sorted(left_out.items()):
        whys = "; ".join(f"{spec}: {why}" for spec, why in hits[:3]) + (f"; {len(hits) - 3} more" if len(hits) > 3 else "")
        lines.append(f"[yellow]stalled:[/] round {j + 1} left out and replaced in {len(hits)} series"
                     f" ({escape(whys)})")
    if report.held:
        lines.append(f"[yellow]no winner named:[/] {escape(report.held)}")
    line = gpu_line(report.gpu)
    if line:
        lines.append(f"[dim]{escape(line)}[/]")
    return lines


def gpu_line(states) -> str:
    """The clocks each side's evals ran at (the median of each eval's highest SM clock), and their extremes."""
    if not states:
        return ""
    parts = []
    for side in ("A", "B"):
        mine = [g for g in states if g["side"] == side]
        if mine:
            parts.append(f"{side} {stats.median([g['sm_mhz'] for g in mine]):.0f} MHz")
    hottest = max(g["temp_c"] for g in states)
    return (f"GPU during the evals: SM clock {', '.join(parts)}; memory {max(g['mem_mhz'] for g in states)} MHz; "
            f"up to {hottest} °C and {max(g['power_w'] for g in states):.0f} W")


def show_ab(report: ABReport, *, json: bool = False) -> None:
    if json:
        emit_json("ab", report.to_json())
        return
    con = console()
    con.print(f"[bold]popkit bench A/B[/] · task [bold]{escape(report.task)}[/] · {report.rounds} rounds (ABBA,"
              f" a fresh eval per side and round), {_STOPPED.get(report.stopped, report.stopped)} · harness"
              f" {escape(report.harness)}" + (f" ({report.judged})" if report.judged else "")
              + (f" · evals {escape(report.evals)}" if report.evals else ""))

    isolation = isolation_line(report.isolation)
    con.print(f"[dim]system:[/] {escape(system_line(dict(report.system)))}"
              + (f" · [dim]isolation:[/] {escape(isolation)}" if isolation else ""))
    if any(s.a_ns or s.status != "ok" for s in report.shapes):
        con.print(_ab_table(report))
        con.print(f"[dim]{escape(AB_FOOTER.format(a=report.a_path, b=report.b_path))}[/]")
        for line in _ab_notes(report):
            con.print(line)
    if report.failed_side:
        side = report.failed_side
        path = escape(report.path(side))
        if report.failure_mode == "compile":
            con.print(f"[bold red]{side} ({path}) did not pass: compile failed:[/] its compile pre-step could not"
                      " build the extension")
            con.print(f"[dim]hint: `popkit compile {path}` shows the compiler's errors at lines of the file[/]")
        else:
            failure = report.failure
            con.print(f"[bold red]{side} ({path}) did not pass in benchmark mode:[/] "
                      f"{escape(failure.summary or failure.outcome)}")  # type: ignore[union-attr]
            con.print(f"[dim]hint: `popkit bench {path}` runs benchmark mode alone and shows the details[/]")
        return
    chart = pictures.ab_lines(report)
    if chart:
        con.print()
        for line in chart:
            con.print(line, soft_wrap=True)
    con.print(f"done in {report.duration_s:.1f} s")
