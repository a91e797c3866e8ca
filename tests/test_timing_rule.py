"""The timing audit of tasks/eval.py (docs/design.md, "Work that outlives the end event"), on a CPU.

A fake GPU (FakeGpu) plays the timeline a GPU trace records: the host queues work at its own time, each
queue runs its pieces in order, events complete once the work queued before them on their queue is done.
The harness's side (FakeHarness) queues what Device.measure queues around every timed call (markers, the
L2 flush, the start and end events), so the trace the audit reads has the real structure; host stalls can
be put anywhere. Submissions are bodies that queue work: honest, fork-join, CUDA graphs, the side-queue cheat.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from test_harness_split import copy_harness, load_harness

ROOT = Path(__file__).resolve().parent.parent


def _load_eval():
    """popkit's harness (tasks/eval.py and the modules it loads), its names in one namespace."""
    return load_harness("popkit_harness_timing_rule")


ev = _load_eval()

MARKER = "void at::cuda::(anonymous namespace)::spin_kernel(long)"
TIMED, SIDE, OTHER = (0, 7), (0, 13), (0, 14)  # (device, queue) as the profiler names them
FLUSH_NS = 80_000  # the 256 MiB L2 flush on an H100
LEAD_SPIN_NS = 100_000  # the first marker's spin (eval.LEAD_SPIN_CYCLES at 2 GHz)


class FakeGpu:
    """One clock (ns). Work queued at host time `now` starts LAUNCH_NS later at the earliest, after the queue's
    previous piece and after what the queue was told to wait for; every launch or record costs the host API_NS."""

    LAUNCH_NS, API_NS = 2_000, 3_000

    def __init__(self):
        self.now = 0.0
        self.free: dict = {}  # queue -> when its last piece ends
        self.records: list = []

    def host(self, ns: float) -> None:
        self.now += ns

    def _earliest(self, queue) -> float:
        return max(self.now + self.LAUNCH_NS, self.free.get(queue, 0.0))

    def launch(self, queue, duration: float, name: str = "kernel") -> float:
        start = self._earliest(queue)
        self.free[queue] = start + duration
        self.records.append(ev.GpuRecord(queue, start, start + duration, name))
        self.now += self.API_NS
        return start + duration

    def graph(self, queue, durations: list[float]) -> float:
        """A CUDA graph replayed on `queue`: one host call, its kernels back to back (the trace lists each)."""
        t = self._earliest(queue)
        for i, d in enumerate(durations):
            self.records.append(ev.GpuRecord(queue, t, t + d, f"graph node {i}"))
            t += d
        self.free[queue] = t
        self.now += self.API_NS
        return t

    def record_event(self, queue) -> float:
        """The GPU time the event completes."""
        t = self._earliest(queue)
        self.free[queue] = t
        self.now += self.API_NS
        return t

    def wait(self, queue, t: float) -> None:
        self.free[queue] = max(self.free.get(queue, 0.0), t)

    def sync(self) -> None:
        self.now = max([self.now, *self.free.values()]) + 1_000


class FakeHarness:
    """A trace session on a FakeGpu, queued as TraceAudit.start and Device.measure queue it."""

    def __init__(self, gpu: FakeGpu | None = None):
        self.gpu = gpu or FakeGpu()
        self.calls: list[tuple[float, float]] = []  # (event time, lead) per timed call
        self.ends: list[float] = []  # the GPU time of each call's end event
        self.gpu.launch(TIMED, 1_000, MARKER)
        self.gpu.sync()

    def untimed(self, body) -> None:
        """A checked call or the harness's own checks between timed calls: no markers."""
        body(self.gpu)
        self.gpu.sync()

    def timed(self, body, stall_before_start: float = 0.0, stall_after_end: float = 0.0, after_end=None) -> None:
        g = self.gpu
        g.sync()
        h0 = g.now
        g.launch(TIMED, LEAD_SPIN_NS, MARKER)
        g.launch(TIMED, FLUSH_NS, "fill (L2 flush)")
        g.host(stall_before_start)
        start = g.record_event(TIMED)
        lead = g.now - h0
        body(g)
        end = g.record_event(TIMED)
        if after_end is not None:
            after_end(g)
        g.host(stall_after_end)
        g.launch(TIMED, 1_000, MARKER)
        g.sync()
        g.launch(TIMED, 1_000, MARKER)
        self.calls.append((end - start, lead))
        self.ends.append(end)

    def audit(self) -> list:
        return ev.audit_trace(self.gpu.records, self.calls)


