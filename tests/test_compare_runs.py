"""`popkit compare`: identical bytes never get a winner, one mode on both sides (said in the
table), devices compared without their run labels, and one run's numbers the same in history, show and compare."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import UsageError
from popkit.ledger import runcompare
from popkit.ledger.history import History, db_path
from popkit.model.results import CaseResult, ModeRun, RunReport

SPECS = ("size: 1024; seed: 0", "size: 2048; seed: 1")


def _run(mode: str, means, spread: float = 0.01) -> ModeRun:
    cases = tuple(CaseResult(kind="benchmark", index=i, spec=SPECS[i], passed=True, runs=4, mean_ns=m,
                             std_ns=m * spread, err_ns=m * spread / 2, best_ns=m * 0.98, worst_ns=m * 1.02, median_ns=m,
                             samples_ns=(m * (1 - spread), m, m, m * (1 + spread)), stop="converged", timer="cuda-event")
                  for i, m in enumerate(means))
    return ModeRun(mode=mode, secret=False, seed=None, exit_code=0, duration_s=1.0, timeout_s=180.0, check="pass",
                   benchmarks=cases, raw={"check": "pass"})


def _report(*runs: ModeRun, sha: str = "a" * 64, device: str = "cpu", label: str = "",
            ranking_by: str = "geom") -> RunReport:
    mode = "leaderboard" if any(r.mode == "leaderboard" for r in runs) else "benchmark"
    return RunReport(task="vectoradd", task_path="/tasks/vectoradd", leaderboard="vectoradd", ranking_by=ranking_by,
                     submission="sub.py", sha256=sha, mode=mode, harness="popkit",
                     started_at="2026-11-02T10:00:00+00:00", duration_s=3.0, system={"device": device},
                     runs=runs, label=label)


@pytest.fixture
def env(tmp_path):
    return {"POPKIT_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "POPKIT_WIDTH": "250"}


def _db(env) -> History:
    return History(db_path(env))


def _compare(env, a: int, b: int, *more: str):
    return CliRunner().invoke(app, ["compare", str(a), str(b), *more], env=env)


def test_identical_bytes_never_name_a_winner(env):
    db = _db(env)
    a = db.record_run(_report(_run("benchmark", (1000.0, 4000.0))), b"x")
    b = db.record_run(_report(_run("benchmark", (3770.0, 15080.0))), b"x")  # the same file, 3.77x slower
    result = _compare(env, a, b)
    assert result.exit_code == 0, result.output
    assert "faster" not in result.output
    rows = [line for line in result.output.splitlines() if line.lstrip().startswith(("size:", "score"))]
    assert len(rows) == 3 and all("same bytes: no winner" in row for row in rows)
    assert ("same bytes: both runs are of the same file (sha256 aaaaaaaa); their difference is the machine's "
            "run-to-run spread, not the code's") in result.output
    doc = json.loads(_compare(env, a, b, "--json").stdout)
    assert doc["same_bytes"] is True and doc["comparison"]["verdict"] == "same_bytes"
    assert {s["verdict"] for s in doc["comparison"]["shapes"]} == {"same_bytes"}


def test_different_bytes_still_get_their_verdict(env):
    db = _db(env)
    a = db.record_run(_report(_run("benchmark", (1000.0, 4000.0))), b"x")
    b = db.record_run(_report(_run("benchmark", (500.0, 2000.0)), sha="b" * 64), b"y")
    result = _compare(env, a, b)
    assert f"run {b} faster" in result.output and "same bytes" not in result.output


def test_modes_are_compared_mode_to_mode_and_said(env):
    db = _db(env)
    ranked = db.record_run(_report(_run("benchmark", (1000.0, 4000.0)), _run("leaderboard", (3770.0, 15080.0))), b"x")
    plain = db.record_run(_report(_run("benchmark", (1000.0, 4000.0)), sha="b" * 64), b"y")
    result = _compare(env, ranked, plain)
    assert result.exit_code == 0, result.output
    assert ("benchmark mode on both sides; each shape: the mean of its timed calls (what the leaderboard ranks); "
            "score: geom of those means, as `popkit history` shows it") in result.output
    assert (f"note: run {ranked} also timed leaderboard mode: `popkit history` shows its score from that mode; this "
            "table compares benchmark mode, the mode both runs timed") in result.output
    assert "faster" not in result.output  # 1000 ns against 1000 ns, not against leaderboard mode's 3770 ns
    both = db.record_run(_report(_run("benchmark", (900.0, 3600.0)), _run("leaderboard", (3770.0, 15080.0)),
                                 sha="c" * 64), b"z")
    result = _compare(env, ranked, both)
    assert "leaderboard mode on both sides;" in result.output and "note:" not in result.output


def test_runs_with_no_mode_in_common_are_refused(env):
    db = _db(env)
    a = db.record_run(_report(_run("leaderboard", (1000.0, 4000.0))), b"x")
    b = db.record_run(_report(_run("benchmark", (1000.0, 4000.0))), b"y")
    result = _compare(env, a, b)
    assert result.exit_code == 2, result.output
    assert (f"error: run {a} timed leaderboard mode, run {b} benchmark mode: their times are not comparable"
            in result.output)
    assert ("hint: compare two runs of the same kind (`popkit bench FILE`, or both with --leaderboard)"
            in result.output)


def test_the_device_comparison_ignores_run_labels(env):
    db = _db(env)
    a = db.record_run(_report(_run("benchmark", (1000.0, 4000.0)), label="A/B side A, against b.py"), b"x")
    b = db.record_run(_report(_run("benchmark", (1000.0, 4000.0)), sha="b" * 64, label="A/B side B, against a.py"),
                      b"y")
    result = _compare(env, a, b)
    assert "cpu [A/B side A, against b.py]" in result.output  # the label is still shown on the run's line
    assert "different devices" not in result.output
    c = db.record_run(_report(_run("benchmark", (1000.0, 4000.0)), sha="c" * 64, device="NVIDIA H100"), b"z")
    result = _compare(env, a, c)
    assert ("warning: the runs were on different devices (cpu, NVIDIA H100); the ratio mixes code and hardware"
            in result.output)


def test_one_runs_numbers_agree_between_history_show_and_compare(env):
    db = _db(env)
    a = db.record_run(_report(_run("benchmark", (1000.0, 4000.0)), _run("leaderboard", (1100.0, 4400.0))), b"x")
    b = db.record_run(_report(_run("benchmark", (800.0, 3000.0)), _run("leaderboard", (1000.0, 4000.0)),
                              sha="b" * 64), b"y")
    score_a, score_b = "2.20 µs", "2.00 µs"  # geometric means of the leaderboard-mode means
    history = CliRunner().invoke(app, ["history"], env=env).output
    assert score_a in next(line for line in history.splitlines() if line.strip().startswith(str(a)))
    assert f"score (geom, public): {score_a}" in CliRunner().invoke(app, ["show", str(a)], env=env).output
    result = _compare(env, a, b)
    assert "A mean" in result.output and "B mean" in result.output
    score_row = next(line for line in result.output.splitlines() if line.lstrip().startswith("score (geomean)"))
    assert score_a in score_row and score_b in score_row and "0.909×" in score_row
    first = next(line for line in result.output.splitlines() if line.lstrip().startswith(SPECS[0]))
    assert "1100 ns" in first and "1000 ns" in first  # leaderboard mode's means, as show lists them


@pytest.mark.parametrize("ranking_by", ["geom", "mean", "last"])
def test_the_score_ratio_is_the_ratio_of_the_scores(env, ranking_by):
    db = _db(env)
    a = db.record_run(_report(_run("benchmark", (1000.0, 4000.0)), ranking_by=ranking_by), b"x")
    b = db.record_run(_report(_run("benchmark", (500.0, 3000.0)), sha="b" * 64, ranking_by=ranking_by), b"y")
    rc = runcompare.compare_runs(a, b, _db(env))
    assert rc.comparison.score.estimate == pytest.approx(rc.b_score_s / rc.a_score_s)
    assert rc.comparison.score.low < rc.comparison.score.estimate < rc.comparison.score.high


def test_a_run_without_timings_is_refused(env):
    db = _db(env)
    test_only = db.record_run(_report(ModeRun(mode="test", secret=False, seed=None, exit_code=0, duration_s=1.0,
                                              timeout_s=10.0, check="pass")), b"x")
    other = db.record_run(_report(_run("benchmark", (1000.0, 4000.0))), b"y")
    with pytest.raises(UsageError, match=f"run {test_only} has no local timings"):
        runcompare.compare_runs(test_only, other, _db(env))


def test_a_run_over_some_shapes_is_not_ranked_against_a_run_over_all(env):
    """A CPU run that the sizing cut to fewer shapes has a score over other shapes: compare gives no score row."""
    from dataclasses import replace

    db = _db(env)
    a = db.record_run(_report(_run("benchmark", (1000.0, 4000.0))), b"x")
    cut = replace(_report(_run("benchmark", (900.0,)), sha="b" * 64), skipped_shapes=(SPECS[1],))
    b = db.record_run(cut, b"y")
    doc = json.loads(_compare(env, a, b, "--json").stdout)
    assert doc["b_score_s"] is None and doc["a_score_s"] is None
    assert any("shapes left out by the CPU sizing" in n and "do not rank" in n for n in doc["notes"])
    assert [s["spec"] for s in doc["comparison"]["shapes"]] == [SPECS[0]]  # the shape both timed
