"""Runs on one local Ray instance shared by this module (the library reuses a connection it finds): a killed
worker, a run past its deadline, forging attacks through a worker, an A/B pair, and the CLI's JSON."""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from popkit.distributed import ray_session
from popkit.distributed import scheduler as cluster
from popkit.model.tasks import load_task
from popkit.run import runner
from test_adversarial import ATTACKS, NO_PROBE, assert_nothing_left, attack_env, recorded, tamper_task, wait_until

FIX = Path(__file__).parent / "fixtures"
DOUBLE = FIX / "tasks" / "double"
SUBS = FIX / "submissions"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:
        # The workers keep the environment they start with: their cache (bundles, build index) is a test folder.
        patch.setenv("POPKIT_CACHE_DIR", str(tmp_path_factory.mktemp("worker-cache")))
        with ray_session.connect(None, lambda _msg: None) as session:
            yield session


def job(path: Path, task=None) -> cluster.Job:
    return cluster.Job((path,), (path.read_bytes(),), task or load_task(DOUBLE))


def _ray_worker_of(pid: int) -> int:
    """The Ray worker process above `pid` (its title is `ray::run_bundle`)."""
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().startswith(b"ray::"):
                return pid
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        pid = int(stat[stat.rindex(b")") + 2:].split()[1])
    raise AssertionError("no Ray worker above the eval")


def test_a_worker_killed_mid_run_fails_that_run_only_by_name(local_ray, tmp_path):
    log = tmp_path / "attack.log"
    killed = {}

    def kill_the_victims_worker() -> None:
        assert wait_until(lambda: any(role == "eval" for role, _, _ in recorded(log)), 60)
        eval_pid = next(pid for role, pid, _ in recorded(log) if role == "eval")
        killed["worker"] = _ray_worker_of(eval_pid)
        os.kill(killed["worker"], signal.SIGKILL)

    threading.Thread(target=kill_the_victims_worker, daemon=True).start()
    jobs = [job(SUBS / "good.py"), job(ATTACKS / "escape.py"), job(SUBS / "good.py")]
    run = cluster.run_jobs(jobs, "test", runner.RunOptions(precompile=False, env=attack_env(log), isolation="none"))
    good, victim, other = run.results
    assert "worker" in killed
    assert victim.outcome == "worker_lost" and victim.exit_code == 6
    assert victim.failure.startswith("worker lost: WorkerCrashedError: "), victim.failure
    assert good.outcome == other.outcome == "passed"
    assert run.exit_code == 6
    assert_nothing_left(log, within_s=10)  # the run's watchdog took its eval, grandchild and workdir along


def test_a_run_past_its_deadline_is_cancelled_as_timed_out(local_ray, tmp_path):
    log = tmp_path / "attack.log"
    never = replace(load_task(DOUBLE), test_timeout=600.0)  # the runner's own timeout would come first
    jobs = [job(ATTACKS / "escape.py", never), job(SUBS / "good.py")]
    # A deadline counts from the submission: a fresh worker process may take seconds to start on a busy machine.
    run = cluster.run_jobs(jobs, "test", runner.RunOptions(precompile=False, env=attack_env(log), isolation="none"), deadline_s=25)
    late, good = run.results
    assert (late.outcome, late.exit_code) == ("timed_out", 7)
    assert late.failure == ("timed out: no result from its worker within 25 s (cancelled; the worker process was "
                            "killed)")
    assert good.outcome == "passed"
    assert_nothing_left(log, within_s=10)


