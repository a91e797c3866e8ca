"""popkit's harness, the worker side: timed and profiled calls.

TraceAudit (one GPU profiler trace per timed case, its markers and its self-test) and TimedCase (the benchmark,
leaderboard and profile calls of one case). The numbers they report are checked by the trusted side
(popkit_trusted.Session, popkit_judge.forged_time).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any

from popkit_calls import Caller, Checker
from popkit_protocol import (GpuRecord, LEADERBOARD_SEED_STEP, PROFILE_CALLS, PROFILE_WARMUP_CALLS, SELF_TEST_CYCLES,
                             TRACE_MARGIN_NS, TraceError, audit_trace, with_seed_offset)
from popkit_shared import CaseFailure, Device, ReferenceTask, clone_data, first_line, flatten_tensors


@contextlib.contextmanager
def _quiet_stderr():
    """fd 2 to /dev/null: the profiler's library prints a line on every start and stop of a trace."""
    try:
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class TraceAudit:
    """The GPU-timestamp audit of timed calls (audit_trace): one profiler trace per timed case, GPU activities
    only (CUPTI on NVIDIA, roctracer on ROCm), on from before the case's checked calls (so every kernel the
    timed calls launch was launched once in the trace, and no timed call pays a first-launch cost of the
    tracer) until its last timed call; the harness's markers bracket every timed call (Device.measure).

    The profiler's functions are captured when this is made, before the submission is imported (they are
    tripwires too). A submission can see that a profiler runs; it runs on every timed call alike.
    """

    def __init__(self, torch, device: Device):
        from torch.autograd import ProfilerActivity, ProfilerConfig, ProfilerState
        from torch._C._profiler import _ExperimentalConfig

        autograd = torch.autograd
        self.torch, self.device = torch, device
        self._prepare, self._enable = autograd._prepare_profiler, autograd._enable_profiler
        self._disable, self._enabled = autograd._disable_profiler, autograd._profiler_enabled
        self._sleep = torch.cuda._sleep
        self._config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False,
                                      _ExperimentalConfig(), "")
        self._activities = {ProfilerActivity.CUDA}
        self._cpu = autograd.DeviceType.CPU
        self.active = False
        self.calls: list[tuple[float, float]] = []

    def mark(self, cycles: int = 0) -> None:
        """One marker on the current (timed) queue: a spin of `cycles` GPU cycles."""
        self._sleep(cycles)

    def start(self) -> None:
        """Start a trace (a leftover one of the harness's is dropped first) and launch the first marker.
        Raises TraceError when another profiler already runs."""
        self.abandon()
        self.device.sync()
        if self._enabled():
            raise TraceError("a profiler was already running when the harness started its trace (custom_kernel "
                             "or its import started one)")
        with _quiet_stderr():
            self._prepare(self._config, self._activities)
            self._enable(self._config, self._activities)
        self.active, self.calls = True, []
        self.mark()
        self.device.sync()

    def note(self, timing: dict) -> None:
        """A timed call's event time and lead (Device.measure's reply)."""
        self.calls.append((float(timing["ns"]), float(timing.get("lead", math.inf))))

    def records(self) -> list[GpuRecord]:
        """Stop the trace; its GPU activities. Raises TraceError when the trace was stopped by someone else."""
        self.device.sync()
        self.active = False
        try:
            with _quiet_stderr():
                events = self._disable().events()
        except RuntimeError as exc:
            raise TraceError(f"the harness's trace was stopped during the timed calls ({first_line(exc)})") from None
        found = []
        for e in events:
            if e.device_type() == self._cpu:
                continue
            start = float(e.start_ns())
            end = float(e.end_ns()) if hasattr(e, "end_ns") else start + float(e.duration_ns())
            found.append(GpuRecord((e.device_index(), e.device_resource_id()), start, end, e.name()))
        return found

    def finish(self) -> dict:
        """End the case's trace; per timed call what audit_trace found, or {"error": why}, for the parent."""
        if not self.active:
            return {"error": "the harness's trace was not running at the end of the case"}
        calls = self.calls
        try:
            audits = audit_trace(self.records(), calls)
        except TraceError as exc:
            return {"error": str(exc)}
        return {"overruns": [a.overrun_ns for a in audits], "marker_overruns": [a.marker_overrun_ns for a in audits],
                "on_time": [a.on_time for a in audits], "on_current": [a.on_current for a in audits],
                "kernel_ns": [a.kernel_ns for a in audits], "gap_ns": [a.gap_ns for a in audits],
                "launches": [a.launches for a in audits], "early": [a.early_ns for a in audits]}

    def abandon(self) -> None:
        """Stop a trace this harness left running (a failed case), discarding it."""
        if self.active:
            self.active = False
            try:
                with _quiet_stderr():
                    self._disable()
            except RuntimeError:
                pass

    def self_test(self, calls: int = 3) -> str:
        """Before the submission is imported: whether this machine's trace shows what the audit needs, by timed
        calls that leave a spin of SELF_TEST_CYCLES GPU cycles (milliseconds: far longer than the tracer's own
        cost on the host, which on an H100 adds 15 µs and more to a wait and a launch on another queue) running
        on another queue after their end event. "" when the audit sees every one of them, else why not."""
        torch, device = self.torch, self.device
        try:
            self.start()
            side = torch.cuda.Stream()

            def escape(_):
                ready = device.Event()
                ready.record()
                side.wait_event(ready)
                with torch.cuda.stream(side):
                    self._sleep(SELF_TEST_CYCLES)

            for _ in range(calls):
                device.sync()
                _, timing = device.measure(escape, None, trace=self)
                device.sync()
                self.note(timing)
            audits = audit_trace(self.records(), self.calls)
        except Exception as exc:  # whatever breaks here means: no usable trace on this machine
            self.abandon()
            return f"{type(exc).__name__}: {first_line(exc)}"
        if any(a.overrun_ns is None or a.overrun_ns <= TRACE_MARGIN_NS for a in audits):
            return "the trace did not show the work left running on another queue after the end event"
        return ""


