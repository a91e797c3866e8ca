"""scripts/gpu_inner_loop.py on the CPU: its plan, its table, and the CLI start-up it measures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_inner_loop", ROOT / "scripts" / "gpu_inner_loop.py")
inner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inner)


def test_dry_run_writes_the_plan_and_marks_missing_tasks(tmp_path, capsys):
    problems = tmp_path / "problems"
    (problems / "pmpp_v2" / "grayscale_py").mkdir(parents=True)
    (problems / "pmpp_v2" / "grayscale_py" / "task.yml").write_text("lang: py\n")
    assert inner.main(["--out", str(tmp_path / "out"), "--problems", str(problems), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "out" / "inner.json").read_text())
    labels = {c["label"]: c for c in doc["plan"]}
    assert len([c for c in doc["plan"] if "(bundled" in c["label"]]) == 7
    assert [c["label"] for c in doc["plan"] if c.get("builds")] == ["vectoradd (bundled, load_inline CUDA)"]
    assert labels["grayscale_v2"]["missing"] is False and labels["cholesky (linalg)"]["missing"] is True
    sub = Path(labels["fp8_quant (helion)"]["submission"])
    compile(sub.read_text(), str(sub), "exec")  # the written submissions are valid Python
    assert "| task | verdict (popkit / bare) |" in capsys.readouterr().out


def test_table_rows_ratio_and_disagreement():
    row = {"label": "matmul_v2 (wrong kernel)", "popkit_outcomes": ["failed"], "bare_outcomes": ["passed"],
           "verdicts_agree": False, "as_expected": True, "expect": "failed", "prestep": ["nothing to build"],
           "bare_s": [4.0, 6.0], "popkit_s": [5.0, 5.5], "ratio": 5.25 / 5.0}
    text = inner.markdown({"card": "NVIDIA H100 80GB HBM3", "repeats": 2, "rows": [row]})
    assert "on NVIDIA H100 80GB HBM3" in text
    assert ("| matmul_v2 (wrong kernel) | failed / passed **(differ)** | skipped: nothing to build | 5.00 s | "
            "5.25 s | 1.05 | | | | |") in text


def test_pair_statistics_set_each_popkit_run_against_the_bare_run_beside_it():
    row = {"bare_s": [4.0, 5.0, 6.0], "popkit_s": [4.4, 6.0, 6.3], "own_s": [0.3, 0.4, 0.3]}
    stats = inner.paired(row)
    assert stats["pair_ratios"] == pytest.approx([1.1, 1.2, 1.05])
    assert stats["pair_ratio_median"] == pytest.approx(1.1)
    assert stats["sum_ratio"] == pytest.approx(16.7 / 15.0)
    assert stats["own_ratio"] == pytest.approx(5.3 / 5.0)
    assert stats["eval_ratio"] == pytest.approx(15.7 / 15.0)
    text = inner.markdown({"card": "c", "repeats": 3, "rows": [{
        **row, **stats, "label": "t", "popkit_outcomes": ["passed"], "bare_outcomes": ["passed"],
        "verdicts_agree": True, "as_expected": True, "prestep": [""], "ratio": 6.0 / 5.0}]})
    assert "| t | passed / passed | off | 5.00 s | 6.00 s | 1.20 | 1.10 | 1.11 | 1.06 | 1.05 |" in text


def test_cli_help_does_not_import_torch():
    startup = inner.cli_startup()
    assert startup["imports_torch"] is False
    assert startup["popkit_cli_import_us"] > 0


def test_overhead_table_says_popkits_own_time_and_the_probe_beside():
    row = {"label": "softmax (bundled)", "own_s": [0.9, 1.1, 1.0], "probe_beside_s": [5.2], "probe_after_s": [0.0]}
    lines = inner.overhead_lines([row, {"label": "cholesky (linalg)", "skipped": "task not found"}])
    assert lines[1:] == ["| task | popkit's own time (wall less its evals) | bare test mode, probe beside | "
                         "probe outlived the eval |", "|---|---|---|---|", "| softmax (bundled) | 1.00 s | 5.20 s | 0.00 s |"]
    assert inner.overhead_lines([{"label": "x", "own_s": [0.5]}])[1:] == [
        "| task | popkit's own time (wall less its evals) |", "|---|---|", "| x | 0.50 s |"]


@pytest.mark.slow
def test_measure_times_a_bundled_case_on_the_cpu():
    case = {"label": "identity (bundled)", "task": "identity", "expect": "passed",
            "submission": str(ROOT / "submissions" / "identity" / "pytorch.py")}
    row = inner.measure(case, 1, probe_beside=True)
    assert row["bare_outcomes"] == row["popkit_outcomes"] == ["passed"] and row["as_expected"]
    assert 0 < row["own_s"][0] < row["popkit_s"][0] and row["probe_beside_s"][0] > 0 and row["probe_after_s"][0] >= 0


def test_pooled_statistics_take_every_pair_of_every_row_and_the_pool_option_prints_them(tmp_path, capsys):
    rows = [{"label": "a", "bare_s": [4.0, 6.0], "popkit_s": [4.4, 6.6], "own_s": [0.4, 0.6]},
            {"label": "b", "skipped": "task not found"},
            {"label": "c", "bare_s": [10.0], "popkit_s": [10.0], "own_s": [0.5]}]
    found = inner.pooled(rows, draws=200)
    assert found["pairs"] == 3
    assert found["sum_ratio"] == pytest.approx(21.0 / 20.0)
    assert found["pair_ratio_median"] == pytest.approx(1.1)
    assert found["own_median_s"] == pytest.approx(0.5) and found["own_share"] == pytest.approx(1.5 / 20.0)
    assert found["eval_ratio"] == pytest.approx(19.5 / 20.0)
    assert 1.0 <= found["low"] <= found["sum_ratio"] <= found["high"] <= 1.1
    assert inner.pooled([rows[1]]) is None and inner.pooled_line([]) == []
    (tmp_path / "one.json").write_text(json.dumps({"rows": rows[:2]}))
    (tmp_path / "two.json").write_text(json.dumps({"rows": rows[2:]}))
    assert inner.main(["--pool", str(tmp_path / "one.json"), str(tmp_path / "two.json")]) == 0
    assert capsys.readouterr().out.startswith("All 3 pairs: popkit test took 1.050x the bare eval (sum ratio")
