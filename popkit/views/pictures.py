"""Pictures of a bench run: per-shape bars with 95% intervals and achieved bandwidth against the GPU's peak, in the
terminal (Rich) and as one self-contained HTML page (inline SVG and CSS: no script, no network) to open or share.

The numbers are the report's own: each benchmark case's mean, its 95% interval (from the raw samples when the eval
sent them, else from err and n: stats), and the bandwidth its byte count implies (results.CaseResult), against the
datasheet peak of the GPU the run used (gpus.peak_bandwidth). Nothing here runs or measures anything.
"""

from __future__ import annotations

import html
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from popkit.errors import UsageError
from popkit.model import stats
from popkit.model.gpus import peak_bandwidth
from popkit.model.results import CaseResult, RunReport
from popkit.views.common import escape, format_interval, format_time

BAR_CELLS = 30  # the terminal bar's width at the slowest shape
_SVG_BAR_W = 420  # pixels for the slowest shape's bar (and for the peak bandwidth)
_ROW_H = 26
_LABEL_W = 220
_VALUE_W = 260


@dataclass(frozen=True)
class Bar:
    """One benchmark shape: its mean, 95% interval (ns) and the bandwidth it implies (bytes/s, None unknown)."""

    spec: str
    mean_ns: float | None  # None: the shape did not run or failed
    low_ns: float | None = None
    high_ns: float | None = None
    bandwidth: float | None = None
    note: str = ""  # why there is no time


def _interval(case: CaseResult) -> tuple[float | None, float | None]:
    try:
        if len(case.samples_ns) >= 2:
            ci = stats.positive_mean_ci95(list(case.samples_ns))
        elif case.mean_ns and case.err_ns is not None and case.runs >= 2:
            ci = stats.positive_mean_interval(case.mean_ns, case.err_ns, case.runs)
        else:
            return None, None
    except (ValueError, ZeroDivisionError):
        return None, None
    return ci.low, ci.high


def bars(report: RunReport) -> list[Bar]:
    """The shapes of the run that ranks (public leaderboard mode, else benchmark mode), one Bar each; a shape a
    CPU run skipped is a bar without a time that says so."""
    mode = "leaderboard" if report.runs_of("leaderboard", secret=False) else "benchmark"
    run = next(iter(report.runs_of(mode, secret=False)), None)
    found = []
    for case in run.benchmarks if run else ():
        if case.passed and case.mean_ns is not None:
            low, high = _interval(case)
            found.append(Bar(case.spec, case.mean_ns, low, high, case.bandwidth_bytes_per_s))
        else:
            found.append(Bar(case.spec, None, note=(case.error or case.message or "no time").splitlines()[0][:80]))
    found += [Bar(spec, None, note="skipped: sized out on this CPU") for spec in report.skipped_shapes]
    return found


def terminal_lines(report: RunReport) -> list[str]:
    """Rich markup lines: a bar per shape scaled to the slowest, its mean and interval, and % of peak bandwidth."""
    shown = bars(report)
    timed = [b for b in shown if b.mean_ns]
    if not timed:
        return []
    slowest = max(b.mean_ns or 0 for b in timed)
    peak = peak_bandwidth(report.system.get("device"))
    width = max(len(b.spec) for b in shown)
    lines = ["[bold]per shape[/] [dim](bar: mean time, scaled to the slowest; [ ]: 95% interval)[/]"]
    for b in shown:
        if b.mean_ns is None:
            lines.append(f"  {escape(b.spec.ljust(width))} [dim]{escape(b.note)}[/]")
            continue
        cells = max(1, round(BAR_CELLS * b.mean_ns / slowest))
        bar = "█" * cells + " " * (BAR_CELLS - cells)
        ci = f" {format_interval(b.low_ns, b.high_ns)}" if b.low_ns and b.high_ns else ""
        bw = ""
        if b.bandwidth:
            bw = f" · {b.bandwidth / 1e9:,.0f} GB/s" + (f" ({100 * b.bandwidth / peak:.0f}% of peak)" if peak else "")
        lines.append(f"  {escape(b.spec.ljust(width))} [cyan]{bar}[/] {format_time(b.mean_ns)}[dim]{escape(ci)}{bw}[/]")
    return lines


# ------------------------------------------------------------------------------------------ HTML


