"""scripts/ab_simulate.py on the CPU: every profile and ratio is simulated, written as JSON and tabulated."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ab_simulate", ROOT / "scripts" / "ab_simulate.py")
ab_simulate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_simulate)


def test_every_profile_and_ratio_is_written_and_tabulated(tmp_path, capsys):
    assert ab_simulate.main(["--out", str(tmp_path), "--trials", "3"]) == 0
    rows = json.loads((tmp_path / "ab_simulate.json").read_text())
    assert len(rows) == len(ab_simulate.PROFILES) * len(ab_simulate.RATIOS)
    assert all(r["outcome"]["verdicts"] == 3 * 4 for r in rows)
    table = capsys.readouterr().out
    assert table.count("\n| ") == len(rows) and "| 100 us shapes, H100 | 1.0 |" in table
