"""A verdict the submission cannot write: cheats that take over the worker (the process that imports the
submission) still fail, because the trusted process judges every output and witnesses every time itself.

Each file in submissions/cheats/ says what it does and what catches it. They run against the bundled
vectoradd task through popkit.run.runner, with small cases so a CPU box gets through them.
"""

from __future__ import annotations

import os
import random
import statistics
from pathlib import Path

import pytest

from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run.executor import Executor
from test_harness_split import load_harness

ROOT = Path(__file__).resolve().parent.parent
CHEATS = ROOT / "submissions" / "cheats"
CHILD_ENV = {"OMP_NUM_THREADS": "1"}
TEST_CASES = [{"size": 1, "seed": 21}, {"size": 17, "seed": 22}, {"size": 64, "seed": 23}]
BENCH_CASES = [{"size": 96, "seed": 72}]


def run(name: str, mode: str, tmp_path: Path, *, cases=None, seed=None):
    task = load_task(ROOT / "tasks" / "vectoradd")
    ws = Executor().new_workspace(tmp_path / f"{Path(name).stem}-{mode}")
    main = ws.prepare(task, (CHEATS / name).read_bytes())
    cases = cases or (TEST_CASES if mode == "test" else BENCH_CASES)
    return runner.run_mode(ws, main, mode, cases, timeout_s=240,
                           options=runner.RunOptions(env=CHILD_ENV), seed=seed)


def errors_of(mode_run) -> list[str]:
    return [c.error for c in mode_run.tests + mode_run.benchmarks if not c.passed]


def assert_failed_by_name(mode_run, expected: str) -> None:
    errors = errors_of(mode_run)
    assert mode_run.exit_code == 112 and mode_run.check == "fail", (mode_run.exit_code, errors, mode_run.stderr)
    assert errors and all(expected in e for e in errors), errors


