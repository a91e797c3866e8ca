"""What a run's text report says: noise warnings name the right device and fold into one
line, a speed-up over the reference has an interval, and a Python exception in the submission shows the line
of the user's file it came from."""

from __future__ import annotations

import pytest

from popkit.model import stats
from popkit.model.diagnostics import submission_frame
from popkit.model.results import CaseResult, ModeRun, RunReport, folded_noise, noisy_timing
from popkit.model.tasks import Task
from popkit.views import running as view

TRACEBACK = """Traceback (most recent call last):
  File "/tmp/popkit-run-27uhknnx/eval.py", line 1193, in invoke
    out = self.kernel(kernel_input)
  File "/tmp/popkit-run-27uhknnx/submission.py", line 11, in custom_kernel
    return helper(a) + b
  File "/tmp/popkit-run-27uhknnx/submission.py", line 6, in helper
    return a.nonexistent_method()
AttributeError: 'Tensor' object has no attribute 'nonexistent_method'
"""


def _timed(spec: str, mean: float, median: float, runs: int = 100, samples=()) -> CaseResult:
    return CaseResult(kind="benchmark", index=0, spec=spec, passed=True, runs=runs, mean_ns=mean, median_ns=median,
                      std_ns=mean * 0.05, err_ns=mean * 0.05 / runs ** 0.5, best_ns=median * 0.9,
                      worst_ns=mean * 3, samples_ns=tuple(samples))


def _report(*runs: ModeRun, device: str = "cpu", ranking_by: str = "geom", submission: str = "mine.py") -> RunReport:
    return RunReport(task="vectoradd", task_path="/t", leaderboard="vectoradd", ranking_by=ranking_by,
                     submission=submission, sha256="x", mode=runs[0].mode, harness="popkit", started_at="now",
                     duration_s=1.0, system={"device": device}, runs=runs)


def _run(mode: str, *cases: CaseResult, tests=()) -> ModeRun:
    passed = all(c.passed for c in cases + tuple(tests))
    return ModeRun(mode=mode, secret=False, seed=None, exit_code=0, duration_s=1.0, timeout_s=60.0,
                   check="pass" if passed else "fail", benchmarks=cases, tests=tuple(tests))


@pytest.fixture
def out(monkeypatch, capsys):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("POPKIT_WIDTH", "400")

    def printed(report: RunReport, **kw) -> str:
        task = Task(name="vectoradd", path=__import__("pathlib").Path("/t"), files=(), lang="py", description="",
                    main="eval.py")
        view.show_run(report, task, **kw)
        return capsys.readouterr().out

    return printed


def test_noise_names_the_cpu_the_gpu_or_the_device():
    case = _timed("size: 1", 200_000, 100_000)
    assert "(other work on the CPU, clocks, the host)" in noisy_timing(case, "cpu")
    assert "(other work on the GPU, clocks, the host)" in noisy_timing(case, "NVIDIA H100 80GB HBM3")
    assert "(other work on the device, clocks, the host)" in noisy_timing(case, None)


def test_repeated_noise_warnings_fold_into_one_line_with_the_count(out):
    cases = [_timed(f"size: {2 ** i}", 100_000 * (1.04 + i / 100), 100_000) for i in range(4)]
    report = _report(_run("benchmark", *cases), _run("leaderboard", *cases))
    assert len(report.warnings) == 4  # --json keeps one per case (the runs repeat them word for word)
    assert report.folded_warnings == (
        "noisy timing in 8 timed cases (size: 1, size: 2, size: 4, size: 8): the mean is 4–7% above the median; a "
        "few slow calls (other work on the CPU, clocks, the host) pulled the mean, which is what ranks; rerun before "
        "trusting a difference this size (--json lists each)",)
    text = out(report)
    assert [line for line in text.splitlines() if line.startswith("warning:")] == [
        "warning: " + report.folded_warnings[0]]
    assert folded_noise(cases[:1], "cpu") == noisy_timing(cases[0], "cpu")
    assert folded_noise([_timed("size: 1", 100_000, 100_000)]) == ""


def test_the_speedup_over_the_reference_has_an_interval(out):
    mine = _run("benchmark", _timed("size: 1", 1000, 1000, runs=4, samples=(990, 1000, 1000, 1010)),
                _timed("size: 2", 4000, 4000, runs=4, samples=(3960, 4000, 4000, 4040)))
    ref = _run("benchmark", _timed("size: 1", 2000, 2000, runs=4, samples=(1980, 2000, 2000, 2020)),
               _timed("size: 2", 4000, 4000, runs=4, samples=(3960, 4000, 4000, 4040)))
    report, baseline = _report(mine), _report(ref)
    rows, score = view.speedup_intervals(report, baseline)
    first = stats.ratio_ci95([1980, 2000, 2000, 2020], [990, 1000, 1000, 1010])
    assert rows[0][:3] == ("size: 1", 1000.0, 2000.0) and rows[0][3] == first
    assert score.estimate == pytest.approx(2 ** 0.5) and score.low < 2 ** 0.5 < score.high
    text = out(report, baseline=baseline)
    assert "speedup over the reference: its mean / yours" in text
    assert f"2.00× [{first.low:.2f}, {first.high:.2f}]" in text
    assert f"1.41× [{score.low:.2f}, {score.high:.2f}]" in text


def test_an_exception_in_the_submission_names_the_line_of_the_users_file(out):
    failed = CaseResult(kind="test", index=0, spec="size: 1; seed: 4242", passed=False,
                        error="AttributeError: 'Tensor' object has no attribute 'nonexistent_method'", message=TRACEBACK)
    report = _report(_run("test", tests=(failed,)), submission="kernels/mine.py")
    text = out(report)
    assert ("  ❌ size: 1; seed: 4242\n     AttributeError: 'Tensor' object has no attribute 'nonexistent_method'\n"
            "     at kernels/mine.py:6 in helper\n") in text
    assert submission_frame(TRACEBACK) == (6, "helper")
    assert submission_frame(TRACEBACK.replace("submission.py", "lib.py")) is None
    assert submission_frame("") is None


def test_terminal_escapes_in_a_submissions_message_never_reach_the_terminal(tmp_path, monkeypatch):
    """An exception message with raw escapes (clear the screen, a green PASSED) reached the text report as they
    were: every control character but newline and tab is shown as `\\xNN`."""
    from pathlib import Path

    from typer.testing import CliRunner

    from popkit.cli import app

    sub = tmp_path / "esc.py"
    sub.write_text('#!POPCORN leaderboard double\ndef custom_kernel(data):\n'
                   '    raise RuntimeError("\\x1b[2J\\x1b[32mPASSED\\x1b[0m\\r all good\\x07")\n')
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    task = Path(__file__).parent / "fixtures" / "tasks" / "double"
    result = CliRunner().invoke(app, ["test", str(sub), "--task", str(task)], env={"NO_COLOR": "1"})
    assert result.exit_code != 0
    assert "\\x1b[2J\\x1b[32mPASSED" in result.output, result.output[-2000:]
    assert not any(c in result.output for c in "\x1b\r\x07"), repr(result.output[-2000:])
