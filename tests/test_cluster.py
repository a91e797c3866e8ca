"""`--cluster`: the bundle, parity, addresses and the CLI's refusals (no Ray started), then the whole CLI on a
local Ray instance (12 runs against the same runs made one by one; Ctrl-C leaves nothing behind)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

import popkit
from popkit.distributed import bundle
from popkit.distributed import parity
from popkit.distributed import ray_local
from popkit.distributed import ray_session
from popkit.distributed import scheduler as cluster
from popkit.errors import EnvironmentProblem, ExitCode, UsageError
from popkit.machine import nvml
from popkit.model.results import ModeRun, RunReport
from popkit.model.tasks import load_task, resolve_task
from popkit.run import runner
from popkit.views import cluster as view
from test_adversarial import ATTACKS, alive, assert_nothing_left, attack_env, recorded, wait_until
from test_nvml import H100, FakeNvml

ROOT = Path(popkit.__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"
DOUBLE = FIX / "tasks" / "double"
SUBS = FIX / "submissions"


# ------------------------------------------------------------------------------------- the bundle


def test_a_bundle_keeps_the_task_files_paths_relative_to_its_root_and_runs_the_same(tmp_path):
    task = load_task(DOUBLE)
    files = bundle.task_files(task)
    assert files.task_dir == "double"
    assert [rel for rel, _ in files.files] == ["common/tiny_eval.py"]  # `../common/tiny_eval.py` kept
    assert files.names == (("eval.py", "common/tiny_eval.py"),)
    folder = bundle.unpack(files, tmp_path / "cache")
    assert folder == tmp_path / "cache" / "bundles" / files.digest
    made = bundle.Bundle(task, files.digest, ((str(SUBS / "good.py"), (SUBS / "good.py").read_bytes()),),
                         "benchmark", runner.RunOptions(precompile=False), popkit="x")
    moved = bundle.task_in(made, files, folder)
    assert moved.path == (folder / "double").resolve() and moved.files[1].source == "../common/tiny_eval.py"
    there = runner.run_submission(moved, SUBS / "good.py", "benchmark", runner.RunOptions(precompile=False),
                                  system={"device": "cpu"})
    here = runner.run_submission(task, SUBS / "good.py", "benchmark", runner.RunOptions(precompile=False),
                                 system={"device": "cpu"})
    assert there.outcome == here.outcome == "passed" and there.score_public_s == here.score_public_s


def test_a_cached_bundle_that_a_run_changed_is_unpacked_again(tmp_path):
    files = bundle.task_files(load_task(DOUBLE))
    folder = bundle.unpack(files, tmp_path)
    (folder / "common" / "tiny_eval.py").write_text("print('forged')\n")
    assert bundle.unpack(files, tmp_path) == folder
    assert (folder / "common" / "tiny_eval.py").read_bytes() == files.files[0][1]


def test_a_bundle_path_that_leaves_it_is_refused(tmp_path):
    files = bundle.TaskFiles("t", (("../outside.py", b"x"),), (("eval.py", "../outside.py"),))
    with pytest.raises(popkit.errors.TaskError, match="file path `../outside.py` leaves the bundle"):
        bundle.unpack(files, tmp_path)
    assert not (tmp_path / "outside.py").exists()


def test_the_bundle_digest_names_every_input():
    task = load_task(DOUBLE)
    files = bundle.task_files(task)
    base = bundle.Bundle(task, files.digest, (("a.py", b"x"),), "test", runner.RunOptions(), popkit="1")
    assert base.digest == replace(base).digest
    for changed in (replace(base, submissions=(("a.py", b"y"),)), replace(base, mode="benchmark"),
                    replace(base, options=runner.RunOptions(secret_seeds=(5,))), replace(base, popkit="2"),
                    replace(base, require_gpu="H100"), replace(base, task=replace(task, test_timeout=3.0))):
        assert changed.digest != base.digest


# ------------------------------------------------------------------------------------------ parity


def test_parity_refuses_another_popkit_or_gpu_kind():
    found = {"device": "NVIDIA H100 80GB HBM3", "popkit": "0.1.0+abc"}
    assert parity.refusal(found, "0.1.0+abc", "H100") == ""
    assert parity.refusal(found, "0.1.0+abc", "h100") == ""
    assert parity.refusal(found, "0.1.0+def", None) == (
        "parity mismatch: the worker runs popkit 0.1.0+abc, the run was sent by popkit 0.1.0+def "
        "(install the same popkit on every node)")
    assert parity.refusal(found, "0.1.0+abc", "A100") == (
        "parity mismatch: the worker's device is NVIDIA H100 80GB HBM3, --require-gpu asked for A100")
    assert not parity.matches("NVIDIA GH200 480GB", "H100")  # the table's order: GH200 is not an H100
    assert parity.matches("NVIDIA GeForce RTX 4090", "4090")  # a card the table does not know: by its name
    assert parity.differences([{"device": "A", "torch": "2"}, {"device": "B", "torch": "2"}]) == ["device: A, B"]


def test_the_driver_version_comes_from_nvml():
    class Driver(FakeNvml):
        def _nvmlSystemGetDriverVersion(self, buf, length):
            buf.value = b"580.65.06"
            return 0

    lib = Driver([H100])
    assert nvml.driver_version(lib) == "580.65.06" and lib.shut
    assert nvml.system_driver_version("libno-such-nvml.so") is None


def test_the_popkit_identity_is_the_version_and_a_digest_of_the_code():
    identity = parity.popkit_identity()
    assert identity.startswith(popkit.__version__ + "+") and len(identity.split("+")[1]) == 12


# ------------------------------------------------------------------------------- addresses, errors


def test_cluster_addresses():
    assert ray_session.address_of("ray", env={}) is None
    assert ray_session.address_of("ray", env={"RAY_ADDRESS": "10.0.0.5:6379"}) == "10.0.0.5:6379"
    assert ray_session.address_of("ray:10.0.0.5:6379", env={"RAY_ADDRESS": "x:1"}) == "10.0.0.5:6379"
    assert ray_session.address_of("ray:local", env={}) is None
    with pytest.raises(UsageError, match="unknown cluster `slurm`"):
        ray_session.address_of("slurm:x")
    with pytest.raises(UsageError, match="no address after `ray:`"):
        ray_session.address_of("ray:")
    with pytest.raises(UsageError, match="not HOST:PORT"):
        ray_session.check_reachable("gpubox")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_cluster_is_exit_11_naming_the_address():
    port = _closed_port()
    with pytest.raises(EnvironmentProblem) as caught:
        ray_session.check_reachable(f"127.0.0.1:{port}")
    assert caught.value.message.startswith(f"cannot reach the Ray cluster at 127.0.0.1:{port}: ")
    assert caught.value.exit_code == ExitCode.ENVIRONMENT


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="needs Ray: pip install 'popkit[ray]' (without it the CLI says so first; CI installs it)")
def test_the_cli_says_an_unreachable_address_and_nothing_runs(cli):
    port = _closed_port()
    result = cli("bench", str(SUBS / "good.py"), "--task", str(DOUBLE), "--cluster", f"ray:127.0.0.1:{port}",
                 "--json")
    assert result.exit_code == 11, result.output
    doc = json.loads(result.stdout)
    assert doc["message"].startswith(f"cannot reach the Ray cluster at 127.0.0.1:{port}")
    assert "ray start --head" in doc["hint"]


def test_without_ray_the_cluster_is_exit_11_with_the_install_line(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from popkit.cli import main\n"
            f"sys.argv = ['popkit', 'test', {str(SUBS / 'good.py')!r}, '--task', {str(DOUBLE)!r}, '--cluster', 'ray']\n"
            "main()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POPKIT_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 11, done.stderr
    assert "error: --cluster ray needs Ray, which is not installed here" in done.stderr
    assert "install it with: pip install 'popkit[ray]'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args,message", [
    (["test", "good.py", "wrong.py"], "test takes one submission (2 given); several run with --gpus or --cluster"),
    (["bench", "good.py", "--json-lines"], "--json-lines goes with --cluster"),
    (["bench", "good.py", "--require-gpu", "H100"], "--require-gpu goes with --cluster"),
    (["bench", "good.py", "wrong.py", "--pairs"], "--pairs goes with --cluster"),
    (["bench", "good.py", "--cluster", "ray", "--gpus", "0,1"], "--gpus does not run on a cluster"),
    (["bench", "good.py", "--cluster", "ray", "--baseline", "reference"], "--baseline does not run on a cluster"),
    (["test", "good.py", "--cluster", "ray", "--hip-on-cuda"], "--hip-on-cuda does not run on a cluster"),
    (["bench", "good.py", "--cluster", "ray", "--json", "--json-lines"], "--json and --json-lines are two"),
    (["bench", "good.py", "--cluster", "ray", "--keep-workdir"], "--keep-workdir would keep the folder on the"),
    (["bench", "good.py", "wrong.py", "good.py", "--cluster", "ray", "--pairs"], "--pairs runs A/Bs in benchmark"),
    (["bench", "good.py", "--cluster", "slurm"], "--cluster slurm: unknown cluster `slurm`"),
])
def test_cluster_options_that_do_not_fit_are_usage_errors(cli, args, message):
    args = [str(SUBS / a) if a.endswith(".py") else a for a in args]
    result = cli(*args, "--task", str(DOUBLE))
    assert result.exit_code == 2, result.output
    assert message in result.output and "hint" in result.output  # --json: the error as a JSON document


def test_a_cuda_build_on_a_cluster_without_gpus_is_refused_before_anything_runs():
    job = cluster.Job((Path("k.py"),), (b"load_inline(cuda_sources=src)\ndef custom_kernel(d): pass\n",),
                      load_task(DOUBLE))
    with pytest.raises(EnvironmentProblem, match="k.py: builds a CUDA extension, and the Ray cluster has no GPU"):
        cluster.gpus_for(job, "test", runner.RunOptions(), 0, 0, allow_cpu=False)
    vectoradd = resolve_task("vectoradd")
    pytorch = cluster.Job((Path("p.py"),), (b"def custom_kernel(d): return d\n",), vectoradd)
    with pytest.raises(EnvironmentProblem, match="the Ray cluster has no GPU, and the benchmarks of `vectoradd`"):
        cluster.gpus_for(pytorch, "benchmark", runner.RunOptions(), 0, 0, allow_cpu=False)
    assert cluster.gpus_for(pytorch, "test", runner.RunOptions(), 0, 0, allow_cpu=False) == 0
    assert cluster.gpus_for(pytorch, "benchmark", runner.RunOptions(), 2, 2, allow_cpu=False) == 1
    assert cluster.gpus_for(cluster.Job((Path("g.py"),), (b"",), load_task(DOUBLE)), "test", runner.RunOptions(),
                            2, 2, allow_cpu=False) == 0  # a task made for the CPU takes a CPU slot


def test_a_deadline_adds_up_every_timeout_of_the_run():
    job = cluster.Job((Path("g.py"),), (b"",), load_task(DOUBLE))  # 20 s per mode
    assert cluster.deadline_for(job, "leaderboard", runner.RunOptions(secret_seeds=(1,)), 8) == \
        runner.PRECOMPILE_TIMEOUT_S + 2 * 60 + cluster.GRACE_S
    assert cluster.deadline_for(job, "test", runner.RunOptions(precompile=False), 8) == 20 + cluster.GRACE_S


# ------------------------------------------------------------------------------ results and views


WORKER = {"host": "gpubox", "node_ip": "10.0.0.5", "node_id": "ab" * 28, "pid": 4242, "gpus": ["1"],
          "facts": {"device": "NVIDIA H100 80GB HBM3", "driver": "580.65.06", "torch": "2.8.0", "cuda": "12.8",
                    "popkit": "0.1.0+x"}}


def _report(outcome: str = "passed") -> RunReport:
    run = ModeRun(mode="test", secret=False, seed=None, exit_code=0 if outcome == "passed" else 112,
                  duration_s=1.0, timeout_s=20, check="pass" if outcome == "passed" else "fail", outcome=outcome,
                  summary="" if outcome == "passed" else "check failed: test, test 0: expected 2, got 3")
    return RunReport(task="double", task_path="/t", leaderboard=None, ranking_by="geom", submission="a.py",
                     sha256="0", mode="test", harness="task", started_at="2026-01-01T00:00:00+00:00", duration_s=1.5,
                     system={"device": "NVIDIA H100 80GB HBM3"}, runs=(run,))


def test_a_worker_answer_becomes_a_result_that_names_its_worker():
    job = cluster.Job((Path("a.py"),), (b"x",), load_task(DOUBLE))
    result = cluster.from_worker(0, job, {"worker": WORKER, "report": _report().to_json()})
    assert result.outcome == "passed" and result.exit_code == 0
    assert result.report.label == "ray gpubox GPU 1"
    assert result.report.system["worker"]["pid"] == 4242
    assert result.report.notes[-1].startswith("ran on Ray worker gpubox GPU 1 (pid 4242, node abababababab): "
                                              "NVIDIA H100 80GB HBM3, driver 580.65.06, torch 2.8.0, CUDA 12.8")
    refused = cluster.from_worker(1, job, {"worker": WORKER, "refused": "parity mismatch: x"})
    assert (refused.outcome, refused.exit_code, refused.failure) == ("parity_mismatch", 11, "parity mismatch: x")
    assert refused.history_reports() == []
    error = cluster.from_worker(2, job, {"worker": WORKER, "error": EnvironmentProblem("no GPU", "use one").to_json()})
    assert (error.outcome, error.exit_code, error.failure) == ("error", 11, "no GPU (use one)")


def test_the_table_names_each_result_its_worker_and_why_it_failed(capsys, monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "160")
    job = cluster.Job((Path("a.py"),), (b"x",), load_task(DOUBLE))
    other = {**WORKER, "facts": {**WORKER["facts"], "device": "NVIDIA A100-SXM4-80GB"}}
    results = (cluster.from_worker(0, job, {"worker": WORKER, "report": _report().to_json()}),
               cluster.from_worker(1, job, {"worker": other, "report": _report("failed").to_json()}),
               cluster.Result(2, job, failed="worker_lost", failure="worker lost: WorkerCrashedError: died", code=6))
    run = cluster.ClusterRun("10.0.0.5:6379", False, {"CPU": 32, "GPU": 2}, results)
    assert run.exit_code == 1
    view.show_cluster(run)
    out = capsys.readouterr().out
    assert "2. a.py: check failed: test, test 0: expected 2, got 3" in out
    assert "3. a.py: worker lost: WorkerCrashedError: died" in out
    assert "1 of 3 passed · on the Ray cluster at 10.0.0.5:6379 (32 CPU, 2 GPU)" in out
    assert "workers differ (device: NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3)" in out
    view.result_line(results[2])
    line = json.loads(capsys.readouterr().out)
    assert line["schema"] == "popkit/cluster-result/1" and line["outcome"] == "worker_lost" and line["exit_code"] == 6


# ------------------------------------------------------------------------- a local Ray instance


def _twelve(tmp_path: Path) -> list[Path]:
    """Twelve CPU submissions of the `double` fixture task: passing, wrong, crashing, not building."""
    names = ["good.py", "wrong.py", "crash.py", "badtest.py", "buildfail.py", "good.py"] * 2
    files = []
    for i, name in enumerate(names):
        path = tmp_path / f"s{i:02d}_{name}"
        path.write_bytes((SUBS / name).read_bytes() + f"\n# variant {i}\n".encode())
        files.append(path)
    return files


@pytest.mark.slow
def test_twelve_runs_on_a_local_instance_give_the_verdicts_of_one_by_one_and_are_all_recorded(cli, tmp_path):
    pytest.importorskip("ray")
    files = _twelve(tmp_path)
    alone = [runner.run_submission(load_task(DOUBLE), f, "benchmark", runner.RunOptions(), system={"device": "cpu"})
             for f in files]
    result = cli("bench", *map(str, files), "--task", str(DOUBLE), "--cluster", "ray", "--json-lines")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    first_failure = next(int(r.exit_code) for r in alone if int(r.exit_code))
    assert result.exit_code == first_failure == 1, result.output
    assert len(lines) == 12 and {line["schema"] for line in lines} == {"popkit/cluster-result/1"}
    by_file = {line["files"][0]: line for line in lines}
    for path, local in zip(files, alone):
        remote = by_file[str(path)]
        assert (remote["outcome"], remote["exit_code"]) == (local.outcome, int(local.exit_code)), path
        assert remote["report"]["score_public_s"] == local.score_public_s
        assert remote["worker"]["gpus"] == [] and remote["report"]["label"].startswith("ray ")
    assert {local.outcome for local in alone} == {"passed", "failed", "crashed", "compile_failed"}
    listed = json.loads(cli("history", "-n", "50", "--json").stdout)["runs"]
    assert sorted(r["submission"] for r in listed) == sorted(map(str, files))
    assert all(r["device"].endswith("CPU]") and "[ray " in r["device"] for r in listed)


def _with_this_popkit(env: dict[str, str]) -> dict[str, str]:
    """`env` with the popkit under test first on PYTHONPATH, for a `python -m popkit` (or -c) in another folder."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)}


