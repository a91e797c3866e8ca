"""scripts/gpu_multi.py and scripts/bare_eval.py on the CPU: the bare protocol run, the plan, the table."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(ROOT / "scripts"))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bare_eval = _load("bare_eval")
gpu_multi = _load("gpu_multi")


def test_bare_run_speaks_the_protocol_without_popkit():
    good = (FIX / "submissions" / "good.py").read_text()
    result = bare_eval.bare_run(FIX / "tasks" / "double", good, "test", gpus=2)
    assert result["_passed"] and result["_exit"] == 0 and result["test-count"] == "2"
    assert (result["env.gpus"], result["env.nvls"], result["env.multicast"]) == ("2", "0", "1")
    wrong = bare_eval.bare_run(FIX / "tasks" / "double", "def custom_kernel(x):\n    return x\n", "benchmark")
    assert not wrong["_passed"] and wrong["_exit"] == 112
    bench = bare_eval.bare_run(FIX / "tasks" / "double", good, "benchmark")
    assert abs(bare_eval.mean_score_s(bench, "geom") - 20e-6) < 1e-12  # geometric mean of 10, 20, 40 µs


def test_multi_dry_run_writes_submissions_that_define_custom_kernel(tmp_path):
    assert gpu_multi.main(["--out", str(tmp_path), "--dry-run"]) == 0
    plan = json.loads((tmp_path / "multi.json").read_text())["plan"]
    assert {(t, k) for t, k, _ in plan} == {("all2all", "right"), ("gemm-rs", "right"), ("gemm-rs", "wrong"),
                                             ("ag-gemm", "right")}
    for _, _, path in plan:
        tree = ast.parse(Path(path).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "custom_kernel" for n in tree.body)


def test_multi_shortens_every_task_to_k_cases(tmp_path):
    problems = tmp_path / "problems"
    for name in gpu_multi.TASKS:
        shutil.copytree(FIX / "tasks" / "multi", problems / "amd_distributed" / name)
        shutil.copytree(FIX / "tasks" / "common", problems / "amd_distributed" / "common", dirs_exist_ok=True)
    root = gpu_multi.shortened_copy(problems, tmp_path / "copy", 1)
    for name in gpu_multi.TASKS:
        spec = yaml.safe_load((root / name / "task.yml").read_text())
        assert len(spec["tests"]) == 1 and len(spec["benchmarks"]) == 3


def test_multi_table_marks_a_disagreement():
    def row(kind, bare, mine):
        return {"task": "gemm-rs", "kind": kind, "bare": {"_passed": bare, "_exit": 0 if bare else 112},
                "popkit": {"passed": mine, "exit": 0 if mine else 1}, "bare_s": 1.0, "popkit_s": 2.0}

    text = gpu_multi.markdown([row("right", True, True), row("wrong", False, True)], "NVIDIA H100", 2, 2)
    assert "2× NVIDIA H100" in text and "world_size 2" in text
    assert "| gemm-rs | right | pass | pass | yes |" in text and "| gemm-rs | wrong | fail (exit 112) | pass | **no** |" in text
