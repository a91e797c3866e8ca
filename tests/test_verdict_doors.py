"""Every door a verdict leaves popkit by, driven by the verdict cheats on the CPU: `popkit test`, `bench
--leaderboard`, an A/B, `tune`, `submit --gate`, MCP `test`/`bench` with `source`, and `--cluster ray`.

A cheat that takes over the worker (submissions/cheats/: `tensor_int`, `judge_swap`, `json_forge`,
`channel_takeover` hand over wrong results; `measure_forge` reports 1.2 µs for a kernel that sleeps 20 ms)
must fail by the name of its class at every door, judged on the sealed side (`judged: sealed`), never pass,
never be picked, never be handed to popcorn-cli. docs/sealed-run.md keeps the door table.

The cheats are written for vectoradd; here each cheat's mechanism (the file above its custom_kernel) is put in
front of the task's own honest kernel (submissions/TASK/pytorch.py), whose output the cheat then replaces by 7s
(a wrong result) or delays by 20 ms (a forged time), so the same cheat runs on every bundled task (the files of
scripts/gpu_verdict_doors.py, which drives them through the same doors on a GPU). The tasks are
copies of the bundled ones with small cases and no `gpus` (a CPU then runs their own cases, with no sizing
probe before the chain), their eval still popkit's harness, byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from popkit.cli import app
from popkit.mcpserver import worker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_verdict_doors", ROOT / "scripts" / "gpu_verdict_doors.py")
doors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doors)
FAKE_POPCORN = doors.FAKE_POPCORN
SMALL_CASES = {
    "identity": [{"size": 1, "seed": 11}, {"size": 1000, "seed": 12}],
    "vectoradd": [{"size": 1, "seed": 21}, {"size": 17, "seed": 22}],
    "grayscale": [{"height": 1, "width": 1, "seed": 31}, {"height": 17, "width": 33, "seed": 32}],
    "vectorsum": [{"size": 1, "seed": 41}, {"size": 4099, "seed": 42}],
    "softmax": [{"rows": 1, "cols": 1, "seed": 51}, {"rows": 17, "cols": 129, "seed": 52}],
    "matmul": [{"m": 1, "n": 1, "k": 1, "seed": 61}, {"m": 17, "n": 33, "k": 65, "seed": 62}],
}
TASKS = list(SMALL_CASES)
WRONG = doors.WRONG  # cheat -> the name its failure carries: `elements mismatch`, `no output`
FORGED = "time forged"  # the CPU has no trace audit: its time witness names a lowered time (doors.FORGED on a GPU)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """The bundled tasks, copied with small cases and without `gpus`."""
    root = tmp_path_factory.mktemp("doors") / "tasks"
    shutil.copytree(ROOT / "tasks", root)
    for name, cases in SMALL_CASES.items():
        yml = root / name / "task.yml"
        doc = yaml.safe_load(yml.read_text())
        doc.update(tests=cases, benchmarks=cases[-1:])
        for key in ("gpus", "templates"):
            doc.pop(key, None)
        yml.write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "ledger"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("NO_COLOR", "1")


def cheat_file(cheat: str, task: str, folder: Path) -> Path:
    """`cheat`'s mechanism in front of `task`'s kernel (scripts/gpu_verdict_doors.py writes the same files)."""
    path = folder / f"{task}_{cheat}.py"
    path.write_text(doors.cheat_source(cheat, task))
    return path


def cli(*args: str, env: dict | None = None):
    result = CliRunner().invoke(app, list(args), env=env)
    return result, (json.loads(result.stdout) if result.stdout.lstrip().startswith("{") else None)


def errors_of(run: dict) -> list[str]:
    return [c["error"] for c in run["tests"] + run["benchmarks"] if not c["passed"]]


def assert_failed_by_name(doc: dict, expected: str) -> None:
    """A run document (popkit/run/1) that failed, judged on the sealed side, every failing case by `expected`."""
    assert doc["schema"] == "popkit/run/1", doc
    failing = [e for run in doc["runs"] for e in errors_of(run)]
    assert doc["outcome"] == "failed" and doc["exit_code"] == 1, (doc["outcome"], failing)
    assert doc["judged"] == "sealed", doc["harness"]
    assert failing and all(expected in e for e in failing), failing
    assert doc["score_public_s"] is None


# ----------------------------------------------------------------------------------- test, bench --leaderboard


@pytest.mark.parametrize("cheat", list(WRONG))
@pytest.mark.parametrize("task", TASKS)
def test_popkit_test_fails_every_wrong_result_cheat_by_name(tasks, task, cheat, tmp_path):
    result, doc = cli("test", str(cheat_file(cheat, task, tmp_path)), "--task", str(tasks / task), "--json")
    assert result.exit_code == 1, result.output
    assert_failed_by_name(doc, WRONG[cheat])


@pytest.mark.parametrize("task", TASKS)
def test_bench_leaderboard_fails_the_forged_time_by_name(tasks, task, tmp_path):
    """The kernel is right, so its tests pass; its first timed mode fails on the trusted clock."""
    result, doc = cli("bench", str(cheat_file("measure_forge", task, tmp_path)), "--task", str(tasks / task),
                      "--leaderboard", "--json")
    assert result.exit_code == 1, result.output
    assert [(r["mode"], r["outcome"]) for r in doc["runs"]] == [("test", "passed"), ("benchmark", "failed")]
    assert_failed_by_name(doc, FORGED)


@pytest.mark.parametrize("cheat", list(WRONG))
@pytest.mark.parametrize("task", ["matmul"])
def test_bench_leaderboard_fails_every_wrong_result_cheat_by_name(tasks, task, cheat, tmp_path):
    result, doc = cli("bench", str(cheat_file(cheat, task, tmp_path)), "--task", str(tasks / task),
                      "--leaderboard", "--json")
    assert result.exit_code == 1, result.output
    assert_failed_by_name(doc, WRONG[cheat])


# ------------------------------------------------------------------------------------------------ the A/B


@pytest.mark.parametrize("cheat", ["tensor_int", "measure_forge"])
def test_an_ab_fails_the_cheating_side_by_name_and_names_no_winner(tasks, cheat, tmp_path):
    task = "vectoradd"
    result, doc = cli("bench", str(ROOT / "submissions" / task / "pytorch.py"), str(cheat_file(cheat, task, tmp_path)),
                      "--task", str(tasks / task), "--rounds", "4", "--budget", "0", "--json")
    assert result.exit_code == 1, result.output
    assert doc["schema"] == "popkit/ab/2" and doc["failed_side"] == "B" and doc["failure_outcome"] == "failed", doc
    failing = errors_of(doc["failure"])
    expected = FORGED if cheat == "measure_forge" else WRONG[cheat]
    assert failing and all(expected in e for e in failing), failing
    assert "trusted-verdict" in doc["failure"]["raw"]["trust.checks"].split(",") and doc["judged"] == "sealed"
    assert doc["stopped"] == "failed" and not doc["score"]["b_ns"], doc["score"]  # no time of the cheat counted


# ------------------------------------------------------------------------------------------------ tune


def tunable(task: str, folder: Path) -> Path:
    """One file, three variants: CHEAT=0 honest, CHEAT=1 tensor_int, CHEAT=2 measure_forge."""
    path = folder / f"{task}_tunable.py"
    path.write_text(doors.tunable_source(task))
    return path


@pytest.mark.parametrize("race", ["cold", "warm"])
def test_tune_drops_each_cheating_variant_by_name_and_never_picks_one(tasks, tmp_path, race, monkeypatch):
    """Cold race evals, and warm ones (pairs started ahead, as on a machine of 8 CPUs or more)."""
    from popkit.run import warm
    from popkit.tuning import ahead

    monkeypatch.setattr(ahead, "ahead_depth", lambda cpus=None: 2 if race == "warm" else 0)
    gone, real_go = [], warm.WarmPair.go
    monkeypatch.setattr(warm.WarmPair, "go", lambda self, *a, **k: gone.append(self.mode) or real_go(self, *a, **k))
    task, out = "vectoradd", tmp_path / "tuned.py"
    result, doc = cli("tune", str(tunable(task, tmp_path)), "--task", str(tasks / task), "-o", str(out),
                      "--confirm", "1", "--rounds", "4", "--json", "--no-history")  # the default harness: popkit
    assert result.exit_code == 0, result.output
    assert doc["harness"] == "popkit"
    variants = {v["label"]: v for v in doc["variants"]}
    wrong, forged = variants["CHEAT=1"], variants["CHEAT=2"]
    assert wrong["outcome"] == "failed" and WRONG["tensor_int"] in wrong["message"], wrong
    # measure_forge's results are right, so its check passes; its first race round fails it on the trusted clock
    assert forged["outcome"] == "passed" and FORGED in forged["race_failure"] and not forged["rounds"], forged
    assert variants["CHEAT=0"]["outcome"] == "passed" and variants["CHEAT=0"]["rounds"]
    assert doc["winner_label"] == "CHEAT=0" and "\nCHEAT = 0\n" in out.read_text()
    assert bool(gone) == (race == "warm") and set(gone) <= {"benchmark"}


# ------------------------------------------------------------------------------------------- submit --gate


@pytest.fixture
def popcorn(tmp_path) -> dict:
    """The environment of a submit that reaches the fake popcorn-cli (which logs every call it gets)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".popcorn.yaml").write_text("cli_id: test-id\n")
    return {"POPKIT_POPCORN": str(FAKE_POPCORN), "HOME": str(home), "FAKE_POPCORN_LOG": str(tmp_path / "calls.jsonl"),
            "FAKE_POPCORN": "success", "POPKIT_HOME": os.environ["POPKIT_HOME"]}