def honest(ns: float):
    return lambda g: g.launch(TIMED, ns)


def honest_with_stall(ns: float, stall: float):
    """Two kernels on the timed queue with the host stalled between them."""
    def body(g):
        g.launch(TIMED, ns)
        g.host(stall)
        g.launch(TIMED, ns / 2)
    return body


def fork_join(ns: float):
    """Work on another queue, joined back to the timed queue before returning: honest."""
    def body(g):
        g.wait(SIDE, g.record_event(TIMED))
        g.launch(SIDE, ns)
        g.wait(TIMED, g.record_event(SIDE))
    return body


def side_queue(ns: float, sink: list | None = None):
    """The cheat: the work on another queue, never joined back."""
    def body(g):
        g.wait(SIDE, g.record_event(TIMED))
        end = g.launch(SIDE, ns)
        if sink is not None:
            sink.append(end)
    return body


# ============================================================================ honest calls pass


def test_honest_calls_pass_whatever_the_host_does():
    """Host stalls anywhere (before the start event, inside the call, before the end marker) never fail an honest
    call: a stall only moves the bounds later. 300 calls of every honest kind, stalls up to 2 ms."""
    rng = random.Random(20)
    harness = FakeHarness()
    for _ in range(300):
        ns = rng.choice([1_000, 20_000, 300_000, 2_000_000])
        body = rng.choice([honest(ns), fork_join(ns), honest_with_stall(ns, rng.choice([0, 50_000, 2e6])),
                           lambda g, ns=ns: g.graph(TIMED, [ns / 3] * 3)])
        harness.timed(body, stall_before_start=rng.choice([0, 0, 0, 150_000, 176_000, 2e6]),
                      stall_after_end=rng.choice([0, 0, 40_000, 2e6]))
        if rng.random() < 0.3:  # leaderboard mode: the harness's checks and the next input between calls
            harness.untimed(lambda g: (g.launch(TIMED, 30_000, "check"), g.launch(OTHER, 10_000, "generate")))
    audits = harness.audit()
    assert len(audits) == 300
    assert all(a.overrun_ns <= 0 and a.marker_overrun_ns <= 0 for a in audits)
    assert ev.unsynchronized_trace(audits) is None
    assert all(ev.untimed_ns(a) == 0 for a in audits)  # nothing added to an honest call's time


def test_work_on_the_timed_queue_never_fails():
    """Stream order: whatever runs on the timed queue before the end event ends before it, however long."""
    rng = random.Random(7)
    harness = FakeHarness()
    for _ in range(200):
        kernels = [rng.choice([500, 5_000, 80_000, 1e6]) for _ in range(rng.randint(1, 6))]

        def body(g, kernels=kernels):
            for k in kernels:
                g.launch(TIMED, k)
                g.host(rng.choice([0, 0, 100_000]))
        harness.timed(body, stall_before_start=rng.choice([0, 1e6]), stall_after_end=rng.choice([0, 1e6]))
    assert max(a.overrun_ns for a in harness.audit()) <= 0


def test_an_on_time_start_gives_the_end_events_exact_time():
    """Queued while the flush ran, the start event completes when the flush does: flush end + event time is the
    end event's own time, so an honest kernel that ends right at the end event overruns by exactly 0."""
    harness = FakeHarness()
    harness.timed(honest(50_000))
    (audit,) = harness.audit()
    assert audit.on_time and audit.overrun_ns == 0.0
    assert audit.marker_overrun_ns <= 0  # the end marker starts once the end event completed, or later
    # A host 150 µs slow to queue the flush and the start event (longer than the flush) is still on time: the
    # first marker's spin keeps the GPU busy until the start event is queued.
    harness = FakeHarness()
    harness.timed(honest(50_000), stall_before_start=150_000)
    (audit,) = harness.audit()
    assert audit.on_time and audit.overrun_ns == 0.0


def test_a_call_without_gpu_work_has_no_overrun():
    harness = FakeHarness()
    harness.timed(lambda g: g.host(5_000))
    (audit,) = harness.audit()
    assert audit.overrun_ns is None and audit.marker_overrun_ns is None
    assert ev.unsynchronized_trace(harness.audit()) is None


