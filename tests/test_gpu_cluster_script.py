"""scripts/gpu_cluster.py on the CPU: its plan, its checks and its table; the whole flow on CPU slots (slow)."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_cluster", ROOT / "scripts" / "gpu_cluster.py")
gpu_cluster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_cluster)


def test_eight_bundled_submissions_each_naming_its_task():
    assert len(gpu_cluster.FILES) == 8
    for rel in gpu_cluster.FILES:
        task = rel.split("/")[1]
        assert f"#!POPCORN leaderboard {task}" in (ROOT / rel).read_text()


def test_the_checks_want_every_gpu_every_verdict_and_a_named_worker():
    files = ["a.py", "b.py"]
    rows = [{"file": "a.py", "outcome": "passed", "gpus": ["0"], "named": True},
            {"file": "b.py", "outcome": "failed", "gpus": ["1"], "named": True}]
    good = gpu_cluster.check(rows, ["passed", "failed"], files, 2)
    assert good == {"all_results": True, "verdicts_equal": True, "gpus_used": ["0", "1"], "every_gpu_used": True,
                    "reports_name_worker": True}
    one_gpu = [dict(row, gpus=["0"]) for row in rows]
    assert not gpu_cluster.check(one_gpu, ["passed", "failed"], files, 2)["every_gpu_used"]
    assert not gpu_cluster.check(rows, ["passed", "passed"], files, 2)["verdicts_equal"]
    assert not gpu_cluster.check(rows[:1], ["passed", "failed"], files, 2)["all_results"]


def _bench_doc(key: str, durations: list[float], start: str = "2026-11-27T10:00:00+00:00") -> dict:
    """A phase's `popkit bench --json`: runs that each start where the one before ended."""
    t, runs = datetime.fromisoformat(start), []
    for d in durations:
        runs.append({"report": {"started_at": t.isoformat(), "duration_s": d}})
        t += timedelta(seconds=d)
    return {key: runs}


def test_the_table_gives_each_phase_its_ratio_to_the_mean_of_one_after_another():
    rows = [{"file": "a.py", "outcome": "passed", "gpus": ["1"], "named": True}]
    checks = gpu_cluster.check(rows, ["passed"], ["a.py"], 1)
    result = {"files": ["a.py"], "gpus": 2, "card": "NVIDIA H100 80GB HBM3", "ray": "2.60.0",
              "warm": {"seconds": 61.0}, "local": ["passed"],
              "phases": {"sequential": {"seconds": 110.0, "doc": _bench_doc("runs", [50.0, 55.0])},
                         "embedded": {"seconds": 55.0, "rows": rows, "checks": checks},
                         "joined": {"seconds": 48.0, "rows": rows, "checks": checks},
                         "sequential_after": {"seconds": 90.0, "checks": {"verdicts_equal": False}}}}
    text = gpu_cluster.markdown(result)
    assert "One after another on one GPU: 100.0 s, the mean of the `--gpus 0` phases." in text
    assert "| `--gpus 0` (one GPU, one after another) | 110.0 | 1.10 | 105.0 | 105.0 | 0 | yes | yes |" in text
    assert "| `--cluster ray` (local instance, start-up included) | 55.0 | 0.55 | - | - | 1 | yes | yes |" in text
    assert "| `--cluster ray:ADDRESS` (head started before) | 48.0 | 0.48 | - | - | 1 | yes | yes |" in text
    assert "| `--gpus 0` again, after the cluster phases | 90.0 | 0.90 | - | - | 0 | **no** | yes |" in text
    assert "| a.py | passed | passed (1) | passed (1) |" in text


def test_run_times_sum_the_reports_and_span_first_start_to_last_end():
    doc = _bench_doc("results", [2.0, 3.0])
    doc["results"].append({"report": {"started_at": "2026-11-27T10:00:01+00:00", "duration_s": 1.0}})  # overlaps
    times = gpu_cluster.run_times({"doc": doc})
    assert times == {"sum": 6.0, "span": 5.0}
    assert gpu_cluster.run_times({"doc": None}) == {}


