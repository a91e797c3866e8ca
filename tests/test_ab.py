"""popkit.ab: interleaving, pooled statistics, verdicts; one real run on the runner's tiny task."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit import ab, runner, stats
from popkit.ab import ABReport, Comparison, compare_shapes
from popkit.cli import app
from popkit.results import CaseResult, ModeRun
from popkit.stats import Interval, Summary
from popkit.tasks import load_task

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TASK_DIR = FIXTURES / "tasks" / "double"
GOOD = FIXTURES / "submissions" / "good.py"
WRONG = FIXTURES / "submissions" / "wrong.py"
OPTIONS = runner.RunOptions(precompile=False)
SYSTEM = {"device": "cpu", "torch": "2.14.1"}  # skips the environment probe (a torch import)


def _case(spec, samples=(), mean=None, std=None, runs=0, passed=True):
    if samples:
        mean, std, runs = stats.mean(samples), stats.std(samples), len(samples)
    return CaseResult(kind="benchmark", index=0, spec=spec, passed=passed, runs=runs, mean_ns=mean, std_ns=std,
                      samples_ns=tuple(samples))


@pytest.mark.parametrize("ci, expected", [
    (Interval(0.5, 0.4, 0.6), ab.B_FASTER), (Interval(2.0, 1.5, 2.5), ab.A_FASTER),
    (Interval(1.0, 0.9, 1.1), ab.SAME), (Interval(0.8, 0.6, 1.0), ab.SAME), (Interval(0.5, None, None), ab.UNKNOWN),
])
def test_verdict(ci, expected):
    assert ab.verdict(ci) == expected


def test_compare_shapes_pools_raw_samples_over_rounds():
    a = {"n: 1": [_case("n: 1", (100.0, 110.0, 120.0)), _case("n: 1", (100.0, 110.0, 120.0))]}
    b = {"n: 1": [_case("n: 1", (50.0, 55.0, 60.0)), _case("n: 1", (50.0, 55.0, 60.0))]}
    comparison = compare_shapes(a, b, "v6.py", "v7.py")
    (shape,) = comparison.shapes
    assert shape.from_samples and shape.a_samples_ns == (100.0, 110.0, 120.0) * 2
    assert shape.ratio == stats.ratio_ci95([50.0, 55.0, 60.0] * 2, [100.0, 110.0, 120.0] * 2)
    assert shape.ratio.estimate == pytest.approx(0.5) and shape.verdict == ab.B_FASTER
    assert comparison.score.estimate == pytest.approx(0.5) and comparison.verdict == ab.B_FASTER


def test_compare_shapes_falls_back_to_mean_std_n():
    a = {"n: 1": [_case("n: 1", mean=100.0, std=10.0, runs=10)] * 2}
    b = {"n: 1": [_case("n: 1", mean=101.0, std=10.0, runs=10)] * 2}
    (shape,) = compare_shapes(a, b).shapes
    assert not shape.from_samples and shape.a_samples_ns == ()
    assert shape.a == stats.pooled_summary([Summary(10, 100.0, 10.0)] * 2)
    assert shape.ratio == stats.ratio_ci95_summary(shape.b, shape.a)
    assert shape.verdict == ab.SAME


def test_compare_shapes_geomean_score_and_unmatched_shapes():
    a = {"n: 1": [_case("n: 1", (100.0, 100.0, 100.0))], "n: 2": [_case("n: 2", (400.0, 400.0, 400.0))],
         "n: 3": [_case("n: 3", (1.0, 1.0))]}
    b = {"n: 1": [_case("n: 1", (200.0, 200.0, 200.0))], "n: 2": [_case("n: 2", (100.0, 100.0, 100.0))]}
    comparison = compare_shapes(a, b)
    assert [s.spec for s in comparison.shapes] == ["n: 1", "n: 2"]
    assert comparison.score.estimate == pytest.approx((2.0 * 0.25) ** 0.5)


def test_comparison_round_trip():
    comparison = compare_shapes({"n: 1": [_case("n: 1", (1.0, 2.0, 3.0))]}, {"n: 1": [_case("n: 1", (2.0, 3.0))]})
    assert Comparison.from_json(json.loads(json.dumps(comparison.to_json()))) == comparison


class FakeRunner:
    """Replaces runner.run_mode: records the order of calls and answers with fixed timings."""

    def __init__(self, times: dict[str, float], fail_side: str | None = None):
        self.times, self.fail_side, self.calls = times, fail_side, []

    def __call__(self, workdir, main, mode, cases, *, timeout_s, options, seed=None, gpus=None, cases_name=None):
        side = Path(workdir).name
        self.calls.append((side, dict(cases[0])["size"], mode, len(cases)))
        base = self.times[side] * dict(cases[0])["size"]
        if side == self.fail_side:
            return ModeRun(mode=mode, secret=False, seed=None, exit_code=112, duration_s=0.1, timeout_s=timeout_s,
                           check="fail", outcome="failed", summary="benchmark 0 failed: mismatch")
        case = _case(f"size: {dict(cases[0])['size']}", (base * 0.99, base, base * 1.01))
        return ModeRun(mode=mode, secret=False, seed=None, exit_code=0, duration_s=0.1, timeout_s=timeout_s,
                       check="pass", benchmarks=(case,))


def _tmp_sub(tmp_path, name):
    path = tmp_path / name
    shutil.copyfile(GOOD, path)
    return path


def test_run_ab_interleaves_per_shape_and_alternates_who_goes_first(tmp_path, monkeypatch):
    fake = FakeRunner({"A": 2.0, "B": 1.0})
    monkeypatch.setattr(runner, "run_mode", fake)
    task = load_task(TASK_DIR)
    report = ab.run_ab(task, _tmp_sub(tmp_path, "a.py"), _tmp_sub(tmp_path, "b.py"), OPTIONS, rounds=3,
                       system=SYSTEM)
    order = [(side, size) for side, size, _, _ in fake.calls]
    assert order[:6] == [("A", 10), ("B", 10), ("B", 10), ("A", 10), ("A", 10), ("B", 10)]
    assert [size for _, size in order] == [10] * 6 + [20] * 6 + [40] * 6
    assert all(mode == "benchmark" and n == 1 for _, _, mode, n in fake.calls)
    assert report.exit_code == 0 and report.failure is None and report.rounds == 3
    assert report.system == SYSTEM
    assert [s.spec for s in report.comparison.shapes] == ["size: 10", "size: 20", "size: 40"]
    assert all(s.ratio.estimate == pytest.approx(0.5) and s.verdict == ab.B_FASTER
               for s in report.comparison.shapes)
    assert report.comparison.verdict == ab.B_FASTER
    assert ABReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_run_ab_stops_at_a_failing_side(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run_mode", FakeRunner({"A": 1.0, "B": 1.0}, fail_side="B"))
    report = ab.run_ab(load_task(TASK_DIR), _tmp_sub(tmp_path, "a.py"), _tmp_sub(tmp_path, "b.py"), OPTIONS,
                       system=SYSTEM)
    assert report.failed_side == "B" and report.exit_code == 1
    assert report.failure.summary == "benchmark 0 failed: mismatch"
    assert ABReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_run_ab_for_real_on_the_tiny_task(tmp_path):
    """The tiny eval reports the same timings for any correct submission: no significant difference."""
    report = ab.run_ab(load_task(TASK_DIR), GOOD, _tmp_sub(tmp_path, "copy.py"), OPTIONS, rounds=2,
                       system=SYSTEM)
    assert report.failure is None, report.failure
    assert [s.spec for s in report.comparison.shapes] == ["size: 10; seed: 3", "size: 20; seed: 4",
                                                          "size: 40; seed: 5"]
    shape = report.comparison.shapes[0]
    assert shape.from_samples and shape.a_samples_ns == (9995.0, 10000.0, 10005.0) * 2
    assert shape.ratio.estimate == pytest.approx(1.0) and shape.verdict == ab.SAME
    assert report.comparison.verdict == ab.SAME


def test_run_ab_for_real_with_a_wrong_b(tmp_path):
    report = ab.run_ab(load_task(TASK_DIR), GOOD, WRONG, OPTIONS, rounds=1, system=SYSTEM)
    assert report.failed_side == "B" and report.failure.outcome == "failed"
    assert report.comparison.shapes == ()


def test_bench_a_b_command(tmp_path, monkeypatch):
    monkeypatch.setattr("popkit.system.probe", lambda python=None, timeout=60.0: SYSTEM)
    env = {"POPKIT_WIDTH": "200", "NO_COLOR": "1", "POPKIT_HOME": str(tmp_path / "h")}
    copy = _tmp_sub(tmp_path, "v7.py")
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(copy), "--task", str(TASK_DIR), "--rounds", "2",
                                      "--no-precompile"], env=env)
    assert result.exit_code == 0, result.output
    assert "popkit bench A/B" in result.output and "2 rounds per shape" in result.output
    assert "no significant difference" in result.output
    assert "score (geomean)" in result.output
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(copy), "--task", str(TASK_DIR), "--rounds", "1",
                                      "--no-precompile", "--json"], env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/ab/1" and doc["comparison"]["verdict"] == "no_significant_difference"


def test_bench_a_b_records_each_side_in_history(tmp_path, monkeypatch):
    monkeypatch.setattr("popkit.system.probe", lambda python=None, timeout=60.0: SYSTEM)
    env = {"POPKIT_WIDTH": "200", "NO_COLOR": "1", "POPKIT_HOME": str(tmp_path / "h")}
    copy = _tmp_sub(tmp_path, "v7.py")
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(copy), "--task", str(TASK_DIR), "--rounds", "2",
                                      "--no-precompile", "--json"], env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    listed = CliRunner().invoke(app, ["history", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["runs"]
    assert sorted(r["sha256"] for r in rows) == sorted([doc["a_sha256"], doc["b_sha256"]])
    assert {r["kind"] for r in rows} == {"bench"} and all(r["outcome"] == "passed" for r in rows)
    shapes = doc["comparison"]["shapes"]
    a_means = [s["a"]["mean"] for s in shapes]
    expected = (a_means[0] * a_means[1] * a_means[2]) ** (1 / 3) / 1e9  # the fixture task ranks by geom
    a_row = next(r for r in rows if r["sha256"] == doc["a_sha256"])
    assert a_row["score_s"] == pytest.approx(expected)
    shown = CliRunner().invoke(app, ["show", str(a_row["id"])], env=env)
    assert shown.exit_code == 0 and "size: 40; seed: 5" in shown.output


def test_no_history_leaves_no_database(tmp_path, monkeypatch):
    monkeypatch.setattr("popkit.system.probe", lambda python=None, timeout=60.0: SYSTEM)
    env = {"POPKIT_HOME": str(tmp_path / "h")}
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(_tmp_sub(tmp_path, "v7.py")), "--task", str(TASK_DIR),
                                      "--rounds", "1", "--no-precompile", "--no-history"], env=env)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "h").exists()
