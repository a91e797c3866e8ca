"""popkit's harness, the trusted side: the process `python eval.py MODE CASES` starts as.

It holds the result pipe (ResultPipe, with its closing HMAC record), starts the worker (WorkerLink: a spawned
process, requests out, JSON replies in), decides the device's audit rule and the cases, runs each mode (Session)
and writes every verdict and statistic. It imports the task's reference (through popkit_judge), never the
submission and never a worker-side module (popkit_worker, popkit_calls, popkit_timed).
"""

from __future__ import annotations

import base64
import dataclasses
import hmac
import json
import math
import multiprocessing
import os
import sys
import time
import traceback
from typing import Any, Callable

from popkit_judge import EMPTY_CALLS, Judge, forged_time, unexplained_ns
from popkit_protocol import (AUDIT_RULES, BUDGETS, Budget, CallAudit, CasesError, DEFAULT_AUDIT, EXIT_BAD_CASES,
                             EXIT_CUDA, EXIT_FAILED, EXIT_NO_FD, EXIT_OK, EXIT_USAGE, LEADERBOARD_SEED_STEP,
                             LoopResult, MAX_GO_BYTES, MAX_REPLY_BYTES, MODES, PHASES, Stats, TRUST_CHECKS,
                             WARMUP_SEED_STEP, WARM_READY_LINE, apply_secret_seed, escape_value, format_number,
                             format_spec, parse_cases, read_cases, summarize, timing_loop, untimed_ns,
                             unsynchronized_trace, unsynchronized_work, with_seed_offset)
from popkit_seal import make_non_dumpable
from popkit_shared import first_line


class ResultPipe:
    """The result pipe: one `key: value` line per write, flushed at once (a timeout keeps what was written).

    With a key (read from POPKIT_KEY_FD), close() writes one closing record last, `popkit.end: HMAC`, the
    HMAC-SHA256 of every byte written before it: popkit requires it, so a line that another process
    wrote on the pipe (or a run cut short) cannot pass as this harness's verdict.
    """

    def __init__(self, fd: int, key: str = ""):
        self._file = os.fdopen(fd, "w", encoding="utf-8", errors="replace", buffering=1)
        self._mac = hmac.new(key.encode(), digestmod="sha256") if key else None

    def write(self, key: str, value: Any) -> None:
        line = f"{key}: {escape_value(value)}\n"
        self._file.write(line)
        self._file.flush()
        if self._mac is not None:
            self._mac.update(line.encode("utf-8", "replace"))

    def close(self) -> None:
        if self._mac is not None:
            self._file.write(f"popkit.end: {self._mac.hexdigest()}\n")
        self._file.close()


class WorkerGone(Exception):
    """The worker process died or the channel was corrupted; the failure applies to every remaining case."""

    def __init__(self, error: str, message: str = ""):
        super().__init__(error)
        self.error, self.message = error, message