def _marked(mark: str) -> list[str]:
    """Processes whose environment holds `mark`: everything the popkit under test started, Ray's included."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        command = c.read().replace(b"\0", b" ")[:80].decode(errors="replace")
                    found.append(f"{pid} {command}")
        except OSError:
            pass
    return found


def test_a_signal_that_ray_turned_into_a_bare_keyboard_interrupt_keeps_its_name():
    def popkit_handler(signum, _frame):  # what cli.main installs
        raise popkit.errors.Interrupted(signum)

    before = signal.signal(signal.SIGTERM, popkit_handler)
    raised: BaseException | None = None
    try:
        with ray_session._signals_named():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                signal.sigtimedwait([], 0.1)  # the handler runs here
            except popkit.errors.Interrupted:
                raise KeyboardInterrupt from None  # what ray.wait makes of it
    except KeyboardInterrupt as exc:  # caught here so that a failure does not stop pytest itself
        raised = exc
    finally:
        after = signal.signal(signal.SIGTERM, before)
    assert isinstance(raised, popkit.errors.Interrupted) and raised.signum == signal.SIGTERM, repr(raised)
    assert after is popkit_handler


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_cancels_every_run_and_leaves_no_ray_or_popkit_process(tmp_path, sig):
    pytest.importorskip("ray")
    mark = f"popkit-test-{uuid.uuid4().hex}"
    log = tmp_path / "attack.log"
    env = _with_this_popkit({**os.environ, **attack_env(log), "POPKIT_HOME": str(tmp_path / "home"),
                             "POPKIT_TEST_MARK": mark,
                             "POPKIT_ISOLATION": "none"})  # the attack logs outside the workspace
    escape = str(ATTACKS / "escape.py")  # a detached grandchild, and a kernel that never returns

    def defaults() -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)

    popkit_ = subprocess.Popen([sys.executable, "-m", "popkit", "test", escape, escape, escape, "--task", str(DOUBLE),
                                "--no-precompile", "--no-history", "--cluster", "ray"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=defaults)
    assert wait_until(lambda: len(recorded(log)) >= 4, 60), "two runs did not start"
    popkit_.send_signal(sig)
    _out, err = popkit_.communicate(timeout=60)
    assert popkit_.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1].startswith(f"popkit: stopped by {sig.name};"), err
    assert "Traceback" not in err
    assert wait_until(lambda: not _marked(mark), 20), _marked(mark)
    assert_nothing_left(log)


def _tree(root: int) -> dict[int, bytes]:
    """Every process below `root`, each with its start time (so a reused pid is not taken for it)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, bytes] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        starts[int(entry)] = fields[19]
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found[pid] = starts[pid]
            todo.append(pid)
    return found


