"""scripts/gpu_ab_sensitivity.py on the CPU: the planted work leaves outputs alone and scales per shape, the
buffer is picked from the curve, the calibration child's code parses, the table and the criteria."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_ab_sensitivity", ROOT / "scripts" / "gpu_ab_sensitivity.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def test_the_planted_work_runs_per_shape_and_changes_no_output_bit():
    text = (ROOT / "submissions" / "vectorsum" / "pytorch.py").read_text()
    plain, slow = {}, {}
    exec(compile(text, "pytorch.py", "exec"), plain)
    exec(compile(script.plant_text(text, {1000: 64, 5000: 4096}), "slow.py", "exec"), slow)
    for size, n in ((1000, 64), (5000, 4096)):
        x = torch.randn(size)
        assert torch.equal(slow["custom_kernel"](x), plain["custom_kernel"](x))
        assert slow["_plant_buffers"][n].sum().item() == n  # one extra add over n elements, on the output's device
    slow["custom_kernel"](torch.randn(7))  # a shape without a plan: nothing planted
    assert set(slow["_plant_buffers"]) == {64, 4096}
    assert "stream" not in script.PLANT_TAIL.lower() and "_sleep" not in script.PLANT_TAIL


def test_the_key_counts_input_elements_through_tuples_and_dicts():
    scope = {}
    exec(script.KEY_SOURCE, scope)
    key = scope["_plant_key"]
    assert key((torch.zeros(3, 4), torch.zeros(5))) == 17 and key({"a": torch.zeros(2), "b": [torch.zeros(3)]}) == 5
    ast.parse(script.CALIBRATE_CHILD)  # the child's code at least parses here (it needs a GPU to run)


def test_choose_picks_the_closest_cost_and_never_below_the_least():
    curve = [[256, 1500.0], [4096, 1600.0], [65536, 2500.0], [1048576, 12000.0]]
    assert script.choose(curve, 10.0) == (256, 1500.0)  # below one kernel's least cost: that cost
    assert script.choose(curve, 11000.0) == (1048576, 12000.0)
    assert script.choose(curve, 2400.0) == (65536, 2500.0)


def test_rows_and_criteria_from_a_b_documents():
    def ab(kind, verdicts):
        shapes = [{"spec": f"size: {i}", "verdict": v, "rounds": 4, "stalled": {},
                   "ratio": {"estimate": 1.05, "low": 1.01, "high": 1.09}} for i, v in enumerate(verdicts)]
        return {"task": "vectorsum", "kind": kind, "seconds": 50.0, "report": {"shapes": shapes}}

    results = {"started_at": "now", "device": "H100",
               "plans": {"vectorsum": {"base_ns": [50_000, 150_000], "planted": {"1%": [0.04, 0.01],
                                                                                  "5%": [0.05, 0.05]}}},
               "abs": [ab("same", ["no_significant_difference", "b_faster"]), ab("1%", ["a_faster", "a_faster"]),
                       ab("5%", ["a_faster", "no_significant_difference"])]}
    rows = script.shape_rows(results)
    assert [r["planted"] for r in rows] == [0.0, 0.0, 0.04, 0.01, 0.05, 0.05]
    got = script.summary(rows)
    assert got["same_winners"] == 1 and got["same_verdicts"] == 2
    assert got["5%"]["share"] == pytest.approx(0.5) and got["1% at 100 us+"] == {"verdicts": 1, "named_slower": 1,
                                                                                "share": 1.0}
    table = script.markdown(results)
    assert "| vectorsum | 1% | size: 1 | 150.0 µs | 1.0% | 1.0500 [1.0100, 1.0900] | a_faster | 4 (0) | 50 |" in table


def test_unknown_tasks_are_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        script.main(["--out", str(tmp_path), "--tasks", "vectorsum,nope"])
    assert stopped.value.code == 2 and "unknown task(s) ['nope']" in capsys.readouterr().err


def test_trace_agreement_compares_kernels_and_gaps_with_the_event_time():
    from popkit.model.results import CaseResult

    traced = CaseResult(kind="benchmark", index=0, spec="size: 1", passed=True, runs=3, mean_ns=101_000.0,
                        median_ns=100_000.0, kernel_ns=(98_000.0,) * 3, gap_ns=(500.0,) * 3, launches=(2.0,) * 3)
    plain = CaseResult(kind="benchmark", index=1, spec="size: 2", passed=True, runs=3, mean_ns=5.0, median_ns=5.0)
    (row,) = script.trace_agreement([traced, plain])
    assert row["trace_over_event"] == pytest.approx(0.985) and row["launches"] == 2.0
