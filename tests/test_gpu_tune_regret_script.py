"""scripts/gpu_tune_regret.py on the CPU: the points it times are tune's, its regret and table, the exhaustive loop
over a stand-in `popkit bench`, and a dry run on the fixture task (slow)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from popkit.model import tunespec
from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.tuning import workflow as tune
from tests.test_tune import Fake

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_tune_regret", ROOT / "scripts" / "gpu_tune_regret.py")
regret_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(regret_script)
TASK_DIR = ROOT / "tests" / "fixtures" / "tasks" / "chunksum"
SUBMISSION = ROOT / "tests" / "fixtures" / "tune" / "chunksum.py"
TEMPLATE = '''#!POPKIT tune A=1,2,3,4,5,6
#!POPKIT tune B=1,2,3
A = 3
B = 2


def custom_kernel(data):
    return data
'''


def test_a_variant_rewrites_each_assignment_once_and_the_points_are_tunes(tmp_path):
    text = regret_script.variant_text(TEMPLATE, {"A": 5, "B": 1})
    spec = tunespec.parse(TEMPLATE, "t.py")
    assert text == tunespec.variant_text(TEMPLATE, spec, {"A": 5, "B": 1})  # what tune itself writes
    with pytest.raises(SystemExit, match="no module-level assignment of C"):
        regret_script.variant_text(TEMPLATE, {"C": 1})
    report = tune.run_tune(load_task(TASK_DIR), SUBMISSION, tmp_path / "o.py", runner.RunOptions(),
                           tune.TuneSettings(record=False, per_shape=False), backend=Fake().backend)
    points = regret_script.points_of(report)
    assert [p["label"] for p in points] == ["CHUNK=1", "CHUNK=256", "CHUNK=1000", "CHUNK=4096"]
    assert [p["passed"] for p in points] == [True, True, False, True]


def _point(label, scores, failures=()):
    return {"label": label, "scores": list(scores), "failures": list(failures), "eval_s": [2.0] * len(scores)}


def test_regret_is_the_picks_pooled_time_over_the_best_points_with_an_interval():
    points = [_point("A=1", [1.00, 1.02, 0.98]), _point("A=2", [1.10, 1.12, 1.08]), _point("A=3", [0.5], ["x"])]
    found = regret_script.regret(points, "A=2")
    assert found["best"] == "A=1" and found["rank"] == 2 and found["timed"] == 2  # a failed point is not ranked
    assert found["regret"]["estimate"] == pytest.approx(1.10, rel=1e-3)
    assert found["regret"]["low"] < 1.10 < found["regret"]["high"] and found["regret"]["low"] > 1.0
    same = regret_script.regret(points, "A=1")
    assert same["regret"] == {"estimate": 1.0, "low": 1.0, "high": 1.0} and same["rank"] == 1
    assert regret_script.regret(points, "A=9")["regret"] is None


def test_summary_and_table_report_regret_and_the_share_of_gpu_time():
    points = [_point("A=1", [1.0, 1.0, 1.0]), _point("A=2", [1.1, 1.1, 1.1])]
    report = {"decided_by": "race", "builds": 0, "duration_s": 9.0, "exit_code": 0,
              "phases": [{"name": "probe", "seconds": 1.0}, {"name": "check", "seconds": 2.0},
                         {"name": "race", "seconds": 4.0}, {"name": "final check", "seconds": 1.0}]}
    row = regret_script.summary("softmax", points, report, regret_script.regret(points, "A=1"))
    assert (row["exhaustive_s"], row["tune_s"], row["share"], row["repeats"]) == (12.0, 7.0, 0.583, 3)
    text = regret_script.markdown({"device": "NVIDIA H100", "started_at": "2026-11-27T10:00:00+00:00",
                                   "total_s": 400, "tasks": [row]})
    assert "| softmax | 2 x 3 | A=1 | A=1 (1) | 1.000 [1.000, 1.000] | race | 7 s | 12 s | 0.583 | 0 |" in text
    pair = regret_script.regret([_point("A=1", [1.0, 1.1, 0.9]), _point("A=2", [1.1, 1.21, 0.99])], "A=2")
    assert pair["regret"]["estimate"] == pytest.approx(1.1) and pair["regret"]["low"] == pytest.approx(1.1)


def test_exhaustive_times_every_point_in_alternating_rounds_in_tunes_build(tmp_path):
    fake = Fake()
    order: list[tuple[str, dict]] = []
    task = load_task(TASK_DIR)

    def bench(path, task=None, record=True, env=None, label="", allow_cpu=False):
        order.append((tunespec.label(tunespec.parse(Path(path).read_text(), "v").default), env))
        assert record is False and label == "regret"
        return SimpleNamespace(report=fake.run(load_task(task), path, "benchmark", runner.RunOptions()))

    path = tmp_path / "chunksum.py"
    path.write_text(SUBMISSION.read_text())
    points = [{"label": f"CHUNK={c}", "values": {"CHUNK": c}, "build": "b" * 16 if c == 1 else "", "passed": True}
              for c in (1, 256, 1000, 4096)]
    ticks = iter(range(10**6))
    rows = regret_script.exhaustive(str(TASK_DIR), path, points, 3, deadline=10**9, build_root="/x/build",
                                    folder=tmp_path / "points", bench=bench, clock=lambda: float(next(ticks)))
    assert sorted(p.name for p in (tmp_path / "points").iterdir()) == [f"chunksum.00{i}.py" for i in range(4)]
    labels = [p["label"] for p in points]
    assert [label for label, _env in order] == labels + labels[::-1] + labels  # the order alternates
    assert order[0][1] == {"TORCH_EXTENSIONS_DIR": "/x/build/tune-" + "b" * 16} and order[1][1] == {}
    by = {r["label"]: r for r in rows}
    assert len(by["CHUNK=4096"]["scores"]) == 3 and by["CHUNK=1000"]["failures"] and not by["CHUNK=1000"]["scores"]
    assert regret_script.regret(rows, "CHUNK=4096")["rank"] == 1
    assert by["CHUNK=4096"]["scores"][0] == pytest.approx(math.sqrt(5e3 * 10e3) / 1e9, rel=0.02)  # geom, in s
    kept: list[int] = []  # what a run cut short has written: every repeat's evals, as each repeat ends
    short = regret_script.exhaustive(str(TASK_DIR), path, points, 5, deadline=-1.0, build_root="",
                                     folder=tmp_path / "again", bench=bench,
                                     on_repeat=lambda rows: kept.append(sum(len(r["eval_s"]) for r in rows)))
    assert all(len(r["eval_s"]) == regret_script.MIN_REPEATS for r in short)  # past the deadline: the least
    assert kept == [len(points), 2 * len(points)]


@pytest.mark.slow
def test_dry_run_writes_both_files(tmp_path, capsys):
    fixtures = sorted((ROOT / "tests" / "fixtures" / "tune").iterdir())
    assert regret_script.main(["--out", str(tmp_path), "--dry-run", "--repeats", "2", "--minutes", "4"]) == 0
    doc = json.loads((tmp_path / "regret.json").read_text())
    (row,) = doc["tasks"]
    assert row["points"] == 3 and row["repeats"] == 2  # the 3 points that passed their checks
    assert row["best"] in ("CHUNK=4096", "CHUNK=256")
    assert row["regret"] is not None and row["tune_builds"] == 0 and row["exhaustive_s"] > 0
    assert capsys.readouterr().out.startswith("`python3 scripts/gpu_tune_regret.py` on cpu (dry run)")
    assert sorted((ROOT / "tests" / "fixtures" / "tune").iterdir()) == fixtures  # nothing written beside the input


def test_exhaustive_spreads_a_repeats_evals_over_the_gpus_so_each_point_meets_each_gpu(tmp_path):
    import threading

    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def bench(path, task=None, record=True, env=None, label="", allow_cpu=False, device=None):
        with lock:
            seen.append((tunespec.label(tunespec.parse(Path(path).read_text(), "v").default), device))
        return SimpleNamespace(report=SimpleNamespace(outcome="failed"))  # a failure is enough here

    path = tmp_path / "chunksum.py"
    path.write_text(SUBMISSION.read_text())
    points = [{"label": f"CHUNK={c}", "values": {"CHUNK": c}, "build": "", "passed": True} for c in (1, 256, 4096)]
    rows = regret_script.exhaustive(str(TASK_DIR), path, points, 3, deadline=10**9, build_root="",
                                    folder=tmp_path / "points", bench=bench, devices=["0", "1", "2"])
    assert all(len(r["eval_s"]) == 3 and len(r["failures"]) == 3 for r in rows)
    for label in (p["label"] for p in points):
        assert sorted(d for lab, d in seen if lab == label) == ["0", "1", "2"], seen  # every GPU once