def _svg_times(shown: Sequence[Bar]) -> str:
    slowest = max(b.high_ns or b.mean_ns or 0 for b in shown) or 1.0
    height = _ROW_H * len(shown) + 10
    width = _LABEL_W + _SVG_BAR_W + _VALUE_W
    parts = [f'<svg class="chart" role="img" aria-label="mean time per shape" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">']
    for i, b in enumerate(shown):
        y = 5 + i * _ROW_H
        parts.append(f'<text x="{_LABEL_W - 8}" y="{y + 16}" text-anchor="end">{html.escape(b.spec)}</text>')
        if b.mean_ns is None:
            parts.append(f'<text class="note" x="{_LABEL_W}" y="{y + 16}">{html.escape(b.note)}</text>')
            continue
        w = max(1.0, _SVG_BAR_W * b.mean_ns / slowest)
        parts.append(f'<rect class="bar" x="{_LABEL_W}" y="{y + 3}" width="{w:.1f}" height="{_ROW_H - 8}"/>')
        if b.low_ns and b.high_ns:
            x0, x1 = _LABEL_W + _SVG_BAR_W * b.low_ns / slowest, _LABEL_W + _SVG_BAR_W * b.high_ns / slowest
            mid = y + _ROW_H / 2 - 1
            parts.append(f'<path class="ci" d="M{x0:.1f} {mid - 6}v12M{x0:.1f} {mid}H{x1:.1f}M{x1:.1f} {mid - 6}v12"/>')
        label = format_time(b.mean_ns) + (f"  95% {format_interval(b.low_ns, b.high_ns)}" if b.low_ns and b.high_ns else "")
        parts.append(f'<text x="{_LABEL_W + _SVG_BAR_W + 8}" y="{y + 16}">{html.escape(label)}</text>')
    return "".join(parts) + "</svg>"


def _svg_bandwidth(shown: Sequence[Bar], peak: float | None) -> str:
    rated = [b for b in shown if b.bandwidth]
    if not rated:
        return "<p class=\"note\">No shape carries a byte count (popkit's harness sends it), so no bandwidth.</p>"
    top = max([peak or 0.0] + [b.bandwidth or 0.0 for b in rated])
    height = _ROW_H * len(rated) + 30
    width = _LABEL_W + _SVG_BAR_W + _VALUE_W
    parts = [f'<svg class="chart" role="img" aria-label="achieved bandwidth per shape" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">']
    for i, b in enumerate(rated):
        y = 5 + i * _ROW_H
        share = f" ({100 * b.bandwidth / peak:.0f}% of peak)" if peak else ""  # type: ignore[operator]
        parts.append(f'<text x="{_LABEL_W - 8}" y="{y + 16}" text-anchor="end">{html.escape(b.spec)}</text>')
        parts.append(f'<rect class="bw" x="{_LABEL_W}" y="{y + 3}" '
                     f'width="{max(1.0, _SVG_BAR_W * b.bandwidth / top):.1f}" height="{_ROW_H - 8}"/>')  # type: ignore[operator]
        parts.append(f'<text x="{_LABEL_W + _SVG_BAR_W + 8}" y="{y + 16}">'
                     f'{b.bandwidth / 1e9:,.0f} GB/s{html.escape(share)}</text>')  # type: ignore[operator]
    if peak:
        x = _LABEL_W + _SVG_BAR_W * peak / top
        bottom = 5 + len(rated) * _ROW_H
        parts.append(f'<path class="peak" d="M{x:.1f} 2V{bottom}"/>'
                     f'<text class="note" x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">'
                     f'peak {peak / 1e9:,.0f} GB/s</text>')
    return "".join(parts) + "</svg>"


_STYLE = """body{font:14px system-ui,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 6px}.meta{color:#5a6372}
.chart text{font:12px ui-monospace,monospace;fill:#1d2330}.chart .note,.note{fill:#8a93a3;color:#8a93a3}
.bar{fill:#3b6fd8}.bw{fill:#2e9e6a}.ci{stroke:#111;stroke-width:2;fill:none}.peak{stroke:#d04a3a;stroke-width:2;
stroke-dasharray:5 3}.warn{color:#a05a00}"""