def said_why(path: Path) -> Path:
    """`path` with each line that reaches the harness's module saying why (lint then warns instead of refusing)."""
    lines = [line + "  # popkit: allow sys-modules -- a door test" if "sys.modules" in line or "__mp_main__" in line
             else line for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("cheat,gate,said", [("tensor_int", "test", False), ("measure_forge", "leaderboard", True)])
def test_submit_gate_refuses_to_hand_a_cheat_to_popcorn(tasks, popcorn, cheat, gate, said, tmp_path):
    path = cheat_file(cheat, "vectoradd", tmp_path)
    result, doc = cli("submit", str(said_why(path) if said else path), "--task", str(tasks / "vectoradd"),
                      "--gate", gate, "--no-guard", "--json", env=popcorn)
    assert result.exit_code == 1, result.output
    assert not Path(popcorn["FAKE_POPCORN_LOG"]).exists(), "popcorn-cli was called"
    assert doc["remote"] is None
    assert_failed_by_name(doc["gate"], FORGED if cheat == "measure_forge" else WRONG[cheat])


def test_submit_refuses_a_file_that_reaches_the_harness_before_any_gate(tasks, popcorn, tmp_path):
    result, doc = cli("submit", str(cheat_file("measure_forge", "vectoradd", tmp_path)), "--task",
                      str(tasks / "vectoradd"), "--gate", "leaderboard", "--no-guard", "--json", env=popcorn)
    assert result.exit_code == 8 and "reads `sys.modules`" in doc["message"], result.output
    assert not Path(popcorn["FAKE_POPCORN_LOG"]).exists(), "popcorn-cli was called"


# ------------------------------------------------------------------------------------------------- MCP


def mcp(tool: str, arguments: dict) -> dict:
    """The document an MCP tool call answers (the server's worker runs it as here)."""
    import io

    out = io.StringIO()
    worker.serve_one({"tool": tool, "arguments": arguments}, worker.Reporter(out))
    (line,) = [json.loads(x) for x in out.getvalue().splitlines() if '"done"' in x or '"error"' in x]
    return line.get("done") or line.get("error")


@pytest.mark.parametrize("cheat", ["tensor_int", "judge_swap"])
def test_mcp_test_with_source_fails_a_wrong_result_by_name(tasks, cheat, tmp_path):
    source = cheat_file(cheat, "softmax", tmp_path).read_text()
    doc = mcp("test", {"source": source, "task": str(tasks / "softmax"), "history": False})
    assert doc["harness"] == "popkit"  # the agents' default
    assert_failed_by_name(doc, WRONG[cheat])


def test_mcp_bench_with_source_fails_a_forged_time_by_name(tasks, tmp_path):
    source = cheat_file("measure_forge", "softmax", tmp_path).read_text()
    doc = mcp("bench", {"source": source, "task": str(tasks / "softmax"), "leaderboard": True, "history": False})
    assert_failed_by_name(doc, FORGED)


# --------------------------------------------------------------------------------------------- --cluster ray


def test_cluster_ray_fails_every_cheat_by_name(tasks, tmp_path):
    pytest.importorskip("ray", reason="--cluster ray needs ray (pip install 'popkit[ray]')")
    task = "vectoradd"
    files = [cheat_file(c, task, tmp_path) for c in ("tensor_int", "measure_forge")]
    # Ray's processes import popkit where they start: the popkit under test first on their path (as test_cluster)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    result, doc = cli("bench", *map(str, files), "--task", str(tasks / task), "--leaderboard", "--no-precompile",
                      "--cluster", "ray", "--json", env={"PYTHONPATH": path})
    assert result.exit_code == 1, result.output
    assert doc["schema"] == "popkit/cluster/1" and len(doc["results"]) == 2, doc
    for result_doc, expected in zip(doc["results"], (WRONG["tensor_int"], FORGED)):
        assert result_doc["outcome"] == "failed", result_doc
        assert_failed_by_name({**result_doc["report"], "schema": "popkit/run/1"}, expected)
