"""scripts/gpu_sandbox_check.py on the CPU: its plan, its table and ratios, and the probe it runs in the sandbox."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from popkit.run import sandbox

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_sandbox_check", ROOT / "scripts" / "gpu_sandbox_check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_dry_run_names_every_bundled_cuda_example(tmp_path, capsys):
    assert check.main(["--out", str(tmp_path), "--dry-run"]) == 0
    plan = json.loads((tmp_path / "sandbox_check.json").read_text())["plan"]
    assert all((ROOT / "submissions" / name).is_file() for name in plan["cuda"] + plan["pairs"])
    assert len(plan["cuda"]) == 6 and '"pair_count": 4' in capsys.readouterr().out


def test_ratios_and_table():
    rows = [{"file": "a/cuda.py", "popkit_s": [1.1, 1.3, 1.2], "bare_s": [1.0, 1.0, 1.0]},
            {"file": "a/pytorch.py", "popkit_s": [2.0], "bare_s": [2.0]}]
    assert check.ratio(rows[0]["popkit_s"], rows[0]["bare_s"]) == pytest.approx(1.2)
    assert check.pooled(rows) == pytest.approx(1.15)
    first = {"outcome": "passed", "isolation": "namespaces", "prestep_ran": True}
    text = check.table({"cuda": [{"file": "a/cuda.py", "first": first, "second": {**first, "prestep_ran": False}}],
                        "pairs": rows, "pooled": 1.15, "start_up_ms": {"sandbox": 80.0, "bare": 1.0}})
    assert "| a/cuda.py | passed | passed | skipped | namespaces |" in text
    assert "| a/cuda.py | 1.00 s | 1.20 s | 1.200 |" in text
    assert "pooled ratio (median of per-pair ratios): 1.150" in text


@pytest.mark.slow
@pytest.mark.skipif(bool(sandbox.unavailable()), reason="no sandbox here")
def test_the_probe_runs_in_the_sandbox_and_sees_an_empty_home(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    found = check.probe_inside(tmp_path)
    home = os.path.expanduser("~")
    # HOME is empty but for the folders that hold the interpreter (a pyenv or a virtual environment under HOME)
    holding = {os.path.relpath(p, home).split(os.sep)[0] for p in sandbox.sandbox_paths(check.sys.executable,
               dict(os.environ))["visible"] if p.startswith(home + os.sep)}
    assert found["uid"] == 65534 and set(found["home"]) <= holding, (found, holding)
    assert "shadow" not in found["etc"] and "sda" not in found["dev"] and "null" in found["dev"]
    assert found["isolation"] == "namespaces" and found["cuda"] is False