def test_checked_calls_and_the_harness_checks_between_calls_are_not_a_calls_work():
    """Before the first timed call (checked calls) and between calls (leaderboard checks), even work left on
    another queue belongs to no timed call: the device is synchronized before each timed call starts."""
    harness = FakeHarness()
    harness.untimed(side_queue(500_000))  # a checked call that cheats: its output is checked, not its time
    for _ in range(3):
        harness.timed(honest(10_000))
        harness.untimed(lambda g: g.launch(OTHER, 400_000, "check"))
    assert ev.unsynchronized_trace(harness.audit()) is None


# ============================================================================ the cheat fails, at any share


def test_one_side_queue_call_in_forty_fails_by_name():
    ends: list[float] = []
    harness = FakeHarness()
    for call in range(1, 41):
        harness.timed(side_queue(200_000, ends) if call == 7 else honest(200_000))
    audits = harness.audit()
    assert audits[6].overrun_ns == pytest.approx(ends[0] - harness.ends[6])
    assert [i for i, a in enumerate(audits, 1) if a.overrun_ns > ev.TRACE_MARGIN_NS] == [7]
    message = ev.unsynchronized_trace(audits)
    overrun_us = round(audits[6].overrun_ns / 1e3)
    assert message == (f"unsynchronized work: call 7 of 40 left {overrun_us} µs of GPU work running on another "
                       "queue after its end event (1 of the 40 timed calls did; GPU timestamps), so the event time "
                       "misses it: work on another queue must be joined to the current one before custom_kernel "
                       "returns")


@pytest.mark.parametrize("share", [0.1, 0.2, 0.4, 0.49])
def test_the_share_cheat_fails_at_every_share(share):
    """The share cheat's own schedule (submissions/cheats/side_stream_share.py: call n cheats when floor(n*share)
    grows), 100 timed calls with host stalls: the drain rule's share would pass it, the trace audit does not."""
    harness = FakeHarness()
    rng = random.Random(share)
    cheating = [int(n * share) > int((n - 1) * share) for n in range(1, 101)]
    for cheats in cheating:
        harness.timed(side_queue(150_000) if cheats else honest(150_000), stall_after_end=rng.choice([0, 60_000]))
    audits = harness.audit()
    late = [a.overrun_ns > ev.TRACE_MARGIN_NS for a in audits]
    assert late == cheating
    assert ev.unsynchronized_trace(audits).startswith("unsynchronized work: call ")
    # The same calls' drains (host clock): every cheating call drains late, and so do a few honest ones.
    drains = [140e3 if c else 5e3 for c in cheating]
    assert ev.unsynchronized_work(drains) is None  # below half: the drain rule's hole


def test_a_late_start_falls_back_to_the_end_marker_which_still_catches_long_escapes():
    """The host stalled past the flush's end before queuing the start event: the end event's time is then only
    bounded by the end marker, which starts after the host queued it."""
    harness = FakeHarness()
    harness.timed(honest(100_000), stall_before_start=200_000)
    harness.timed(side_queue(300_000), stall_before_start=200_000)
    honest_call, cheat = harness.audit()
    assert not honest_call.on_time and honest_call.overrun_ns == honest_call.marker_overrun_ns <= 0
    assert not cheat.on_time and cheat.overrun_ns == cheat.marker_overrun_ns > 250_000


def test_escapes_within_the_margin_pass_and_just_past_it_fail():
    def with_overrun(ns: float):
        harness = FakeHarness()
        harness.timed(honest(1_000))
        calls = list(harness.calls)
        # The side work ends `ns` after the end event's GPU time (flush end + event time).
        flush = next(r for r in harness.gpu.records if r.name.startswith("fill"))
        harness.gpu.records.append(ev.GpuRecord(SIDE, flush.end_ns, flush.end_ns + calls[0][0] + ns))
        return ev.unsynchronized_trace(ev.audit_trace(harness.gpu.records, calls))
    assert with_overrun(ev.TRACE_MARGIN_NS) is None
    assert with_overrun(ev.TRACE_MARGIN_NS + 1) is not None


