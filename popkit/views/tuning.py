"""The report of `popkit tune`: the variants ranked, why the others dropped, the winner and the file written."""

from __future__ import annotations

from popkit.model.stats import Interval
from popkit.tuning.result import PER_SHAPE, Phase, TuneReport, Variant
from popkit.views.common import console, emit_json, escape, format_time, table as common_table
from popkit.views.running import system_line

TOP = 10  # variants shown in the table; --json has every one


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _ratio(ci: Interval | None) -> str:
    if ci is None:
        return "-"
    if not ci.defined:
        return f"{ci.estimate:.3f}×"
    return f"{ci.estimate:.3f}× [{ci.low:.3f}, {ci.high:.3f}]"


def _race(v: Variant, report: TuneReport) -> str:
    if v.race_failure:
        return "[red]failed in benchmark mode[/]"
    if v.left_after is not None:
        return f"out after round {v.left_after}"
    if not v.scores_s:
        return "-"
    return "[bold]winner[/]" if v.index == report.winner else "finalist"


def _verdict(v: Variant) -> str:
    if v.ab is None:
        if v.race_ratio is not None:
            return "[green]faster (race)[/]" if v.faster else "-"
        return "incumbent" if v.incumbent else "-"
    if v.ab.failed_side:
        return f"[red]A/B: side {v.ab.failed_side} failed[/]"
    if v.faster:
        return "[green]faster[/]"
    return {"a_faster": "[red]slower[/]", "no_significant_difference": "same"}.get(v.ab.verdict, "undecided")


def _rank_key(v: Variant) -> tuple:
    """Winner, then the rest by their race score; unraced and failed last."""
    return (v.left_after is not None, v.score_s is None, v.score_s or 0.0, v.index)


def show_tune(report: TuneReport, *, json: bool = False) -> None:
    if json:
        emit_json("tune", report.to_json())
        return
    con = console()
    variants = [v for v in report.variants]
    grid = f"grid of {report.grid_points}" if report.grid_points is not None else "optuna"
    con.print(f"[bold]popkit tune[/] · task [bold]{escape(report.task)}[/] · {escape(report.submission)} · "
              f"{_plural(len([v for v in variants if v.index != PER_SHAPE]), 'variant')} ({grid}) · "
              f"{_plural(report.builds, 'build')} · {report.race_rounds} race round(s) · harness "
              f"{escape(report.harness)} · {report.duration_s:.0f} s")
    con.print(f"[dim]system:[/] {escape(system_line(dict(report.system)))}")
    raced = sorted((v for v in variants if v.passed), key=_rank_key)
    if report.winner is not None:
        raced.sort(key=lambda v: v.index != report.winner)
    if raced:
        table = common_table(("variant", "score", "race", f"vs {_short(report.incumbent)} (95% CI)", "A/B"),
                             right=("score",), show_edge=False)
        for v in raced[:TOP]:
            score = format_time(v.score_s * 1e9) if v.score_s else "-"
            resumed = " [dim](resumed)[/]" if v.resumed else ""
            table.add_row(escape(v.label) + resumed, score, _race(v, report), _ratio(v.ratio), _verdict(v))
        con.print(table)
        if len(raced) > TOP:
            con.print(f"[dim]… {len(raced) - TOP} more that passed their checks (--json lists every variant)[/]")
        con.print(f"[dim]score: the task's {escape(report.ranking_by)} over the shapes' times (median of each eval's"
                  " calls, else mean), geometric mean over race rounds; the A/B interval is time variant / time"
                  " incumbent over rounds of fresh evals (docs/design.md, \"How tune decides\")[/]")
    dropped = [v for v in variants if v.outcome and not v.passed]
    for v in dropped[:TOP]:
        con.print(f"[red]dropped[/] {escape(v.label)}: {escape(v.message or v.outcome)}")
    if len(dropped) > TOP:
        con.print(f"[dim]… {len(dropped) - TOP} more dropped (--json lists them)[/]")
    for v in variants:
        if v.race_failure:
            con.print(f"[red]left the race[/] {escape(v.label)}: {escape(v.race_failure)}")
    unchecked = [v for v in variants if not v.outcome]
    if unchecked:
        con.print(f"[yellow]not checked:[/] {_plural(len(unchecked), 'variant')} (the time budget ran out)")
    _shape_table(report, con, raced)
    if report.per_shape:
        table = common_table(("benchmark", "values written"), show_edge=False)
        for choice in report.per_shape:
            table.add_row(escape(choice.spec), escape(choice.label))
        con.print(table)
    for note in report.notes:
        con.print(f"[yellow]note:[/] {escape(note)}")
    if report.phases:
        con.print("[dim]time:[/] " + " · ".join(_phase(p) for p in report.phases)
                  + (f" [dim](race evals {report.race_evals})[/]" if report.race_evals else ""))
    _verdict_lines(report, con)


