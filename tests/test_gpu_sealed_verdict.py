"""scripts/gpu_sealed_verdict.py on a CPU: the commands it runs, and how it reads popkit's JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_sealed_verdict", ROOT / "scripts" / "gpu_sealed_verdict.py")
verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(verdict)


def test_dry_run_benches_every_verdict_cheat_and_every_cuda_example(capsys):
    assert verdict.main(["--out", "unused", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    benches = [b for b in lines if " bench " in b]
    assert len(benches) == len(verdict.VERDICT_CHEATS) + 6
    assert all((ROOT / "submissions" / "cheats" / name).is_file() for name in verdict.VERDICT_CHEATS)


def _doc(outcome, error="", device="NVIDIA H100", audit="trace"):
    case = {"passed": not error, "error": error}
    return {"outcome": outcome, "score_public_s": 1e-5,
            "runs": [{"benchmarks": [case], "raw": {"system.device": device, "trust.audit": audit}}]}


def test_a_cheat_is_as_expected_only_when_it_fails_with_its_class():
    caught = verdict.summarize("measure_forge.py", "vectoradd", 1, _doc("failed", "time forged: 1.2 µs"), 3.0)
    assert verdict.expected(caught)
    audited = verdict.summarize("measure_forge.py", "vectoradd", 1,
                                _doc("failed", "unsynchronized work: call 2 of 3 left 20200 µs"), 3.0)
    assert verdict.expected(audited)  # on a GPU the trace audit judges the lowered time first
    wrong_class = verdict.summarize("tensor_int.py", "vectoradd", 1, _doc("failed", "time forged: x"), 3.0)
    assert not verdict.expected(wrong_class)
    passed = verdict.summarize("judge_swap.py", "vectoradd", 0, _doc("passed"), 3.0)
    assert not verdict.expected(passed)
    forged_device = verdict.summarize("ready_forge.py", "vectoradd", 0, _doc("passed", device="forged-device"), 3.0)
    assert not verdict.expected(forged_device)
    assert verdict.expected(verdict.summarize("ready_forge.py", "vectoradd", 0, _doc("passed"), 3.0))
    assert "| vectoradd | judge_swap.py | passed | – |" in verdict.markdown([passed], "H100")
