"""`popkit risk FILE`: the cases planned, the judge's margin and determinism, the verdict, and the known-risk
kernels (tests/fixtures/risk: one at 95% of its tolerance, one nondeterministic reduction, one wrong only next to
the public grid) getting the right verdict on the CPU, with the honest examples low."""

from __future__ import annotations

import importlib.util
import json
import os
import types
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from popkit.cli import app
from popkit.model.tasks import resolve_task
from popkit.operations import risk
from popkit.operations.risk import CaseRisk, RiskReport
from popkit.run import protocol

ROOT = Path(__file__).resolve().parents[1]
RISKY = Path(__file__).parent / "fixtures" / "risk"


def _judge_module():
    spec = importlib.util.spec_from_file_location("popkit_risk_judge", ROOT / "popkit" / "operations" / "risk_children" / "judge.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


judge = _judge_module()


def test_the_plan_holds_the_public_cases_each_on_the_extra_seeds_and_the_shapes_next_to_them():
    task = resolve_task("vectoradd")
    planned = risk.plan_cases(task, benchmarks=False, secret_seeds=(5,))
    origins = [origin for _case, origin in planned]
    assert [c for c, o in planned if o == "test"] == [dict(c) for c in task.tests]
    assert "benchmark" not in origins
    first = dict(task.tests[0])  # size 1: size 0 is not tried, size 2 is
    assert {**first, "seed": protocol.secret_case_seed(first["seed"], 5)} in [c for c, o in planned if o == "seed"]
    near = [c for c, o in planned if o == "near"]
    assert {**first, "size": 2} in near and {**first, "size": 0} not in near
    # 128 - 1 == 127 is a public size but on another seed, so it is a new case; no case is planned twice
    keys = [json.dumps(c, sort_keys=True) for c, _ in planned]
    assert len(keys) == len(set(keys))
    with_benchmarks = risk.plan_cases(task, benchmarks=True, secret_seeds=())
    assert {**dict(task.benchmarks[2]), "size": 4094} in [c for c, o in with_benchmarks if o == "near"]


def _case(origin="test", passed=True, margin=0.1, deterministic=True, distinct=1, message="", size=1):
    return CaseRisk({"size": size, "seed": 1}, origin, passed, margin, deterministic, distinct, message)


def test_the_verdict_names_the_case_that_drives_it():
    assert risk.verdict([_case(margin=0.1), _case(margin=0.3, size=2)])[0::2] == ("low", 1)
    assert risk.verdict([_case(margin=0.1), _case(margin=0.95, size=2)])[0::2] == ("high", 1)
    assert risk.verdict([_case(margin=0.6)])[0] == "medium"
    level, reason, driver = risk.verdict([_case(), _case(deterministic=False, distinct=3, size=9)])
    assert (level, driver) == ("medium", 1) and "3 different outputs" in reason
    # a failing case wins over margins; a public case is named before one next to the grid
    level, reason, driver = risk.verdict([_case(margin=0.99), _case("near", False, None, message="bad", size=6),
                                          _case("benchmark", False, 3.0, message="worse", size=7)])
    assert (level, driver) == ("high", 2) and reason.startswith("benchmark case `size: 7; seed: 1` fails (and 1 more)")
    assert risk.verdict([_case(margin=None)])[0] == "low"
    assert risk.verdict([])[0] == "high"


def test_the_report_survives_json():
    report = RiskReport("vectoradd", "x.py", "medium", "why", 0, (_case(margin=None, deterministic=None),), 3,
                        (7,), 2, "none (off)", ("compare",), ("a note",))
    assert RiskReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert report.exit_code == 0 and RiskReport.from_json({**report.to_json(), "level": "high"}).exit_code == 1


def _reference(source: str) -> types.ModuleType:
    module = types.ModuleType("reference")
    exec(source, module.__dict__)
    return module


MINI_REFERENCE = """
def compare(output, expected, *, rtol, atol):  # what the judge scales
    ok = bool(((output - expected).abs() <= atol + rtol * expected.abs()).all())
    return ok, "" if ok else "mismatch"

def check_implementation(data, output):
    return compare(output, data * 2, rtol=0.0, atol=0.5)
"""


def test_the_margin_is_the_worst_error_over_the_tolerance():
    tolerance = judge.Tolerance(_reference(MINI_REFERENCE))
    assert tolerance.patched == ["compare"]
    data = torch.tensor([1.0, 2.0])
    assert judge.margin(data, data * 2, tolerance) == 0.0
    assert judge.margin(data, data * 2 + torch.tensor([0.1, 0.4]), tolerance) == pytest.approx(0.8, abs=1e-4)
    assert judge.margin(data, data * 2 + 1.5, tolerance) == pytest.approx(3.0, abs=1e-4)  # fails: 3x over
    assert judge.margin(data, data * 2 + float("nan"), tolerance) is None  # fails at any scale


def test_a_check_without_a_tolerance_function_has_no_margin():
    tolerance = judge.Tolerance(_reference("def check_implementation(data, output):\n"
                                           "    return bool((data == output).all()), ''\n"))
    assert tolerance.patched == [] and judge.margin(torch.ones(2), torch.ones(2), tolerance) is None


def test_outputs_are_read_as_data_and_malformed_headers_refused():
    t = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    blob = bytes(t.reshape(-1).view(torch.uint8).untyped_storage())
    entry = {"structure": "tensor", "tensors": [{"dtype": "float16", "shape": [2, 3], "offset": 0, "nbytes": 12}]}
    assert torch.equal(judge.load(entry, blob, torch.device("cpu")), t)
    pair = {"structure": "tuple", "tensors": entry["tensors"] * 2}
    assert len(judge.load(pair, blob, torch.device("cpu"))) == 2
    for bad in ({**entry, "structure": "pickle"},
                {"structure": "tensor", "tensors": [{**entry["tensors"][0], "dtype": "object"}]},
                {"structure": "tensor", "tensors": [{**entry["tensors"][0], "shape": [4, 3]}]},
                {"structure": "tensor", "tensors": [{**entry["tensors"][0], "offset": 4}]}):
        with pytest.raises(ValueError):
            judge.load(bad, blob, torch.device("cpu"))


def test_the_judge_reads_no_link_and_no_oversized_file(tmp_path):
    (tmp_path / "real").write_bytes(b"x" * 10)
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(OSError):
        judge._read(str(tmp_path / "link"), 100)
    with pytest.raises(ValueError):
        judge._read(str(tmp_path / "real"), 5)


def _risk(args, monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    return CliRunner().invoke(app, ["risk", *args, "--secret-seed", "11", "--repeats", "2", "--json"])


@pytest.mark.slow
@pytest.mark.parametrize("file, task, level, said", [
    (RISKY / "near_tolerance.py", "vectorsum", "high", "of the task's tolerance"),
    (RISKY / "nondeterministic.py", "vectorsum", "medium", "not bitwise deterministic"),
    (RISKY / "off_grid.py", "vectoradd", "high", "shape next to the public grid"),
    (ROOT / "submissions" / "vectorsum" / "pytorch.py", "vectorsum", "low", "every case passes"),
    (ROOT / "submissions" / "vectoradd" / "pytorch.py", "vectoradd", "low", "every case passes"),
])
def test_known_risks_get_their_verdict_and_honest_examples_low(file, task, level, said, monkeypatch):
    result = _risk([str(file), "--task", task, "--no-benchmarks"], monkeypatch)
    doc = json.loads(result.stdout)
    assert result.exit_code == (1 if level == "high" else 0), result.output
    assert doc["schema"] == "popkit/risk/1" and doc["level"] == level and said in doc["reason"]
    assert doc["tolerance_functions"] == ["compare"] and doc["secret_seeds"] == [11]
    assert {c["origin"] for c in doc["cases"]} == {"test", "seed", "near"}
    if file.name == "near_tolerance.py":
        assert all(0.9 < c["margin"] < 1.0 for c in doc["cases"])


@pytest.mark.slow
def test_a_submission_that_patches_the_check_in_its_own_process_is_still_judged(monkeypatch):
    """The verdict is not the submission's process's: check_patch replaces reference.check_implementation there,
    and the judge, a process that never imports it, still fails its zeros."""
    result = _risk([str(ROOT / "submissions" / "cheats" / "check_patch.py"), "--no-benchmarks"], monkeypatch)
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and doc["level"] == "high" and "mismatch" in doc["reason"]


def test_an_output_file_larger_than_its_header_says_is_not_read(tmp_path):
    entry = {"structure": "tensor", "tensors": [{"dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8}]}
    assert judge._size(entry) == 8
    (tmp_path / "0-0.bin").write_bytes(b"\0" * 9)
    with pytest.raises(ValueError):
        judge._read(str(tmp_path / "0-0.bin"), judge._size(entry))
    with pytest.raises(ValueError):
        judge._size({"structure": "tensor", "tensors": [{"offset": 0, "nbytes": judge.MAX_FILE_BYTES + 1}]})


def _vectoradd():
    from popkit.submission.source import Source

    return resolve_task("vectoradd", ()), Source.read(ROOT / "submissions" / "vectoradd" / "pytorch.py")


def test_a_kernel_that_does_not_build_is_exit_5_with_the_compilers_first_message(monkeypatch):
    """risk sets its run up as a cold eval does (the compile pre-step, the build store), so a failed build is
    named before anything runs."""
    from popkit.errors import ExitCode, PopkitError
    from popkit.model.results import CompileStep
    from popkit.run.runner import RunOptions, RunSession

    failed = CompileStep(exit_code=1, duration_s=1.0, stderr="cuda.cu: error: expected a type\nninja: build stopped")
    scripts = []
    monkeypatch.setattr(RunSession, "pre_step", lambda self, *a, **k: failed)
    monkeypatch.setattr(RunSession, "script", lambda self, *a, **k: scripts.append(a))
    task, source = _vectoradd()
    with pytest.raises(PopkitError) as raised:
        risk.assess(task, source, RunOptions(), repeats=2, benchmarks=False)
    assert raised.value.exit_code == ExitCode.COMPILE_FAILED
    assert str(raised.value).endswith("the kernel did not build: cuda.cu: error: expected a type")
    assert not scripts  # nothing of the submission ran


@pytest.mark.slow
def test_the_pre_step_runs_before_the_submission_does(monkeypatch):
    from popkit.run.runner import RunOptions, RunSession

    order = []
    real_pre, real_script = RunSession.pre_step, RunSession.script
    monkeypatch.setattr(RunSession, "pre_step", lambda self, *a, **k: order.append("pre-step") or real_pre(self, *a, **k))
    monkeypatch.setattr(RunSession, "script", lambda self, *a, **k: order.append("run") or real_script(self, *a, **k))
    task, source = _vectoradd()
    report = risk.assess(task, source, RunOptions(), repeats=2, benchmarks=False)
    assert order == ["pre-step", "run"] and report.level == "low"


def test_the_submissions_side_writes_each_outputs_exact_bytes_that_the_judge_loads_back(tmp_path):
    """run_submission's writer and the judge's loader agree byte for byte, for the dtypes, shapes and layouts a
    kernel returns (a transposed view, an empty tensor, a tuple), with the bytes taken at C speed."""
    spec = importlib.util.spec_from_file_location("popkit_risk_run", ROOT / "popkit" / "operations" / "risk_children" / "run_submission.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    outputs = [torch.randn(3, 5).to(torch.bfloat16).t(), torch.arange(7, dtype=torch.int64), torch.zeros(0),
               (torch.tensor([True, False]), torch.randn(2, 2, dtype=torch.float16))]
    for i, output in enumerate(outputs):
        path = tmp_path / f"{i}.bin"
        entry = writer._write(output, str(path))
        loaded = judge.load(entry, path.read_bytes(), torch.device("cpu"))
        expected = output if isinstance(output, tuple) else (output,)
        got = loaded if isinstance(loaded, tuple) else (loaded,)
        assert len(got) == len(expected)
        for a, b in zip(expected, got):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