class WorkerLink:
    """The parent's end of the worker: requests go as pickles, replies come back as JSON only."""

    def __init__(self, target: Callable, settings: dict):
        """`target`: the worker's first function, called in the spawned process with (channel, settings). It is
        eval.py's worker_entry, which loads the worker side's modules there: this process never imports them."""
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        # Not daemonic: a daemonic process may not start children, and honest kernels may (torch.compile).
        # close() stops it; PR_SET_PDEATHSIG stops it if this process dies first.
        self._proc = ctx.Process(target=target, args=(child_conn, {**settings, "cwd": os.getcwd()}),
                                 name="popkit-worker")
        # A spawned worker starts as `python -c ...`, with its working folder first on its import path until
        # multiprocessing sets it up: it starts in this file's folder (where the submission cannot write in a
        # sandbox) and moves to the working folder before anything of the submission runs.
        here = os.getcwd()
        os.chdir(os.path.dirname(os.path.abspath(__file__)))
        try:
            self._proc.start()
        finally:
            os.chdir(here)
        child_conn.close()  # only the worker holds its end, so its death reads as EOF here

    def receive(self) -> dict:
        try:
            raw = self._conn.recv_bytes(MAX_REPLY_BYTES)
        except EOFError:
            raise self._gone() from None
        except OSError as exc:
            raise WorkerGone("result-pipe write: foreign bytes arrived on the harness channel (the submission "
                             "wrote to a file descriptor it does not own)", f"{type(exc).__name__}: {exc}") from None
        try:
            reply = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise WorkerGone("result-pipe write: foreign bytes arrived on the harness channel (the submission "
                             "wrote to a file descriptor it does not own)", repr(raw[:200])) from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            raise WorkerGone("result-pipe write: a malformed message arrived on the harness channel", repr(raw[:200]))
        return reply

    def request(self, op: str, **fields: Any) -> dict:
        self.send(op, **fields)
        return self.receive()

    def send(self, op: str, **fields: Any) -> None:
        """A request whose reply the caller receives later (a warm start's `load`: Session.start receives it)."""
        try:
            self._conn.send({"op": op, **fields})
        except (OSError, EOFError):
            raise self._gone() from None

    def _gone(self) -> WorkerGone:
        self._proc.join(5)
        code = self._proc.exitcode
        return WorkerGone(f"worker process died (exit code {code}) while running the submission")

    def kill(self) -> None:
        """End a worker that broke the channel at once: it must not keep writing while verdicts are written."""
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)

    def close(self) -> None:
        """Stop the worker and wait for it: nothing of the submission may outlive the final `check` line."""
        try:
            self._conn.send({"op": "stop"})
        except (OSError, EOFError):
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()


def _case_failed(pipe: ResultPipe, prefix: str, error: str, message: str = "") -> None:
    pipe.write(f"{prefix}.status", "fail")
    pipe.write(f"{prefix}.error", error)
    if message:
        pipe.write(f"{prefix}.message", message)