def test_side_queue_work_too_short_for_the_margin_is_timed_to_its_trace():
    """A small shape's side-queue cheat: its work (6 µs) ends inside the margin after the end event, so nothing
    proves it; the call is timed to the end of its work instead, and the cheat's time is no lower than the
    honest kernel's (on an H100 the events alone timed such calls at 1.7 µs against a median of 6.8 µs)."""
    harness = FakeHarness()
    harness.timed(honest(6_000))
    harness.timed(side_queue(6_000))
    honest_call, cheat = harness.audit()
    assert ev.unsynchronized_trace([honest_call, cheat]) is None
    (honest_ns, _), (event_ns, _) = harness.calls
    assert event_ns < honest_ns  # the events alone: the cheat looks faster
    assert ev.untimed_ns(honest_call) == 0
    assert event_ns + ev.untimed_ns(cheat) >= honest_ns  # timed to its trace: no faster than the honest call


def test_no_call_passing_the_audit_is_timed_shorter_than_its_own_gpu_work():
    """Event time plus what the trace adds covers the call's busy GPU time on every queue, whatever the call
    does: on the timed queue, forked and joined, short side-queue escapes, work started beside the flush."""
    rng = random.Random(11)
    harness = FakeHarness()
    bodies = [honest, fork_join, side_queue, lambda ns: (lambda g: g.launch(SIDE, ns))]
    for _ in range(200):
        harness.timed(rng.choice(bodies)(rng.choice([1_000, 3_000, 6_000, 9_000])),
                      stall_after_end=rng.choice([0, 20_000]))
    audits = harness.audit()
    judged = [(call, a) for call, a in zip(harness.calls, audits)
              if ev.unsynchronized_trace([a]) is None and a.kernel_ns]
    assert len(judged) > 100
    assert all(event_ns + ev.untimed_ns(a) >= a.kernel_ns for (event_ns, _lead), a in judged)


def test_side_queue_work_started_before_the_start_event_fails_or_is_counted():
    """Work put on another queue without waiting for the timed one runs beside the L2 flush, before the start
    event: long, it fails by name; short, its time before the start event is added."""
    def early(ns: float):
        return lambda g: g.launch(SIDE, ns)  # no wait: it starts as soon as the host queues it, under the flush
    harness = FakeHarness()
    harness.timed(early(60_000))
    (audit,) = harness.audit()
    assert audit.early_ns > ev.TRACE_MARGIN_NS
    assert ev.unsynchronized_trace([audit]).startswith("unsynchronized work: call 1 of 1 started GPU work on "
                                                       "another queue ")
    harness = FakeHarness()
    harness.timed(honest(6_000))
    flush = next(r for r in harness.gpu.records if r.name.startswith("fill"))
    harness.gpu.records.append(ev.GpuRecord(SIDE, flush.end_ns - 5_000, flush.end_ns + 1_000))
    (audit,) = harness.audit()
    assert audit.early_ns == 5_000 and ev.unsynchronized_trace([audit]) is None and ev.untimed_ns(audit) == 5_000


def test_cuda_graph_kernels_count():
    """A graph replayed on another queue and not joined escapes like any kernel; on the timed queue, or joined
    back, it is honest."""
    harness = FakeHarness()
    harness.timed(lambda g: g.graph(TIMED, [30_000] * 4))
    harness.timed(lambda g: (g.wait(SIDE, g.record_event(TIMED)), g.graph(SIDE, [30_000] * 4),
                             g.wait(TIMED, g.record_event(SIDE))))
    harness.timed(lambda g: (g.wait(SIDE, g.record_event(TIMED)), g.graph(SIDE, [30_000] * 4)))
    audits = harness.audit()
    assert [a.overrun_ns > ev.TRACE_MARGIN_NS for a in audits] == [False, False, True]
    assert ev.unsynchronized_trace(audits).startswith("unsynchronized work: call 3 of 3 left ")


def test_work_queued_on_the_timed_queue_after_the_end_event_is_named_so():
    """A background thread that queues work on the timed queue once custom_kernel returned: the end marker waits
    behind it, but the end event's exact time (an on-time start) still shows it."""
    harness = FakeHarness()
    harness.timed(honest(1_000), after_end=lambda g: g.launch(TIMED, 400_000))
    (audit,) = harness.audit()
    assert audit.on_current and audit.marker_overrun_ns <= 0 < audit.overrun_ns
    assert "of GPU work running on the timed queue after its end event" in ev.unsynchronized_trace([audit])


# ============================================================================ a disturbed trace fails closed


