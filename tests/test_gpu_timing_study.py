"""scripts/gpu_timing_study.py on a CPU: its plan, and the rules and tables it derives from popkit's JSON."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_timing_study", ROOT / "scripts" / "gpu_timing_study.py")
study = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = study  # dataclasses look their module up while the class is built
spec.loader.exec_module(study)


def test_the_plan_runs_every_share_then_the_honest_pairs_in_abba_order_then_the_drain_rule_alone():
    jobs = study.plan(["softmax", "matmul"], [0.1, 0.4], pairs=2, drain_shares=[0.4])
    cheats = [(j.task, j.share, j.audit) for j in jobs if j.kind == "cheat"]
    assert cheats == [("softmax", 0.0, "trace"), ("softmax", 0.1, "trace"), ("softmax", 0.4, "trace"),
                      ("matmul", 0.0, "trace"), ("matmul", 0.1, "trace"), ("matmul", 0.4, "trace"),
                      ("softmax", 0.0, "drain"), ("softmax", 0.4, "drain"), ("matmul", 0.0, "drain"),
                      ("matmul", 0.4, "drain")]
    assert [j.kind for j in jobs[6:14]] == ["honest"] * 8 and jobs[-1].env == {"POPKIT_TIMING_AUDIT": "drain",
                                                                                 "POPKIT_CHEAT_SHARE": "0.4"}
    honest = [(j.task, j.pair, j.audit) for j in jobs if j.kind == "honest"]
    assert honest == [("softmax", 0, "trace"), ("softmax", 0, "drain"), ("matmul", 0, "trace"), ("matmul", 0, "drain"),
                      ("softmax", 1, "drain"), ("softmax", 1, "trace"), ("matmul", 1, "drain"), ("matmul", 1, "trace")]
    assert jobs[1].env == {"POPKIT_TIMING_AUDIT": "trace", "POPKIT_CHEAT_SHARE": "0.1"}
    assert jobs[13].env == {"POPKIT_TIMING_AUDIT": "trace"} and jobs[13].path == ROOT / "submissions/matmul/cuda.py"


def test_dry_run_lists_the_builds_and_every_eval(capsys):
    assert study.main(["--out", "unused", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 + 66 + 1
    assert all(" test " in line and "/cuda.py --task " in line and "--precompile" in line for line in lines[:6])
    assert lines[6] == ("POPKIT_TIMING_AUDIT=trace POPKIT_CHEAT_SHARE=0.0 leaderboard eval (popkit harness, mode "
                        "alone): submissions/cheats/side_stream_share.py --task identity")
    assert lines[-2].startswith("POPKIT_TIMING_AUDIT=drain POPKIT_CHEAT_SHARE=0.4 leaderboard eval")
    assert lines[-1] == "66 evals, about 6 minutes after the builds"


@pytest.mark.parametrize("argv", [["--tasks", "identity,nope"], ["--shares", "0.4,1.5"], ["--pairs", "-1"], ["--honest", "vectoradd"]])
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as info:
        study.main(["--out", "x", "--dry-run", *argv])
    assert info.value.code == 2


def _report(outcome: str, cases: list[dict], ranking: str = "geom", audit: str = "trace") -> dict:
    raw, benchmarks = {"trust.audit": audit}, []
    for i, c in enumerate(cases):
        p = f"benchmark.{i}."
        raw[p + "spec"] = f"size: {i}"
        raw[p + ("samples" if c.get("passed", True) else "audit_samples")] = ",".join(map(str, c["samples"]))
        raw[p + "drains"] = ",".join(map(str, c["drains"]))
        if "overruns" in c:
            raw[p + "overruns"] = ",".join(map(str, c["overruns"]))
            raw[p + "marker_overruns"] = ",".join(str(o - 10e3) for o in c["overruns"])
            raw[p + "late_starts"] = "0"
        benchmarks.append({"passed": c.get("passed", True), "error": c.get("error", "")})
    return {"outcome": outcome, "ranking_by": ranking, "score_public_s": None,
            "runs": [{"benchmarks": benchmarks, "raw": raw, "summary": ""}]}


def test_a_case_carries_what_each_rule_says_and_the_charged_times():
    raw = _report("failed", [{"passed": False, "error": "unsynchronized work: call 2 of 4 left 183 µs",
                              "samples": [100e3, 10e3, 100e3, 10e3], "drains": [5e3, 190e3, 190e3, 190e3],
                              "overruns": [-1e3, 183e3, float("nan"), 2e3]}])["runs"][0]["raw"]
    case = study.case_signals(raw, 0, False, "unsynchronized work: call 2 of 4 left 183 µs")
    assert case["event_mean_ns"] == 55e3 and case["calls"] == 4
    assert case["drain_rule"].startswith("unsynchronized work: 3 of 4 timed calls")  # 3, and half the calls
    assert case["trace_rule"].startswith("unsynchronized work: call 2 of 4 left 183 µs")
    assert case["late_calls_trace"] == 1 and case["late_calls_drain"] == 3
    assert case["max_overrun_ns"] == 183e3
    assert case["charged_mean_ns"] == (100e3 + 193e3 + 100e3 + 12e3) / 4
    assert case["idle_mean_ns"] == (105e3 + 200e3 + 290e3 + 200e3) / 4


def _rows():
    def cheat(share, event, overrun, outcome="failed", classes=("unsynchronized work",)):
        errors = [f"{c}: x" for c in classes]
        case = {"samples": [event] * 10, "drains": [5e3] * 10, "overruns": [overrun] + [-1e3] * 9,
                "passed": outcome == "passed", "error": errors[0] if errors else ""}
        return study.job_row(study.Job("cheat", "softmax", "trace", share), _report(outcome, [case]), 5.0)

    def honest(pair, audit, event):
        case = {"samples": [event] * 10, "drains": [5e3] * 10}
        if audit == "trace":
            case["overruns"] = [-1e3] * 10
        return study.job_row(study.Job("honest", "softmax", audit, pair=pair), _report("passed", [case]), 5.0)

    def drain_cheat(share, event, outcome):
        case = {"samples": [event] * 10, "drains": [5e3] * 10, "passed": True}
        return study.job_row(study.Job("cheat", "softmax", "drain", share), _report(outcome, [case], audit="drain"), 5.0)

    return [cheat(0.0, 300e3, -1e3, "passed", ()), cheat(0.4, 200e3, 120e3),
            honest(0, "trace", 101e3), honest(0, "drain", 100e3), honest(1, "drain", 100e3), honest(1, "trace", 101e3),
            drain_cheat(0.0, 300e3, "passed"), drain_cheat(0.4, 150e3, "passed")]


def test_the_summary_compares_cheats_with_share_zero_and_the_audit_with_the_drain_rule():
    summary = study.summarize(_rows())
    base, cheat, drain_base, drain_cheat = summary["cheats"]
    assert drain_cheat["audit"] == "drain" and drain_cheat["fake_speedup"] == pytest.approx(2.0)
    assert base["share"] == 0.0 and base["fake_speedup"] == pytest.approx(1.0)
    assert cheat["fake_speedup"] == pytest.approx(1.5) and cheat["trace_rule_fails"] and not cheat["drain_rule_fails"]
    (honest,) = summary["honest"]
    assert honest["runs"] == {"trace": 2, "drain": 2} and honest["passed"] == {"trace": 2, "drain": 2}
    assert honest["ratio"] == pytest.approx(1.01)
    assert summary["rules"] == {"drain": {"cheats_caught": 0, "cheats": 1, "honest_failed": 0, "honest_runs": 4},
                                "trace": {"cheats_caught": 1, "cheats": 1, "honest_failed": 0, "honest_runs": 4},
                                "drain alone": {"cheats_caught": 0, "cheats": 1, "honest_failed": None,
                                                "honest_runs": None}}
    assert study.expected(summary)
    table = study.markdown(summary, "NVIDIA H100 80GB HBM3")
    assert "| softmax | 0.4 | trace | failed (unsynchronized work) | 200.0 | 1.50 | passes | fails | 212.0 |" in table
    assert "| softmax | 0.4 | drain | passed | 150.0 | 2.00 | passes | – | – | 155.0 | – |" in table
    assert "- drain alone rule: caught 0 of 1 cheating runs." in table
    assert ("| softmax | 2/2 / 2/2 | 101.0, 101.0 | 100.0, 100.0 | 1.0100 [1.0100, 1.0100] | 0.00% / 0.00% | -1.0 "
            "| 0/20 | 0 | 0 |") in table
    assert "- drain rule: caught 0 of 1 cheating runs; failed 0 of 4 honest runs." in table
    assert table.rstrip().endswith("every honest run passed): yes.")


def test_a_cheat_that_passes_is_not_as_expected():
    rows = _rows()
    rows[1] = {**rows[1], "outcome": "passed", "classes": []}
    assert not study.expected(study.summarize(rows))