def _still_alive(processes: dict[int, bytes]) -> list[str]:
    left = []
    for pid, start in processes.items():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ")[:60].decode(errors="replace")
        except OSError:
            continue
        if fields[19] == start and fields[0] != b"Z":
            left.append(f"{pid} {command}")
    return left


@pytest.mark.slow
def test_sigkill_of_popkit_leaves_no_process_of_its_local_ray_instance_and_no_file(tmp_path):
    """The class: what a local instance starts and writes outliving popkit, which runs no handler when it is
    killed (Ray's agents lived on for minutes, its session folder stayed in TMPDIR, its token went to ~/.ray)."""
    pytest.importorskip("ray")
    home = tmp_path / "home"
    home.mkdir()
    temp = Path(tempfile.mkdtemp(prefix="pk-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    mark = f"popkit-test-{uuid.uuid4().hex}"
    log = tmp_path / "attack.log"
    env = _with_this_popkit({**os.environ, **attack_env(log), "HOME": str(home), "TMPDIR": str(temp),
                             "POPKIT_HOME": str(tmp_path / "popkit-home"), "POPKIT_TEST_MARK": mark,
                             "POPKIT_CACHE_DIR": str(tmp_path / "cache"),
                             "POPKIT_ISOLATION": "none"})  # the attack logs outside the workspace
    escape = str(ATTACKS / "escape.py")  # a detached grandchild, and a kernel that never returns
    try:
        popkit_ = subprocess.Popen([sys.executable, "-m", "popkit", "test", escape, escape, "--task", str(DOUBLE),
                                    "--no-precompile", "--no-history", "--cluster", "ray"], env=env, cwd=tmp_path,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert wait_until(lambda: len(recorded(log)) >= 2, 120), popkit_.stderr.read1().decode()
            started = _tree(popkit_.pid)
            during = sorted(p.name for p in temp.iterdir())
            popkit_.kill()
            popkit_.wait(30)
        finally:
            if popkit_.poll() is None:
                popkit_.kill()
            popkit_.stderr.close()
        assert any(name.startswith("popkit-ray-") for name in during), during  # the instance lived in TMPDIR
        assert len(started) > 5, started  # the watchdog, Ray's head, GCS, raylet, agents, workers, evals
        assert wait_until(lambda: not _still_alive(started) and not _marked(mark), 20), \
            (_still_alive(started), _marked(mark))
        assert_nothing_left(log)  # the runs' evals and their detached grandchildren too
        assert wait_until(lambda: not list(temp.iterdir()), 20), sorted(temp.rglob("*"))[:20]
        assert not (home / ".ray").exists()
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_a_popkit_planted_in_the_folder_of_the_call_is_not_what_the_workers_run(tmp_path):
    """The class: files in the folder popkit runs from (Ray puts it first on every worker's import path). The
    instance: a `popkit` package there, which a worker imported instead of the popkit that sent the run."""
    pytest.importorskip("ray")
    planted = tmp_path / "popkit"
    planted.mkdir()
    (planted / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n"
                                         "raise ImportError('the planted popkit')\n")
    env = _with_this_popkit({**os.environ, "POPKIT_HOME": str(tmp_path / "home"), "POPKIT_ISOLATION": "none"})
    # -P: this process does not import from its current folder either (a `popkit` console script does not).
    done = subprocess.run([sys.executable, "-P", "-m", "popkit", "test", str(SUBS / "good.py"), "--task", str(DOUBLE),
                           "--no-precompile", "--no-history", "--cluster", "ray", "--json"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert json.loads(done.stdout)["results"][0]["outcome"] == "passed"
    assert not (tmp_path / "imported").exists()


@pytest.mark.slow
def test_a_worker_that_cannot_load_popkit_is_a_parity_mismatch(tmp_path):
    """Real Ray, started by a library caller from a folder with a broken `popkit` in it (popkit keeps a connection
    it finds): the worker cannot unpickle run_bundle, and the run fails as a parity mismatch, exit 11."""
    pytest.importorskip("ray")
    (tmp_path / "popkit").mkdir()
    (tmp_path / "popkit" / "__init__.py").write_text("raise ImportError('not the popkit that sent the run')\n")
    script = ("import logging, ray\nfrom pathlib import Path\nfrom popkit.distributed import scheduler as cluster\nfrom popkit.run import runner\n"
              "from popkit.model.tasks import load_task\n"
              "ray.init(address='local', include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)\n"
              f"path = Path({str(SUBS / 'good.py')!r})\n"
              f"job = cluster.Job((path,), (path.read_bytes(),), load_task(Path({str(DOUBLE)!r})))\n"
              "result, = cluster.run_jobs([job], 'test', runner.RunOptions(precompile=False)).results\n"
              "print(result.outcome, result.exit_code, result.failure, sep='|')\nray.shutdown()\n")
    env = _with_this_popkit({**os.environ, "POPKIT_HOME": str(tmp_path / "home")})
    done = subprocess.run([sys.executable, "-P", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome, code, failure = done.stdout.strip().splitlines()[-1].split("|")
    assert (outcome, code) == ("parity_mismatch", "11"), failure
    assert failure == ("parity mismatch: the worker cannot load popkit's worker function (ImportError: not the popkit "
                       "that sent the run); install the same popkit on every node")


def test_a_lost_worker_a_worker_without_popkit_and_a_bug_on_the_worker_each_have_their_name():
    class RayError(Exception):
        pass

    class RayTaskError(RayError):
        def __init__(self, cause):
            super().__init__(str(cause))
            self.cause = cause

    class WorkerCrashedError(RayError):
        pass

    class FakeRay:
        exceptions = type("exceptions", (), {"RayError": RayError, "RayTaskError": RayTaskError})

        def __init__(self, raised):
            self.raised = raised

        def get(self, _ref):
            raise self.raised

    job = cluster.Job((Path("a.py"),), (b"x",), load_task(DOUBLE))
    lost = cluster.collect(FakeRay(WorkerCrashedError("The worker died unexpectedly\nmore")), None, 0, job)
    assert (lost.outcome, lost.exit_code, lost.failure) == (
        "worker_lost", 6, "worker lost: WorkerCrashedError: The worker died unexpectedly")
    absent = cluster.collect(FakeRay(RayTaskError(ModuleNotFoundError("No module named 'popkit.distributed.scheduler'"))), None, 0,
                             job)
    assert (absent.outcome, absent.exit_code) == ("parity_mismatch", 11)
    assert absent.failure.startswith("parity mismatch: the worker cannot load popkit's worker function "
                                     "(ModuleNotFoundError: No module named 'popkit.distributed.scheduler')")
    wrapped = RuntimeError("Failed to unpickle serialized function.\nTraceback (most recent call last):\n  ...\n"
                           "ModuleNotFoundError: No module named 'popkit'")  # what Ray raises around it
    absent = cluster.collect(FakeRay(RayTaskError(wrapped)), None, 0, job)
    assert (absent.outcome, absent.exit_code, absent.failure) == (
        "parity_mismatch", 11, "parity mismatch: the worker cannot load popkit's worker function (ModuleNotFoundError: "
                               "No module named 'popkit'); install the same popkit on every node")
    bug = cluster.collect(FakeRay(RayTaskError(KeyError("x"))), None, 0, job)
    assert (bug.outcome, bug.exit_code, bug.failure) == ("error", 70, "worker error: KeyError: 'x' (a popkit bug: "
                                                                      "please report it)")


def test_a_local_instance_offers_as_many_slots_as_runs_can_go_at_once():
    vectoradd = resolve_task("vectoradd")
    gpu_runs = [cluster.Job((Path(f"p{i}.py"),), (b"def custom_kernel(d): return d\n",), vectoradd) for i in range(8)]
    cpu_run = cluster.Job((Path("g.py"),), (b"",), load_task(DOUBLE))  # a task made for the CPU
    options = runner.RunOptions()
    assert cluster.local_slots(gpu_runs, "benchmark", options, False, 2) == 2  # one per GPU, not one per run
    assert cluster.local_slots(gpu_runs[:3], "benchmark", options, False, 8) == 3
    assert cluster.local_slots(gpu_runs + [cpu_run], "benchmark", options, False, 2) == 9  # a CPU run beside them
    assert cluster.local_slots(gpu_runs, "benchmark", options, False, None) == 8  # GPUs not known
    assert cluster.local_slots(gpu_runs, "benchmark", options, False, 0) == 8  # CPU slots (refused later: no GPU)
    assert cluster.local_slots([], "benchmark", options, False, 2) == 0
    world = [cluster.Job((Path("w.py"),), (b"",), replace(vectoradd, multi_gpu=True))] * 4
    assert cluster.local_slots(world, "benchmark", replace(options, world_size=2), False, 4) == 2  # 2 GPUs a run
    assert cluster.local_slots(world, "benchmark", replace(options, world_size=4), False, 2) == 4  # Ray refuses it


def test_a_local_instance_counts_the_gpus_cuda_would_see(monkeypatch):
    monkeypatch.setattr(nvml.ctypes, "CDLL", lambda _name: FakeNvml([H100, H100]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cluster.visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert cluster.visible_gpus() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-4b1c")  # a UUID: NVML cannot map it here
    assert cluster.visible_gpus() is None

    def no_driver(_name):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(nvml.ctypes, "CDLL", no_driver)
    assert cluster.visible_gpus() is None


def test_run_jobs_starts_a_local_instance_with_those_slots_and_a_cluster_with_its_own(monkeypatch):
    seen = []

    class Stop(Exception):
        pass

    def connect(address, _say, slots=None):
        seen.append((address, slots))
        raise Stop

    monkeypatch.setattr(cluster, "connect", connect)
    monkeypatch.setattr(cluster, "visible_gpus", lambda: 2)
    vectoradd = resolve_task("vectoradd")
    jobs = [cluster.Job((SUBS / "good.py",), ((SUBS / "good.py").read_bytes(),), vectoradd)] * 4
    for address in (None, "10.0.0.5:6379"):
        with pytest.raises(Stop):
            cluster.run_jobs(jobs, "benchmark", runner.RunOptions(), address)
    assert seen == [(None, 2), ("10.0.0.5:6379", None)]


def test_a_local_instance_lives_in_tmpdir_unless_rays_socket_paths_would_not_fit_there(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert ray_local.parent_folder() == "/tmp"
    fits = "/" + "x" * (ray_local.SOCKET_PATH_MAX - ray_local.SOCKET_TAIL - 1)
    monkeypatch.setattr(tempfile, "tempdir", fits)
    assert ray_local.parent_folder() == fits
    monkeypatch.setattr(tempfile, "tempdir", fits + "x")  # a socket path one byte too long
    assert ray_local.parent_folder() == "/tmp"


def test_a_head_that_fails_or_never_answers_is_exit_11_and_leaves_nothing(monkeypatch, tmp_path):
    """Without Ray: a head that exits saying why, and one that never writes its address (its child too)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pids = tmp_path / "pids"
    fails = [sys.executable, "-c", "import sys; print('starting'); print('RuntimeError: no GCS here'); sys.exit(3)"]
    hangs = [sys.executable, "-c", f"import os, subprocess, time; child = subprocess.Popen(['sleep', '600']); "
             f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}'); time.sleep(600)"]
    monkeypatch.setattr(ray_local, "head_argv", lambda *_args: fails)
    with pytest.raises(EnvironmentProblem, match="cannot start a local Ray instance: RuntimeError: no GCS here"):
        with ray_local.started(1, 2**20, {}):
            pass
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(ray_local, "head_argv", lambda *_args: hangs)
    monkeypatch.setattr(ray_local, "START_TIMEOUT_S", 2.0)
    with pytest.raises(EnvironmentProblem, match="its head did not answer within 2 s"):
        with ray_local.started(1, 2**20, {}):
            pass
    head, child = map(int, pids.read_text().split())
    pids.unlink()
    assert list(tmp_path.iterdir()) == []
    assert wait_until(lambda: not alive(head) and not alive(child), 5)


def _fake_head(monkeypatch, tmp_path, slots_seen: list | None = None) -> None:
    """ray_local.started without Ray: an empty folder, as the real one gives (its own tests start Ray)."""

    @contextlib.contextmanager
    def started(slots, _store_bytes, _config, meanwhile=lambda: None):
        if slots_seen is not None:
            slots_seen.append(slots)
        meanwhile()
        folder = Path(tempfile.mkdtemp(dir=tmp_path))
        (folder / "cwd").mkdir()
        try:
            yield ray_local.Head("127.0.0.1:1", folder, folder / "cwd")
        finally:
            shutil.rmtree(folder)

    monkeypatch.setattr(ray_session.ray_local, "started", started)


def test_ray_starts_from_an_empty_folder_of_its_own_and_the_caller_stays_where_it_was(monkeypatch, tmp_path):
    """Ray puts the caller's current folder first on every worker's import path: it must not be the user's."""
    seen = []

    class FakeRay:
        is_initialized = staticmethod(lambda: False)
        init = staticmethod(lambda **kw: seen.append((os.getcwd(), os.listdir("."))))
        shutdown = staticmethod(lambda **kw: None)

    monkeypatch.setattr(ray_session, "import_ray", lambda: FakeRay)
    monkeypatch.setattr(ray_session, "check_reachable", lambda address: None)
    _fake_head(monkeypatch, tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for address in (None, "10.0.0.5:6379"):
        with ray_session.connect(address, lambda _msg: None):
            assert os.getcwd() == str(here)
            folder, listed = seen.pop()
            assert folder != str(here) and listed == [] and Path(folder).is_dir()  # the instance runs there
        assert not Path(folder).exists() and os.getcwd() == str(here)

    def refused(**_kw):
        raise ConnectionError("no raylet")

    monkeypatch.setattr(FakeRay, "init", staticmethod(refused))
    with pytest.raises(EnvironmentProblem, match="cannot join the local Ray instance popkit started: no raylet"):
        with ray_session.connect(None, lambda _msg: None):
            pass
    assert os.getcwd() == str(here)


def test_a_local_instance_offers_no_more_cpu_slots_than_there_are_runs(monkeypatch, tmp_path):
    """Ray starts a worker process per CPU slot of a local instance; a cluster joined keeps its own."""
    inits, slots_seen = [], []

    class FakeRay:
        is_initialized = staticmethod(lambda: False)
        init = staticmethod(lambda **kw: inits.append(kw))
        shutdown = staticmethod(lambda **kw: None)

    monkeypatch.setattr(ray_session, "import_ray", lambda: FakeRay)
    monkeypatch.setattr(ray_session, "check_reachable", lambda address: None)
    monkeypatch.setattr(ray_session.os, "cpu_count", lambda: 32)
    _fake_head(monkeypatch, tmp_path, slots_seen)
    for address, slots in ((None, 8), (None, 64), (None, None), ("10.0.0.5:6379", 8)):
        with ray_session.connect(address, lambda _msg: None, slots=slots):
            pass
    assert slots_seen == [8, 32, None]
    assert [kw["address"] for kw in inits] == ["127.0.0.1:1"] * 3 + ["10.0.0.5:6379"]
    assert all("num_cpus" not in kw for kw in inits)  # a driver joining the head it started says nothing of slots


def test_rays_auth_token_is_made_private_without_following_a_link(tmp_path):
    """Ray leaves ~/.ray/auth_token readable by every user (0644): popkit makes it 0600 and its folder 0700."""
    import os
    import stat

    from popkit.distributed.ray_session import private_token

    folder = tmp_path / ".ray"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    token = folder / "auth_token"
    token.write_text("secret")
    os.chmod(token, 0o644)
    assert private_token(token)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not private_token(token)  # already private
    other = tmp_path / "other.txt"
    other.write_text("x")
    os.chmod(other, 0o644)
    token.unlink()
    token.symlink_to(other)
    assert not private_token(token) and stat.S_IMODE(other.stat().st_mode) == 0o644


def test_a_local_instances_workers_import_the_drivers_popkit(tmp_path, monkeypatch):
    """A checkout that is not installed goes first on the workers' import path; an installed popkit does not (its
    workers find it, and site-packages never goes before the standard library)."""
    checkout = tmp_path / "checkout"
    env = ray_local.head_env(tmp_path, {"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert env["PYTHONPATH"] == ray_local.import_path({"PYTHONPATH": "/elsewhere"}).get("PYTHONPATH", "/elsewhere")
    assert ray_local.import_path({}, checkout) == {"PYTHONPATH": str(checkout)}
    assert ray_local.import_path({"PYTHONPATH": str(checkout)}, checkout) == {}  # already first
    monkeypatch.setattr("site.getsitepackages", lambda: [str(checkout)])
    assert ray_local.import_path({"PYTHONPATH": "/elsewhere"}, checkout) == {}
