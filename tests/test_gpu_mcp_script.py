"""scripts/gpu_mcp.py on the CPU: its table, its argument errors, and the whole loop as a dry run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_mcp", ROOT / "scripts" / "gpu_mcp.py")
gpu_mcp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_mcp)


def test_table_shows_verdicts_scores_and_the_cancel():
    row = {"label": "vectoradd", "test": ["passed", "passed"], "documents_equal": True,
           "mcp_scores_s": [100e-6, 102e-6], "cli_scores_s": [101e-6, None], "score_ratio": 101e-6 / 101e-6,
           "ab_verdict": "no_significant_difference", "ab_rounds": 4}
    cancel = {"running_processes": 5, "stopped_s": 1.2, "left_processes": [], "left_folders": [],
              "next_call_ok": True}
    text = gpu_mcp.markdown({"card": "NVIDIA H100 80GB HBM3", "started": "2026-11-26 10:00:00", "tools": ["a"] * 13,
                             "rows": [row], "cancel": cancel, "history_runs": 9, "ok": True})
    assert "popkit mcp on NVIDIA H100 80GB HBM3, 2026-11-26" in text and "13 tools listed" in text
    assert ("| vectoradd | passed / passed | yes | 101.00 µs | 101.00 µs | 1.0000 | "
            "no_significant_difference (4 rounds) |") in text
    assert "(5 processes): gone in 1.2 s, 0 processes and 0 folders left; next call answered." in text
    assert "Checks: PASS" in text


def test_steady_drops_timestamps_durations_and_the_builds_output_only():
    doc = {"started_at": "x", "runs": [{"duration_s": 1.0, "outcome": "passed", "stdout": "ninja: no work to do"}],
           "eval_s": [1.0], "score": 2, "precompile": {"log": "[1/3] c++ ..."}, "precompile_skipped": ""}
    assert gpu_mcp.steady(doc) == {"runs": [{"outcome": "passed"}], "score": 2}


@pytest.mark.parametrize("args", [["--tasks", "matmul"], ["--pairs", "0"]])
def test_bad_arguments_stop_with_usage(tmp_path, args):
    with pytest.raises(SystemExit) as info:
        gpu_mcp.main(["--out", str(tmp_path), "--dry-run", *args])
    assert info.value.code == 2


@pytest.mark.slow
def test_dry_run_drives_the_whole_loop(tmp_path, capsys):
    assert gpu_mcp.main(["--out", str(tmp_path), "--dry-run", "--pairs", "1"]) == 0
    doc = json.loads((tmp_path / "gpu_mcp.json").read_text())
    (row,) = doc["rows"]
    assert row["ok"] and row["test"] == ["passed", "passed"] and row["score_ratio"] == 1.0
    assert doc["cancel"]["ok"] and doc["cancel"]["left_processes"] == [] and doc["history_runs"] == 6
    assert (tmp_path / "gpu_mcp.md").read_text() in capsys.readouterr().out
