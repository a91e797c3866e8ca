"""scripts/gpu_watch.py on the CPU: its plan, the submissions it writes, and its table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_watch", ROOT / "scripts" / "gpu_watch.py")
gw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gw)


def test_dry_run_plans_six_bundled_and_three_public_cases(tmp_path, capsys):
    problems = tmp_path / "problems"
    (problems / "pmpp_v2" / "vectoradd_py").mkdir(parents=True)
    (problems / "pmpp_v2" / "vectoradd_py" / "task.yml").write_text("lang: py\n")
    assert gw.main(["--out", str(tmp_path / "out"), "--problems", str(problems), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "out" / "watch.json").read_text())
    keys = [c["key"] for c in doc["plan"]]
    assert keys == ["identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul", "vectoradd_v2",
                    "grayscale_v2", "matmul_v2"]
    missing = {c["key"]: c["missing"] for c in doc["plan"]}
    assert missing["vectoradd_v2"] is False and missing["matmul_v2"] is True and missing["identity"] is False
    for case in doc["plan"][6:]:
        sub = Path(case["submission"])
        compile(sub.read_text(), str(sub), "exec")  # the written submissions are valid Python
    out = capsys.readouterr().out
    assert "-m popkit test" in out and "--watch --json --no-history" in out and "(task missing: skipped)" in out


def test_only_names_cases_and_an_unknown_one_is_refused(tmp_path, capsys):
    assert gw.main(["--out", str(tmp_path), "--only", "softmax,matmul_v2", "--dry-run"]) == 0
    assert [c["key"] for c in json.loads((tmp_path / "watch.json").read_text())["plan"]] == ["softmax", "matmul_v2"]
    try:
        gw.main(["--out", str(tmp_path), "--only", "nope", "--dry-run"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "unknown case(s) nope" in capsys.readouterr().err


def test_table_gives_medians_ratios_and_flags_a_miss():
    warm = [{"seconds": 0.4, "outcome": "passed", "ready_at_save": True}, {"seconds": 0.6, "outcome": "passed",
                                                                          "ready_at_save": False}]
    row = {"label": "softmax (bundled)", "bare": [{"seconds": 4.0, "outcome": "passed"}],
           "cold": [{"seconds": 5.0, "outcome": "passed"}], "warm": warm,
           "median_s": {"bare": 4.0, "cold": 5.0, "warm": 0.5}, "warm_over_bare": 0.125, "warm_over_cold": 0.1}
    slow = {**row, "label": "matmul (bundled)", "median_s": {"bare": 1.0, "cold": 2.0, "warm": 0.8},
            "warm_over_bare": 0.8, "warm_over_cold": 0.4}
    text = gw.markdown({"card": "NVIDIA H100 80GB HBM3", "repeats": 2,
                        "rows": [row, slow, {"label": "matmul_v2", "skipped": "task not found under x"}]})
    assert "on NVIDIA H100 80GB HBM3" in text
    assert "| softmax (bundled) | 4.00 s | 5.00 s | 0.50 s | 0.12 | 0.10 | passed / passed / passed | 1/2 |" in text
    assert "| matmul (bundled) | 1.00 s | 2.00 s | 0.80 s | 0.80 **(> 0.5)** | 0.40 |" in text
    assert "| matmul_v2 | task not found under x |" in text
    assert "1 of 2 cases at or below 0.5 x the bare eval" in text