def test_a_trace_without_the_harness_markers_is_an_error():
    harness = FakeHarness()
    for _ in range(40):
        harness.timed(honest(10_000))
    records = harness.gpu.records
    missing = [r for r in records if r is not [m for m in records if m.name == MARKER][5]]
    with pytest.raises(ev.TraceError, match=r"^the trace holds 120 of the 121 markers the harness launched on the "
                                            r"timed queue$"):
        ev.audit_trace(missing, harness.calls)
    with pytest.raises(ev.TraceError, match="^the trace does not begin with the harness's first marker$"):
        ev.audit_trace([ev.GpuRecord(SIDE, -1.0, 0.0, "kernel"), *records], harness.calls)
    with pytest.raises(ev.TraceError, match="does not begin"):
        ev.audit_trace([], harness.calls)


def test_the_marker_kernel_launched_by_the_submission_on_the_timed_queue_is_an_error_and_elsewhere_just_work():
    harness = FakeHarness()
    harness.timed(lambda g: g.launch(TIMED, 1_000, MARKER))
    with pytest.raises(ev.TraceError, match="holds 5 of the 4 markers"):
        harness.audit()
    harness = FakeHarness()
    harness.timed(lambda g: (g.wait(SIDE, g.record_event(TIMED)), g.launch(SIDE, 90_000, MARKER)))
    assert harness.audit()[0].overrun_ns > 80_000


def test_a_call_whose_flush_is_missing_is_an_error():
    harness = FakeHarness()
    harness.timed(lambda g: g.host(5_000))
    records = [r for r in harness.gpu.records if not r.name.startswith("fill")]
    with pytest.raises(ev.TraceError, match="^timed call 1 has no L2 flush between its markers$"):
        ev.audit_trace(records, harness.calls)


# ============================================================================ the parent's verdict and pipe keys


class ScriptedWorker:
    """The parent's view of a worker (no process, no torch): scripted timed calls, then one bench_end reply."""

    def __init__(self, calls: list[dict], end: dict, ready: dict | None = None):
        self.calls, self.end, self.ready = iter(calls), end, ready or {}

    def receive(self) -> dict:
        return {"ok": True, "system": {"device": "Fake GPU"}, "timer": "cuda-event", **self.ready}

    def request(self, op: str, **fields) -> dict:
        if op == "bench_call":
            return next(self.calls)
        if op == "bench_end":
            return self.end
        return {"ok": True}

    def kill(self) -> None:
        pass


class Pipe:
    def __init__(self):
        self.lines: dict[str, str] = {}

    def write(self, key, value):
        self.lines.setdefault(key, str(value))


def _run_session(audit_reply: dict, calls: int = 3, ready: dict | None = None, trust: bool = True):
    """A benchmark case through Session: identical event times converge after 3 timed calls (and 3 warm-up)."""
    timed = [{"ok": True, "ns": 100e3, "drain": 4e3, "lead": 20e3}] * calls
    warm = [{"ok": True, "ns": 100e3, "drain": 4e3, "lead": 20e3}] * 3
    pipe = Pipe()
    end = {"ok": True, "audit": audit_reply}
    session = ev.Session(pipe, ScriptedWorker(warm + timed, end, ready), "benchmark", [{"size": 8, "seed": 1}],
                         trust, clock_ns=lambda: 0, audit="trace")
    session.start()
    session.run()
    return session, pipe.lines


def _summary(overruns, markers=None, on_time=None, on_current=None) -> dict:
    n = len(overruns)
    return {"overruns": overruns, "marker_overruns": markers or [o and o - 20e3 for o in overruns],
            "on_time": on_time or [True] * n, "on_current": on_current or [False] * n}


def test_a_case_with_one_late_call_fails_and_keeps_its_signals():
    session, lines = _run_session(_summary([None, 183e3, -1e3]))
    assert not session.all_passed
    assert lines["trust.audit"] == "trace"
    assert lines["benchmark.0.error"].startswith("unsynchronized work: call 2 of 3 left 183 µs of GPU work running "
                                                 "on another queue after its end event (1 of the 3 timed calls did")
    assert lines["benchmark.0.overruns"] == "nan,183000.0,-1000.0"
    assert lines["benchmark.0.marker_overruns"] == "nan,163000.0,-21000.0"
    assert lines["benchmark.0.late_starts"] == "0"
    assert lines["benchmark.0.drains"] == "4000.0,4000.0,4000.0"
    assert lines["benchmark.0.audit_samples"] == "100000.0,100000.0,100000.0"
    assert "benchmark.0.mean" not in lines


