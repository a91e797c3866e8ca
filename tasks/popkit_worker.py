"""popkit's harness, the worker side: the spawned process that imports the submission.

worker_main starts it (death signal, seal, working folder), Worker sets it up (torch, the device, the task's
reference, the tripwires, then the submission) and hands each request of the trusted side to Checker or
TimedCase; replies go back as JSON only. Never imported by the trusted process.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from popkit_calls import Caller, Checker, Exporter, Guards
from popkit_protocol import inputs_ahead
from popkit_seal import die_with_parent, seal_worker
from popkit_shared import CaseFailure, Device, ReferenceTask, exception_failure, first_line
from popkit_timed import TimedCase, TraceAudit

# POPKIT_WORKER_SPIN=1, a measurement switch (scripts/gpu_split_cost.py): on a GPU, once the submission is loaded,
# the worker polls for its next request, this long at most, instead of sleeping in recv, so that the host work of a
# timed call (launching the kernel, recording the events) starts on a thread that was running, not one the
# scheduler (or a virtual machine's host) has just woken; the empty calls whose round trip the time witness credits
# are served the same way as the timed calls. Off by default until a GPU run shows what it changes.
SPIN_S = 0.05


class Worker:
    """The submission's side of one invocation: starts up (imports, captures), then hands each request to
    the piece that does it (Checker for test cases, TimedCase for the timed and profile modes)."""

    def __init__(self, settings: dict):
        self.trust = bool(settings.get("trust", True))
        self.audit = str(settings.get("audit", "off"))
        self.spin = bool(settings.get("spin", False))
        self.checker: Checker | None = None
        self.timed: TimedCase | None = None
        self.reply: dict[str, Any] = {}  # the `ready` reply so far (prepare); a failure in it fails every case
        self.device: Device | None = None
        self.task: ReferenceTask | None = None
        self.guards: Guards | None = None
        self._defaults: tuple | None = None  # _generation_defaults() when a warm start generated inputs
        self.trace: TraceAudit | None = None  # the trace audit (start_audit), when it judges this worker's timing
        self.exporter = Exporter(settings.get("outputs_fd"))

    def start_audit(self, torch, device: Device) -> tuple[TraceAudit | None, dict]:
        """The timing audit this worker applies ({"audit": rule, "audit_note": why it differs from the one
        asked for}) and, for the trace audit, its TraceAudit, self-tested before the submission is imported.
        A CPU has no device queues: nothing to audit."""
        if self.audit == "off" or not device.cuda:
            return None, {"audit": "off"}
        if self.audit != "trace":
            return None, {"audit": self.audit}
        try:
            trace = TraceAudit(torch, device)
            problem = trace.self_test()
        except Exception as exc:  # no profiler API in this torch
            trace, problem = None, f"{type(exc).__name__}: {first_line(exc)}"
        if problem:
            return None, {"audit": "drain", "audit_note": f"no usable GPU trace here ({problem}); the drain rule "
                                                          "judges instead"}
        return trace, {"audit": "trace"}

    def start(self) -> dict:
        """Import torch, self-test the trace audit, import the reference, capture tripwires, import the
        submission; the `ready` reply."""
        self.prepare()
        return self.load()

    def prepare(self) -> None:
        """Everything before the submission: torch, the device, the trace audit's self-test, the reference, the
        tripwires."""
        import torch

        # The harness times and synchronizes with references captured before the import.
        self.device = device = Device(torch)
        self.reply = {"ok": True, "system": device.system(), "timer": device.timer}
        self.trace, audit = self.start_audit(torch, device)
        self.reply.update(audit)
        try:
            import reference
        except BaseException as exc:  # the task itself is broken: every case fails with this
            traceback.print_exc()
            self.reply.update(exception_failure(exc, torch, "reference.py failed to import: ").reply())
            return
        self.task = ReferenceTask(reference, device)
        self.guards = Guards(torch, reference)

    def warm(self, mode: str, cases: list[dict]) -> dict:
        """A warm start: prepare, then what the mode needs before its first call (the device's context, the
        L2 flush buffer of the timed modes, the cases' inputs and layouts); the submission is not imported."""
        self.prepare()
        if not self.reply.get("ok"):
            return {"ok": True, "warm": True}
        device = self.device
        try:  # ahead of time only: a failure here is met again, and reported, where the run meets it cold
            if device.cuda:
                device.torch.empty(1, device="cuda")  # the context, before anything is timed
                if mode in ("benchmark", "leaderboard"):
                    device.flush_l2()  # allocates the flush buffer once
            self._defaults = self._generation_defaults()
            self.task.preload(inputs_ahead(mode, cases, self.trust), self.trust)
        except BaseException:
            self.task.drop()
        return {"ok": True, "warm": True}

    def _generation_defaults(self) -> tuple:
        """The torch defaults input generation reads without being told (a submission may set them at import)."""
        torch = self.device.torch
        device = getattr(torch, "get_default_device", lambda: None)()
        return torch.get_default_dtype(), str(device)

    def load(self) -> dict:
        """Import the submission and check the tripwires after its import; the `ready` reply."""
        reply, device, task, guards = self.reply, self.device, self.task, self.guards
        if not reply.get("ok"):
            return reply
        torch = device.torch
        try:
            import submission
        except BaseException as exc:
            traceback.print_exc()
            return {**reply, **exception_failure(exc, torch).reply()}
        if task.ahead and self._generation_defaults() != self._defaults:
            task.drop()  # the import changed what generate_input would make: generate as a cold start does
        kernel = getattr(submission, "custom_kernel", None)
        if not callable(kernel):
            return {**reply, "ok": False, "error": "submission.py defines no custom_kernel(data)", "message": ""}
        caller = Caller(kernel, device, guards, self.trust)
        self.checker = Checker(task, caller, self.trust, self.exporter)
        self.timed = TimedCase(task, caller, self.checker, self.trust, self.trace)
        if self.trust:
            try:
                guards.check_tripwires()
                guards.check_threads(guards.threads_at_start, during="the submission's import")
            except CaseFailure as failure:
                return {**reply, **failure.reply()}
        return reply

    def spinning(self) -> bool:
        """Whether the next request is awaited by polling (SPIN_S): spin on, a GPU, the submission loaded."""
        return self.spin and self.device is not None and bool(self.device.cuda) and self.timed is not None

    def handle(self, request: dict) -> dict:
        op = request["op"]
        self.exporter.reset()
        try:
            if op == "ping":
                return {"ok": True}
            if op == "check":
                self.checker.checked(request["case"], request.get("shown"))
                reply = {"ok": True}
            elif op == "bench_begin":
                reply = self.timed.begin(request["case"], request["mode"])
            elif op == "bench_next":
                reply = self.timed.next_input()
            elif op == "bench_call":
                reply = self.timed.call()
            elif op == "bench_output":
                reply = self.timed.check_output()
            elif op == "bench_empty":
                reply = self.timed.empty_call()
            elif op == "bench_end":
                reply = self.timed.end()
            elif op == "profile":
                reply = self.timed.profile()
            else:
                return {"ok": False, "error": f"unknown request {op!r}"}
        except CaseFailure as failure:
            return failure.reply()
        if self.exporter.outputs:
            reply["outputs"] = self.exporter.outputs
        return reply


def next_request(conn, spin: bool, clock=time.perf_counter) -> Any:
    """The next request from the trusted process: with `spin`, polled for up to SPIN_S before blocking."""
    if spin:
        deadline = clock() + SPIN_S
        while not conn.poll(0) and clock() < deadline:
            pass
    return conn.recv()


def _send(conn, reply: dict) -> None:
    conn.send_bytes(json.dumps(reply, allow_nan=True).encode("utf-8"))


def _start_failure(exc: BaseException) -> dict:
    return {"ok": False, "error": f"worker failed to start: {type(exc).__name__}: {first_line(exc)}",
            "message": traceback.format_exc()}


def worker_main(conn, settings: dict) -> None:
    """The spawned worker's entry point: start up, then answer requests until `stop`."""
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    try:
        os.chdir(settings.get("cwd") or os.getcwd())
    except OSError:
        pass
    if settings.get("trust", True):
        try:
            problem = seal_worker()
        except (OSError, AttributeError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            print(f"eval: worker not sealed: {problem}", file=sys.stderr)
    worker = Worker(settings)
    warm = settings.get("warm")
    _serve(conn, worker, warm)
    if warm is not None or settings.get("trust", True):
        # With the trust checks on (and in a warm start) the worker ends at once: the verdict waits for this exit,
        # and Python's own teardown of torch takes 0.2-2 s. Nothing of the verdict depends on it (the device was
        # synchronized after every call, and the submission's atexit handlers never could reach the pipe). With
        # them off the worker ends as the leaderboard's eval process does, its teardown and atexit handlers run.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(0)


def _serve(conn, worker: Worker, warm: dict | None) -> None:
    """Start up (a warm start: prepare, say so, and import the submission only on `load`), then answer
    requests until `stop` or the end of the channel."""
    if warm is not None:
        try:
            _send(conn, worker.warm(warm["mode"], warm["cases"]))
        except BaseException as exc:
            traceback.print_exc()
            worker.reply = _start_failure(exc)
            _send(conn, {"ok": True, "warm": True})
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request.get("op") != "load":
            return
    try:
        ready = worker.start() if warm is None else worker.load()
    except BaseException as exc:
        traceback.print_exc()
        ready = _start_failure(exc)
    _send(conn, ready)
    while True:
        try:
            request = next_request(conn, worker.spinning())
        except (EOFError, OSError):
            return
        if request.get("op") == "stop":
            return
        try:
            reply = worker.handle(request)
        except BaseException as exc:  # a harness bug must still answer, or the parent waits forever
            reply = {"ok": False, "error": f"harness error: {type(exc).__name__}: {first_line(exc)}",
                     "message": traceback.format_exc()}
        _send(conn, reply)
