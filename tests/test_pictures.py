"""Pictures of a bench run: per-shape bars with 95% intervals and bandwidth against the GPU's peak, in the terminal
and as a self-contained HTML page; the page rendered in real headless Chromium (slow, skipped without it)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from popkit.errors import UsageError
from popkit.model.results import CaseResult, ModeRun, RunReport
from popkit.views import pictures

H100 = {"device": "NVIDIA H100 80GB HBM3", "gpu_count": 1}


def _case(i: int, size: int, mean_us: float, spread: float) -> CaseResult:
    samples = tuple(mean_us * 1e3 * (1 + spread * ((k % 5) - 2) / 2) for k in range(20))
    return CaseResult("benchmark", i, f"size: {size}; seed: {i}", True, runs=len(samples),
                      mean_ns=sum(samples) / len(samples), samples_ns=samples, bytes=6 * size * size)


def _report(system=H100, skipped=()) -> RunReport:
    cases = (_case(0, 1024, 10.0, 0.1), _case(1, 4096, 60.0, 0.05), _case(2, 8192, 240.0, 0.02))
    run = ModeRun("benchmark", False, None, exit_code=0, duration_s=3.0, timeout_s=180, check="pass",
                  benchmarks=cases)
    return RunReport(task="vectoradd", task_path="/t", leaderboard="vectoradd_v2", ranking_by="geom",
                     submission="mine.py", sha256="0" * 64, mode="benchmark", harness="popkit",
                     started_at="2026-11-27T00:00:00Z", duration_s=3.0, system=system, runs=(run,),
                     skipped_shapes=tuple(skipped))


def test_each_shape_is_a_bar_with_its_interval_and_its_share_of_the_peak():
    lines = pictures.terminal_lines(_report())
    rows = [line for line in lines if "size:" in line]
    assert len(rows) == 3
    cells = [row.count("█") for row in rows]
    assert cells[-1] == pictures.BAR_CELLS and cells[0] < cells[1] < cells[2]  # scaled to the slowest
    assert all(re.search(r"\[[\d.]+, [\d.]+\] µs", row) for row in rows)
    # 6 * 8192² bytes in ~240 µs: ~1,678 GB/s, about half of the H100 SXM's 3.35 TB/s
    assert "% of peak" in rows[2] and "GB/s" in rows[2]


def test_a_skipped_shape_is_named_not_drawn():
    lines = pictures.terminal_lines(_report(system={"device": "cpu"}, skipped=("size: 16384; seed: 9",)))
    assert any("size: 16384" in line and "skipped" in line and "█" not in line for line in lines)
    assert not any("% of peak" in line for line in lines)  # no peak for a CPU


def test_the_page_is_self_contained_with_bars_whiskers_and_the_peak_line():
    page = pictures.run_html(_report(skipped=("size: 16384; seed: 9",)), "popkit bench · vectoradd_v2")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched from anywhere
    assert page.count('class="bar"') == 3 and page.count('class="ci"') == 3 and page.count('class="bw"') == 3
    assert 'class="peak"' in page and "not leaderboard-faithful" in page and "size: 16384" in page


def test_the_page_is_written_whole_or_the_error_names_the_path(tmp_path):
    out = pictures.write_html(tmp_path / "r.html", "<p>x</p>")
    assert out.read_text() == "<p>x</p>"
    with pytest.raises(UsageError, match="a folder"):
        pictures.write_html(tmp_path, "<p>x</p>")
    with pytest.raises(UsageError, match="cannot write"):
        pictures.write_html(tmp_path / "no" / "r.html", "<p>x</p>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]  # no temporary file left


def test_html_goes_with_one_file_run_or_an_ab_here(cli, tmp_path):
    result = cli("bench", "a.py", "b.py", "c.py", "--html", str(tmp_path / "r.html"), "--gpus", "0")
    assert result.exit_code == 2 and "--html writes the report of one file's bench run or of an A/B" in result.output
    assert not (tmp_path / "r.html").exists()


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit non-interlaced PNG, as Chromium writes screenshots."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytes(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                best = min((abs(p - left), 0, left), (abs(p - up), 1, up), (abs(p - corner), 2, corner))[2]
                line[i] = (line[i] + best) & 255
        rows.append(bytes(line))
        prev = bytes(line)
    return width, channels, rows


@pytest.mark.slow
def test_chromium_renders_the_page_with_its_bars(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    page = pictures.write_html(tmp_path / "r.html", pictures.run_html(_report(), "popkit bench"))
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1000,600", page.as_uri()], capture_output=True, timeout=120, check=False)
    width, channels, rows = _png_pixels(shot.read_bytes())
    pixels = [row[i:i + 3] for row in rows for i in range(0, len(row), channels)]
    assert len(set(pixels)) > 20, "a blank page"
    bar, bandwidth = bytes((0x3B, 0x6F, 0xD8)), bytes((0x2E, 0x9E, 0x6A))  # .bar and .bw fills of the page's CSS
    bar_rows = sum(1 for row in rows if bar in {row[i:i + 3] for i in range(0, len(row), channels)})
    assert bar_rows >= 3 * 10 and pixels.count(bandwidth) > 1000  # three bars ~18 px tall each, and the green ones


def _recorded(tmp_path: Path, monkeypatch) -> Path:
    """Three bench runs of one file, its bytes changed each time and its score better, in a ledger of its own."""
    from dataclasses import replace

    from popkit.ledger import history

    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "ledger"))
    sub = tmp_path / "mine.py"
    sub.write_text("v1")
    for i, factor in enumerate((1.0, 0.5, 0.25)):
        base = _report()
        run = base.runs[0]
        faster = tuple(replace(c, mean_ns=c.mean_ns * factor, samples_ns=()) for c in run.benchmarks)
        report = replace(base, submission=str(sub), sha256=f"{i}" * 64, started_at=f"2026-11-27T0{i}:00:00Z",
                         runs=(replace(run, benchmarks=faster),))
        history.record_run(report, f"v{i}".encode())
    return sub


def test_history_of_a_file_draws_its_score_over_its_versions(cli, tmp_path, monkeypatch):
    sub = _recorded(tmp_path, monkeypatch)
    result = cli("history", "--file", str(sub), "--html", str(tmp_path / "h.html"))
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "× the first" in line]
    assert len(rows) == 3 and [row.count("█") for row in rows] == [pictures.BAR_CELLS, 15, 8]  # oldest first
    assert "4.00× the first" in rows[2]
    page = (tmp_path / "h.html").read_text()
    assert page.count('class="bar"') == 3 and "<script" not in page
    result = cli("history", "--html", str(tmp_path / "x.html"))
    assert result.exit_code == 2 and "add --file FILE" in result.output and not (tmp_path / "x.html").exists()


def _ab_report():
    from popkit.measure.ab import ABReport, Series
    from popkit.model.stats import Interval

    shapes = (Series("size: 1024", a_ns=(1.0,) * 4, b_ns=(0.8,) * 4, ratio=Interval(0.8, 0.75, 0.85)),
              Series("size: 8192", a_ns=(1.0,) * 4, b_ns=(1.0,) * 4, ratio=Interval(1.0, 0.97, 1.03)))
    return ABReport(task="vectoradd", a_path="v1.py", b_path="v2.py", a_sha256="a", b_sha256="b", harness="task",
                    ranking_by="geom", statistic="median", max_rounds=8, budget_s=60, rounds=4, stopped="settled",
                    started_at="", duration_s=9.0, shapes=shapes,
                    score=Series("score", ratio=Interval(0.894, 0.87, 0.92)), system=H100)


def test_an_ab_draws_each_ratio_on_a_log_axis_around_one():
    lines = pictures.ab_lines(_ab_report())
    rows = [line for line in lines if "×" in line]
    assert len(rows) == 3 and rows[-1].lstrip().startswith("score (geom)")
    faster, same = rows[0], rows[1]
    # B is 0.8x A: its dot and its whole interval left of the 1.0 mark; 1.0x sits on the mark
    assert faster.index("●") < faster.index("│") and faster.index("]") < faster.index("│")
    assert same.index("●") == faster.index("│") and "│" not in same.split("×")[0]
    page = pictures.ab_html(_ab_report(), "A/B")
    assert page.count("<circle") == 3 and page.count('class="ci"') == 3 and "<script" not in page


def test_history_marks_a_run_over_some_shapes(cli, tmp_path, monkeypatch):
    from popkit.ledger import history

    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "ledger"))
    full = history.record_run(_report(), b"x").run_id
    cut = history.record_run(_report(skipped=("size: 16384; seed: 9",)), b"x").run_id
    result = cli("history", "--json")
    marks = {r["id"]: r["leaderboard_faithful"] for r in __import__("json").loads(result.stdout)["runs"]}
    assert marks == {full: True, cut: False}
    result = cli("history")
    assert "*: not leaderboard-faithful" in result.output
    row = next(line for line in result.output.splitlines() if line.strip().startswith(str(cut)))
    assert "*" in row
