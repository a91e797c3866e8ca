"""scripts/gpu_templates.py on the CPU: its table, the trimmed matmul task, and a dry run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_templates", ROOT / "scripts" / "gpu_templates.py")
gpu_templates = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_templates)


def test_the_matmul_copy_drops_8192_cubed(tmp_path):
    shapes = yaml.safe_load((gpu_templates.trimmed_matmul(tmp_path) / "task.yml").read_text())["benchmarks"]
    assert len(shapes) == 3 and all(s["m"] != 8192 for s in shapes)


def test_table():
    res = {"device": "NVIDIA H100", "started_at": "2026-11-27T10:00:00+00:00", "total_s": 300,
           "builds": {"softmax template": "built 40 s"}, "tests": {"softmax": "passed", "matmul": "passed"},
           "grid": {"points": 22, "shapes": 6, "failures": []},
           "softmax": {"shapes": [{"shape": "16384x4096", "bytes": 8 * 16384 * 4096, "template_us": 190.0,
                                   "example_us": 181.0, "copy_share_template": 0.95, "template_ok": True,
                                   "example_ok": True}],
                       "copy_us": 180.5, "copy_tb_s": 2.97, "largest": "16384x4096", "share_template": 0.95,
                       "share_example": 0.997},
           "matmul": {"ratio": {"estimate": 1.1, "low": 1.05, "high": 1.15}, "verdict": "A faster", "rounds": 8,
                      "stopped": "settled", "exit_code": 0,
                      "shapes": [{"shape": "m: 1024; n: 1024; k: 1024", "example_us": 29.0, "template_us": 31.0}]}}
    text = gpu_templates.markdown(res)
    assert text.startswith("`python3 scripts/gpu_templates.py` on NVIDIA H100, 2026-11-27 10:00 UTC (300 s in all)")
    assert "| 16384x4096 | 190.0 | 181.0 | 95% | True, True |" in text
    assert "template 95% of the copy's bandwidth (goal: >= 90%), the hand-written example 100%." in text
    assert "template / example time 1.100 [1.050, 1.150] (goal: <= 1.25)" in text
    assert "Matmul grid: 22 points x 6 shapes, 0 failures." in text


def test_dry_run_renders_checks_and_writes_both_files(tmp_path, capsys):
    assert gpu_templates.main(["--out", str(tmp_path), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "templates.json").read_text())
    assert doc["grid_points"] == {"softmax": 20, "matmul": 22}
    assert doc["tests"] == {"softmax": "lint ok", "matmul": "lint ok"}
    assert (tmp_path / "templates.md").read_text() == capsys.readouterr().out.rstrip("\n") + "\n"
