"""scripts/gpu_firsthour.py's CPU side: the line it fills is the one `popkit new` writes in a skeleton, and its
dry run writes the plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_firsthour  # noqa: E402

SET_YAML = Path(__file__).parent / "fixtures" / "leaderboards" / "problems.yaml"


def test_the_filled_line_replaces_the_skeletons_copy(cli, tmp_path):
    result = cli("new", "--task", "open_v2", "--tasks-root", str(SET_YAML), "--gpu", "H100", "-o", str(tmp_path / "s.py"))
    assert result.exit_code == 0, result.output
    skeleton = (tmp_path / "s.py").read_text()
    filled = gpu_firsthour.fill_skeleton(skeleton)
    assert gpu_firsthour.SKELETON_LINE not in filled and gpu_firsthour.FILLED_LINE in filled
    with pytest.raises(ValueError, match="no `out"):
        gpu_firsthour.fill_skeleton(filled)


def test_the_dry_run_writes_the_loop_in_order(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_firsthour.py"), "--out", str(tmp_path),
                           "--dry-run"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = [s["step"] for s in json.loads((tmp_path / "firsthour.json").read_text())["steps"]]
    assert steps[:2] == ["tasks", "new"] and steps.index("test") < steps.index("bench --leaderboard --html") \
        < steps.index("check") < steps.index("submit --dry-run")
    assert "| step | exit |" in (tmp_path / "firsthour.md").read_text()
