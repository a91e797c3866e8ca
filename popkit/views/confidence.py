"""Reports of risk (each case's margin to the tolerance and determinism, then the verdict) and verify."""

from __future__ import annotations

from popkit.operations.evidence import REPRODUCES, SAME_VERDICT, VerifyReport
from popkit.operations.risk import RiskReport
from popkit.views.common import console, emit_json, escape, table

_COLOUR = {"low": "green", "medium": "yellow", "high": "red"}


def show_risk(report: RiskReport, *, json: bool = False, every: bool = False) -> None:
    """The cases that matter (all with `every`): failing, varying, and the ten closest to the tolerance."""
    if json:
        emit_json("risk", report.to_json())
        return
    con = console()
    seeds = ", ".join(str(s) for s in report.secret_seeds) or "none"
    con.print(f"[bold]popkit risk[/] · task [bold]{escape(report.task)}[/] · {escape(report.submission)}")
    con.print(f"[dim]{len(report.cases)} cases x {report.repeats} calls; extra secret seeds: {seeds}; "
              f"{report.refused} shape(s) next to the grid refused by generate_input; isolation: "
              f"{escape(report.isolation)}[/]")
    order = sorted(range(len(report.cases)), key=lambda i: (report.cases[i].passed, report.cases[i].deterministic
                                                            is not False, -(report.cases[i].margin or 0.0)))
    shown = order if every else [i for i in order if not report.cases[i].passed
                                 or report.cases[i].deterministic is False] + \
        [i for i in order if report.cases[i].passed and report.cases[i].deterministic is not False][:10]
    out = table(["case", "from", "check", "margin", "repeats", "note"], right=("margin",))
    for i in shown:
        c = report.cases[i]
        margin = "?" if c.margin is None else f"{c.margin:.0%}" if c.margin < 10 else f"{c.margin:,.0f}x"
        repeat = {True: "bitwise", False: f"{c.distinct} outputs", None: "-"}[c.deterministic]
        out.add_row(escape(c.spec()), c.origin, "pass" if c.passed else "[red]fail[/]", margin, repeat,
                    escape(c.message[:120]))
    con.print(out)
    if len(shown) < len(report.cases):
        con.print(f"[dim]{len(report.cases) - len(shown)} more case(s) pass further from the tolerance "
                  "(--all lists them)[/]")
    for note in report.notes:
        con.print(f"[dim]note: {escape(note)}[/]")
    colour = _COLOUR.get(report.level, "bold")
    con.print(f"[{colour}]{report.level} risk[/]: {escape(report.reason)}")


def show_verify(report: VerifyReport, *, json: bool = False) -> None:
    """Each timed shape: reproduces or not, the ratio here / recorded with its interval; then the verdict."""
    if json:
        emit_json("verify", report.to_json())
        return
    con = console()
    con.print(f"[bold]popkit verify[/] {escape(report.evidence)} · task [bold]{escape(report.task)}[/] · "
              f"{escape(str(report.here_gpu))}")
    out = table(["shape", "result", "here / recorded", "95% interval"], right=("here / recorded",))
    for s in report.shapes:
        ratio = s.comparison.ratio if s.comparison else None
        interval = f"{ratio.low:.3f} - {ratio.high:.3f}" if ratio is not None and ratio.defined else "-"
        colour = "green" if s.status == REPRODUCES else "dim" if s.status == SAME_VERDICT else "red"
        out.add_row(escape(s.key), f"[{colour}]{s.status}[/]", escape(s.note.removeprefix("here / recorded = ")),
                    interval)
    con.print(out)
    for note in report.notes:
        con.print(f"[dim]note: {escape(note)}[/]")
    scores = [f"{name} {value * 1e6:.2f} µs" for name, value in (("recorded", report.recorded_score_s),
                                                                  ("here", report.here_score_s)) if value is not None]
    if scores:
        con.print(f"[dim]score: {', '.join(scores)}[/]")
    if report.reproduces:
        con.print(f"[green]reproduces[/]: every benchmark-mode shape within the noise (or {report.tolerance:.0%}) "
                  "of the evidence, every verdict the same")
    else:
        bad = sum(1 for s in report.shapes if s.status not in (REPRODUCES, SAME_VERDICT))
        con.print(f"[red]does not reproduce[/]: {bad} of {len(report.shapes)} shape(s)" if report.shapes else
                  "[red]does not reproduce[/]: the evidence holds no timed shape")