def run_html(report: RunReport, title: str = "") -> str:
    """The whole page for one bench run: what ran where, the score, then the two charts."""
    shown = bars(report)
    device = str(report.system.get("device") or "cpu")
    peak = peak_bandwidth(device)
    score = report.score_public_s
    mode = "leaderboard" if report.runs_of("leaderboard", secret=False) else "benchmark"
    lines = [f"{html.escape(report.submission)} · task {html.escape(report.task)} · {mode} mode · "
             f"{html.escape(device)}",
             f"score ({report.ranking_by}, public): {html.escape(format_time(score * 1e9)) if score else 'none'}"
             f" · outcome {html.escape(report.outcome)}"]
    if not report.leaderboard_faithful:
        lines.append('<span class="warn">not leaderboard-faithful: '
                     + html.escape(", ".join(report.skipped_shapes) and "shapes skipped: "
                                   + ", ".join(report.skipped_shapes) or "cases changed") + "</span>")
    body = "<br>".join(lines)
    times = _svg_times(shown) if shown else "<p class=\"note\">No benchmark shape ran.</p>"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title or report.submission)}"
            f"</title><style>{_STYLE}</style></head><body>\n<h1>{html.escape(title or 'popkit bench')}</h1>\n"
            f"<p class=\"meta\">{body}</p>\n<h2>Mean time per shape, with its 95% interval</h2>\n{times}\n"
            f"<h2>Achieved bandwidth against the GPU's peak</h2>\n{_svg_bandwidth(shown, peak)}\n</body></html>\n")


def write_html(path: Path, page: str) -> Path:
    """Write `page` to `path` whole or not at all (a temporary file beside it, then a rename); UsageError (exit 2)
    naming the path when it cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--html {path}: a folder", "give a file name, e.g. --html report.html")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".popkit-", suffix=".html", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(page)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"--html {path}: cannot write ({exc.strerror or exc})", "give a writable path") from None
    return path


# ------------------------------------------------------------------------------------------ a file over its versions


@dataclass(frozen=True)
class Version:
    """One scored run of a file: when, which bytes, the mode and device it ranked in, its score (seconds)."""

    run_id: int
    created_at: str
    sha256: str
    mode: str
    device: str
    score_s: float


def versions(records: Sequence) -> list[Version]:
    """The scored runs among history records (history.RunRecord, newest first), oldest first."""
    found = [Version(r.id, r.created_at, r.sha256, r.mode, r.device or "-", r.score_s) for r in records
             if r.kind != "submission" and r.score_s]
    return sorted(found, key=lambda v: (v.created_at, v.run_id))


def history_lines(records: Sequence) -> list[str]:
    """Rich markup lines: each scored run of the file as a bar (scaled to the slowest), oldest first; the score
    against the first one's; empty with fewer than two scored runs."""
    shown = versions(records)
    if len(shown) < 2:
        return []
    slowest = max(v.score_s for v in shown)
    lines = ["[bold]score over the file's versions[/] [dim](oldest first; bar: score, scaled to the slowest; "
             "compare like with like: one mode, one device)[/]"]
    for v in shown:
        cells = max(1, round(BAR_CELLS * v.score_s / slowest))
        change = f"{shown[0].score_s / v.score_s:.2f}× the first"
        lines.append(f"  #{v.run_id:<4} {escape(v.created_at[:16])} {v.sha256[:8]} {escape(v.mode[:11]):11} "
                     f"[cyan]{'█' * cells}{' ' * (BAR_CELLS - cells)}[/] {format_time(v.score_s * 1e9)} "
                     f"[dim]{escape(change)} · {escape(v.device)}[/]")
    return lines


def history_html(records: Sequence, title: str) -> str:
    """The page for a file's scored runs: a bar per run, oldest first, with the score and what it ran on."""
    shown = versions(records)
    if not shown:
        chart = '<p class="note">No scored run of this file is recorded (`popkit bench` records them).</p>'
    else:
        slowest = max(v.score_s for v in shown)
        width, height = _LABEL_W + _SVG_BAR_W + _VALUE_W, _ROW_H * len(shown) + 10
        parts = [f'<svg class="chart" role="img" aria-label="score per version" width="{width}" height="{height}" '
                 f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">']
        for i, v in enumerate(shown):
            y = 5 + i * _ROW_H
            label = f"#{v.run_id} {v.created_at[:16]} {v.sha256[:8]}"
            parts.append(f'<text x="{_LABEL_W - 8}" y="{y + 16}" text-anchor="end">{html.escape(label)}</text>')
            parts.append(f'<rect class="bar" x="{_LABEL_W}" y="{y + 3}" '
                         f'width="{max(1.0, _SVG_BAR_W * v.score_s / slowest):.1f}" height="{_ROW_H - 8}"/>')
            parts.append(f'<text x="{_LABEL_W + _SVG_BAR_W + 8}" y="{y + 16}">'
                         f'{html.escape(format_time(v.score_s * 1e9))} · {html.escape(v.mode)} · '
                         f'{html.escape(v.device)}</text>')
        chart = "".join(parts) + "</svg>"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
            f"<p class=\"meta\">{len(shown)} scored run(s), oldest first; compare like with like (one mode, one "
            f"device)</p>\n<h2>Score per version</h2>\n{chart}\n</body></html>\n")


# ------------------------------------------------------------------------------------------ an A/B


