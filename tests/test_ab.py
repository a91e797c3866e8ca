"""popkit.ab: the counterbalanced A/B (order, looks, budget, failures, coverage in simulation) and compare_shapes.

A fake eval (injected as run_eval) answers for the GPU; two tests run the tiny fixture eval for real.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import ExitCode
from popkit.measure import ab, abrounds
from popkit.measure import shapes
from popkit.measure.ab import ABReport
from popkit.measure.shapes import Comparison, compare_shapes
from popkit.model import stats
from popkit.model.results import CaseResult, CompileStep, ModeRun
from popkit.model.stats import Interval, Summary
from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.views.comparison import show_ab

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
    (Interval(0.5, 0.4, 0.6), shapes.B_FASTER), (Interval(2.0, 1.5, 2.5), shapes.A_FASTER),
    (Interval(1.0, 0.9, 1.1), shapes.SAME), (Interval(0.8, 0.6, 1.0), shapes.SAME), (Interval(0.5, None, None), shapes.UNKNOWN),
])
def test_verdict(ci, expected):
    assert shapes.verdict(ci) == expected


def test_compare_shapes_pools_raw_samples_over_rounds():
    a = {"n: 1": [_case("n: 1", (100.0, 110.0, 120.0)), _case("n: 1", (100.0, 110.0, 120.0))]}
    b = {"n: 1": [_case("n: 1", (50.0, 55.0, 60.0)), _case("n: 1", (50.0, 55.0, 60.0))]}
    comparison = compare_shapes(a, b, "v6.py", "v7.py")
    (shape,) = comparison.shapes
    assert shape.from_samples and shape.a_samples_ns == (100.0, 110.0, 120.0) * 2
    assert shape.ratio == stats.ratio_ci95([50.0, 55.0, 60.0] * 2, [100.0, 110.0, 120.0] * 2)
    assert shape.ratio.estimate == pytest.approx(0.5) and shape.verdict == shapes.B_FASTER
    assert comparison.score.estimate == pytest.approx(0.5) and comparison.verdict == shapes.B_FASTER


def test_compare_shapes_falls_back_to_mean_std_n():
    a = {"n: 1": [_case("n: 1", mean=100.0, std=10.0, runs=10)] * 2}
    b = {"n: 1": [_case("n: 1", mean=101.0, std=10.0, runs=10)] * 2}
    (shape,) = compare_shapes(a, b).shapes
    assert not shape.from_samples and shape.a_samples_ns == ()
    assert shape.a == stats.pooled_summary([Summary(10, 100.0, 10.0)] * 2)
    assert shape.ratio == stats.ratio_ci95_summary(shape.b, shape.a)
    assert shape.verdict == shapes.SAME


def test_compare_shapes_geomean_score_and_unmatched_shapes():
    a = {"n: 1": [_case("n: 1", (100.0, 100.0, 100.0))], "n: 2": [_case("n: 2", (400.0, 400.0, 400.0))],
         "n: 3": [_case("n: 3", (1.0, 1.0))]}
    b = {"n: 1": [_case("n: 1", (200.0, 200.0, 200.0))], "n: 2": [_case("n: 2", (100.0, 100.0, 100.0))]}
    comparison = compare_shapes(a, b)
    assert [s.spec for s in comparison.shapes] == ["n: 1", "n: 2"]
    assert comparison.score.estimate == pytest.approx((2.0 * 0.25) ** 0.5)
    assert comparison.missing == ("n: 3",) and comparison.verdict == shapes.INCOMPLETE  # no silent hole
    assert Comparison.from_json(json.loads(json.dumps(comparison.to_json()))) == comparison


def test_comparison_round_trip():
    comparison = compare_shapes({"n: 1": [_case("n: 1", (1.0, 2.0, 3.0))]}, {"n: 1": [_case("n: 1", (2.0, 3.0))]})
    assert Comparison.from_json(json.loads(json.dumps(comparison.to_json()))) == comparison


SPECS = ["size: 10; seed: 3", "size: 20; seed: 4", "size: 40; seed: 5"]


class FakeEval:
    """Stands in for runner.run_mode: one benchmark eval over the given cases, timed as told.

    `times[side]` scales every shape's time (size * 1000 ns); `jitter(side, call)` multiplies it per
    eval. `fail = (side, call, outcome, size)` makes that side's call-th eval (1-based) fail at that
    shape: `failed` fails the check there, `timed_out` stops before it. `clock` (a list) advances by
    `eval_s` per eval.
    """

    def __init__(self, times, jitter=None, fail=None, clock=None, eval_s=0.0, median=True):
        self.times, self.jitter, self.fail = times, jitter or (lambda side, call: 1.0), fail
        self.clock, self.eval_s, self.median = clock, eval_s, median
        self.calls: list[tuple[str, list[int], str]] = []

    def __call__(self, workspace, main, mode, cases, *, timeout_s, options, seed=None, gpu_count=None, cases_name=None):
        side = Path(workspace.root).name
        sizes = [dict(c)["size"] for c in cases]
        self.calls.append((side, sizes, cases_name))
        if self.clock is not None:
            self.clock[0] += self.eval_s
        call = sum(1 for s, _, _ in self.calls if s == side)
        fail_side, fail_call, outcome, fail_size = self.fail or ("", 0, "", 0)
        failing = side == fail_side and call == fail_call
        benches = []
        for i, size in enumerate(sizes):
            if failing and size == fail_size and outcome == "timed_out":
                break
            t = self.times[side] * size * 1000.0 * self.jitter(side, call)
            passed = not (failing and size == fail_size)
            benches.append(CaseResult(kind="benchmark", index=i, spec=f"size: {size}", passed=passed, runs=10,
                                      mean_ns=t if passed else None, std_ns=1.0 if passed else None,
                                      median_ns=t * 0.99 if passed and self.median else None))
        if failing:
            code = 114 if outcome == "timed_out" else 112
            return ModeRun(mode=mode, secret=False, seed=None, exit_code=code, duration_s=0.1, timeout_s=timeout_s,
                           timed_out=outcome == "timed_out", check="fail" if outcome == "failed" else None,
                           benchmarks=tuple(benches), outcome=outcome, summary=f"{outcome}: benchmark size {fail_size}")
        return ModeRun(mode=mode, secret=False, seed=None, exit_code=0, duration_s=0.1, timeout_s=timeout_s,
                       check="pass", benchmarks=tuple(benches))


def _tmp_sub(tmp_path, name):
    path = tmp_path / name
    shutil.copyfile(GOOD, path)
    return path


def _noisy(sd=0.05, seed=1):
    rng = random.Random(seed)
    return lambda side, call: math.exp(rng.gauss(0.0, sd))


def _ab(tmp_path, fake, **kwargs):
    kwargs.setdefault("warmup", False)
    return ab.run_ab(load_task(TASK_DIR), _tmp_sub(tmp_path, "a.py"), _tmp_sub(tmp_path, "b.py"), OPTIONS,
                     system=SYSTEM, run_eval=fake, **kwargs)


def test_looks_spend_alpha_once_and_start_at_round_four():
    assert abrounds.looks(4) == {4: pytest.approx(0.05)}
    spent = abrounds.looks(8)
    assert sorted(spent) == [4, 6, 8] and spent[4] == pytest.approx(0.025)
    assert sum(spent.values()) == pytest.approx(0.05)
    for bad in (2, 5, 7):
        with pytest.raises(ValueError):
            abrounds.looks(bad)


def test_abba_order_puts_each_side_first_equally_often_per_shape(tmp_path):
    fake = FakeEval({"A": 1.0, "B": 1.0}, jitter=_noisy())
    report = _ab(tmp_path, fake, max_rounds=8, budget_s=0, warmup=True)
    side, sizes, name = fake.calls[0]
    assert (side, sizes, name) == ("A", [10, 20, 40], "ab-warmup.txt")  # the discarded warm-up
    rounds = [fake.calls[i:i + 2] for i in range(1, len(fake.calls), 2)]
    assert len(rounds) == report.rounds == 8 and report.stopped == "max_rounds"
    for (first, sizes_a, _), (second, sizes_b, _) in rounds:
        assert {first, second} == {"A", "B"} and sizes_a == sizes_b
    for size in (10, 20, 40):
        firsts = [r[0][0] for r in rounds if size in r[0][1]]
        assert firsts.count("A") == firsts.count("B") > 0
    assert [r[0][0] for r in rounds[:4]] == ["A", "B", "A", "B"]


def test_clear_difference_settles_at_the_first_look(tmp_path):
    fake = FakeEval({"A": 2.0, "B": 1.0}, jitter=_noisy(0.01))
    report = _ab(tmp_path, fake)
    assert report.stopped == "settled" and report.rounds == 4 and len(fake.calls) == 8
    assert [s.verdict for s in report.shapes] == [shapes.B_FASTER] * 3 and report.verdict == shapes.B_FASTER
    assert all(s.ratio.low < 0.5 < s.ratio.high and s.alpha == pytest.approx(0.025) for s in report.shapes)
    assert report.statistic == "median" and report.shapes[0].a_ns[0] == pytest.approx(2.0 * 10_000 * 0.99, rel=0.05)
    assert ABReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_identical_quiet_candidates_settle_as_the_same(tmp_path):
    report = _ab(tmp_path, FakeEval({"A": 1.0, "B": 1.0}, median=False))
    assert report.stopped == "settled" and report.rounds == 4 and report.statistic == "mean"
    assert all(s.verdict == shapes.SAME and (s.ratio.low, s.ratio.high) == (1.0, 1.0) for s in report.shapes)


def test_settled_shapes_leave_only_once_the_score_is_settled(tmp_path):
    # size 10: B 10% faster, quiet (settles at the first look); 20 and 40: very noisy, so the score (geom)
    # cannot settle, and size 10 keeps running with it because the score needs it every round.
    quiet, noisy = _noisy(0.001, 2), _noisy(0.08, 5)

    class Mixed(FakeEval):
        def __call__(self, workdir, main, mode, cases, **kw):
            run = super().__call__(workdir, main, mode, cases, **kw)
            b = Path(workdir.root).name == "B"
            scaled = [replace_time(c, (0.9 if b else 1.0) * quiet(0, 0) if c.spec == "size: 10" else noisy(0, 0))
                      for c in run.benchmarks]
            return ModeRun(**{**run.__dict__, "benchmarks": tuple(scaled)})

    fake = Mixed({"A": 1.0, "B": 1.0})
    report = _ab(tmp_path, fake, max_rounds=8, budget_s=0)
    assert report.score.verdict == shapes.SAME and report.rounds == 8
    assert all(sizes == [10, 20, 40] for _, sizes, _ in fake.calls)
    assert report.shapes[0].verdict == shapes.B_FASTER and report.shapes[0].rounds == 8


def replace_time(case, factor):
    return CaseResult(**{**case.__dict__, "mean_ns": case.mean_ns * factor, "median_ns": case.median_ns * factor})


def test_budget_stops_at_a_look_and_never_before_the_first(tmp_path):
    clock = [0.0]
    fake = FakeEval({"A": 1.0, "B": 1.0}, jitter=_noisy(), clock=clock, eval_s=10.0)
    report = _ab(tmp_path, fake, max_rounds=10, budget_s=30, clock=lambda: clock[0])
    assert report.stopped == "budget" and report.rounds == 4  # 80 s: the first look is always reached
    clock[0] = 0.0
    fake = FakeEval({"A": 1.0, "B": 1.0}, jitter=_noisy(), clock=clock, eval_s=10.0)
    report = _ab(tmp_path, fake, max_rounds=10, budget_s=120, clock=lambda: clock[0])
    assert report.stopped == "budget" and report.rounds == 6  # at 80 s a block of 40 s fits; at 120 s none
    assert report.duration_s == pytest.approx(120.0) and report.eval_s == (10.0,) * 12


def test_a_failed_shape_is_shown_and_the_score_is_incomplete(tmp_path):
    fake = FakeEval({"A": 1.0, "B": 1.0}, jitter=_noisy(), fail=("B", 3, "failed", 20))
    report = _ab(tmp_path, fake)
    assert report.stopped == "failed" and report.failed_side == "B" and report.rounds == 2
    assert report.exit_code == ExitCode.FAILED and report.failure_mode == "benchmark"
    failed = report.shapes[1]
    assert (failed.status, failed.status_side, failed.verdict) == ("failed", "B", shapes.INCOMPLETE)
    assert [s.status for s in report.shapes] == ["ok", "failed", "ok"]
    assert report.shapes[0].rounds == 2 and report.shapes[0].ratio is None  # too few rounds for an interval
    assert report.verdict == shapes.INCOMPLETE and report.score.missing == (SPECS[1],)
    assert ABReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_a_timeout_marks_every_shape_it_did_not_reach(tmp_path):
    fake = FakeEval({"A": 1.0, "B": 1.0}, fail=("B", 1, "timed_out", 20))
    report = _ab(tmp_path, fake)
    assert [s.status for s in report.shapes] == ["ok", "timed_out", "timed_out"]
    assert report.exit_code == ExitCode.TIMED_OUT and report.score.missing == tuple(SPECS[1:])


def test_a_failure_after_the_first_look_keeps_that_looks_intervals(tmp_path):
    fake = FakeEval({"A": 1.0, "B": 1.0}, jitter=_noisy(), fail=("A", 6, "failed", 40))
    report = _ab(tmp_path, fake, budget_s=0)
    assert report.rounds == 5 and report.failed_side == "A"
    assert report.shapes[0].rounds == 4 and report.shapes[0].ratio.defined  # cut to the look at round 4


def test_compile_failure_names_the_side_and_the_mode(tmp_path, monkeypatch, capsys):
    def fake_precompile(workspace, options, timeout_s=120.0):
        bad = Path(workspace.root).name == "B"
        return CompileStep(exit_code=1 if bad else 0, duration_s=0.1,
                           stderr="RuntimeError: Error building extension 'x'" if bad else "")

    monkeypatch.setattr(runner, "precompile", fake_precompile)
    fake = FakeEval({"A": 1.0, "B": 1.0})
    report = ab.run_ab(load_task(TASK_DIR), _tmp_sub(tmp_path, "a.py"), _tmp_sub(tmp_path, "b.py"),
                       runner.RunOptions(), system=SYSTEM, run_eval=fake)
    assert fake.calls == [] and report.failed_side == "B" and report.failure_mode == "compile"
    assert report.exit_code == ExitCode.COMPILE_FAILED and report.verdict == shapes.INCOMPLETE
    record = ab.side_report(report, "B", load_task(TASK_DIR))
    assert record.outcome == "compile_failed" and ab.side_report(report, "A", load_task(TASK_DIR)) is None
    monkeypatch.setenv("POPKIT_WIDTH", "300")
    show_ab(report)
    shown = capsys.readouterr().out
    assert "compile failed" in shown and f"popkit compile {report.b_path}" in shown
    assert "compile failed on B" in shown.replace("_", " ")


def test_side_reports_keep_a_failed_side_and_the_rounds_of_the_other(tmp_path):
    fake = FakeEval({"A": 1.0, "B": 1.0}, jitter=_noisy(), fail=("B", 3, "failed", 20))
    report = _ab(tmp_path, fake)
    task = load_task(TASK_DIR)
    a, b = ab.side_report(report, "A", task), ab.side_report(report, "B", task)
    assert a.outcome == "passed" and [c.runs for c in a.runs[0].benchmarks] == [2, 2, 2]
    assert a.runs[0].benchmarks[0].mean_ns == pytest.approx(stats.mean(report.shapes[0].a_means_ns))
    assert b.outcome == "failed" and b.runs == (report.failure,)


# ------------------------------------------------------------------- the stopping rule, simulated


def _simulate(trials, ratio, process_sd, shape_sd, order=0.01, drift=0.001, seed=7):
    """Feed the A/B's round logic synthetic rounds; returns (series covering `ratio`, series, winners named).

    Each eval gets a process effect shared by its shapes (sd `process_sd`, the between-process
    variance that dominates), each shape its own noise, the second eval of a round is `order` slower
    and everything drifts by `drift` per eval: the conditions that made the old A/B invent winners.
    """
    rng = random.Random(seed)
    cases = [{"size": s} for s in (10, 20, 40, 80)]
    covered = total = named = 0
    for _ in range(trials):
        state = abrounds.Rounds(cases, "geom", 8)
        evals = 0
        while state.active and state.done < 8:
            runs = {}
            for k, side in enumerate(abrounds.round_order(state.done)):
                evals += 1
                process = rng.gauss(0, process_sd) + k * order + evals * drift
                benches = tuple(CaseResult(kind="benchmark", index=i, spec="", passed=True, runs=10,
                                           mean_ns=t, median_ns=t)
                                for i, t in ((i, cases[i]["size"] * 1e3 * (ratio if side == "B" else 1.0)
                                              * math.exp(process + rng.gauss(0, shape_sd))) for i in state.active))
                runs[side] = ModeRun(mode="benchmark", secret=False, seed=None, exit_code=0, duration_s=0.0,
                                     timeout_s=1.0, check="pass", benchmarks=benches)
            state.add(runs)
        series_list, score = state.final()
        for series in series_list + (score,):
            total += 1
            covered += series.ratio.contains(ratio)
            named += series.verdict in (shapes.A_FASTER, shapes.B_FASTER)
    return covered, total, named


def test_early_stopping_keeps_coverage_with_strong_between_round_variance():
    covered, total, named = _simulate(trials=300, ratio=1.0, process_sd=0.03, shape_sd=0.005)
    assert covered / total >= 0.95, (covered, total)
    assert named / total <= 0.05


def test_early_stopping_keeps_coverage_of_a_real_difference():
    covered, total, _ = _simulate(trials=300, ratio=1.03, process_sd=0.03, shape_sd=0.005, seed=8)
    assert covered / total >= 0.95, (covered, total)


def test_a_three_percent_slowdown_is_named_with_realistic_noise():
    # Large shapes on an H100: between-process spread about 0.3% (docs/gpu-runs/HISTORY.md, "Timing fidelity").
    _, total, named = _simulate(trials=200, ratio=1.03, process_sd=0.003, shape_sd=0.002, seed=9)
    assert named / total >= 0.9, (named, total)


# --------------------------------------------------------------------- the real tiny eval, the CLI


def test_run_ab_for_real_on_the_tiny_task(tmp_path):
    """The tiny eval reports the same timings for any correct submission: settled at the first look, the same."""
    report = ab.run_ab(load_task(TASK_DIR), GOOD, _tmp_sub(tmp_path, "copy.py"), OPTIONS, system=SYSTEM)
    assert report.failed_side == "" and report.stopped == "settled" and report.rounds == 4
    assert [s.spec for s in report.shapes] == SPECS
    assert report.shapes[0].a_ns == (10000.0,) * 4 and report.statistic == "mean"
    assert all(s.verdict == shapes.SAME for s in report.shapes) and report.verdict == shapes.SAME


def test_run_ab_for_real_with_a_wrong_b(tmp_path):
    report = ab.run_ab(load_task(TASK_DIR), GOOD, WRONG, OPTIONS, system=SYSTEM, warmup=False)
    assert report.failed_side == "B" and report.failure.outcome == "failed" and report.rounds == 0
    assert report.verdict == shapes.INCOMPLETE and all(s.status == "failed" for s in report.shapes)


@pytest.fixture
def cli_env(cli_env, monkeypatch):
    monkeypatch.setattr("popkit.machine.system.probe", lambda python=None, timeout=60.0, env=None, scripts=None: SYSTEM)
    return {**cli_env, "POPKIT_WIDTH": "200"}


@pytest.mark.slow
def test_bench_a_b_command(tmp_path, cli_env):
    copy = _tmp_sub(tmp_path, "v7.py")
    args = ["bench", str(GOOD), str(copy), "--task", str(TASK_DIR), "--no-precompile"]
    result = CliRunner().invoke(app, args, env=cli_env)
    assert result.exit_code == 0, result.output
    assert "popkit bench A/B" in result.output and "4 rounds (ABBA" in result.output
    assert "every verdict settled" in result.output and "no significant difference" in result.output
    assert "score (geom)" in result.output
    result = CliRunner().invoke(app, args + ["--json"], env=cli_env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/ab/2" and doc["verdict"] == "no_significant_difference"


def test_bench_a_b_rounds_come_in_pairs(tmp_path, cli_env):
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(_tmp_sub(tmp_path, "v7.py")), "--task", str(TASK_DIR),
                                      "--rounds", "5"], env=cli_env)
    assert result.exit_code == 2 and "even number" in result.output


@pytest.mark.slow
def test_bench_a_b_records_each_side_in_history(tmp_path, cli_env):
    copy = _tmp_sub(tmp_path, "v7.py")
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(copy), "--task", str(TASK_DIR), "--no-precompile",
                                      "--json"], env=cli_env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    listed = CliRunner().invoke(app, ["history", "--json"], env=cli_env)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["runs"]
    assert sorted(r["sha256"] for r in rows) == sorted([doc["a_sha256"], doc["b_sha256"]])
    assert {r["kind"] for r in rows} == {"bench"} and all(r["outcome"] == "passed" for r in rows)
    a_means = [s["a_means_ns"][0] for s in doc["shapes"]]
    expected = (a_means[0] * a_means[1] * a_means[2]) ** (1 / 3) / 1e9  # the fixture task ranks by geom
    a_row = next(r for r in rows if r["sha256"] == doc["a_sha256"])
    assert a_row["score_s"] == pytest.approx(expected)
    shown = CliRunner().invoke(app, ["show", str(a_row["id"])], env=cli_env)
    assert shown.exit_code == 0 and "size: 40; seed: 5" in shown.output


def test_failed_a_b_is_recorded_and_its_hint_names_the_mode(tmp_path, cli_env):
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(WRONG), "--task", str(TASK_DIR), "--no-precompile"],
                                env=cli_env)
    assert result.exit_code == 1, result.output
    assert "did not pass in benchmark mode" in result.output and f"popkit bench {WRONG}" in result.output
    assert "failed on B" in result.output and "incomplete: 3 shapes not compared" in result.output
    rows = json.loads(CliRunner().invoke(app, ["history", "--json"], env=cli_env).stdout)["runs"]
    assert [(r["submission"], r["outcome"]) for r in rows] == [(str(WRONG), "failed")]


def test_no_history_leaves_no_database(tmp_path, cli_env):
    result = CliRunner().invoke(app, ["bench", str(GOOD), str(_tmp_sub(tmp_path, "v7.py")), "--task", str(TASK_DIR),
                                      "--no-precompile", "--no-history"], env=cli_env)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "h").exists()


# ------------------------------------------------------------------- stalled rounds, the rule simulated


def test_stalled_rounds_judge_each_side_against_its_own_other_rounds():
    assert abrounds.stalled_rounds([17.7, 17.7, 18.9, 53.1]) == {3: "3.00x the median of its other rounds"}
    assert abrounds.stalled_rounds([10.0, 10.1, 12.4, 10.2]) == {}  # 22% above: within the spread a side may show
    assert abrounds.stalled_rounds([10.0, 40.0]) == {}  # one other round is no median to judge by
    assert list(abrounds.stalled_rounds([10.0, 30.0, 10.0, 50.0, 10.0], limit=1)) == [3]  # the farthest first
    assert abrounds.stalled_rounds([0.0, 0.0, 0.0, 5.0]) == {}  # no typical time to judge by (a 0 ns timer)


def test_one_stalled_round_does_not_hide_a_consistent_slowdown(tmp_path, monkeypatch, capsys):
    # the failure seen on an H100: B ~1.7x slower in every round, and one round of B stalled 3x (53 us against 18)
    def stall(side, call):
        return 3.0 if (side, call) == ("B", 4) else 1.0 + 0.02 * (call % 3)

    def run():  # evals of 6 s: the 60 s budget ends the A/B at its first look, as it did on the H100
        clock = [0.0]
        fake = FakeEval({"A": 1.0, "B": 1.7}, jitter=stall, clock=clock, eval_s=6.0)
        return _ab(tmp_path, fake, clock=lambda: clock[0])

    report = run()
    assert [s.verdict for s in report.shapes] == [shapes.A_FASTER] * 3 and report.verdict == shapes.A_FASTER
    assert report.rounds == 5 and all(list(s.stalled) == [3] and s.stalled[3].startswith("B: 2.9")
                                      for s in report.shapes)
    assert report.score.stalled and report.shapes[0].ratio.low > 1.6
    assert report.shapes[0].mean_ratio == pytest.approx(stats.mean(report.shapes[0].b_means_ns)
                                                        / stats.mean(report.shapes[0].a_means_ns))
    assert ABReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert report.to_json()["shapes"][0]["stalled"] == {"3": report.shapes[0].stalled[3]}
    monkeypatch.setenv("POPKIT_WIDTH", "300")
    show_ab(report)
    shown = capsys.readouterr().out
    assert "stalled: round 4 left out and replaced in 4 series (size: 10; seed: 3: B: 2.9" in shown
    assert "means B / A" in shown and "5 (1 stalled)" in shown
    monkeypatch.setattr(abrounds, "STALL_FACTOR", 1e9)  # without the rule: the stalled round widens past 1
    old = run()
    assert old.verdict == shapes.SAME and old.rounds == 4 and old.stopped == "budget"


def test_simulated_identical_arms_name_few_winners_even_with_stalls():
    from popkit.measure.absim import Noise, simulate

    for noise in (Noise(), Noise(process_sd=0.02, shape_sd=0.01, stall=0.1)):
        outcome = simulate(150, 1.0, noise, seed=3)
        assert outcome.named <= 0.05 * outcome.verdicts, outcome


def test_simulated_differences_are_named_with_the_default_rounds_and_budget():
    from popkit.measure.absim import Noise, simulate

    stalled = simulate(150, 1.7, Noise(process_sd=0.02, shape_sd=0.01), seed=4)
    assert stalled.right >= 0.95 * stalled.verdicts and stalled.seconds <= 60.0, stalled
    h100 = Noise(process_sd=0.001, shape_sd=0.0007, order=0.001, drift=0.0003)  # 100 us shapes (ab_simulate.py)
    one_percent = simulate(150, 1.01, h100, seed=5)
    assert one_percent.right >= 0.90 * one_percent.verdicts and one_percent.seconds <= 60.0, one_percent


class FakeSampler:
    """Stands in for gpustate.Sampler: each eval's GPU state from `states(side, call)`."""

    def __init__(self, states):
        self.states, self.calls = states, []

    def __call__(self, env):
        outer = self

        class Watch:
            state = None

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                outer.calls.append(None)
                self.state = outer.states(len(outer.calls))

        return Watch()