@pytest.mark.parametrize("attack, mode", [("late_pipe.py", "test"), ("tamper_import.py", "leaderboard")])
def test_a_forging_attack_fails_through_a_worker_as_it_does_here(local_ray, tmp_path, attack, mode):
    task = tamper_task(tmp_path / "task") if attack.startswith("tamper") else load_task(DOUBLE)
    options = runner.RunOptions(precompile=False, env=attack_env(tmp_path / "here.log"), secret_seeds=(5,),
                                isolation="none")  # the attacks log outside the workspace
    here = runner.run_submission(task, ATTACKS / attack, mode, options, system=NO_PROBE)
    log = tmp_path / "there.log"
    run = cluster.run_jobs([job(ATTACKS / attack, task)], mode, runner.RunOptions(
        precompile=False, env=attack_env(log), secret_seeds=(5,), isolation="none"))
    there = run.results[0].report
    assert here.outcome == "failed" and int(here.exit_code) == 1
    assert (there.outcome, int(there.exit_code)) == (here.outcome, int(here.exit_code))
    assert there.failure.summary == here.failure.summary
    assert [r.mode for r in there.runs] == [r.mode for r in here.runs]
    if attack == "late_pipe.py":
        assert there.runs[0].check == "fail"  # the late `check: pass` was not read on the worker either
        assert_nothing_left(log, within_s=10)


def test_an_ab_pair_runs_on_one_worker_and_both_sides_go_to_the_history(local_ray, tmp_path):
    a, b = SUBS / "good.py", tmp_path / "good_v2.py"
    b.write_bytes(a.read_bytes() + b"# v2\n")
    pair = cluster.Job((a, b), (a.read_bytes(), b.read_bytes()), load_task(DOUBLE))
    run = cluster.run_jobs([pair], "benchmark", runner.RunOptions(precompile=False), max_rounds=4, budget_s=0)
    (result,) = run.results
    assert (result.ab.a_path, result.ab.b_path) == (str(a), str(b))
    assert result.ab.rounds == 4 and not result.ab.failed_side and result.exit_code == 0
    assert result.ab.system["worker"]["pid"] == result.worker.pid  # both sides of every round: that process
    labels = [report.label for report, _ in result.history_reports()]
    assert labels == [f"A/B side A, against {b}; ray {result.worker.where}",
                      f"A/B side B, against {a}; ray {result.worker.where}"]


def test_the_cli_prints_one_json_document_and_records_every_run(local_ray, cli):
    result = cli("bench", str(SUBS / "good.py"), str(SUBS / "wrong.py"), "--task", str(DOUBLE), "--no-precompile",
                 "--cluster", "ray", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/cluster/1" and doc["exit_code"] == 1
    assert [(r["files"], r["outcome"]) for r in doc["results"]] == [([str(SUBS / "good.py")], "passed"),
                                                                     ([str(SUBS / "wrong.py")], "failed")]
    assert len(json.loads(cli("history", "--json").stdout)["runs"]) == 2


def test_require_gpu_refuses_workers_of_another_kind(local_ray, cli):
    result = cli("test", str(SUBS / "good.py"), "--task", str(DOUBLE), "--cluster", "ray", "--require-gpu", "H100")
    assert result.exit_code == 11, result.output
    assert "parity mismatch: the worker's device is cpu, --require-gpu asked for H100" in result.output


def test_pairs_make_each_two_files_one_ab(local_ray, cli, tmp_path):
    b = tmp_path / "good_v2.py"
    b.write_bytes((SUBS / "good.py").read_bytes() + b"# v2\n")
    result = cli("bench", str(SUBS / "good.py"), str(b), "--task", str(DOUBLE), "--no-precompile", "--cluster", "ray",
                 "--pairs", "--rounds", "4", "--budget", "0", "--json")
    assert result.exit_code == 0, result.output
    (only,) = json.loads(result.stdout)["results"]
    assert only["kind"] == "ab" and only["ab"]["rounds"] == 4 and only["report"] is None
    assert len(json.loads(cli("history", "--json").stdout)["runs"]) == 2  # each side, as a local A/B records them


def test_a_run_on_a_worker_sees_the_environment_of_a_local_run(local_ray, tmp_path):
    probe = tmp_path / "env_probe.py"
    probe.write_text("import os\n"
                     "RAY = sorted(k for k in os.environ if k.startswith('RAY_'))\n"
                     "OMP = os.environ.get('OMP_NUM_THREADS')\n\n\n"
                     "def custom_kernel(data):\n"
                     "    return 2 * data if not RAY and OMP is None else (RAY, OMP)\n")
    run = cluster.run_jobs([job(probe)], "test", runner.RunOptions(precompile=False))
    assert run.results[0].outcome == "passed", run.results[0].report.failure.summary