class TimedCase:
    """The timed modes of one prepared case: benchmark and leaderboard calls, the last output's check,
    the case's GPU trace (when the trace audit judges: from before the checked calls to the last timed call),
    and profile mode's profiler table."""

    def __init__(self, task: ReferenceTask, caller: Caller, checker: Checker, trust: bool,
                 trace: TraceAudit | None = None):
        self.task, self.caller, self.checker, self.trust, self.trace = task, caller, checker, trust, trace
        self.bench: dict[str, Any] = {}

    def begin(self, case: dict, mode: str) -> dict:
        self.bench = {}
        try:
            if self.trace is not None and mode != "profile":
                self.trace.start()
            data = self.checker.checked(case)  # every benchmark shape is checked before it is timed
            layout = self.task.layout(case, data) if self.trust else None
        except TraceError as exc:
            return {"ok": False, "error": f"timing audit failed: {exc}"}
        except BaseException:
            self._drop_trace()
            raise
        self.bench = {"case": case, "mode": mode, "pristine": data, "layout": layout, "step": 0, "out": None,
                      "input": clone_data(data) if self.trust else data}
        if layout is None:
            return {"ok": True}
        # The fewest bytes a call must move: inputs read once (output buffers are only written), outputs written.
        read = sum(t.numel() * t.element_size() for i, t in enumerate(flatten_tensors(data)) if i not in layout.poisonable)
        return {"ok": True, "bytes": read + sum(layout.out_bytes)}

    def _drop_trace(self) -> None:
        if self.trace is not None:
            self.trace.abandon()

    def _tracing(self) -> TraceAudit | None:
        return self.trace if self.trace is not None and self.trace.active else None

    def call(self) -> dict:
        try:
            return self._call()
        except BaseException:  # the case failed: its trace is of no use
            self._drop_trace()
            raise

    def _call(self) -> dict:
        b = self.bench
        if not b:
            return {"ok": False, "error": "no case prepared"}
        if b["mode"] == "leaderboard":
            if b.get("next") is None:
                return {"ok": False, "error": "no input prepared for this timed call"}
            b["input"], b["next"] = b["next"], None
        out, timing = self.caller.timed(b["input"], self._tracing())
        b["out"] = out
        return {"ok": True, **timing}

    def next_input(self) -> dict:
        """Leaderboard: the next timed call's input (seed + 13, cumulative), made after the previous call
        finished. Every second call gets it in the previous call's tensors (same addresses, new values)."""
        b = self.bench
        b["step"] += 1
        data = self.task.generate(with_seed_offset(b["case"], LEADERBOARD_SEED_STEP * b["step"]))
        b["data"] = data
        if self.trust:
            into = b.get("last_input") if b["step"] % 2 == 0 else None
            b["next"] = self.task.trusted_input(data, b["layout"], 0xFF, into=into)
            b["last_input"] = b["next"]
        else:
            b["next"] = clone_data(data)
        return {"ok": True}

    def check_output(self) -> dict:
        """Leaderboard: the last timed call's output checked (trust on: handed to the trusted process)."""
        b = self.bench
        try:
            if self.trust:
                self.checker.verify(b["out"], b["input"], b["data"], b["layout"], 0xFF)
            else:
                self.checker.verify(b["out"], None, b["data"], None, None)
        except CaseFailure as failure:
            failure.error = f"{failure.error} [timed call {b['step']}]"
            raise
        return {"ok": True}

    def empty_call(self) -> dict:
        """A timed call of a kernel that does nothing, on the same path (the trusted side's per-call overhead)."""
        _, timing = self.caller.timed(None, kernel=lambda _data: None)
        return {"ok": True, **timing}

    def end(self) -> dict:
        """The case's trace audit (when a trace runs: {"audit": TraceAudit.finish()}); then, in benchmark mode
        (trust), the last timed call's output must be right too.

        The output check is skipped for tasks with in/out buffers (inputs the reference reads and then
        changes): every timed call gets the same data, so an honest kernel's last output reflects all the
        earlier calls.
        """
        b = self.bench
        reply: dict[str, Any] = {"ok": True}
        if self._tracing() is not None:
            reply["audit"] = self.trace.finish()
        layout = b.get("layout")
        in_out = layout is not None and bool(layout.writable - layout.poisonable)
        if self.trust and b.get("mode") == "benchmark" and b.get("out") is not None and not in_out:
            try:
                self.checker.verify(b["out"], b["input"], b["pristine"], b["layout"], None)
            except CaseFailure as failure:
                return CaseFailure(f"timed output wrong: the last timed call's output fails the check "
                                   f"(the checked calls passed): {failure.error}", failure.message).reply()
            reply["last_output"] = True
        self.bench = {}
        return reply

    def profile(self) -> dict:
        """A torch profiler table over a few calls of the prepared case."""
        torch = self.task.torch
        kernel_input = self.bench["input"]
        for _ in range(PROFILE_WARMUP_CALLS):
            self.caller.invoke(kernel_input)
        cuda = self.caller.device.cuda
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(PROFILE_CALLS):
                self.caller.invoke(kernel_input)
        sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort_by, row_limit=30)
        self.bench = {}
        return {"ok": True, "report": table}