def test_a_case_is_timed_to_its_trace_where_side_queue_work_outlasted_the_events():
    """Calls 2 and 3 left 4 µs and 1 µs of work on another queue past their end events, call 3 also started
    2 µs early: within the margin, so the case passes, each sample with that time added (and said so)."""
    summary = _summary([-2e3, 4e3, 1e3]) | {"early": [None, -1e3, 2e3]}
    session, lines = _run_session(summary)
    assert session.all_passed, lines.get("benchmark.0.error")
    assert lines["benchmark.0.samples"] == "100000.0,104000.0,103000.0"
    assert lines["benchmark.0.added_ns"] == "0.0,4000.0,3000.0"
    assert lines["benchmark.0.early_starts"] == "nan,-1000.0,2000.0"
    assert lines["benchmark.0.mean"] == format(float(ev.summarize([100e3, 104e3, 103e3]).mean))
    # Late work on the timed queue is only the clocks' disagreement: nothing is added.
    _, lines = _run_session(_summary([-2e3, 4e3, 1e3], on_current=[True] * 3))
    assert lines["benchmark.0.samples"] == "100000.0,100000.0,100000.0" and "benchmark.0.added_ns" not in lines


def test_an_honest_case_passes_with_its_statistics_and_signals():
    session, lines = _run_session(_summary([-2e3, 1e3, 4.9e3], on_time=[True, False, True], on_current=[True] * 3))
    assert session.all_passed, lines.get("benchmark.0.error")
    assert lines["benchmark.0.mean"] == "100000.0" and lines["benchmark.0.late_starts"] == "1"
    assert "benchmark.0.audit_samples" not in lines


@pytest.mark.parametrize("reply,error", [
    ({"error": "the trace holds 7 of the 13 markers the harness launched on the timed queue"},
     "timing audit failed: the trace holds 7 of the 13 markers the harness launched on the timed queue"),
    (None, "timing audit failed: the worker sent no GPU trace for this case"),
    ({"overruns": [1.0]}, "timing audit failed: the worker's GPU trace summary is malformed"),
    (_summary([0.0, 0.0]), "timing audit failed: the GPU trace holds 2 timed calls, the timing loop made 3"),
])
def test_a_missing_or_broken_trace_fails_the_case_by_name(reply, error):
    session, lines = _run_session(reply)
    assert not session.all_passed and lines["benchmark.0.error"] == error


def test_the_worker_says_which_audit_applies_and_trust_off_judges_nothing():
    note = "no usable GPU trace here (TraceError: x); the drain rule judges instead"
    _, lines = _run_session(None, ready={"audit": "drain", "audit_note": note})
    assert lines["trust.audit"] == "drain" and lines["trust.audit_note"] == note
    assert "benchmark.0.error" not in lines  # drains of 4 µs: the drain rule passes the case
    session, lines = _run_session(_summary([500e3] * 3), trust=False)
    assert session.all_passed and "benchmark.0.error" not in lines


def test_the_audit_switch_accepts_only_its_rules(tmp_path):
    """POPKIT_TIMING_AUDIT is read before anything runs: an unknown rule is a usage error (exit 2)."""
    import os
    import subprocess

    copy_harness(tmp_path)
    (tmp_path / "cases.txt").write_text("size: 8; seed: 1\n")
    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPCORN_", "POPKIT_"))}
    env |= {"POPCORN_FD": str(write_fd), "POPKIT_TIMING_AUDIT": "sometimes"}
    done = subprocess.run([sys.executable, "eval.py", "benchmark", "cases.txt"], cwd=tmp_path, env=env,
                          pass_fds=(write_fd,), capture_output=True, text=True, timeout=60)
    os.close(write_fd)
    os.close(read_fd)
    assert done.returncode == 2
    assert done.stderr.strip() == "eval: POPKIT_TIMING_AUDIT must be one of trace, drain, off (got 'sometimes')"


# ============================================================================ the worker's glue (TimedCase)


