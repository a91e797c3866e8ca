"""scripts/gpu_multi.py and scripts/bare_eval.py on the CPU: the bare protocol run, the plan, the table."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
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


fidelity_sweep = _load("fidelity_sweep")


def test_sweep_picks_the_sets_submission_when_its_imports_are_here(tmp_path):
    from popkit.model.tasks import load_task

    task_dir = tmp_path / "t"
    shutil.copytree(FIX / "tasks" / "double", task_dir)
    shutil.copytree(FIX / "tasks" / "common", tmp_path / "common")
    subs = fidelity_sweep.submissions_for(load_task(task_dir))
    assert subs["right"][0] == "ref_kernel wrapper" and subs["wrong"][0] == "ref_kernel + 1"
    (task_dir / "submission.py").write_text("import json\n\ndef custom_kernel(x):\n    return 2 * x\n")
    assert fidelity_sweep.submissions_for(load_task(task_dir))["right"][0] == "the set's submission.py"
    (task_dir / "submission.py").write_text("import popkit_no_such_package\n")
    assert fidelity_sweep.submissions_for(load_task(task_dir))["right"][0] == "ref_kernel wrapper"
    pair = fidelity_sweep.submissions_for(load_task(FIX / "tasks" / "pair"))  # contract: forward/backward
    assert set(pair) == {"wrong"} and "cross_entropy_forward" in pair["wrong"][1]


def test_sweep_table_counts_agreements_and_lists_what_cannot_run():
    row = {"set": "pmpp_v2", "task": "vectoradd_py", "kind": "right", "submission": "the set's submission.py",
           "bare_passed": True, "bare_exit": 0, "popkit_passed": True, "popkit_exit": 0, "popkit_outcome": "passed"}
    wrong = {**row, "kind": "wrong", "submission": "ref_kernel + 1", "bare_passed": False, "bare_exit": 112,
             "popkit_passed": False, "popkit_exit": 1, "popkit_outcome": "failed"}
    doc = {"card": "NVIDIA H100", "total": 42, "runnable": ["vectoradd_v2"], "tests": [row, wrong],
           "leaderboard": [{"task": "vectoradd_py", "bare_score_s": 1e-5, "popkit_score_s": 1.01e-5}],
           "not_runnable": [{"task": "mxfp4-mm", "leaderboard": "amd-mxfp4-mm", "reasons": ["needs an AMD GPU"]}]}
    text = fidelity_sweep.markdown(doc)
    assert "1 of 42 public tasks runnable here; test-mode verdicts identical in 2 of 2 runs" in text
    assert "| pmpp_v2 | vectoradd_py | wrong: ref_kernel + 1 | fail (112) | failed (1) | yes |" in text
    assert "| vectoradd_py | 10.00 µs | 10.10 µs | 1.010 |" in text
    assert "- mxfp4-mm (amd-mxfp4-mm): needs an AMD GPU" in text


def test_sweep_dry_run_plans_nothing_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setattr("popkit.machine.runnable.gpu_devices_visible", lambda: False)
    problems = tmp_path / "problems"
    shutil.copytree(FIX / "needs", problems / "needs")
    shutil.copytree(FIX / "tasks", problems / "tasks")
    shutil.copyfile(FIX / "needs.yaml", problems / "needs.yaml")
    assert fidelity_sweep.main([str(problems), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    planned = {name for name, _, _ in doc["plan"]}
    assert "gpu" not in planned and "nccl" not in planned
    assert {r["task"] for r in doc["not_runnable"]} >= {"gpu", "nccl", "rocm"}


def test_sweep_keeps_why_popkit_did_not_pass():
    sweep = _load("fidelity_sweep")
    assert sweep.why_not_passed({"outcome": "passed", "runs": []}) == ""
    doc = {"outcome": "crashed", "runs": [
        {"outcome": "passed", "summary": "", "stderr": "fine"},
        {"outcome": "crashed", "summary": "crashed: test exited with code 1", "stderr": "x" * 900 + "CUDA error: out of memory"}]}
    why = sweep.why_not_passed(doc)
    assert why.startswith("crashed: test exited with code 1\n") and why.endswith("CUDA error: out of memory")
    assert len(why) < 700  # the output's tail, not all of it
    assert sweep.why_not_passed({"outcome": "no_json", "error": "Traceback ..."}) == "Traceback ..."


@pytest.mark.parametrize("result,alone", [
    ({"bare_passed": True, "popkit_passed": True}, False),
    ({"bare_passed": False, "popkit_passed": False, "popkit_why": "AssertionError: mismatch"}, False),
    ({"bare_passed": False, "popkit_passed": True}, True),
    ({"bare_passed": False, "popkit_passed": False, "popkit_why": "torch.OutOfMemoryError: CUDA out of memory."},
     True),
    ({"bare_passed": False, "popkit_passed": False, "bare_why": "torch.OutOfMemoryError: ..."}, True),
    ({"bare_passed": False, "popkit_passed": False,  # the tail of torch's message, as the sweep keeps it
      "popkit_why": "GiB is free. Process 1006 has 42.47 GiB memory in use. ... try setting "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."}, True),
])
def test_sweep_reruns_alone_what_sharing_the_gpu_may_have_changed(result, alone):
    assert fidelity_sweep.needs_rerun_alone(result) is alone


def test_sweep_table_says_which_jobs_ran_alone():
    row = {"set": "amd", "task": "mla-decode", "kind": "right", "submission": "the set's submission.py",
           "bare_passed": True, "bare_exit": 0, "popkit_passed": True, "popkit_outcome": "passed", "popkit_exit": 0}
    text = fidelity_sweep.markdown({"card": "H100", "total": 1, "runnable": ["x"],
                                    "tests": [row, {**row, "task": "trimul", "first_try": {"bare_passed": False}}]})
    assert "| mla-decode | right: the set's submission.py | pass | pass | yes |" in text
    assert "| trimul | right: the set's submission.py (run alone: out of memory or different beside other jobs) |" in text


def test_sweep_bare_chain_runs_the_ranked_modes_in_order_and_stops_at_a_failure(monkeypatch):
    from popkit.model.tasks import load_task

    task = load_task(FIX / "tasks" / "double")
    seen = []

    def fake(path, source, mode, timeout_s):
        seen.append(mode)
        return {"_passed": mode != "benchmark", "_exit": 0}

    monkeypatch.setattr(fidelity_sweep, "bare_run", fake)
    assert fidelity_sweep.bare_chain(task, "src")["_mode"] == "benchmark"
    assert seen == ["test", "benchmark"]
