"""Progress for long steps: mode, case i/N with its spec, elapsed time; a spinner on terminals, lines in pipes."""

from __future__ import annotations

import io
import sys
import time

from rich.console import Console

import pytest

from popkit.run import proc
from popkit.run import runner
from popkit.run.beside import LiveProgress
from popkit.views.common import ProgressPrinter


class Recorder:
    """A progress printer that records step lines and live updates."""

    def __init__(self):
        self.lines: list[str] = []
        self.live_calls: list[tuple[str, str]] = []

    def __call__(self, msg: str) -> None:
        self.lines.append(msg)

    def live(self, text: str, key: str = "") -> None:
        self.live_calls.append((text, key))


def test_live_progress_reads_the_case_from_the_pipe_as_it_arrives():
    rec = Recorder()
    watch = LiveProgress(rec, "test", total=5, kind="test")
    watch(b"")
    assert rec.live_calls[-1][0] == "test · 5 cases · 0 s"
    watch(b"test-count: 5\ntest.0.spec: size: 127; se")  # a line cut in two by the pipe
    watch(b"ed: 4242\ntest.0.status: pass\ntest.1.spec: size: 128; seed: 5236\n")
    assert rec.live_calls[-1] == ("test · case 2/5: size: 128; seed: 5236 · 0 s", "test/1")


@pytest.mark.slow
def test_proc_run_feeds_the_result_pipe_and_ticks_while_the_child_runs(tmp_path):
    child = ("import os, time\nfd = int(os.environ['POPCORN_FD'])\n"
             "os.write(fd, b'benchmark.0.spec: size: 10\\n')\ntime.sleep(2.5)\n")
    seen: list[bytes] = []
    done = proc.run([sys.executable, "-c", child], tmp_path, {"PATH": "/usr/bin:/bin"}, 30,
                    result_fd_env="POPCORN_FD", watch=seen.append)
    assert done.code == 0
    assert b"benchmark.0.spec: size: 10\n" in seen
    assert seen.count(b"") >= 2  # about once a second while it slept


def test_a_run_reports_each_step_and_live_progress(tmp_path):
    from popkit.model.tasks import load_task
    from tests.test_runner import SUBS, TASKS

    rec = Recorder()
    runner.run_submission(load_task(TASKS / "double"), SUBS / "good.py", "leaderboard",
                          runner.RunOptions(precompile=False), progress=rec, system={"device": "test"})
    assert rec.lines == ["test", "benchmark", "leaderboard"]
    labels = {text.split(" · ")[0] for text, _ in rec.live_calls}
    assert {"test", "benchmark", "leaderboard"} <= labels


def _pipe_printer(enabled: bool = True) -> tuple[ProgressPrinter, io.StringIO]:
    out = io.StringIO()
    return ProgressPrinter(enabled, Console(file=out, width=80, force_terminal=False, no_color=True)), out


def test_in_a_pipe_live_progress_is_a_line_per_case_not_per_second():
    printer, out = _pipe_printer()
    printer("test")
    printer.live("test · case 1/2: size: 3 · 0 s", "test/0")
    printer.live("test · case 1/2: size: 3 · 1 s", "test/0")  # same case, a second later: no new line
    printer.live("test · case 2/2: size: 5 · 2 s", "test/1")
    assert out.getvalue() == "… test\n  test · case 1/2: size: 3 · 0 s\n  test · case 2/2: size: 5 · 2 s\n"


def test_in_a_pipe_a_long_case_still_says_it_is_alive(monkeypatch):
    printer, out = _pipe_printer()
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    printer.live("benchmark · case 1/1: size: 9 · 0 s", "b/0")
    clock[0] += ProgressPrinter.LIVE_EVERY_S
    printer.live("benchmark · case 1/1: size: 9 · 15 s", "b/0")
    assert out.getvalue().splitlines()[-1] == "  benchmark · case 1/1: size: 9 · 15 s"


def test_json_mode_prints_no_progress_at_all():
    printer, out = _pipe_printer(enabled=False)
    printer("test")
    printer.live("test · 2 cases · 1 s", "t")
    with printer.timed("building x.py"):
        pass
    assert out.getvalue() == ""


def test_builds_get_an_elapsed_time_line():
    printer, out = _pipe_printer()
    with printer.timed("building mine.py"):
        time.sleep(1.3)
    assert "  building mine.py · 1 s\n" in out.getvalue()


def test_on_a_terminal_the_spinner_is_gone_before_the_report():
    out = io.StringIO()
    printer = ProgressPrinter(True, Console(file=out, width=80, force_terminal=True, no_color=True))
    with printer:
        printer.live("test · case 1/2: size: 3 · 0 s", "t/0")
        assert printer._status is not None
    assert printer._status is None


def test_the_footer_counts_the_whole_command(monkeypatch, capsys):
    from popkit.model.tasks import load_task
    from popkit.views import running as view
    from tests.test_history import make_report
    from tests.test_runner import TASKS

    monkeypatch.setenv("NO_COLOR", "1")
    report = make_report(mode="test")  # its own run took 3.0 s; the command (with a baseline) took longer
    view.show_run(report, load_task(TASKS / "double"), total_s=451.04)
    assert capsys.readouterr().out.rstrip().endswith("PASSED in 451.0 s")