SHAPE_COLUMNS = 5  # variants shown in the shape x variant table


def _shape_table(report: TuneReport, con, ranked: list[Variant]) -> None:
    """Each benchmark shape's race time (median over rounds) for the best-ranked variants, the fastest per shape
    marked; then the gain of per-shape dispatch over the best single variant."""
    gain = report.dispatch_gain
    if len(report.benchmarks) < 2 or gain is None:
        return
    shown = [v for v in ranked if v.rounds and v.index != PER_SHAPE][:SHAPE_COLUMNS]
    for label in gain.per_shape:  # every shape's fastest has a column
        if label not in [v.label for v in shown]:
            shown.append(next(v for v in report.variants if v.label == label and v.index != PER_SHAPE))
    table = common_table(("benchmark", *(v.label for v in shown)), right=tuple(v.label for v in shown),
                         show_edge=False)
    for i, spec in enumerate(report.benchmarks):
        cells = []
        for v in shown:
            ns = v.shape_ns(i)
            text = format_time(ns) if ns else "-"
            cells.append(f"[bold]{text}*[/]" if v.label == gain.per_shape[i] else text)
        table.add_row(escape(spec), *cells)
    con.print(table)
    if gain.gain > 1.0:
        how = (f"per-shape dispatch (the fastest at each shape, *) {gain.gain:.3f}× faster than the best single "
               f"variant, {escape(gain.best_single)}, by the race's medians")
    else:
        how = (f"one variant, {escape(gain.best_single)}, is the fastest at every shape: per-shape dispatch gains"
               " nothing")
    con.print(f"[dim]shapes:[/] {how}")


def _phase(p: Phase) -> str:
    unit = "build" if p.name == "build" else "eval"
    return f"{escape(p.name)} {p.seconds:.1f} s ({_plural(p.evals, unit)})" if p.evals or p.name != "probe" else \
        f"{escape(p.name)} {p.seconds:.1f} s"


def _why_nothing(report: TuneReport) -> str:
    """Why no file was written, as it happened: stopped early, or what became of the variants that passed."""
    passed = len(report.survivors)
    stop = {"budget": "the time budget ran out", "interrupted": "tune was stopped"}.get(report.stopped, "")
    if stop and passed:
        return f"{stop} before any of the {_plural(passed, 'variant')} that passed their checks was timed"
    if stop:
        return f"{stop} before any variant passed its checks"
    if passed:
        return (f"{_plural(passed, 'variant')} passed their checks, but none finished a benchmark-mode eval "
                "(see `left the race` above)")
    return "no variant passed its checks"


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _verdict_lines(report: TuneReport, con) -> None:
    if not report.output:
        if report.final_check and report.final_check != "passed":
            con.print(f"[bold red]not written:[/] the tuned file did not pass its tests ({report.final_check})")
        else:
            con.print(f"[bold red]nothing written:[/] {escape(_why_nothing(report))}")
        return
    winner = report.winner_variant
    what = escape(report.winner_label or "the input's values")
    if winner is not None and winner.faster and winner.ratio is not None:
        by = "by an A/B" if winner.ab is not None else f"by the race's {len(winner.scores_s)} rounds (no A/B needed)"
        how = f"{_ratio(winner.ratio)} the time of {escape(_short(report.incumbent))}, confirmed {by}"
    elif report.winner is None and report.decided_by == "race":
        how = (f"every other finalist was slower in the race's rounds: the values of "
               f"{escape(_short(report.incumbent))} are kept")
    elif report.winner is None and report.confirmed:
        how = f"no variant was faster than {escape(_short(report.incumbent))} in an A/B: its values are kept"
    elif report.winner is None:
        how = "the input's own values won the race: they are kept"
    elif report.stopped in ("interrupted", "budget"):
        why = "tune was stopped" if report.stopped == "interrupted" else "the time budget ran out"
        how = f"[yellow]the race's fastest when {why}, not confirmed[/] (see the notes)"
    else:
        how = "[yellow]not confirmed by an A/B[/] (see the notes)"
    con.print(f"[bold green]wrote {escape(report.output)}[/]: {what}: {how}")
    con.print(f"[dim]next: popkit test {escape(report.output)}, then popkit submit {escape(report.output)}[/]")


__all__ = ["show_tune"]