class FakeTrace:
    """TraceAudit's interface, logging what the worker asks of it."""

    def __init__(self, fail_start: str = ""):
        self.log: list[str] = []
        self.active, self.calls, self.fail_start = False, [], fail_start

    def start(self):
        if self.fail_start:
            raise ev.TraceError(self.fail_start)
        self.log.append("start")
        self.active, self.calls = True, []

    def mark(self, cycles: int = 0):
        self.log.append(f"mark {cycles}")

    def note(self, timing):
        self.log.append("note")
        self.calls.append((timing["ns"], timing["lead"]))

    def finish(self):
        self.log.append("finish")
        self.active = False
        return {"overruns": [1.0] * len(self.calls), "marker_overruns": [0.0] * len(self.calls),
                "on_time": [True] * len(self.calls), "on_current": [False] * len(self.calls)}

    def abandon(self):
        if self.active:
            self.log.append("abandon")
        self.active = False


class FakeDevice:
    """Device.measure's order with a trace: M1 (a spin), flush and events, the call, M2, drain, M3."""

    cuda = True

    def __init__(self, log: list[str]):
        import types

        self.log = log
        self.torch = types.SimpleNamespace(cuda=types.SimpleNamespace())  # no CUDA error types: not a CUDA failure

    def sync(self):
        pass

    def measure(self, kernel, kernel_input, trace=None):
        if trace is not None:
            trace.mark(ev.LEAD_SPIN_CYCLES)
        out = kernel(kernel_input)
        self.log.append("call")
        if trace is not None:
            trace.mark()
            trace.mark()
        return out, {"ns": 10e3, "drain": 4e3, "lead": 20e3}


class FakeGuards:
    def snapshot(self):
        return set()

    def check_threads(self, before, during="custom_kernel"):
        pass

    def check_tripwires(self):
        pass


class FakeChecker:
    def __init__(self, log: list[str]):
        self.log = log

    def checked(self, case, shown=None):
        self.log.append("checked")
        return {"x": 1}

    def verify(self, *args):
        pass


class FakeTask:
    def layout(self, case, data):
        return ev.Layout([set()], set(), set(), [4], None, None)


def _timed_case(trace, kernel=lambda data: data):
    log = trace.log if trace is not None else []
    caller = ev.Caller(kernel, FakeDevice(log), FakeGuards(), trust=True)
    return ev.TimedCase(FakeTask(), caller, FakeChecker(log), trust=True, trace=trace), log


def test_the_trace_runs_from_before_the_checked_calls_to_the_end_and_marks_every_timed_call():
    trace = FakeTrace()
    timed, log = _timed_case(trace)
    assert timed.begin({"size": 8}, "benchmark")["ok"]
    replies = [timed.call() for _ in range(2)]
    end = timed.end()
    assert log == ["start", "checked",
                   f"mark {ev.LEAD_SPIN_CYCLES}", "call", "mark 0", "mark 0", "note",
                   f"mark {ev.LEAD_SPIN_CYCLES}", "call", "mark 0", "mark 0", "note", "finish"]
    assert all(r["ok"] and r["lead"] == 20e3 for r in replies)
    assert end["ok"] and end["audit"]["overruns"] == [1.0, 1.0]


def test_a_failed_call_drops_the_trace_and_the_next_case_starts_a_new_one():
    trace = FakeTrace()

    def kernel(data):
        raise ValueError("boom")

    timed, log = _timed_case(trace, kernel)
    timed.begin({"size": 8}, "benchmark")
    reply_error = None
    try:
        timed.call()
    except ev.CaseFailure as failure:
        reply_error = failure.error
    assert reply_error == "ValueError: boom" and log[-1] == "abandon" and not trace.active
    timed.begin({"size": 8}, "benchmark")
    assert log[-2:] == ["start", "checked"] and trace.active


def test_a_trace_that_cannot_start_fails_the_case_by_name_and_no_trace_means_no_audit():
    timed, _ = _timed_case(FakeTrace(fail_start="a profiler was already running when the harness started its "
                                                "trace (custom_kernel or its import started one)"))
    assert timed.begin({"size": 8}, "benchmark") == {
        "ok": False, "error": "timing audit failed: a profiler was already running when the harness started its "
                              "trace (custom_kernel or its import started one)"}
    plain, log = _timed_case(None)
    plain.begin({"size": 8}, "benchmark")
    plain.call()
    assert "audit" not in plain.end() and log == ["checked", "call"]