WRONG_RESULT = [
    ("tensor_int.py", "elements mismatch"),
    ("judge_swap.py", "no output"),  # its replaced Checker.verify hands nothing over
    ("json_forge.py", "elements mismatch"),
    ("channel_takeover.py", "no output"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,expected", WRONG_RESULT, ids=[c[0][:-3] for c in WRONG_RESULT])
@pytest.mark.parametrize("mode", ["test", "leaderboard"])
def test_a_worker_that_writes_its_own_verdict_still_fails(name, expected, mode, tmp_path):
    seed = random.randrange(1, 2**31) if mode == "leaderboard" else None
    assert_failed_by_name(run(name, mode, tmp_path, seed=seed), expected)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["benchmark", "leaderboard"])
def test_a_patched_measurement_is_a_forged_time(mode, tmp_path):
    """A right kernel sleeping 20 ms per call that reports 1234 ns: the trusted clock saw 20 ms."""
    assert_failed_by_name(run("measure_forge.py", mode, tmp_path), "time forged")


@pytest.mark.slow
def test_the_ready_reply_chooses_neither_device_nor_audit(tmp_path):
    result = run("ready_forge.py", "benchmark", tmp_path)
    assert result.exit_code == 0, errors_of(result)
    assert result.raw["system.device"] != "forged-device"
    assert result.raw["trust.audit"] == "off"  # a CPU has no device queues: nothing to audit, by the trusted side


@pytest.mark.slow
def test_an_honest_kernel_is_timed_as_before(tmp_path):
    """The trusted clock's witness does not fail a right kernel, and the reported times stay the event times."""
    result = run(str(ROOT / "submissions" / "vectoradd" / "pytorch.py"), "leaderboard", tmp_path,
                 seed=random.randrange(1, 2**31))
    assert result.exit_code == 0 and result.check == "pass", errors_of(result)
    samples = [float(x) for x in result.raw["benchmark.0.samples"].split(",")]
    assert statistics.median(samples) > 0
    # the witness's margin, per timed call, each credited with the empty call beside it
    unexplained = [float(x) for x in result.raw["benchmark.0.unexplained_ns"].split(",")]
    assert len(unexplained) == len(samples) and statistics.median(unexplained) < ev.FORGE_MIN_NS["cpu"]


# ============================================================================ the trusted side, without processes


def _load_eval():
    """popkit's harness (tasks/eval.py and the modules it loads), its names in one namespace."""
    return load_harness("popkit_harness_verdict")


ev = _load_eval()


def test_a_reported_time_far_below_the_trusted_clock_is_forged():
    walls = [20.3e6] * 5  # the trusted clock: 20 ms per call
    assert ev.forged_time([1234.0] * 5, walls, [100e3] * 5, "cpu").startswith(
        "time forged: the worker reported a median of 1.2 µs per call")
    assert ev.forged_time([20.0e6] * 5, walls, [100e3] * 5, "cpu") is None  # the honest report of the same calls


def test_the_empty_calls_overhead_is_credited_only_up_to_its_cap():
    """A worker that makes its empty calls slow cannot buy an unlimited allowance."""
    walls = [5e6] * 5
    assert ev.forged_time([1e3] * 5, walls, [4.9e6] * 5, "cpu") is not None
    assert ev.forged_time([1e3] * 5, [1.1e6] * 5, [1e6] * 5, "cpu") is None  # within the overhead and the floor


def test_a_calls_unexplained_time_is_what_its_report_and_credit_leave():
    assert ev.unexplained_ns([10e3, 20e3], [100e3, 2.5e6], [50e3, 3e6]) == [40e3, 2.5e6 - 20e3 - 1e6]
    assert ev.unexplained_ns([10e3], [100e3, 200e3], [50e3]) == []  # lists that do not match: nothing to say


def test_a_load_that_slows_each_round_trip_is_credited_call_by_call():
    """A loaded machine: every round trip waits for a core, by a different amount each time (0.1-1.5 ms). An
    honest 30 µs call is credited with the empty call beside it and passes; one overhead measured before the load
    would leave the waits unexplained. A 600 µs call reported as 30 µs still fails under the same load."""
    rng = random.Random(7)
    waits = [rng.uniform(100e3, 1.5e6) for _ in range(200)]
    beside = [w + rng.uniform(-50e3, 50e3) for w in waits]
    honest = [30e3 + w for w in waits]
    assert ev.forged_time([30e3] * 200, honest, beside, "cpu") is None
    assert ev.forged_time([30e3] * 200, honest, [100e3] * 200, "cpu") is not None  # the credit of a quiet moment
    assert "time forged" in ev.forged_time([30e3] * 200, [600e3 + w for w in waits], beside, "cpu")


class FakeJudge:
    cuda = True

    def system(self):
        return {"device": "Trusted GPU", "torch": "t", "cuda": "c", "hip": "", "arch": "sm_90"}


class ReadyOnly:
    def __init__(self, ready):
        self.ready = ready

    def receive(self):
        return self.ready

    def kill(self):
        pass


class Lines:
    def __init__(self):
        self.lines = {}

    def write(self, key, value):
        self.lines[key] = str(value)


@pytest.mark.parametrize("ready", [
    {"ok": True, "system": {"device": "forged-device"}, "audit": "off", "timer": "cpu-monotonic"},
    {"ok": True, "system": "not a dict", "audit": "drain"},  # a fallback without its self-test note
])
def test_the_ready_reply_is_data_the_trusted_side_decides(ready):
    pipe = Lines()
    session = ev.Session(pipe, ReadyOnly(ready), "benchmark", [], True, audit="trace", judge=FakeJudge())
    session.start()
    assert pipe.lines["system.device"] == "Trusted GPU" and pipe.lines["trust.audit"] == "trace"
    assert session.timer == "cuda-event"


def test_a_failed_trace_self_test_may_still_fall_back_to_the_drain_rule():
    pipe = Lines()
    ready = {"ok": True, "audit": "drain", "audit_note": "no usable GPU trace here (why)"}
    session = ev.Session(pipe, ReadyOnly(ready), "benchmark", [], True, audit="trace", judge=FakeJudge())
    session.start()
    assert pipe.lines["trust.audit"] == "drain" and "no usable GPU trace" in pipe.lines["trust.audit_note"]


def _judge_reading(tmp_path, data: bytes):
    fd = os.open(tmp_path / "buffer", os.O_RDWR | os.O_CREAT)
    os.write(fd, data)
    judge = object.__new__(ev.Judge)
    import torch

    judge.torch, judge.fd, judge.cuda = torch, fd, False
    judge.dtypes = {n: v for n, v in vars(torch).items() if isinstance(v, torch.dtype)}
    judge._stages = {}
    return judge


def test_the_trusted_side_rebuilds_an_output_from_bytes_and_json_only(tmp_path):
    import torch

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    judge = _judge_reading(tmp_path, bytes(t.view(torch.uint8).reshape(-1).tolist()))
    described = {"structure": {"seq": "tuple", "items": [{"tensor": 0}, {"value": 3}]},
                 "tensors": [{"dtype": "float32", "shape": [2, 3], "offset": 0, "nbytes": 24, "device": "cpu"}]}
    out = judge.read(described)
    assert isinstance(out, tuple) and torch.equal(out[0], t) and out[1] == 3


def test_an_output_read_is_its_own_copy_when_the_staging_memory_is_read_again(tmp_path):
    """read stages the bytes in memory it reuses: an output must survive the reads after it."""
    import torch

    small, large = torch.arange(6, dtype=torch.float32), torch.arange(3 << 18, dtype=torch.int32)
    raw = small.view(torch.uint8).numpy().tobytes() + bytes(40) + large.view(torch.uint8).numpy().tobytes()
    judge = _judge_reading(tmp_path, raw)

    def read(dtype, shape, offset, nbytes):
        return judge.read({"structure": {"tensor": 0}, "tensors": [
            {"dtype": dtype, "shape": shape, "offset": offset, "nbytes": nbytes, "device": "cpu"}]})

    two = read("int32", [3 << 18], 64, 3 << 20)
    one = read("float32", [6], 0, 24)  # staged where `two` was
    three = read("int32", [6], 64 + 400, 24)
    assert torch.equal(two, large) and torch.equal(one, small) and torch.equal(three, large[100:106])


@pytest.mark.parametrize("tensor,why", [
    ({"dtype": "float32", "shape": [2, 3], "offset": 8, "nbytes": 24}, "do not fit"),  # past the buffer's end
    ({"dtype": "float32", "shape": [4, 3], "offset": 0, "nbytes": 24}, "do not fit"),  # bytes not of the shape
    ({"dtype": "os.system", "shape": [2, 3], "offset": 0, "nbytes": 24}, "malformed"),  # no torch dtype
    ({"dtype": "float32", "shape": [-1], "offset": 0, "nbytes": 24}, "malformed"),
    ({"dtype": "float32", "shape": [2, 3], "offset": 0, "nbytes": 24, "device": "cuda"}, "device this machine lacks"),
])
def test_a_description_that_is_not_an_output_is_refused(tmp_path, tensor, why):
    judge = _judge_reading(tmp_path, bytes(24))
    with pytest.raises(ValueError, match=why):
        judge.read({"structure": {"tensor": 0}, "tensors": [tensor]})


@pytest.mark.slow
def test_the_worker_cannot_reach_the_trusted_process(tmp_path):
    """ptrace, process_vm_readv/writev and /proc/<pid>/mem from the worker (as root here: CAP_SYS_PTRACE dropped)."""
    result = run("reach_parent.py", "test", tmp_path)
    assert result.exit_code == 0, errors_of(result)
    lines = (tmp_path / "reach_parent-test" / "reach_parent.txt").read_text().splitlines()
    assert len(lines) == 4 and all(": refused" in line for line in lines), lines


def test_the_seccomp_program_refuses_the_calls_that_reach_another_process():
    """The BPF program run by hand: EPERM for ptrace and process_vm_*, x32 and foreign-ABI calls; others allowed."""
    def verdict(program, arch, nr):
        pc, acc = 0, None
        while True:
            code, jt, jf, k = program[pc]
            if code == 0x20:
                acc = arch if k == 4 else nr
            elif code in (0x15, 0x35):
                pc += jt if (acc == k if code == 0x15 else acc >= k) else jf
            elif code == 0x06:
                return k
            pc += 1

    eperm, allow = 0x00050001, 0x7FFF0000
    program = ev._bpf_program("x86_64")
    x86 = ev._AUDIT_ARCH["x86_64"]
    assert [verdict(program, x86, nr) for nr in (101, 310, 311)] == [eperm] * 3
    assert verdict(program, x86, 0x40000000 + 521) == eperm  # x32 ptrace
    assert verdict(program, 0x40000003, 26) == eperm  # i386
    assert [verdict(program, x86, nr) for nr in (0, 1, 9, 257)] == [allow] * 4


def test_a_report_says_which_harness_judged():
    from popkit.model.results import ModeRun, RunReport
    from popkit.views.running import judged_by

    def report(*checks):
        runs = tuple(ModeRun("test", False, None, 0, 1.0, 10.0, raw={} if c is None else {"trust.checks": c})
                     for c in checks)
        return RunReport("t", "t", None, "geom", "s.py", "0", "test", "task", "2026", 1.0, runs=runs)

    sealed = ",".join(ev.TRUST_CHECKS)
    assert report(sealed, sealed).judged == "sealed" and report(sealed).to_json()["judged"] == "sealed"
    assert judged_by(report(sealed)).startswith("sealed: ")
    assert report(sealed, "").judged == "open"  # one run judged in the open is an open report
    assert judged_by(report("")).startswith("open: ")  # trust off
    assert report(None).to_json()["judged"] == "open"  # a task's own eval (no such key)
    assert report().judged == "open"  # nothing ran


def test_each_timed_calls_own_gpu_work_is_measured_from_the_trace():
    """kernel_ns (busy, overlaps once), gap_ns (idle inside the call's span) and launches, per timed call."""
    q, side = ("gpu", 7), ("gpu", 9)
    spin = ev.MARKER_KERNEL

    def r(queue, start, end, name="k"):
        return ev.GpuRecord(queue, float(start), float(end), name)

    records = [r(q, 0, 10, spin),
               r(q, 100, 110, spin), r(q, 110, 150, "fill"),  # M1, the L2 flush
               r(q, 150, 200), r(side, 180, 220), r(q, 260, 300),  # the call: busy 150-220 and 260-300
               r(q, 400, 410, spin), r(q, 500, 510, spin)]  # M2, M3
    (audit,) = ev.audit_trace(records, [(150.0, 1e9)])
    assert (audit.kernel_ns, audit.gap_ns, audit.launches) == (110.0, 40.0, 3)
    assert ev.busy_ns([r(q, 0, 10), r(q, 5, 20), r(q, 30, 31)]) == 21.0