def test_a_dry_run_writes_the_plan(tmp_path):
    assert gpu_cluster.main(["--out", str(tmp_path), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert doc["files"] == list(gpu_cluster.FILES)
    assert doc["plan"][-2] == "stop the head" and "--gpus 0" in doc["plan"][-1]


def test_a_missing_ray_archive_is_said(tmp_path, capsys):
    assert gpu_cluster.main(["--out", str(tmp_path), "--ray-tar", str(tmp_path / "no.tar.xz")]) == 2
    assert "ray-for-device.sh" in capsys.readouterr().err


@pytest.mark.slow
def test_the_whole_flow_on_cpu_slots(tmp_path):
    pytest.importorskip("ray")
    subs = "tests/fixtures/submissions/"
    code = gpu_cluster.main(["--out", str(tmp_path), "--cpu", "--task", "tests/fixtures/tasks/double",
                             "--files", subs + "good.py", subs + "wrong.py", subs + "crash.py"])
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert code == 0, {k: v.get("stderr_tail") for k, v in doc["phases"].items()}
    assert doc["local"] == ["passed", "failed", "crashed"]
    for phase in ("embedded", "joined"):
        assert [row["outcome"] for row in doc["phases"][phase]["rows"]] == ["passed", "failed", "crashed"]
    assert doc["phases"]["sequential_after"]["checks"]["verdicts_equal"]
    assert doc["bytecode"]["exit"] == 0
    assert (tmp_path / "cluster.md").read_text().startswith("`--cluster` on 0x CPU")


def test_pairs_give_each_ratio_and_their_sum_ratio():
    rows = [{"file": "a.py", "outcome": "passed", "gpus": ["0", "1"], "named": True}]
    checks = gpu_cluster.check(rows, ["passed"], ["a.py"], 1)
    seq = lambda s: {"seconds": s, "checks": {"verdicts_equal": True}}  # noqa: E731
    emb = lambda s: {"seconds": s, "rows": rows, "checks": checks}  # noqa: E731
    pairs = [{"order": ["sequential", "embedded"], "sequential": {"seconds": 100.0}, "embedded": emb(50.0)},
             {"order": ["embedded", "sequential"], "sequential": seq(80.0), "embedded": emb(60.0)}]
    result = {"files": ["a.py"], "gpus": 2, "card": "H", "ray": "2.60.0", "warm": {"seconds": 1.0},
              "local": ["passed"], "phases": {"sequential": pairs[0]["sequential"]}, "pairs": pairs,
              "summary": gpu_cluster.pair_summary(pairs)}
    assert result["summary"]["ratios"] == [0.5, 0.75] and result["summary"]["sum_ratio"] == 110 / 180
    text = gpu_cluster.markdown(result)
    assert "| 2 | embedded | 80.0 | 60.0 | 0.75 | - | yes |" in text
    assert "`--cluster ray`: sum ratio 0.611; median of the ratios 0.625 (0.50-0.75)." in text
    assert "`--gpus 0,1`" not in text and "spread" not in result["summary"]
    assert gpu_cluster.passed(result)
    pairs[1]["sequential"]["checks"]["verdicts_equal"] = False
    assert not gpu_cluster.passed(result)
    pairs[1]["sequential"]["checks"]["verdicts_equal"] = True
    pairs[1]["embedded"]["checks"] = {**checks, "every_gpu_used": False}
    assert not gpu_cluster.passed(result)


def test_spread_is_the_third_of_each_group_with_its_own_ratios_and_checks():
    rows = [{"file": "a.py", "outcome": "passed", "gpus": ["0", "1"], "named": True}]
    checks = gpu_cluster.check(rows, ["passed"], ["a.py"], 1)
    par = lambda s: {"seconds": s, "checks": {"verdicts_equal": True, "gpus_used": ["0", "1"],  # noqa: E731
                                              "every_gpu_used": True}}
    groups = [{"order": ["sequential", "embedded", "spread"], "sequential": {"seconds": 100.0},
               "embedded": {"seconds": 60.0, "rows": rows, "checks": checks}, "spread": par(50.0)},
              {"order": ["embedded", "spread", "sequential"],
               "sequential": {"seconds": 80.0, "checks": {"verdicts_equal": True}},
               "embedded": {"seconds": 50.0, "rows": rows, "checks": checks}, "spread": par(44.0)}]
    summary = gpu_cluster.pair_summary(groups)
    assert summary["spread"]["ratios"] == [0.5, 0.55] and summary["spread"]["sum_ratio"] == 94 / 180
    result = {"files": ["a.py"], "gpus": 2, "card": "H", "ray": "2.60.0", "warm": {"seconds": 1.0},
              "local": ["passed"], "phases": {"sequential": groups[0]["sequential"]}, "pairs": groups,
              "summary": summary}
    text = gpu_cluster.markdown(result)
    assert "| 2 | embedded | 80.0 | 50.0 | 0.62 | 44.0 | 0.55 | - / - | yes |" in text
    assert "`--gpus 0,1`: sum ratio 0.522; median of the ratios 0.525 (0.50-0.55)." in text
    assert gpu_cluster.passed(result)
    groups[1]["spread"]["checks"]["every_gpu_used"] = False
    assert not gpu_cluster.passed(result)


def test_spread_needs_pairs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_cluster.main(["--out", str(tmp_path), "--spread", "--dry-run"])
    assert stop.value.code == 2 and "--spread goes with --pairs N" in capsys.readouterr().err


@pytest.mark.slow
def test_pairs_on_cpu_slots(tmp_path):
    pytest.importorskip("ray")
    subs = "tests/fixtures/submissions/"
    code = gpu_cluster.main(["--out", str(tmp_path), "--cpu", "--task", "tests/fixtures/tasks/double", "--pairs", "3",
                             "--spread", "--files", subs + "good.py", subs + "wrong.py"])
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert code == 0
    assert [pair["order"] for pair in doc["pairs"]] == [["sequential", "embedded", "spread"],
                                                        ["embedded", "spread", "sequential"],
                                                        ["spread", "sequential", "embedded"]]
    assert len(doc["summary"]["ratios"]) == 3 and len(doc["summary"]["spread"]["ratios"]) == 3
    assert all(pair["spread"]["checks"]["gpus_used"] == ["0", "1"] for pair in doc["pairs"])
    assert "joined" not in doc["phases"]
    assert "| 3 | spread |" in (tmp_path / "cluster.md").read_text()
