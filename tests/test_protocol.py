"""The protocol's declared extension points: the statistics tuple pinned to the harness, derived statistics,
the eval convention."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from popkit.model import stats
from popkit.model.results import CaseResult
from popkit.run import protocol
from test_harness_split import load_harness

ROOT = Path(__file__).resolve().parent.parent


def harness():
    """popkit's harness (tasks/eval.py and the modules it loads), its names in one namespace."""
    return load_harness("popkit_harness_under_test")


def test_the_statistics_tuple_is_what_the_harness_writes():
    written = tuple(f.name for f in dataclasses.fields(harness().Stats))
    assert written == protocol.CASE_STATISTICS + protocol.HARNESS_STATISTICS


def test_decoding_reads_every_statistic_the_protocol_names():
    raw = {"benchmark-count": "1", "benchmark.0.spec": "n: 1", **{
        f"benchmark.0.{name}": str(10 + i) for i, name in enumerate(protocol.CASE_STATISTICS + protocol.HARNESS_STATISTICS)}}
    case = protocol.decode_cases(raw, "benchmark", 1)[0]
    assert (case.runs, case.mean_ns, case.std_ns, case.err_ns, case.best_ns, case.worst_ns, case.median_ns) == (
        10, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0)


def test_derived_statistics_come_from_the_samples_and_reach_the_json():
    case = CaseResult(kind="benchmark", index=0, spec="n: 1", passed=True, samples_ns=(1.0, 2.0, 3.0, 4.0, 100.0))
    derived = case.to_json()["derived"]
    assert set(derived) == set(stats.DERIVED)
    assert derived["median"] == 3.0 and derived["p10"] == pytest.approx(1.4) and derived["p90"] == pytest.approx(61.6)
    assert CaseResult.from_json(case.to_json()) == case
    assert CaseResult(kind="test", index=0, spec="", passed=True).to_json()["derived"] == {}


def test_the_conventions_say_how_each_eval_is_run_and_read():
    assert protocol.LEADERBOARD.argv("py", "eval.py", "test", "test.txt") == ["py", "eval.py", "test", "test.txt"]
    assert protocol.LEADERBOARD.env(7, 2) == {"POPCORN_SEED": "7", "POPCORN_GPUS": "2"}
    assert not protocol.LEADERBOARD.sealed and not protocol.LEADERBOARD.first_wins
    assert protocol.POPKIT_HARNESS.sealed and protocol.POPKIT_HARNESS.first_wins
    assert "POPKIT_KEY_FD" in protocol.POPKIT_HARNESS.reserved_env()


def test_a_pass_with_no_case_results_fails_by_name():
    from popkit.model.results import ModeRun

    run = ModeRun(mode="test", secret=False, seed=None, exit_code=0, duration_s=0.1, timeout_s=10, check="pass")
    judged = protocol.judge(run, 0)
    assert judged.outcome == "failed"
    assert judged.summary == "check failed: test wrote `check: pass` but no case results for its 0 case(s)"


def test_the_trace_breakdown_is_read_when_the_harness_sends_it_and_shown():
    from popkit.views.running import breakdown_line

    raw = {"benchmark-count": "1", "benchmark.0.spec": "n: 1", "benchmark.0.status": "pass", "benchmark.0.runs": "3",
           "benchmark.0.mean": "10000", "benchmark.0.median": "10000", "benchmark.0.samples": "9000,10000,11000",
           "benchmark.0.kernel_ns": "6000,6500,7000", "benchmark.0.gap_ns": "500,400,600",
           "benchmark.0.launches": "2,2,2"}
    (case,) = protocol.decode_cases(raw, "benchmark", 1)
    assert case.passed and case.kernel_ns == (6000.0, 6500.0, 7000.0) and case.launches == (2.0, 2.0, 2.0)
    assert case.breakdown == {"kernel_ns": 6500.0, "gap_ns": 500.0, "launches": 2.0, "other_ns": 3000.0,
                              "kernel_share": 0.65}
    assert case.to_json()["breakdown"] == case.breakdown and CaseResult.from_json(case.to_json()) == case
    assert breakdown_line(case) == ("trace: kernels 6.50 µs · gaps 500 ns · 2 launches · launch and event overhead"
                                    " 3.00 µs (65% of the time in kernels)")
    del raw["benchmark.0.kernel_ns"]  # an older harness: no breakdown, nothing shown
    (plain,) = protocol.decode_cases(raw, "benchmark", 1)
    assert plain.breakdown == {} and breakdown_line(plain) == "" and plain.to_json()["breakdown"] == {}
    raw["benchmark.0.gap_ns"] = "1,x"  # malformed fails the case by name, as a bad sample does
    (bad,) = protocol.decode_cases(raw, "benchmark", 1)
    assert not bad.passed and "`benchmark.0.gap_ns` is '1,x'" in bad.error


def test_the_time_witness_margin_is_read_per_call():
    """`unexplained_ns`: per timed call, the trusted clock's time beyond the report and the credited overhead
    (negative where the empty call beside it took longer); it reaches --json and survives a round trip."""
    raw = {"benchmark-count": "1", "benchmark.0.spec": "n: 1", "benchmark.0.status": "pass", "benchmark.0.runs": "3",
           "benchmark.0.mean": "6000", "benchmark.0.samples": "6000,6000,6000",
           "benchmark.0.unexplained_ns": "1500,-300,2.5e4"}
    (case,) = protocol.decode_cases(raw, "benchmark", 1)
    assert case.unexplained_ns == (1500.0, -300.0, 25000.0)
    assert case.to_json()["unexplained_ns"] == (1500.0, -300.0, 25000.0)
    assert CaseResult.from_json(case.to_json()) == case
    raw["benchmark.0.unexplained_ns"] = "1500,nan,0"
    (bad,) = protocol.decode_cases(raw, "benchmark", 1)
    assert not bad.passed and "unexplained_ns" in bad.error


def test_time_added_from_the_trace_is_read_and_said():
    """`added_ns`: per timed call, GPU time on another queue its events missed (its sample includes it)."""
    from popkit.views.running import _case_lines as case_lines

    raw = {"benchmark-count": "1", "benchmark.0.spec": "n: 1", "benchmark.0.status": "pass", "benchmark.0.runs": "4",
           "benchmark.0.mean": "6000", "benchmark.0.best": "6000", "benchmark.0.worst": "6000",
           "benchmark.0.samples": "6000,6000,6000,6000",
           "benchmark.0.added_ns": "0,4000,0,2000"}
    (case,) = protocol.decode_cases(raw, "benchmark", 1)
    assert case.added_ns == (0.0, 4000.0, 0.0, 2000.0) and CaseResult.from_json(case.to_json()) == case
    said = "\n".join(case_lines(case))
    assert ("2 of 4 calls left GPU work on another queue outside their events; timed to their trace (+1500 ns a "
            "call on average)") in said
    del raw["benchmark.0.added_ns"]
    (plain,) = protocol.decode_cases(raw, "benchmark", 1)
    assert plain.added_ns == () and "timed to their trace" not in "\n".join(case_lines(plain))