AB_CELLS = 41  # the terminal axis: ratios from 1/SPAN to SPAN on a log scale, 1.0 in the middle
AB_SPAN = 2.0


def _ab_rows(report) -> list[tuple[str, float, float | None, float | None]]:
    """(label, B/A estimate, low, high) per shape and the score, for those with a ratio (ab.ABReport)."""
    rows = [(s.spec, s.ratio.estimate, s.ratio.low, s.ratio.high) for s in report.shapes if s.ratio is not None]
    if report.score is not None and report.score.ratio is not None:
        r = report.score.ratio
        rows.append((f"score ({report.ranking_by})", r.estimate, r.low, r.high))
    return rows


def _cell(ratio: float) -> int:
    share = (math.log(max(ratio, 1e-9)) / math.log(AB_SPAN) + 1) / 2  # 0 at 1/SPAN, 1 at SPAN
    return max(0, min(AB_CELLS - 1, round(share * (AB_CELLS - 1))))


def ab_lines(report) -> list[str]:
    """Rich markup lines: per shape and the score, time B / time A on a log axis (1/2 to 2, `│` at 1), the 95%
    interval as `[───]` and the estimate as `●`; left of `│` B is faster."""
    rows = _ab_rows(report)
    if not rows:
        return []
    width = max(len(label) for label, *_ in rows)
    lines = [f"[bold]time B / time A[/] [dim](log axis 1/2 … 2; left of │ B is faster; [─●─]: 95% interval)[/]"]
    for label, estimate, low, high in rows:
        cells = [" "] * AB_CELLS
        cells[_cell(1.0)] = "│"
        if low is not None and high is not None:
            lo, hi = _cell(low), _cell(high)
            for i in range(lo, hi + 1):
                cells[i] = "─"
            cells[lo], cells[hi] = "[", "]"
        cells[_cell(estimate)] = "●"
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        lines.append(f"  {escape(label.ljust(width))} {escape(''.join(cells))} {estimate:.3f}×[dim]{ci}[/]")
    return lines


def ab_html(report, title: str) -> str:
    """The page for an A/B: per shape and the score, B / A with its 95% interval on a log axis around 1."""
    rows = _ab_rows(report)
    axis_w, mid = _SVG_BAR_W, _LABEL_W + _SVG_BAR_W / 2

    def x(ratio: float) -> float:
        share = (math.log(max(ratio, 1e-9)) / math.log(AB_SPAN) + 1) / 2
        return _LABEL_W + axis_w * max(0.0, min(1.0, share))

    width, height = _LABEL_W + axis_w + _VALUE_W, _ROW_H * len(rows) + 30
    parts = [f'<svg class="chart" role="img" aria-label="time B / time A per shape" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f'<path class="peak" d="M{mid:.1f} 2V{5 + len(rows) * _ROW_H}"/>']
    for i, (label, estimate, low, high) in enumerate(rows):
        y = 5 + i * _ROW_H + _ROW_H / 2
        parts.append(f'<text x="{_LABEL_W - 8}" y="{y + 4}" text-anchor="end">{html.escape(label)}</text>')
        if low is not None and high is not None:
            parts.append(f'<path class="ci" d="M{x(low):.1f} {y - 6}v12M{x(low):.1f} {y}H{x(high):.1f}'
                         f'M{x(high):.1f} {y - 6}v12"/>')
        parts.append(f'<circle class="bar" cx="{x(estimate):.1f}" cy="{y}" r="5"/>')
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        parts.append(f'<text x="{_LABEL_W + axis_w + 8}" y="{y + 4}">{estimate:.3f}×{html.escape(ci)}</text>')
    bottom = 5 + len(rows) * _ROW_H + 18
    parts.append(f'<text class="note" x="{_LABEL_W}" y="{bottom}">1/{AB_SPAN:g} (B faster)</text>'
                 f'<text class="note" x="{mid:.1f}" y="{bottom}" text-anchor="middle">1</text>'
                 f'<text class="note" x="{_LABEL_W + axis_w}" y="{bottom}" text-anchor="end">{AB_SPAN:g} (A faster)</text>')
    chart = "".join(parts) + "</svg>" if rows else '<p class="note">No shape has a ratio yet.</p>'
    meta = (f"A: {html.escape(report.a_path)} · B: {html.escape(report.b_path)} · {report.rounds} rounds · "
            f"{html.escape(str(report.system.get('device') or 'cpu'))}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n<p class=\"meta\">{meta}</p>\n"
            f"<h2>Time B / time A per shape, with its 95% interval</h2>\n{chart}\n</body></html>\n")
