"""POPKIT_WORKER_SPIN=1, a measurement switch: on a GPU the loaded worker awaits its next request by polling
(popkit_worker.SPIN_S); the submission never sees the switch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from test_harness import DOUBLER, GOOD_DOUBLER, SMALL, run_eval
from test_harness_split import load_harness

h = load_harness()


class Conn:
    """A worker's end of the channel: the request is there after `ready_after` polls (never, with None)."""

    def __init__(self, ready_after: int | None):
        self.ready_after, self.polls, self.received = ready_after, 0, 0

    def poll(self, timeout: float) -> bool:
        assert timeout == 0  # a poll that never sleeps
        self.polls += 1
        return self.ready_after is not None and self.polls > self.ready_after

    def recv(self) -> dict:
        self.received += 1
        return {"op": "bench_call"}


def test_a_spinning_worker_polls_until_the_request_is_there_then_receives_it():
    conn = Conn(ready_after=25)
    assert h.next_request(conn, spin=True) == {"op": "bench_call"}
    assert conn.polls == 26 and conn.received == 1


def test_the_spin_ends_after_its_time_and_the_worker_blocks_as_before():
    conn, ticks = Conn(ready_after=None), iter(range(10**6))
    clock = lambda: next(ticks) * h.SPIN_S / 10  # noqa: E731  ten polls' worth of time, then the deadline
    assert h.next_request(conn, spin=True, clock=clock) == {"op": "bench_call"}
    assert conn.polls == 10 and conn.received == 1


def test_without_spin_the_worker_never_polls():
    conn = Conn(ready_after=0)
    h.next_request(conn, spin=False)
    assert conn.polls == 0 and conn.received == 1


def test_the_worker_spins_only_on_a_gpu_once_the_submission_is_loaded_with_the_switch_on():
    def worker(spin: bool, cuda: bool, loaded: bool = True) -> bool:
        w = h.Worker({"spin": spin, "outputs_fd": None})
        w.device, w.timed = SimpleNamespace(cuda=cuda), SimpleNamespace(bench={}) if loaded else None
        return w.spinning()

    assert worker(spin=True, cuda=True)  # between cases too: the witness's empty calls are served alike
    assert not worker(spin=True, cuda=False)  # the CPU: a core is not spent on waiting
    assert not worker(spin=True, cuda=True, loaded=False)  # start-up: nothing to serve yet
    assert not worker(spin=False, cuda=True)
    assert not h.Worker({"outputs_fd": None}).spinning()  # nothing prepared yet
    assert h.worker_settings(True, "trace", None)["spin"] is False  # off unless asked for
    assert h.worker_settings(True, "trace", None, spin=True)["spin"] is True


def test_the_switch_is_read_and_removed_before_the_submission_is_imported(tmp_path):
    peek = "import os\nassert 'POPKIT_WORKER_SPIN' not in os.environ, 'the switch reached the submission'\n"
    run = run_eval(DOUBLER, peek + GOOD_DOUBLER, "test", SMALL, tmp_path, env={"POPKIT_WORKER_SPIN": "1"})
    assert run.passed, run.raw


def test_a_sealed_worker_may_poll_its_channel(tmp_path):
    """The seccomp filter the worker runs under leaves the calls a poll makes: a request sent at once and one sent
    10 ms later both arrive through next_request's spin (a child process: the seal is for life)."""
    import subprocess
    import sys
    from pathlib import Path

    tasks = Path(__file__).resolve().parents[1] / "tasks"
    code = ("import sys, threading; sys.path.insert(0, sys.argv[1])\n"
            "import popkit_seal, popkit_worker\n"
            "from multiprocessing import Pipe\n"
            "a, b = Pipe()\n"
            "print(popkit_seal.seal_worker() or 'sealed')\n"
            "b.send({'op': 'now'}); print(popkit_worker.next_request(a, True)['op'])\n"
            "threading.Timer(0.01, lambda: b.send({'op': 'later'})).start()\n"
            "print(popkit_worker.next_request(a, True)['op'])\n")
    done = subprocess.run([sys.executable, "-c", code, str(tasks)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    sealed, *ops = done.stdout.splitlines()
    if sealed != "sealed":
        pytest.skip(f"no seccomp filter here: {sealed}")
    assert ops == ["now", "later"]
