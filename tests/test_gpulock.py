"""One timed eval per GPU: the lock a timed mode holds, which GPUs it names, and that a second waits."""

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

from popkit.errors import EnvironmentProblem
from popkit.machine import gpulock, system


@pytest.fixture
def nvidia(monkeypatch):
    """A machine with four NVIDIA GPUs, as the device nodes say."""
    monkeypatch.setattr(system, "gpu_devices_visible", lambda env=None: env.get("CUDA_VISIBLE_DEVICES") != "")
    monkeypatch.setattr(system, "gpu_count", lambda: 4)
    monkeypatch.setattr(gpulock.Path, "exists", lambda self: str(self) == "/dev/nvidia0")


def test_a_run_locks_the_first_gpu_it_sees(nvidia):
    assert gpulock.gpus_of({}) == ["nvidia-0"]
    assert gpulock.gpus_of({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["nvidia-2"]
    assert gpulock.gpus_of({"CUDA_VISIBLE_DEVICES": "2,3"}, gpu_count=2) == ["nvidia-2", "nvidia-3"]


def test_no_visible_gpu_locks_nothing(nvidia):
    assert gpulock.gpus_of({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_a_gpu_named_by_uuid_is_locked_under_that_name(nvidia):
    assert gpulock.gpus_of({"CUDA_VISIBLE_DEVICES": "GPU-1234abcd"}) == ["nvidia-GPU-1234abcd"]


def test_tests_share_a_gpu_with_tests(nvidia, tmp_path):
    with gpulock.timing("test", {}, folder=tmp_path) as first:
        with gpulock.timing("test", {}, folder=tmp_path, wait_s=0.5) as second:
            assert first == second == ["nvidia-0"]


def test_a_test_waits_for_a_timed_run_and_a_timed_run_for_a_test(nvidia, tmp_path):
    with gpulock.timing("leaderboard", {}, folder=tmp_path):
        with pytest.raises(EnvironmentProblem):
            with gpulock.timing("test", {}, folder=tmp_path, wait_s=0.5):
                pass
    with gpulock.timing("test", {}, folder=tmp_path):
        with pytest.raises(EnvironmentProblem):
            with gpulock.timing("benchmark", {}, folder=tmp_path, wait_s=0.5):
                pass


def test_a_waiting_timed_run_holds_back_later_tests(nvidia, tmp_path):
    """The gate: a timed run waiting behind tests is not starved by tests that start after it."""
    gate = os.open(tmp_path / "nvidia-0.gate.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)  # what a waiting timed run holds
        with pytest.raises(EnvironmentProblem):
            with gpulock.timing("test", {}, folder=tmp_path, wait_s=0.5):
                pass
    finally:
        os.close(gate)


def _holder(path):
    """Another process holding the lock file at `path` until its stdin closes."""
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o644); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_timed_eval_waits_while_another_holds_its_gpu(nvidia, tmp_path):
    holder = _holder(tmp_path / "nvidia-0.lock")
    heard = []
    try:
        with pytest.raises(EnvironmentProblem, match="nvidia-0: another popkit eval has held it"):
            with gpulock.timing("leaderboard", {}, folder=tmp_path, waiting=heard.append, wait_s=0.6):
                pass
        assert heard == ["waiting for GPU nvidia-0: another popkit eval is using it"]
    finally:
        holder.stdin.close()
        holder.wait()
    with gpulock.timing("benchmark", {}, folder=tmp_path, wait_s=5) as held:  # the holder died: the lock is free
        assert held == ["nvidia-0"]
        fd = os.open(tmp_path / "nvidia-0.lock", os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_the_lock_is_released_when_the_block_ends(nvidia, tmp_path):
    with gpulock.timing("profile", {"CUDA_VISIBLE_DEVICES": "1"}, folder=tmp_path):
        pass
    fd = os.open(tmp_path / "nvidia-1.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_link_planted_at_a_lock_name_is_not_followed(nvidia, tmp_path):
    victim = tmp_path / "victim"
    folder = tmp_path / "locks"
    folder.mkdir()
    (folder / "nvidia-0.lock").symlink_to(victim)
    with gpulock.timing("leaderboard", {}, folder=folder) as held:
        assert held == []  # not lockable: the eval runs unlocked rather than through the link
    assert not victim.exists()


def test_run_mode_holds_the_gpu_lock_while_the_eval_runs(nvidia, tmp_path, monkeypatch):
    """The runner's one place that starts an eval takes the lock for a timed mode."""
    from popkit.run import runner

    seen = {}

    class Stop(Exception):
        pass

    class FakeExecutor:
        def env(self, env):
            return dict(env)

    class FakeWorkspace:
        executor = FakeExecutor()
        files = tmp_path

        def write_cases(self, name, text):
            pass

        def run(self, *args, **kwargs):
            fd = os.open(tmp_path / "nvidia-0.lock", os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen["locked"] = False
            except BlockingIOError:
                seen["locked"] = True
            finally:
                os.close(fd)
            raise Stop

    monkeypatch.setattr(gpulock, "LOCK_DIR", tmp_path)
    with pytest.raises(Stop):
        runner.run_mode(FakeWorkspace(), "eval.py", "leaderboard", [{"size": 1}], timeout_s=5,
                        options=runner.RunOptions())
    assert seen == {"locked": True}


def test_a_sessions_helper_script_shares_the_gpu_as_a_test_does(nvidia, tmp_path, monkeypatch):
    """risk's run and tune's probes run the submission on the GPU: never beside a timed eval."""
    from types import SimpleNamespace

    from popkit.run import runner

    seen = {}

    class FakeWorkspace:
        executor = SimpleNamespace(env=dict)

        def add(self, name, data):
            pass

        def run(self, *args, **kwargs):
            for key, how in (("exclusive_refused", fcntl.LOCK_EX), ("shared_granted", fcntl.LOCK_SH)):
                fd = os.open(tmp_path / "nvidia-0.lock", os.O_RDONLY)
                try:
                    fcntl.flock(fd, how | fcntl.LOCK_NB)
                    seen[key] = how == fcntl.LOCK_SH
                except BlockingIOError:
                    seen[key] = how == fcntl.LOCK_EX
                finally:
                    os.close(fd)
            return "done"

    monkeypatch.setattr(gpulock, "LOCK_DIR", tmp_path)
    session = SimpleNamespace(sides={"": SimpleNamespace(workspace=FakeWorkspace())},
                              options=runner.RunOptions(), env=lambda: {})
    assert runner.RunSession.script(session, "probe.py", b"", [], 5) == "done"
    assert seen == {"exclusive_refused": True, "shared_granted": True}


def _warm_pair(mode="test"):
    from popkit.model.tasks import load_task
    from popkit.run import runner, warm
    from popkit.run.executor import Executor
    from test_watch import CHILD_ENV, DOUBLER, HONEST

    return warm.WarmPair(load_task(DOUBLER), mode, HONEST, runner.RunOptions(env=CHILD_ENV), Executor(),
                         system={"device": "cpu"})


def test_a_warm_pairs_start_up_waits_while_a_timed_eval_holds_its_gpu(nvidia, tmp_path, monkeypatch):
    """The start-up uses the GPU (context, inputs): it never starts beside a timed eval; discard() ends the wait."""
    monkeypatch.setattr(gpulock, "LOCK_DIR", tmp_path)
    holder = _holder(tmp_path / "nvidia-0.lock")  # a timed eval on GPU 0
    try:
        pair = _warm_pair()
        time.sleep(0.5)
        pair.discard()
        assert pair._done is None, "the pair's eval started while a timed eval held the GPU"
        assert isinstance(pair._error, EnvironmentProblem) and "stopped" in str(pair._error)
        assert not pair.alive
    finally:
        holder.stdin.close()
        holder.wait()


@pytest.mark.slow
def test_a_warm_pair_frees_its_gpu_once_ready(nvidia, tmp_path, monkeypatch):
    """Ready, the pair holds nothing: a timed eval may take the GPU while it waits for `go`."""
    monkeypatch.setattr(gpulock, "LOCK_DIR", tmp_path)
    pair = _warm_pair()
    try:
        assert pair._watch.ready.wait(120), pair._error
        fd = os.open(tmp_path / "nvidia-0.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        pair.discard()


@pytest.mark.slow
def test_pairs_started_ahead_on_one_gpu_each_judge_in_turn(nvidia, tmp_path, monkeypatch):
    """tune's race on a GPU: two start-ups hold the GPU shared at once, then each `go` holds it alone. The first
    `go` waits for the other start-up to be ready, never for its own (which would never come)."""
    from popkit.run import warm
    from test_watch import HONEST

    monkeypatch.setattr(gpulock, "LOCK_DIR", tmp_path)
    found: dict = {}

    def race() -> None:
        with warm.Ahead(lambda _key: _warm_pair("benchmark"), depth=2) as pairs:
            pairs.refill([0, 1])
            found["reports"] = [pairs.run(key, HONEST, lambda _msg: None) for key in (0, 1)]

    thread = threading.Thread(target=race, daemon=True)
    thread.start()
    thread.join(180)
    assert not thread.is_alive(), "a `go` holds the GPU while its own start-up waits for it"
    reports = found["reports"]
    assert [r.outcome for r in reports] == ["passed", "passed"]
    assert all(r.runs[0].benchmarks for r in reports)