def _gpu(sm_mhz, throttle=()):
    from popkit.machine.gpustate import GpuState

    return GpuState(samples=20, sm_mhz=sm_mhz, sm_mhz_low=345, mem_mhz=2619, temp_c=41, power_w=210.0,
                    throttle=tuple(throttle))


def test_arms_at_different_clocks_name_no_winner_and_say_why(tmp_path, monkeypatch, capsys):
    # ABBA: evals 1, 4, 5, 8 are A's, 2, 3, 6, 7 B's; B's evals ran at a 10% lower clock
    sides = "ABBAABBA"
    fake = FakeSampler(lambda n: _gpu(1980 if sides[(n - 1) % 8] == "A" else 1785))
    report = _ab(tmp_path, FakeEval({"A": 1.0, "B": 1.1}, jitter=_noisy(0.01)), sampler=fake)
    assert report.rounds == 4 and len(report.gpu) == 8 and report.gpu[0]["side"] == "A"
    assert "different SM clocks (A 1980 MHz, B 1785 MHz" in report.held
    assert all(s.verdict == shapes.SAME and s.ratio.low > 1.05 for s in report.shapes)  # a winner, held back
    assert report.verdict == shapes.SAME and ABReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    monkeypatch.setenv("POPKIT_WIDTH", "300")
    show_ab(report)
    shown = capsys.readouterr().out
    assert "no winner named: GPU state (below)" in shown and "no winner named: the arms ran at different" in shown
    assert "SM clock A 1980 MHz, B 1785 MHz" in shown


