"""scripts/gpu_hip.py on the CPU: the plan it renders, the tables it writes, its argument errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_hip.py"


@pytest.fixture(scope="module")
def gpu_hip():
    spec = importlib.util.spec_from_file_location("gpu_hip", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_renders_the_plan_and_writes_both_files(gpu_hip, tmp_path, capsys):
    assert gpu_hip.main(["--out", str(tmp_path), "--tasks", "softmax", "--dry-run"]) == 0
    doc = json.loads((tmp_path / "hip.json").read_text())
    kinds = sorted((f["target"], f["style"], f["kind"]) for f in doc["files"])
    assert kinds == [("cuda", "library", "template"), ("hip", "inline", "example"), ("hip", "inline", "template"),
                     ("hip", "library", "template")]
    assert all(Path(f["path"]).is_file() for f in doc["files"])
    text = (tmp_path / "hip.md").read_text()
    assert "a logic check, not AMD timing" in text and "| softmax example | not run | not run |" in text
    assert text in capsys.readouterr().out


def test_tables_show_results_and_failures(gpu_hip):
    doc = {"card": "NVIDIA H100 80GB HBM3", "started": "2026-11-26 15:00:00", "files": [
        {"task": "softmax", "target": "hip", "style": "library", "kind": "template", "path": "x",
         "build": {"exit_code": 0, "seconds": 41.2}, "test": {"outcome": "passed"},
         "library": {"opcheck": {"test_schema": "SUCCESS", "test_faketensor": "SUCCESS"}, "compile_equal": True}},
        {"task": "matmul", "target": "cuda", "style": "library", "kind": "template", "path": "y",
         "build": {"exit_code": 0, "seconds": 50.0}, "test": {"outcome": "passed"},
         "library": {"opcheck": {"test_schema": "SUCCESS", "test_faketensor": "boom"}, "compile_equal": False}},
    ]}
    text = gpu_hip.markdown(doc)
    assert "NVIDIA H100 80GB HBM3" in text
    assert "| softmax template (library) | 41.2 | passed |" in text
    assert "| hip | softmax | passed | pass | pass |" in text
    assert "| cuda | matmul | passed | **FAIL** | **FAIL** |" in text


def test_unknown_task_is_an_argument_error(gpu_hip, tmp_path):
    with pytest.raises(SystemExit) as exc:
        gpu_hip.main(["--out", str(tmp_path), "--tasks", "nope", "--dry-run"])
    assert exc.value.code == 2


def test_the_library_check_child_is_valid_python(gpu_hip):
    compile(gpu_hip.LIBRARY_CHECK, "gpu_hip.LIBRARY_CHECK", "exec")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("target", ["cuda", "hip"])
@pytest.mark.parametrize("task", ["identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul"])
def test_library_template_passes_opcheck_and_compiles_to_eager(gpu_hip, tmp_path, target, task):
    (entry,) = [f for f in gpu_hip.plan(tmp_path, (task,)) if f["target"] == target and f["style"] == "library"]
    result = gpu_hip.library_check(entry, tmp_path)
    assert gpu_hip.opcheck_passed(result) and result["compile_equal"] is True, result
