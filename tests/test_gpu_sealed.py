"""scripts/gpu_sealed.py on a CPU: the commands it runs, and the table it writes from popkit's JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_sealed", ROOT / "scripts" / "gpu_sealed.py")
sealed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sealed)


def test_dry_run_builds_then_benches_the_cheat_and_every_cuda_example(capsys):
    assert sealed.main(["--out", "unused", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    compiles, benches = lines[:6], lines[6:]
    assert all(" compile " in c and c.endswith("/cuda.py --json") for c in compiles)
    assert len(benches) == 12 and all("--leaderboard --harness popkit --secret-runs 0" in b for b in benches)
    cheats = [b for b in benches if "side_stream.py" in b]
    assert len(cheats) == 6 and all(b.endswith("--no-precompile") for b in cheats)
    assert {b.split("--task ")[1].split()[0] for b in cheats} == set(sealed.TASKS)


def test_unknown_task_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        sealed.main(["--out", "x", "--tasks", "identity,nope", "--dry-run"])
    assert info.value.code == 2


def _doc(outcome, errors=(), score=None, drains=()):
    cases = [{"passed": not e, "error": e} for e in errors] or [{"passed": True, "error": ""}]
    raw = {f"benchmark.{i}.drain_max": str(d) for i, d in enumerate(drains)}
    return {"outcome": outcome, "score_public_s": score, "runs": [{"benchmarks": cases, "raw": raw}]}


def test_rows_name_the_failure_class_and_whether_it_was_expected():
    caught = sealed.summarize("side_stream", "softmax", 1, _doc("failed", [
        "", "unsynchronized work: 12 of 12 timed calls left work running", "time beats physics: size: 8"],
        drains=[4e3, 290e3]), 12.0)
    assert (caught["class"], caught["max_drain_ns"]) == ("unsynchronized work", 290e3)
    assert sealed.expected(caught)
    other = sealed.summarize("side_stream", "identity", 1, _doc("failed", ["elements mismatch: 3"]), 3.0)
    assert not sealed.expected(other)
    honest = sealed.summarize("cuda.py", "softmax", 0, _doc("passed", score=303e-6, drains=[5e3]), 20.0)
    assert sealed.expected(honest) and honest["class"] == ""
    escaped = sealed.summarize("side_stream", "vectoradd", 0, _doc("passed", score=1e-6), 9.0)
    assert not sealed.expected(escaped)
    table = sealed.markdown([caught, honest, escaped], "NVIDIA H100 80GB HBM3")
    assert "on an NVIDIA H100 80GB HBM3" in table
    assert "| softmax | side_stream | failed | unsynchronized work | – | 290.0 | yes |" in table
    assert "| softmax | cuda.py | passed | – | 303.0 | 5.0 | yes |" in table
    assert "| vectoradd | side_stream | passed | – | 1.0 | – | **no** |" in table
    assert "2 of 3 as expected" in table