def test_throttling_in_either_arm_names_no_winner_and_equal_clocks_do(tmp_path):
    throttled = FakeSampler(lambda n: _gpu(1980, ("hw_thermal",) if n == 3 else ()))
    report = _ab(tmp_path, FakeEval({"A": 1.0, "B": 1.1}, jitter=_noisy(0.01)), sampler=throttled)
    assert report.held.startswith("the GPU throttled during the evals (B: hw_thermal)")
    assert report.verdict == shapes.SAME
    steady = FakeSampler(lambda n: _gpu(1980 - n % 2 * 15, ("sw_power_cap",)))  # within 2%, a power cap: noted only
    report = _ab(tmp_path, FakeEval({"A": 1.0, "B": 1.1}, jitter=_noisy(0.01)), sampler=steady)
    assert report.held == "" and report.verdict == shapes.A_FASTER


@pytest.mark.slow
def test_an_ab_runs_its_evals_through_warm_pairs_started_ahead(tmp_path, monkeypatch):
    """popkit's harness, CPUs to spare (two pairs at a time here): every eval, the warm-up's included, is one warm
    pair's `go` on the shapes its round compares, and the report says so; asked to run cold, none is."""
    from popkit.run import warm

    chunksum, sub = FIXTURES / "tasks" / "chunksum", FIXTURES / "tune" / "chunksum.py"
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    shutil.copy(sub, a)
    shutil.copy(sub, b)
    monkeypatch.setattr(warm, "ahead_depth", lambda cpus=None: 2)
    gone: list[int] = []
    real_go = warm.WarmPair.go
    monkeypatch.setattr(warm.WarmPair, "go", lambda self, content, progress, cases=None: gone.append(len(cases))
                        or real_go(self, content, progress, cases))
    options = runner.RunOptions(harness="popkit")
    task = load_task(chunksum)
    report = ab.run_ab(task, a, b, options, system=SYSTEM, max_rounds=4, budget_s=0)
    # At least 4 rounds: a round a host stall slowed is replaced, on the shapes still compared.
    assert report.failed_side == "" and report.rounds >= 4 and report.evals == "warm, 2 ahead", report.to_json()
    assert len(gone) == 1 + 2 * report.rounds and len(report.eval_s) == 2 * report.rounds
    assert gone[:9] == [len(task.benchmarks)] * 9 and report.judged == "sealed"
    assert all(len(s.a_ns) >= 4 and len(s.b_ns) >= 4 for s in report.shapes)
    cold = ab.run_ab(task, a, b, options, system=SYSTEM, max_rounds=4, budget_s=0, warm_evals=False)
    assert len(gone) == 1 + 2 * report.rounds and cold.evals == "cold: asked to run cold" and cold.rounds >= 4
