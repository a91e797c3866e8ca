"""`bench --evidence OUT` and `popkit verify OUT`: the file holds what a re-check needs under a digest; verify
re-runs it shape by shape, refuses another GPU or other task files, and fails a tampered file by name."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.operations import evidence

FIX = Path(__file__).parent / "fixtures"
DOUBLE = FIX / "tasks" / "double"  # its eval reports size µs per call: the same timings on every run
GOOD = FIX / "submissions" / "good.py"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


def _written(cli, tmp_path: Path) -> Path:
    out = tmp_path / "run.evidence.json"
    result = cli("bench", GOOD, "--task", DOUBLE, "--no-history", "--evidence", out)
    assert result.exit_code == 0, result.output
    return out


def _rewrite(path: Path, change) -> None:
    """Change the document and write a fresh digest: what a forger who knows the format would do."""
    doc = json.loads(path.read_text())
    change(doc)
    doc["digest"] = evidence.digest_of(doc)
    path.write_text(json.dumps(doc))


def test_the_evidence_holds_the_bytes_hashes_machine_samples_and_score_under_a_digest(cli, tmp_path):
    doc = json.loads(_written(cli, tmp_path).read_text())
    assert doc["schema"] == "popkit/evidence/1" and doc["digest"] == evidence.digest_of(doc)
    content = base64.b64decode(doc["submission"]["bytes_b64"])
    assert content == GOOD.read_bytes() and doc["submission"]["sha256"] == hashlib.sha256(content).hexdigest()
    assert doc["task"]["files"]["eval.py"] == hashlib.sha256((FIX / "tasks" / "common" / "tiny_eval.py").read_bytes()).hexdigest()
    assert {"gpu", "driver", "clocks", "torch", "cuda"} <= set(doc["machine"])
    benchmarks = doc["report"]["runs"][-1]["benchmarks"]
    assert [b["spec"] for b in benchmarks] == ["size: 10; seed: 3", "size: 20; seed: 4", "size: 40; seed: 5"]
    assert all(b["samples_ns"] and b["passed"] for b in benchmarks) and doc["score_s"] == pytest.approx(20e-6)


def test_verify_reruns_and_says_each_shape_reproduces(cli, tmp_path):
    out = _written(cli, tmp_path)
    result = cli("verify", out, "--task", DOUBLE, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/verify/1" and doc["reproduces"] is True
    assert [s["status"] for s in doc["shapes"]] == ["reproduces"] * 3


def test_a_result_that_does_not_reproduce_is_named_shape_by_shape(cli, tmp_path):
    out = _written(cli, tmp_path)

    def halve_the_last(doc):  # claims 40 µs ran in 20: the re-run here says otherwise
        case = doc["report"]["runs"][-1]["benchmarks"][2]
        case["samples_ns"] = [x / 2 for x in case["samples_ns"]]
        case["mean_ns"] /= 2

    _rewrite(out, halve_the_last)
    result = cli("verify", out, "--task", DOUBLE)
    assert result.exit_code == 1
    assert "benchmark: size: 40; seed: 5 │ differs" in result.output and "1 of 3 shape(s)" in result.output


def test_a_tampered_file_fails_by_name(cli, tmp_path):
    out = _written(cli, tmp_path)
    doc = json.loads(out.read_text())
    doc["score_s"] = 1e-9
    out.write_text(json.dumps(doc))
    result = cli("verify", out, "--task", DOUBLE)
    assert result.exit_code == 1 and "digest mismatch" in result.output
    out = _written(cli, tmp_path)
    _rewrite(out, lambda d: d["submission"].update(bytes_b64=base64.b64encode(b"def custom_kernel(d): return d\n").decode()))
    result = cli("verify", out, "--task", DOUBLE)
    assert result.exit_code == 1 and "bytes do not match their sha256" in result.output


def test_another_gpu_is_refused_with_exit_11(cli, tmp_path):
    out = _written(cli, tmp_path)
    _rewrite(out, lambda d: d["machine"].update(gpu="NVIDIA H100 80GB HBM3"))
    result = cli("verify", out, "--task", DOUBLE)
    assert result.exit_code == 11 and "recorded on NVIDIA H100 80GB HBM3" in result.output


def test_other_task_files_are_refused_with_exit_3(cli, tmp_path):
    out = _written(cli, tmp_path)
    shutil.copytree(FIX / "tasks", tmp_path / "tasks")
    changed = tmp_path / "tasks" / "common" / "tiny_eval.py"
    changed.write_text(changed.read_text() + "\n# changed\n")
    result = cli("verify", out, "--task", tmp_path / "tasks" / "double")
    assert result.exit_code == 3 and "differ from the recorded ones: eval.py" in result.output


def test_evidence_goes_with_one_file_and_not_a_folder_it_cannot_write(cli, tmp_path):
    result = cli("bench", GOOD, GOOD, "--task", DOUBLE, "--evidence", tmp_path / "x.json")
    assert result.exit_code == 2 and "--evidence records one file's run" in result.output
    result = cli("verify", tmp_path / "none.json")
    assert result.exit_code == 2 and "no such file" in result.output


@pytest.mark.slow
def test_a_pytorch_example_on_the_cpu_round_trips(cli, tmp_path):
    out = tmp_path / "vectorsum.json"
    sub = ROOT / "submissions" / "vectorsum" / "pytorch.py"
    result = cli("bench", sub, "--allow-cpu", "--harness", "popkit", "--no-history", "--evidence", out)
    assert result.exit_code == 0, result.output
    result = cli("verify", out, "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code in (0, 1) and doc["shapes"]  # a loaded CPU may differ; the verdicts may not
    statuses = {s["status"] for s in doc["shapes"]}
    assert statuses <= {"reproduces", "differs", "missing"}
    if "missing" in statuses:  # only where the CPU sizing kept other shapes on one side
        assert any("--allow-cpu sizing" in note for note in doc["notes"]) and result.exit_code == 1
    assert all(s["comparison"]["from_samples"] for s in doc["shapes"] if s["status"] != "missing")


def test_popkits_harness_is_hashed_where_it_judges():
    files = evidence.harness_files("popkit")
    assert {"eval.py", "popkit_trusted.py", "popkit_worker.py"} <= set(files)
    assert files["eval.py"] == hashlib.sha256((ROOT / "tasks" / "eval.py").read_bytes()).hexdigest()
    assert evidence.harness_files("task") == {}


def test_another_harness_than_the_recorded_one_is_refused_with_exit_3(cli, tmp_path):
    out = _written(cli, tmp_path)
    _rewrite(out, lambda d: d["task"].update(harness_files={**evidence.harness_files("popkit"),
                                                             "popkit_trusted.py": "0" * 64}))
    result = cli("verify", out, "--task", DOUBLE)
    assert result.exit_code == 3 and "popkit's harness here differs from the one that judged the run: " \
                                      "popkit_trusted.py" in result.output


def _check(mode: str, recorded: list[float], here: list[float]) -> evidence.ShapeCheck:
    from popkit.model.results import CaseResult, ModeRun, RunReport

    def report(samples: list[float]) -> RunReport:
        case = CaseResult("benchmark", 0, "n: 1", True, runs=len(samples), mean_ns=sum(samples) / len(samples),
                          std_ns=1.0, samples_ns=tuple(samples))
        run = ModeRun(mode, False, None, 0, 1.0, 60, False, "pass", benchmarks=(case,))
        return RunReport("t", "t", None, "geom", "s.py", "0", mode, "popkit", "", 1.0, runs=(run,))
    (check,) = evidence.compare(report(recorded), report(here), evidence.DEFAULT_TOLERANCE)
    return check


def test_a_host_stall_in_one_run_moves_the_mean_not_the_median_and_still_reproduces():
    """An H100's re-run of vectoradd at 1024 (benchmark mode): medians 6.50 and 6.56 µs, but stalled calls put
    the mean 17% higher, interval [1.02, 1.33]; the medians decide. Here 10 calls of 100 stalled to 20 µs."""
    recorded = [6500.0 + (i % 7) * 20 for i in range(100)]
    here = [6560.0 + (i % 7) * 20 for i in range(90)] + [20_000.0] * 10
    check = _check("benchmark", recorded, here)
    assert check.comparison.ratio.low > 1.05  # the means' interval alone says it differs
    assert check.status == evidence.REPRODUCES and "medians 1.009" in check.note
    slower = _check("benchmark", recorded, [x * 1.3 for x in recorded])
    assert slower.status == "differs"


def test_leaderboard_mode_shapes_are_compared_by_verdict_alone():
    """Leaderboard-mode times vary between processes (0.83x-2.44x on one quiet H100): shown, never decisive."""
    check = _check("leaderboard", [6800.0] * 50, [15000.0] * 50)
    assert check.status == evidence.SAME_VERDICT and "times are not compared" in check.note