class Session:
    """One eval invocation in the parent: talks to the worker, writes the pipe, computes statistics."""

    def __init__(self, pipe: ResultPipe, link: WorkerLink, mode: str, cases: list[dict], trust: bool,
                 clock_ns: Callable[[], float] = time.monotonic_ns, audit: str = DEFAULT_AUDIT,
                 judge: "Judge | None" = None, judge_failure: dict | None = None):
        self.pipe, self.link, self.mode, self.cases, self.trust = pipe, link, mode, cases, trust
        self.clock_ns = clock_ns
        self.audit = audit  # the timing audit asked for; the worker may only say its trace failed its self-test
        self.judge = judge  # the trusted side's checks (trust on); None: the worker's verdicts stand
        self.judge_failure = judge_failure  # the trusted side could not start: every case fails with it
        self.all_passed = True
        self.cuda_failed = False
        self.gone: WorkerGone | None = None  # set once the worker is unusable
        self.global_failure: dict | None = None  # import or setup failure that fails every case
        self.timer = "cpu-monotonic"

    # -- start-up
    def start(self) -> None:
        try:
            ready = self.link.receive()
        except WorkerGone as gone:
            self._lose_worker(gone)
            return
        system = self.judge.system() if self.judge is not None else ready.get("system")
        for key in ("device", "torch", "cuda", "hip", "arch"):
            value = system.get(key, "") if isinstance(system, dict) else ""
            self.pipe.write(f"system.{key}", value if isinstance(value, str) else "")
        if self.judge is not None and not self.judge.cuda and self.mode in BUDGETS:
            self.pipe.write("system.copy_bandwidth", f"{self.judge.copy_bandwidth():.0f}")
        self.pipe.write("trust.checks", ",".join(TRUST_CHECKS) if self.trust else "")
        if self.judge is not None:
            # The trusted side decides: a CPU has no device queues to audit; the worker may only report that
            # its trace failed the self-test, and the drain rule judges then.
            note = ready.get("audit_note")
            if not self.judge.cuda:
                self.audit = "off"
            elif self.audit == "trace" and ready.get("audit") == "drain" and isinstance(note, str):
                self.audit = "drain"
            else:
                note = None
            self.timer = "cuda-event" if self.judge.cuda else "cpu-monotonic"
        else:
            self.audit = ready.get("audit", self.audit)
            note = ready.get("audit_note")
            self.timer = ready.get("timer", self.timer)
        if self.mode in BUDGETS:
            self.pipe.write("trust.audit", str(self.audit))
            if note:
                self.pipe.write("trust.audit_note", str(note))
        if not ready["ok"]:
            self.global_failure = ready
        elif self.judge_failure is not None:
            self.global_failure = self.judge_failure

    def _fail(self, prefix: str, reply: dict) -> None:
        self.all_passed = False
        _case_failed(self.pipe, prefix, str(reply.get("error", "failed")), str(reply.get("message", "")))
        if reply.get("cuda") is True:
            self.cuda_failed = True

    def _blocked(self, prefix: str) -> bool:
        """Fail the case without running it when the worker is gone or the submission never loaded."""
        if self.gone is not None:
            self._fail(prefix, {"error": self.gone.error, "message": self.gone.message})
            return True
        if self.global_failure is not None:
            self._fail(prefix, self.global_failure)
            return True
        return False

    def _ask(self, op: str, **fields: Any) -> dict:
        """A request whose failure to get an answer becomes a failing reply (and marks the worker gone)."""
        if self.gone is not None:
            return {"ok": False, "error": self.gone.error, "message": self.gone.message}
        try:
            return self.link.request(op, **fields)
        except WorkerGone as gone:
            self._lose_worker(gone)
            return {"ok": False, "error": gone.error, "message": gone.message}

    def _lose_worker(self, gone: WorkerGone) -> None:
        self.gone = gone
        self.link.kill()

    # -- modes
    def run(self) -> None:
        if self.mode == "test":
            self.run_tests()
        elif self.mode == "profile":
            self.run_profiles()
        else:
            self.run_benchmarks()

    def run_tests(self) -> None:
        self.pipe.write("test-count", len(self.cases))
        for i, case in enumerate(self.cases):
            prefix = f"test.{i}"
            self.pipe.write(f"{prefix}.spec", format_spec(case))
            if self.cuda_failed or self._blocked(prefix):
                continue
            reply = self._ask("check", case=case)
            if self.judge is not None:
                reply = self._probed(case, self.judge.checked(case, reply)) or {"ok": True}
            if reply["ok"]:
                self.pipe.write(f"{prefix}.status", "pass")
            else:
                self._fail(prefix, reply)
            if self.cuda_failed:
                return

    def run_benchmarks(self) -> None:
        warm_budget, case_budget = BUDGETS[self.mode]
        self.pipe.write("benchmark-count", len(self.cases))
        if self.cases and self.gone is None and self.global_failure is None:
            # Warm-up; its numbers are discarded. With trust on it gets its own seeds, so a timed call
            # never sees an input the warm-up already saw (a memo cache keyed on content gains nothing).
            first = with_seed_offset(self.cases[0], WARMUP_SEED_STEP) if self.trust else self.cases[0]
            warm = self.time_case(first, warm_budget)
            if warm[0] is None and warm[1].get("cuda"):  # the context is gone: nothing more can run
                self.pipe.write("benchmark.0.spec", format_spec(self.cases[0]))
                self._fail("benchmark.0", warm[1])
                return
        for i, case in enumerate(self.cases):
            prefix = f"benchmark.{i}"
            self.pipe.write(f"{prefix}.spec", format_spec(case))
            if self.cuda_failed or self._blocked(prefix):
                continue
            started = time.monotonic_ns()
            loop, info = self.time_case(case, case_budget)
            # The case's wall time, checks and input generation included (popkit sizes CPU runs from it).
            self.pipe.write(f"{prefix}.wall_ns", time.monotonic_ns() - started)
            if loop is None:
                self._fail(prefix, info)
                if self.cuda_failed:
                    return
                continue
            self.write_audit(prefix, loop, info.get("audit"))
            unsynchronized, traced = self.timing_verdict(loop, info.get("audit"))
            if unsynchronized:
                median = summarize(loop.samples).median
                self._fail(prefix, {"error": unsynchronized, "message": f"the event-timed median was "
                                    f"{median / 1e3:.1f} µs over {len(loop.samples)} calls"})
                # A failed case has no statistics (as in the protocol); its event times stay readable.
                self.pipe.write(f"{prefix}.audit_samples", ",".join(format_number(x) for x in loop.samples))
                continue
            if info.get("forged"):
                self._fail(prefix, {"error": info["forged"]})
                continue
            self.write_stats(prefix, traced)
            if info.get("unexplained"):  # per call, the trusted clock's time that the report leaves unexplained
                self.pipe.write(f"{prefix}.unexplained_ns", ",".join(format_number(x) for x in info["unexplained"]))
            if isinstance(info.get("bytes"), int) and info["bytes"] > 0:
                self.pipe.write(f"{prefix}.bytes", info["bytes"])

    def _probed(self, case: dict, failure: dict | None) -> dict | None:
        """A case's failure outside test mode, named mode branching when it repeats in this mode (a control
        rerun) and goes away when sys.argv says test (a failure that goes away on a plain rerun depends on
        earlier calls, not on the mode)."""
        if failure is None or self.mode == "test" or not failure.get("probe"):
            return failure
        if self.judge.checked(case, self._ask("check", case=case, shown=self.mode)) is None:
            return failure
        if self.judge.checked(case, self._ask("check", case=case, shown="test")) is None:
            return {**failure, "error": f"mode branching: custom_kernel's output is wrong in {self.mode} mode but "
                                        f"right when sys.argv says test ({failure.get('error')})"}
        return failure

    def time_case(self, case: dict, budget: Budget) -> tuple[LoopResult | None, dict]:
        """Checked call(s), then the timing loop, then (benchmark mode) the last output's check."""
        judge = self.judge
        # The per-call overhead the time witness credits: on a GPU measured before the case's trace starts; on a
        # CPU an empty call beside each timed call, so a load that slows the round trips slows both alike.
        beside = judge is not None and not judge.cuda
        overhead = self._overhead() if judge is not None and not beside else 0.0
        overheads: list[float] = []
        begin = self._ask("bench_begin", case=case, mode=self.mode)
        failure = self._probed(case, judge.checked(case, begin)) if judge is not None else (
            None if begin["ok"] else begin)
        if failure is not None:
            return None, failure
        walls: list[float] = []
        steps = [0]

        def timed_call() -> dict:
            if self.mode == "leaderboard":
                steps[0] += 1
                ready = self._ask("bench_next")
                if not ready["ok"]:
                    return ready
            credit = overhead
            if beside:
                empty, credit = self._empty_call()
                if not empty["ok"]:
                    return empty
            overheads.append(credit)
            started = self.clock_ns()
            reply = self._ask("bench_call")
            walls.append(float(self.clock_ns() - started))
            if not reply["ok"]:
                return reply
            ns = reply.get("ns")
            if not isinstance(ns, (int, float)) or isinstance(ns, bool) or not 0 <= ns < math.inf:
                return {"ok": False, "error": f"time forged: the worker reported {str(ns)[:40]} as a call's time"}
            if self.mode == "leaderboard":
                checked = self._ask("bench_output")
                step = steps[0]
                failure = (judge.one(with_seed_offset(case, LEADERBOARD_SEED_STEP * step), checked, 0xFF)
                           if judge is not None else (None if checked["ok"] else checked))
                if failure is not None:
                    error = failure.get("error")
                    if "[timed call" not in str(error):
                        error = f"{error} [timed call {step}]"
                    return {**failure, "error": error}
            return reply

        loop = timing_loop(timed_call, self.clock_ns, budget)
        if loop.stop == "failed":
            return None, loop.failure
        end = self._ask("bench_end")
        if not end["ok"]:
            return None, end
        if judge is None:
            return loop, {**begin, "audit": end.get("audit")}
        size, in_out = judge.case_facts(case)
        if self.mode == "benchmark" and not in_out:
            failure = judge.one(case, end, None) if end.get("last_output") else {
                "ok": False, "error": "no output: the worker handed over no output of the last timed call"}
            if failure is not None:
                return None, {**failure, "error": f"timed output wrong: the last timed call's output fails the "
                                                  f"check (the checked calls passed): {failure.get('error')}"}
        # Judged after the timing audit (run_benchmarks): work left on a side queue also slows the trusted
        # clock, and the failure then names its own class rather than the witness's.
        forged = forged_time(loop.samples, walls, overheads, "cuda" if judge.cuda else "cpu")
        return loop, {"ok": True, "bytes": size, "audit": end.get("audit"), "forged": forged,
                      "unexplained": unexplained_ns(loop.samples, walls, overheads)}

    def _overhead(self) -> float:
        """The median time this process sees for a timed call of a kernel that does nothing (EMPTY_CALLS)."""
        walls = []
        for _ in range(EMPTY_CALLS):
            reply, wall = self._empty_call()
            if not reply["ok"]:
                return 0.0
            walls.append(wall)
        return sorted(walls)[len(walls) // 2]

    def _empty_call(self) -> tuple[dict, float]:
        """One timed call of a kernel that does nothing: the worker's reply and the time this process saw."""
        started = self.clock_ns()
        reply = self._ask("bench_empty")
        return reply, float(self.clock_ns() - started)

    def write_audit(self, prefix: str, loop: LoopResult, audit: dict | None) -> None:
        """The timing audit's signals of a case, per timed call: drains (host clock) and, from the GPU trace,
        how long each call's work ran past its end event."""
        if loop.drains:
            ordered = sorted(loop.drains)
            self.pipe.write(f"{prefix}.drain_median", format_number(ordered[len(ordered) // 2]))
            self.pipe.write(f"{prefix}.drain_max", format_number(ordered[-1]))
            self.pipe.write(f"{prefix}.drains", ",".join(format_number(d) for d in loop.drains))
        if isinstance(audit, dict) and isinstance(audit.get("overruns"), list):
            def numbers(values):
                return ",".join("nan" if v is None else format_number(v) for v in values)
            self.pipe.write(f"{prefix}.overruns", numbers(audit["overruns"]))
            self.pipe.write(f"{prefix}.marker_overruns", numbers(audit.get("marker_overruns") or []))
            self.pipe.write(f"{prefix}.late_starts", sum(1 for x in audit.get("on_time") or [] if not x))
            if isinstance(audit.get("early"), list):
                self.pipe.write(f"{prefix}.early_starts", numbers(audit["early"]))
            for key in ("kernel_ns", "gap_ns", "launches"):  # the worker's trace, per timed call (informational)
                values = audit.get(key)
                if isinstance(values, list) and all(isinstance(v, (int, float)) for v in values):
                    text = ",".join(str(int(v)) for v in values) if key == "launches" else numbers(values)
                    self.pipe.write(f"{prefix}.{key}", text)

    def timing_verdict(self, loop: LoopResult, audit: dict | None) -> tuple[str | None, LoopResult]:
        """The failure the timing audit in force gives a case's timed calls, or None (trust off: none), and the
        loop whose samples the case's statistics are made of: with the trace audit, each call timed to the
        span of its own GPU work where work on another queue outlasted its events (untimed_ns)."""
        if not self.trust or self.audit == "off":
            return None, loop
        if self.audit == "drain":
            return unsynchronized_work(loop.drains), loop
        if not isinstance(audit, dict):
            return "timing audit failed: the worker sent no GPU trace for this case", loop
        if audit.get("error"):
            return f"timing audit failed: {audit['error']}", loop

        def number(x: Any) -> float | None:
            return None if x is None else float(x)
        try:
            early = audit.get("early") or [None] * len(audit["overruns"])
            audits = [CallAudit(number(o), number(m), bool(t), bool(c), early_ns=number(e))
                      for o, m, t, c, e in zip(audit["overruns"], audit["marker_overruns"], audit["on_time"],
                                               audit["on_current"], early, strict=True)]
        except (KeyError, TypeError, ValueError):
            return "timing audit failed: the worker's GPU trace summary is malformed", loop
        if len(audits) != len(loop.samples):
            return (f"timing audit failed: the GPU trace holds {len(audits)} timed calls, the timing loop made "
                    f"{len(loop.samples)}"), loop
        added = [untimed_ns(a) for a in audits]
        if any(added):
            loop = dataclasses.replace(loop, samples=[s + a for s, a in zip(loop.samples, added)], added=added)
        return unsynchronized_trace(audits), loop

    def write_stats(self, prefix: str, loop: LoopResult) -> None:
        stats = summarize(loop.samples)
        for field in dataclasses.fields(Stats):  # popkit.protocol's CASE_STATISTICS + HARNESS_STATISTICS, in order
            value = getattr(stats, field.name)
            self.pipe.write(f"{prefix}.{field.name}", value if field.name == "runs" else format_number(value))
        self.pipe.write(f"{prefix}.samples", ",".join(format_number(s) for s in loop.samples))
        if loop.added:  # per call, the GPU time on another queue its events missed, added to its sample
            self.pipe.write(f"{prefix}.added_ns", ",".join(format_number(a) for a in loop.added))
        self.pipe.write(f"{prefix}.stop", loop.stop)
        self.pipe.write(f"{prefix}.timer", self.timer)

    def run_profiles(self) -> None:
        self.pipe.write("benchmark-count", len(self.cases))
        for i, case in enumerate(self.cases):
            prefix = f"benchmark.{i}"
            self.pipe.write(f"{prefix}.spec", format_spec(case))
            if self.cuda_failed or self._blocked(prefix):
                continue
            begin = self._ask("bench_begin", case=case, mode=self.mode)
            if self.judge is not None:
                begin = self._probed(case, self.judge.checked(case, begin)) or begin
            reply = self._ask("profile") if begin["ok"] else begin
            if not reply["ok"]:
                self._fail(prefix, reply)
                if self.cuda_failed:
                    return
                continue
            report = base64.b64encode(reply.get("report", "").encode("utf-8")).decode("ascii")
            self.pipe.write(f"{prefix}.report", report)
            self.pipe.write(f"{prefix}.status", "pass")
            self.pipe.write(f"{prefix}.timer", self.timer)


def read_key() -> str:
    """The closing record's key from the descriptor POPKIT_KEY_FD names ('' without one); the descriptor is
    closed, and the variable removed, before the worker starts."""
    fd_text = os.environ.pop("POPKIT_KEY_FD", "")
    try:
        fd = int(fd_text)
    except ValueError:
        return ""
    try:
        return os.read(fd, 4096).decode("ascii", "replace").strip()
    except OSError:
        return ""
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def read_control() -> int | None:
    """The warm start's control descriptor (POPKIT_CONTROL_FD), made non-inheritable; None for a cold start."""
    fd_text = os.environ.pop("POPKIT_CONTROL_FD", "")
    try:
        fd = int(fd_text)
        os.set_inheritable(fd, False)
    except (ValueError, OSError):
        return None
    return fd


def read_go(fd: int) -> dict | None:
    """Block until popkit's `go` line arrives on the control descriptor; None at end of file (popkit let this
    warm start go without a run). Raises ValueError for anything but one well-formed `go` line."""
    data = bytearray()
    while not data.endswith(b"\n"):
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            if data:
                raise ValueError("the control descriptor closed in the middle of a line")
            return None
        data += chunk
        if len(data) > MAX_GO_BYTES:
            raise ValueError(f"a control line longer than {MAX_GO_BYTES} bytes")
    word, _, body = bytes(data).decode("utf-8").strip().partition(" ")
    go = json.loads(body) if word == "go" else None
    if not isinstance(go, dict) or not all(isinstance(go.get(k), str) for k in ("mode", "cases", "key")):
        raise ValueError(f"expected `go {{\"mode\", \"cases\", \"key\"}}`, got {bytes(data[:80])!r}")
    return go


def output_buffer() -> int:
    """The buffer the worker hands its outputs over in: an anonymous file of this process (a memfd), given to
    the worker at spawn; this process reads it with pread (it never maps what the worker can write)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("popkit-outputs", os.MFD_CLOEXEC)
    import tempfile

    fd, path = tempfile.mkstemp(prefix="popkit-outputs-")
    os.unlink(path)
    return fd


def start_judge(fd: int | None) -> tuple[Judge | None, dict | None]:
    """The trusted side (trust on: `fd` is the output buffer), or the failure every case fails with."""
    if fd is None:
        return None, None
    try:
        return Judge(fd), None
    except BaseException as exc:
        traceback.print_exc()
        return None, {"ok": False, "error": f"the trusted side failed to start: {type(exc).__name__}: "
                                            f"{first_line(exc)}", "message": traceback.format_exc()}


def worker_settings(trust: bool, audit: str, fd: int | None, spin: bool = False) -> dict:
    """What the worker starts with; the output buffer travels as a descriptor the spawn passes on."""
    from multiprocessing.reduction import DupFd

    return {"trust": trust, "audit": audit, "spin": spin, "outputs_fd": DupFd(fd) if fd is not None else None}


def run_session(pipe: ResultPipe, link: WorkerLink, mode: str, cases: list[dict], trust: bool,
                gone: WorkerGone | None = None, audit: str = "off", outputs: int | None = None,
                judged: tuple[Judge | None, dict | None] | None = None, asked: int | None = None) -> int:
    """The mode's cases on the pipe, then `check` and the closing record once the worker is gone; the exit code.
    `asked`: when the worker was asked for its `ready` (started, or told to load the submission), monotonic ns.

    Where the eval's time went, by this process's clock (informational; PHASES): the trusted side's start (torch,
    the reference, the device's context; 0 when a warm start made it before `go`), the worker's start until its
    `ready` (its imports and device, and the submission's import and build), the cases, and the worker's exit."""
    asked = time.monotonic_ns() if asked is None else asked
    phases = {name: 0 for name in PHASES}
    started = time.monotonic_ns()
    judge, failure = judged if judged is not None else start_judge(outputs)
    phases["judge"] = time.monotonic_ns() - started if judged is None else 0
    session = Session(pipe, link, mode, cases, trust, audit=audit, judge=judge, judge_failure=failure)
    try:
        if gone is None:
            session.start()
        else:  # a warm start whose worker died before `go`: every case fails with it, as in a cold start
            session.gone = gone
        phases["ready"] = time.monotonic_ns() - asked
        started = time.monotonic_ns()
        session.run()
        phases["cases"] = time.monotonic_ns() - started
    finally:
        started = time.monotonic_ns()
        link.close()  # the worker is gone before the verdict is written
        phases["close"] = time.monotonic_ns() - started
    for name, ns in phases.items():
        pipe.write(f"phase.{name}_ns", ns)
    passed = session.all_passed and not session.cuda_failed
    pipe.write("check", "pass" if passed else "fail")
    pipe.close()
    if session.cuda_failed:
        return EXIT_CUDA
    return EXIT_OK if passed else EXIT_FAILED


def warm_main(worker_entry: Callable, fd: int, control: int, mode: str, cases: list[dict], trust: bool,
              secret: int | None, audit: str = "off", spin: bool = False) -> int:
    """A warm start (POPKIT_CONTROL_FD): the worker prepares everything but the submission, `popkit.warm: ready`
    goes on the pipe, and on `go` the mode runs as in a cold start, with `go`'s cases and key."""
    outputs = output_buffer() if trust else None
    link = WorkerLink(worker_entry, {**worker_settings(trust, audit, outputs, spin),
                                     "warm": {"mode": mode, "cases": cases}})
    judged = start_judge(outputs)
    gone = None
    try:
        link.receive()  # the worker is warm (a failure in its start-up is kept for the `load` reply)
    except WorkerGone as exc:
        gone = exc
        link.kill()
    os.write(fd, (WARM_READY_LINE + "\n").encode())
    try:
        go = read_go(control)
        if go is not None and go["mode"] != mode:
            raise ValueError(f"`go` asks for {go['mode']} mode; this warm start prepared {mode} mode")
        cases = [apply_secret_seed(c, secret) for c in parse_cases(go["cases"])] if go is not None else cases
    except (ValueError, UnicodeDecodeError, CasesError) as exc:
        link.close()
        print(f"eval: bad control line: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        os.close(control)
    if go is None:
        link.close()
        return EXIT_OK
    asked = time.monotonic_ns()
    if gone is None:
        try:
            link.send("load")  # the submission is imported now; Session.start receives the `ready` reply
        except WorkerGone as exc:
            gone = exc
            link.kill()
    return run_session(ResultPipe(fd, go["key"]), link, mode, cases, trust, gone, audit=audit, judged=judged,
                       asked=asked)


def main(worker_entry: Callable, argv: list[str] | None = None) -> int:
    """`python eval.py MODE CASES` on the trusted side; `worker_entry` starts the worker (see WorkerLink)."""
    argv = list(sys.argv if argv is None else argv)
    fd_text = os.environ.get("POPCORN_FD", "")
    try:
        fd = int(fd_text)
        os.fstat(fd)
    except (ValueError, OSError):
        print("eval: POPCORN_FD must name an open file descriptor (the result pipe)", file=sys.stderr)
        return EXIT_NO_FD
    os.set_inheritable(fd, False)
    os.environ.pop("POPCORN_FD", None)
    if len(argv) != 3 or argv[1] not in MODES:
        print(f"usage: python eval.py {{{'|'.join(MODES)}}} CASES_FILE", file=sys.stderr)
        return EXIT_USAGE
    mode, cases_path = argv[1], argv[2]
    seed_text = os.environ.pop("POPCORN_SEED", None)  # read, then unset: the worker never sees it
    trust = os.environ.pop("POPKIT_TRUST", "1").strip() != "0"
    audit = os.environ.pop("POPKIT_TIMING_AUDIT", "").strip() or DEFAULT_AUDIT  # read, then unset
    spin = os.environ.pop("POPKIT_WORKER_SPIN", "0").strip() == "1"
    control = read_control()
    pipe_key = read_key() if control is None else ""
    if audit not in AUDIT_RULES:
        print(f"eval: POPKIT_TIMING_AUDIT must be one of {', '.join(AUDIT_RULES)} (got {audit!r})", file=sys.stderr)
        return EXIT_USAGE
    try:
        secret = int(seed_text) if seed_text not in (None, "") else None
    except ValueError:
        print(f"eval: POPCORN_SEED is not an integer: {seed_text!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cases = [apply_secret_seed(c, secret) for c in read_cases(cases_path)]
    except CasesError as exc:
        print(f"eval: bad cases file: {exc}", file=sys.stderr)
        return EXIT_BAD_CASES
    if trust:
        make_non_dumpable()
    # Only timed modes audit their timing, and only with the trust checks on (off: what the leaderboard does).
    audit = audit if trust and mode in BUDGETS else "off"
    if control is not None:
        return warm_main(worker_entry, fd, control, mode, cases, trust, secret, audit, spin)
    outputs = output_buffer() if trust else None
    asked = time.monotonic_ns()
    link = WorkerLink(worker_entry, worker_settings(trust, audit, outputs, spin))
    return run_session(ResultPipe(fd, pipe_key), link, mode, cases, trust, audit=audit, outputs=outputs,
                       asked=asked)
