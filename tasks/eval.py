"""popkit's harness: runs one mode of a GPU MODE task the way the leaderboard's runner does.

Usage (as the runner calls it, in a working directory holding reference.py, task.py, utils.py and
submission.py side by side):

    POPCORN_FD=<write end of a pipe> [POPCORN_SEED=<secret seed>] python eval.py MODE CASES_FILE

MODE is test, benchmark, leaderboard or profile. CASES_FILE has one case per line, `key: value`
pairs joined by "; " (values are Python literals: ints, floats, True/False, lists; anything else
is kept as a string).

Exit codes: 0 every case passed; 2 bad usage or unknown mode; 110 CUDA API failure; 111 no
usable POPCORN_FD; 112 ran, but a check failed; 113 bad or unreadable cases file.

Environment:
    POPCORN_FD    write end of the result pipe (required). It is kept non-inheritable and removed
                  from the environment; the submission never sees it.
    POPCORN_SEED  secret seed (optional). Read, then removed before the submission is imported;
                  each case seed `a` becomes a + (a+b)(a+b+1)//2 for secret seed `b`.
    POPKIT_TRUST  "0" turns popkit's trust checks off (fidelity runs: only what the leaderboard's
                  own eval does). Any other value, or unset, leaves them on. Removed from the
                  environment before the submission is imported.
    POPKIT_KEY_FD set by popkit: a descriptor holding the key of the closing record `popkit.end: HMAC`
                  (see ResultPipe). The key is read and the descriptor closed before anything else
                  starts, so the key is in no environment, command line or open file of the worker.
    POPKIT_TIMING_AUDIT  a measurement switch (scripts/gpu_timing_study.py): which rule judges work left
                  running after the end event. `trace` (default): GPU timestamps of every timed call
                  (TraceAudit); `drain`: the host-clock share rule (unsynchronized_work); `off`: none.
                  Removed from the environment before the submission is imported; an unknown value exits 2.
    POPKIT_CONTROL_FD  set by `popkit test --watch` instead of POPKIT_KEY_FD: a warm start (warm_main).
                  The parent and its worker do everything that does not need the submission (torch,
                  the device, the reference, the L2 flush buffer, the inputs of CASES_FILE's cases),
                  write `popkit.warm: ready` on the pipe, then wait for one line on this descriptor:
                  `go {"mode": MODE, "cases": CASES_FILE_TEXT, "key": KEY}`. Only then is the submission
                  imported, and the mode runs exactly as a cold start runs it (the same Session, the same
                  pipe lines, the key's closing record); both processes then exit. End of file instead of
                  `go`: exit 0, nothing written. The descriptor is non-inheritable; the worker never has it.

Pipe keys: test-count, test.I.spec|status|error|message; benchmark-count,
benchmark.I.spec|runs|mean|std|err|best|worst (nanoseconds), benchmark.I.status: fail with
benchmark.I.error, benchmark.I.report (profile mode: base64 of a torch profiler table), check.
popkit's extra keys: benchmark.I.median (ns), benchmark.I.samples (every timed call, ns, comma
separated), benchmark.I.stop (converged, max_time, wall_time, max_repeats), benchmark.I.timer
(cuda-event, cpu-monotonic), benchmark.I.message (details of a failure, as test.I.message),
benchmark.I.status: pass (profile mode, which has no statistics), benchmark.I.bytes (trust checks on:
the fewest bytes one call must move, inputs read once and outputs written once),
benchmark.I.drain_median|drain_max|drains (GPU: ns the device stayed busy after a timed call's end event,
by the host clock), benchmark.I.overruns|marker_overruns (trace audit: per timed call, ns its GPU work ended
after its end event; nan without GPU work), benchmark.I.kernel_ns|gap_ns|launches (trace audit, per timed call:
GPU time its own work kept a queue busy, idle time inside its span, its activities; the worker's trace),
benchmark.I.late_starts (calls judged against the end marker
alone), benchmark.I.audit_samples (event times of a case the timing audit failed), system.device|torch|cuda|
hip|arch, trust.checks, trust.audit (the timing audit that judged: trace, drain, off) and trust.audit_note.
Newlines in values are written as the two characters `\\n`.

Process layout (docs/sealed-run.md): this process, the trusted side, holds the pipe, imports the task's
reference (never the submission), decides the device, the timer, the audit rule and the cases, judges every
output (Judge) and computes every statistic. The submission runs in ONE worker started with the
multiprocessing "spawn" method; it lives for the whole invocation, never receives the pipe, and sends back
JSON only (never pickle, so nothing it sends can run code here) plus its outputs' bytes in a memfd this
process made (Exporter). With trust off the worker's verdicts stand, as in the leaderboard's own eval.

Code layout (one file, copied whole into the eval's folder): pure pieces (cases file, statistics, the
drain rule, the trace audit's audit_trace and unsynchronized_trace); the parent (ResultPipe, WorkerLink,
Session: the mode runners that write the pipe); the worker, where Worker starts up and dispatches each
request to one of: Device (captured timers, the L2 flush, one measured call), TraceAudit (the GPU trace of a
timed case, its markers and self-test), Guards (tripwires, threads), ReferenceTask (inputs, the reference's layout of a
case, the task's check, poisoned inputs), Caller (one call and the checks after it), Checker (output
verdicts, a case's checked calls, the mode probe) and TimedCase (benchmark, leaderboard and profile calls).

Trust checks (on unless POPKIT_TRUST=0; each failure names its class in the case's error):
    clone-inputs          the kernel gets clones; the reference and the check use the pristine copy
    output-buffer-poison  buffers in data that the reference writes and returns (e.g. identity's
                          `output`) are filled with 0xFF bytes (NaN for floats) before each call
    freed-memory-poison   blocks of the output's byte size are allocated, filled, freed before calls
    double-run            two checked calls per case, with different poison bytes
    fresh-seed            one more checked call on a never-seen input (case seed + 7; the warm-up
                          uses seed + 1009, so no input a timed call gets was seen before)
    input-mutation        inputs compared bit for bit with their pristine copies after the call
    output-aliasing       an output may share storage only with the inputs the reference's
                          corresponding output shares (output buffers, views the reference returns)
    output-type           plain torch.Tensor (or the reference's type), no instance overrides
    recheck-timed         leaderboard: fresh input and a full check for every timed call (every second
                          one written into the previous call's tensors, so a cache keyed on
                          addresses always replays and is named);
                          benchmark: the last timed call's output is checked too (not for tasks
                          with in/out buffers, whose data every timed call changes)
    benchmark-shapes      every benchmark case is checked before it is timed
    tripwires             timers, synchronize, events, comparison functions and the reference's
                          functions are captured before the submission is imported, verified after
                          the import and after every call; timing uses the captured ones
    threads               a thread started during the call (or the import) that is still alive and
                          runs the submission's code fails it; library thread pools (torch.compile)
                          are not the submission's code
    device-sync           the device is synchronized before any verdict is read
    unsynchronized-work   GPU: every timed call is traced (torch's profiler, GPU activities only) between
                          the harness's marker kernels; a case fails when any call's work on any queue
                          ended more than 10 µs after its end event (GPU timestamps: no host stall counts).
                          Where the trace's self-test fails, the drain rule instead: a device-wide
                          synchronize timed after each end event, failing at least max(3, half) of the
                          calls over 50 µs
    mode-probe            a check failing outside test mode is retried with sys.argv saying test
    pipe-guard            the result fd is non-inheritable and this process is made non-dumpable,
                          so /proc/<pid>/fd cannot reopen it (ineffective when running as root);
                          foreign bytes on the worker channel fail the run
    trusted-verdict       every checked and rechecked output is judged in this process, on its own inputs
                          (Judge); a worker that hands over no output fails with `no output`
    time-witness          this process's clock around every timed call; a reported median far below it
                          (forged_time) fails with `time forged`
    worker-seal           the worker runs under a seccomp filter refusing ptrace and process_vm_readv/writev,
                          without CAP_SYS_PTRACE (seal_worker)

What this cannot stop (docs/sealed-run.md): Python or native code in the worker can rewrite the worker's side
of the harness (its checks are defence in depth; the verdict is this process's), and lower its reported
times within forged_time's tolerance; a process running as root can reopen the pipe; grandchild processes
that detach from the process group outlive the check.
"""

from __future__ import annotations

import ast
import base64
import bisect
import contextlib
import dataclasses
import hmac
import json
import math
import multiprocessing
import os
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

# ------------------------------------------------------------------------------ protocol constants

MODES = ("test", "benchmark", "leaderboard", "profile")
EXIT_OK, EXIT_USAGE, EXIT_CUDA, EXIT_NO_FD, EXIT_FAILED, EXIT_BAD_CASES = 0, 2, 110, 111, 112, 113

WALL_LIMIT_NS = 120e9  # a case's timing loop ends after 120 s of wall time
CONVERGED_REL_ERR = 0.001  # ... or when err/mean falls below this
MIN_RUNS = 3  # no stop rule applies before this many timed calls
LEADERBOARD_SEED_STEP = 13  # leaderboard mode: each timed call regenerates with seed + 13 (cumulative)
# Trust: offsets that never meet the leaderboard's seed + 13k sequence, so no input is ever seen twice.
FRESH_SEED_STEP = 7  # the fresh-seed check of every case
WARMUP_SEED_STEP = 1009  # the warm-up on the first case
FLUSH_MIN_BYTES = 256 * 1024 * 1024  # L2 flush buffer: max(2 x L2, 256 MiB)
PROFILE_WARMUP_CALLS, PROFILE_CALLS = 2, 5
MAX_REPLY_BYTES = 16 * 1024 * 1024  # a longer message on the worker channel is foreign bytes
MAX_GO_BYTES = 16 * 1024 * 1024  # a warm start's `go` line (it carries the cases file's text)
WARM_READY_LINE = "popkit.warm: ready"  # the one line a warm start writes before `go` (outside the HMAC)
# A warm start generates the inputs of its cases ahead of `go` up to this many bytes in all; the rest are
# generated when the run asks for them, as in a cold start.
PRELOAD_BYTES = 1 << 30
MAX_REMEMBERED_OUTPUTS = 100_000  # fingerprints kept to name a replayed output
# Unsynchronized work (docs/design.md, "Work that outlives the end event"): an honest call leaves the device
# idle once its end event completed, so timing a device-wide synchronize then costs only the call itself
# (3-10 µs on an H100; tens on ROCm). 50 µs is well above that and below any escaped work worth having.
DRAIN_MARGIN_NS = 50_000
# Host stalls (the eval descheduled inside those few µs) lengthen some measurements: on an H100 VM an honest
# CUDA example drained late on 21 of 100 calls of one case (docs/benchmarks.md); a cheat lengthens every call
# it cheats on (88-100 of 100 there). A case fails when at least this many calls, and half of them, drained late.
# (The share is the drain rule's hole: a cheat on fewer calls passes. The trace audit below has no share.)
DRAIN_MIN_CALLS, DRAIN_MIN_SHARE = 3, 0.5
# The timing audit that judges unsynchronized work (POPKIT_TIMING_AUDIT, a measurement switch): `trace` reads
# GPU timestamps of every timed call from the profiler (CUPTI on NVIDIA, roctracer on ROCm) and fails a case
# when any call's GPU work ended after its end event; `drain` is the host-clock share rule above; `off` judges
# nothing (the drain is still measured). Where the trace audit's self-test fails (no usable GPU trace) the drain
# rule judges instead, and the pipe says so (trust.audit, trust.audit_note).
AUDIT_RULES = ("trace", "drain", "off")
DEFAULT_AUDIT = "trace"
# A call's GPU work may end at most this long after its end event. The end event's GPU time is exact to a few
# microseconds when its start was queued while the L2 flush still ran (the start event then completes when the
# flush does): on an H100 honest calls measured -0.3 to 1.8 µs past it, a fork-join call 3.8 µs once. The margin
# covers that with room to spare; a cheat that escapes by less gains less than what the tracer adds to its own
# wait and launch on another queue (15 µs and more on that H100).
TRACE_MARGIN_NS = 10_000
# The start event counts as queued in time when the host had queued it this long before the flush could end.
ON_TIME_SLACK_NS = 2_000
# The harness's marker kernel: torch.cuda._sleep, launched on the timed queue around every timed call (before the
# flush, after the end event, after the drain). Honest code has no reason to launch it.
MARKER_KERNEL = "spin_kernel"
# The marker before the flush spins this many GPU cycles (about 100 µs at 2 GHz), so the start event is queued
# while the GPU still works through it and the flush even when the host is slow to queue the flush (40-100 µs
# with the tracer on, against the H100's 81 µs flush): the end event's exact time then applies to nearly
# every call. It runs before the start event: no timed call includes it.
LEAD_SPIN_CYCLES = 200_000
# The trace audit's self-test leaves this many GPU cycles of spinning on another queue (5 ms at 2 GHz).
SELF_TEST_CYCLES = 10_000_000


@dataclass(frozen=True)
class Budget:
    """How long one case's timing loop may run: at most `max_repeats` calls, `max_time_ns` measured."""

    max_repeats: int
    max_time_ns: float


# (warm-up on the first case, every case) per timing mode
BUDGETS = {
    "benchmark": (Budget(100, 0.1e9), Budget(100, 10e9)),
    "leaderboard": (Budget(100, 0.01e9), Budget(100, 30e9)),
}

TRUST_CHECKS = ("clone-inputs", "output-buffer-poison", "freed-memory-poison", "double-run", "fresh-seed",
                "input-mutation", "output-aliasing", "output-type", "recheck-timed", "benchmark-shapes",
                "tripwires", "threads", "device-sync", "unsynchronized-work", "mode-probe", "pipe-guard",
                "trusted-verdict", "time-witness", "worker-seal")

# ------------------------------------------------------------------------------ cases file (pure)


class CasesError(Exception):
    """The cases file cannot be read or parsed (exit 113)."""


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_value(text: str) -> Any:
    """A case value: a Python literal (int, float, True/False, list, ...) or, failing that, the string."""
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _split_pairs(line: str) -> list[str]:
    """Split a case line at "; " separators that are outside brackets and quotes (lists may hold ';')."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(line):
        if quote:
            if ch == quote and line[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == ";" and depth == 0:
            parts.append(line[start:i])
            start = i + 1
    parts.append(line[start:])
    return parts


def parse_case_line(line: str) -> dict[str, Any]:
    """One case line `key: value; key: value` -> {key: value}; raises CasesError when malformed."""
    case: dict[str, Any] = {}
    for part in _split_pairs(line):
        if not part.strip():
            continue
        key, colon, value = part.partition(":")
        key = key.strip()
        if not colon or not _KEY.match(key):
            raise CasesError(f"bad `key: value` pair {part.strip()!r}")
        if key in case:
            raise CasesError(f"key {key!r} given twice")
        case[key] = parse_value(value)
    if not case:
        raise CasesError("empty case")
    return case


def parse_cases(text: str) -> list[dict[str, Any]]:
    """Every non-blank line of a cases file, parsed; raises CasesError (with the line number)."""
    cases = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            cases.append(parse_case_line(line))
        except CasesError as exc:
            raise CasesError(f"line {number}: {exc}") from None
    if not cases:
        raise CasesError("no cases")
    return cases


def read_cases(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CasesError(f"cannot read {path}: {exc}") from None
    return parse_cases(text)


def combine_seed(case_seed: int, secret: int) -> int:
    """The leaderboard's secret-seed transform of a case seed `a` with secret `b`: a + (a+b)(a+b+1)//2."""
    a, b = int(case_seed), int(secret)
    return a + (a + b) * (a + b + 1) // 2


def apply_secret_seed(case: dict[str, Any], secret: int | None) -> dict[str, Any]:
    """The case with its `seed` transformed by the secret seed (unchanged without one or without a seed)."""
    if secret is None or not isinstance(case.get("seed"), int):
        return dict(case)
    return {**case, "seed": combine_seed(case["seed"], secret)}


def with_seed_offset(case: dict[str, Any], offset: int) -> dict[str, Any]:
    """The case with `offset` added to its integer seed (a case without one is returned unchanged)."""
    if not isinstance(case.get("seed"), int):
        return dict(case)
    return {**case, "seed": case["seed"] + offset}


def format_spec(case: dict[str, Any]) -> str:
    """A case as the spec value: `key: value; key: value` (the cases-file format)."""
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def inputs_ahead(mode: str, cases: list[dict[str, Any]], trust: bool) -> list[dict[str, Any]]:
    """The cases whose inputs a run of `mode` generates before any timed call, in the order it asks for them:
    what a warm start can generate before the submission is imported (test: each case, and its fresh-seed
    input with trust on; the timed modes: the warm-up's, then each case's). Leaderboard mode's per-call
    inputs are generated as the calls go, warm or cold."""
    def checked(case: dict[str, Any]) -> list[dict[str, Any]]:
        fresh = [with_seed_offset(case, FRESH_SEED_STEP)] if trust and isinstance(case.get("seed"), int) else []
        return [case] + fresh

    if mode == "test":
        return [c for case in cases for c in checked(case)]
    if mode not in ("benchmark", "leaderboard") or not cases:
        return []
    first = with_seed_offset(cases[0], WARMUP_SEED_STEP) if trust else cases[0]
    return checked(first) + [c for case in cases for c in checked(case)]


def escape_value(value: Any) -> str:
    """A pipe value on one line: newlines become the two characters `\\n`."""
    return str(value).replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")


# ------------------------------------------------------------------------------ statistics (pure)


@dataclass(frozen=True)
class Stats:
    """Statistics of one case's timed calls; every time in nanoseconds."""

    runs: int
    mean: float
    std: float  # sample standard deviation (n - 1); 0 for one sample
    err: float  # std / sqrt(runs)
    best: float
    worst: float
    median: float


def summarize(samples: list[float]) -> Stats:
    """Stats of per-call durations (ns). Needs at least one sample."""
    if not samples:
        raise ValueError("no samples")
    n = len(samples)
    mean = math.fsum(samples) / n
    var = math.fsum((s - mean) ** 2 for s in samples) / (n - 1) if n > 1 else 0.0
    std = math.sqrt(var)
    ordered = sorted(samples)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return Stats(runs=n, mean=mean, std=std, err=std / math.sqrt(n), best=ordered[0], worst=ordered[-1],
                 median=median)


def stop_reason(samples: list[float], budget: Budget, elapsed_ns: float) -> str | None:
    """Why the timing loop stops now, or None to go on.

    After at least MIN_RUNS calls: `converged` when err/mean < 0.001, `max_time` when
    mean*runs > budget.max_time_ns, `wall_time` after 120 s of wall time (elapsed_ns). Independently,
    `max_repeats` when budget.max_repeats calls were made.
    """
    if len(samples) >= MIN_RUNS:
        stats = summarize(samples)
        if stats.err < CONVERGED_REL_ERR * stats.mean:
            return "converged"
        if stats.mean * stats.runs > budget.max_time_ns:
            return "max_time"
        if elapsed_ns > WALL_LIMIT_NS:
            return "wall_time"
    if len(samples) >= budget.max_repeats:
        return "max_repeats"
    return None


def unsynchronized_work(drains_ns: list[float], margin_ns: float = DRAIN_MARGIN_NS) -> str | None:
    """The failure when a case's timed calls left work running on the device after their end event, or None.

    `drains_ns` holds, per timed call, how long a device-wide synchronize took once the end event had
    completed (measure_drain). A call drains late when that exceeds `margin_ns`; the case fails when at
    least DRAIN_MIN_CALLS calls and DRAIN_MIN_SHARE of all calls drained late.
    """
    late = sorted(d for d in drains_ns if d > margin_ns)
    if not late or len(late) < max(DRAIN_MIN_CALLS, math.ceil(DRAIN_MIN_SHARE * len(drains_ns))):
        return None
    typical = late[len(late) // 2]
    return (f"unsynchronized work: {len(late)} of {len(drains_ns)} timed calls left work running on the device "
            f"after their end event (typically {typical / 1e3:.0f} µs, up to {late[-1] / 1e3:.0f} µs; an honest "
            f"call leaves under {margin_ns / 1e3:.0f} µs), so the event time misses it: work on another queue must "
            "be joined to the current one before custom_kernel returns")


def measure_drain(end: Any, *, event_sync: Callable[[Any], None], device_sync: Callable[[], None],
                  clock_ns: Callable[[], float]) -> float:
    """How long (ns) the device stays busy after a timed call: wait for the `end` event (the timed queue is
    done), then time a device-wide synchronize, which also waits for every other queue of this process."""
    event_sync(end)
    t0 = clock_ns()
    device_sync()
    return float(clock_ns() - t0)


@dataclass(frozen=True)
class GpuRecord:
    """One activity of the GPU trace (a kernel, CUDA-graph kernels included, a memcpy or a memset): the queue it
    ran on (any hashable: (device, stream) from the profiler) and its GPU start and end (ns, one clock)."""

    queue: Any
    start_ns: float
    end_ns: float
    name: str = ""


@dataclass(frozen=True)
class CallAudit:
    """What the GPU trace says about one timed call; overruns are ns the call's latest-ending GPU work ended
    after the end event (negative: before it), None when the call launched no GPU work."""

    overrun_ns: float | None  # against the tightest bound: the end event's exact time when on_time, else the marker
    marker_overrun_ns: float | None  # against the end marker alone (it starts once the end event completed)
    on_time: bool  # the start event was queued while the flush ran, so flush end + event time is the end's time
    on_current: bool  # the latest-ending work ran on the timed queue (else: on another queue)
    kernel_ns: float = 0.0  # GPU time the call's own work kept some queue busy (overlaps counted once)
    gap_ns: float = 0.0  # idle GPU time between the call's first work's start and its last work's end
    launches: int = 0  # activities of the call's own work (kernels, copies, sets)


def busy_ns(work: list[GpuRecord]) -> float:
    """The length of the union of the activities' [start, end) intervals."""
    total, reach = 0.0, -math.inf
    for r in sorted(work, key=lambda r: r.start_ns):
        start = max(r.start_ns, reach)
        if r.end_ns > start:
            total += r.end_ns - start
        reach = max(reach, r.end_ns)
    return total


class TraceError(Exception):
    """The GPU trace does not hold the harness's markers as launched (disturbed, or no usable trace here)."""


def is_marker(name: str) -> bool:
    return MARKER_KERNEL in name


def audit_trace(records: list[GpuRecord], calls: list[tuple[float, float]],
                slack_ns: float = ON_TIME_SLACK_NS) -> list[CallAudit]:
    """Per timed call, how long its GPU work ran past its end event; raises TraceError when the trace does not
    have the harness's structure.

    `records` is every GPU activity of one trace session. The harness launched, on the timed queue, one marker
    at the session's start (the trace's first activity: it names the timed queue), then per timed call: marker
    M1 (a spin), the L2 flush, (start event, the call, end event), marker M2, (device-wide synchronize), marker
    M3. `calls` holds per timed call, in order, (event time ns, lead ns): lead is the host time from just before
    M1 was queued until the start event was queued.

    A call's work is every activity starting in [M1, M3) but the markers and the flush (the timed queue's first
    activity after M1): nothing else runs then, since the device is synchronized before M1 and before M3.
    M2 starts only after the end event completed (same queue), so work ending after M2's start certainly
    outlived the end event, whatever the host did. When the start event was queued at least `slack_ns` before
    the flush could end (M1 and then the flush started no earlier than the host queued them, one after the
    other: lead + slack <= M1's GPU duration + the flush's), it completed when the flush did, and flush end +
    event time is the end event's own GPU time: the tight bound.
    """
    gpu = sorted(records, key=lambda r: (r.start_ns, r.end_ns))
    if not gpu or not is_marker(gpu[0].name):
        raise TraceError("the trace does not begin with the harness's first marker")
    timed_queue = gpu[0].queue
    markers = [r for r in gpu if r.queue == timed_queue and is_marker(r.name)]
    expected = 1 + 3 * len(calls)
    if len(markers) != expected:
        raise TraceError(f"the trace holds {len(markers)} of the {expected} markers the harness launched on the "
                         "timed queue")
    others = [r for r in gpu if not (r.queue == timed_queue and is_marker(r.name))]
    starts = [r.start_ns for r in others]
    audits = []
    for k, (event_ns, lead_ns) in enumerate(calls):
        m1, m2, m3 = markers[1 + 3 * k: 4 + 3 * k]
        window = others[bisect.bisect_left(starts, m1.start_ns):bisect.bisect_left(starts, m3.start_ns)]
        flush = next((r for r in window if r.queue == timed_queue), None)
        if flush is None or flush.start_ns >= m2.start_ns:
            raise TraceError(f"timed call {k + 1} has no L2 flush between its markers")
        work = [r for r in window if r is not flush]
        on_time = lead_ns + slack_ns <= (m1.end_ns - m1.start_ns) + (flush.end_ns - flush.start_ns)
        if not work:
            audits.append(CallAudit(None, None, on_time, False))
            continue
        latest = max(work, key=lambda r: r.end_ns)
        marker_overrun = latest.end_ns - m2.start_ns
        overrun = latest.end_ns - (flush.end_ns + event_ns) if on_time else marker_overrun
        busy = busy_ns(work)
        span = latest.end_ns - min(r.start_ns for r in work)
        audits.append(CallAudit(overrun, marker_overrun, on_time, latest.queue == timed_queue, busy, span - busy,
                                len(work)))
    return audits


def _us(ns: float) -> str:
    return f"{ns / 1e3:.1f} µs" if ns < 10e3 else f"{ns / 1e3:.0f} µs"


def unsynchronized_trace(audits: list[CallAudit], margin_ns: float = TRACE_MARGIN_NS) -> str | None:
    """The failure when any timed call's GPU work ended more than `margin_ns` after its end event, or None.

    No share of calls: GPU timestamps carry no host stall, so one late call is proof. The message names the
    call whose work ran longest past its end event, and how many calls did it.
    """
    late = [(i, a) for i, a in enumerate(audits, 1) if a.overrun_ns is not None and a.overrun_ns > margin_ns]
    if not late:
        return None
    call, worst = max(late, key=lambda item: item[1].overrun_ns)
    where = "on the timed queue" if worst.on_current else "on another queue"
    return (f"unsynchronized work: call {call} of {len(audits)} left {_us(worst.overrun_ns)} of GPU work running "
            f"{where} after its end event ({len(late)} of the {len(audits)} timed calls did; GPU timestamps), so "
            "the event time misses it: work on another queue must be joined to the current one before "
            "custom_kernel returns")


@dataclass(frozen=True)
class LoopResult:
    samples: list[float]
    stop: str  # a stop_reason, or "failed"
    failure: dict | None  # the failing call's reply when stop == "failed"
    drains: tuple[float, ...] = ()  # per timed call (GPU only): measure_drain


def timing_loop(measure: Callable[[], dict], clock_ns: Callable[[], float], budget: Budget) -> LoopResult:
    """Call `measure()` until a stop rule fires; it returns {"ok": True, "ns": duration} or a failure.

    `clock_ns` is the wall clock (nanoseconds) used for the 120 s limit; tests inject a fake one.
    """
    samples: list[float] = []
    drains: list[float] = []
    start = clock_ns()
    while True:
        reply = measure()
        if not reply.get("ok"):
            return LoopResult(samples, "failed", reply, tuple(drains))
        samples.append(float(reply["ns"]))
        if isinstance(reply.get("drain"), (int, float)):
            drains.append(float(reply["drain"]))
        reason = stop_reason(samples, budget, clock_ns() - start)
        if reason:
            return LoopResult(samples, reason, None, tuple(drains))


def format_number(x: float) -> str:
    """A time in ns for the pipe: shortest round-trip float text."""
    return repr(float(x))


# ------------------------------------------------------------------------------ parent: pipe and worker


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

    def __init__(self, settings: dict):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        # Not daemonic: a daemonic process may not start children, and honest kernels may (torch.compile).
        # close() stops it; PR_SET_PDEATHSIG stops it if this process dies first.
        self._proc = ctx.Process(target=worker_main, args=(child_conn, {**settings, "cwd": os.getcwd()}),
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


def _make_non_dumpable() -> None:
    """Linux: /proc/<pid>/fd of a non-dumpable process is root's, so a same-user child cannot reopen the pipe."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _case_failed(pipe: ResultPipe, prefix: str, error: str, message: str = "") -> None:
    pipe.write(f"{prefix}.status", "fail")
    pipe.write(f"{prefix}.error", error)
    if message:
        pipe.write(f"{prefix}.message", message)


# ------------------------------------------------------------------------------ parent: the trusted side

CHECKED_CALLS = ((0, 0xFF), (0, 0x7F), (FRESH_SEED_STEP, 0xFF))  # a case's checked calls: (seed offset, poison)
MAX_OUTPUT_BYTES = 1 << 36  # a description of more bytes than this is not an output
FORGE_MIN_NS = {"cpu": 250_000.0, "cuda": 1_000_000.0}  # unexplained time per call always tolerated
FORGE_OVERHEAD_CAP_NS = 1_000_000.0  # the empty call's overhead is credited up to this much
EMPTY_CALLS = 5  # empty calls that measure the per-call overhead of a timed case


class Judge:
    """The trusted side's verdicts: this process imports the task's reference (trusted) and never the
    submission. It makes its own pristine input of every checked call (from the case, the seed it chose),
    reads the worker's output from the buffer it owns (bytes described by JSON, checked against what a tensor
    of that shape and dtype holds), runs the task's check_implementation, names poison and replayed outputs,
    and keeps the fingerprints of every output judged right. An output is rebuilt on the device the kernel left
    it on (the CPU or the GPU), so the task's check sees what it would see in the worker."""

    def __init__(self, fd: int):
        import torch

        import reference

        self.torch, self.fd = torch, fd
        self.generate_input = reference.generate_input
        self.ref_kernel = reference.ref_kernel
        self.check_implementation = reference.check_implementation
        self.cuda = torch.cuda.is_available()
        self.dtypes = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
        self.seen: set = set()
        self.inputs: dict[str, Any] = {}
        self.task = ReferenceTask(reference, Device(torch))  # the reference's layout of a case, as the worker has it
        if self.cuda:
            torch.empty(1, device="cuda")  # the device's context, made while the worker starts (not on a case)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def system(self) -> dict:
        """This process's own reading of the device and versions (Device.system), never the worker's word."""
        return self.task.device.system()

    def pristine(self, case: dict) -> Any:
        key = format_spec(case)
        if key not in self.inputs:
            if len(self.inputs) > 4:
                self.inputs.clear()
            self.inputs[key] = self.generate_input(**case)
            self.sync()
        return self.inputs[key]

    def read(self, output: Any) -> Any:
        """The output a description names, rebuilt from the buffer's bytes; raises ValueError when the
        description is not one of an output (a wrong type, a range outside the buffer, bytes that do not
        match the shape and dtype)."""
        torch = self.torch
        if not isinstance(output, dict) or not isinstance(output.get("tensors"), list):
            raise ValueError("no description of the output")
        size = os.fstat(self.fd).st_size
        tensors = []
        for t in output["tensors"]:
            dtype = self.dtypes.get(t.get("dtype")) if isinstance(t, dict) else None
            shape, offset, nbytes = (t.get("shape"), t.get("offset"), t.get("nbytes")) if dtype else (0, 0, 0)
            if (dtype is None or not isinstance(shape, list) or len(shape) > 16
                    or not all(isinstance(n, int) and 0 <= n for n in shape + [offset, nbytes])):
                raise ValueError(f"a malformed tensor description {str(t)[:120]}")
            numel = math.prod(shape)
            try:
                itemsize = torch.empty((), dtype=dtype).element_size()
            except (RuntimeError, TypeError):
                raise ValueError(f"a dtype no output has {str(t)[:120]}") from None
            if numel * itemsize != nbytes or nbytes > MAX_OUTPUT_BYTES or offset + nbytes > size:
                raise ValueError(f"a tensor description whose bytes do not fit {str(t)[:120]}")
            if t.get("device") not in ("cpu", "cuda") or (t["device"] == "cuda" and not self.cuda):
                raise ValueError(f"a tensor on a device this machine lacks {str(t)[:120]}")
            raw = bytearray(os.pread(self.fd, nbytes, offset)) if nbytes else bytearray(itemsize)
            flat = torch.frombuffer(raw, dtype=torch.uint8)[:nbytes]
            try:
                tensor = (flat.view(dtype) if nbytes else torch.empty(0, dtype=dtype)).reshape(shape)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(f"bytes that are no {t['dtype']} tensor ({_first_line(exc)})") from None
            tensors.append(tensor.to("cuda") if t["device"] == "cuda" else tensor)  # where the kernel left it
        return self._decode(output.get("structure"), tensors)

    def _decode(self, node: Any, tensors: list) -> Any:
        if isinstance(node, dict) and isinstance(node.get("tensor"), int) and 0 <= node["tensor"] < len(tensors):
            return tensors[node["tensor"]]
        if isinstance(node, dict) and node.get("seq") in ("tuple", "list") and isinstance(node.get("items"), list):
            items = [self._decode(x, tensors) for x in node["items"]]
            return tuple(items) if node["seq"] == "tuple" else items
        if isinstance(node, dict) and "value" in node and (node["value"] is None or isinstance(node["value"],
                                                                                             (bool, int, float, str))):
            return node["value"]
        if isinstance(node, dict) and isinstance(node.get("unsupported"), str):
            raise ValueError(f"custom_kernel returned a {node['unsupported'][:80]}, which is no tensor")
        raise ValueError("a malformed output structure")

    def judge(self, case: dict, output: Any, byte: int | None) -> dict | None:
        """None when the output of the call on `case` is right, else the failing reply (the class named
        where poison or a replayed result shows)."""
        try:
            out = self.read(output)
        except ValueError as exc:
            return {"ok": False, "error": f"no output: the worker's description of custom_kernel's output is "
                                          f"unusable ({exc})", "probe": False}
        try:
            data = self.pristine(case)
        except BaseException as exc:
            return {"ok": False, "error": f"generate_input failed: {type(exc).__name__}: {_first_line(exc)}"}
        outs, described = flatten_tensors(out), output["tensors"]
        try:
            result = self.check_implementation(clone_data(data), out)
            self.sync()
        except BaseException as exc:
            return {"ok": False, "error": f"check_implementation raised {type(exc).__name__}: {_first_line(exc)}",
                    "message": traceback.format_exc(), "probe": True}
        ok, message = _normalize_verdict(result)
        mark = fingerprint(outs)
        if ok:
            if len(self.seen) < MAX_REMEMBERED_OUTPUTS:
                self.seen.add(mark)
            return None
        error = message.strip() or "check_implementation failed"
        if byte is not None:
            for o, d in zip(outs, described):
                fraction = poisoned_fraction(o, byte)
                if d.get("buffer") and fraction >= 0.5:
                    error = ("fabricated output: custom_kernel returned the output buffer from data without "
                             "writing it (it still holds the harness's poison)")
                    break
                if fraction >= 0.5:
                    error = (f"stale memory: {fraction:.0%} of the output still holds the poison the harness "
                             "wrote into freed memory before the call (allocated, never written)")
                    break
            else:
                if mark in self.seen:
                    error = "output replay: custom_kernel returned a previous call's result for a new input"
        elif mark in self.seen:
            error = "output replay: custom_kernel returned a previous call's result for a new input"
        return {"ok": False, "error": error, "message": message, "probe": True}

    def checked(self, case: dict, reply: dict) -> dict | None:
        """None when every checked call of `case` (CHECKED_CALLS) handed over a right output, else the failure."""
        if not reply.get("ok"):
            return reply
        calls = [(with_seed_offset(case, step) if step else case, byte) for step, byte in CHECKED_CALLS
                 if not step or isinstance(case.get("seed"), int)]
        outputs = reply.get("outputs")
        if not isinstance(outputs, list) or len(outputs) != len(calls):
            count = len(outputs) if isinstance(outputs, list) else 0
            return {"ok": False, "error": f"no output: the worker handed over {count} outputs of custom_kernel for "
                                          f"the {len(calls)} checked calls of the case (the worker answered for "
                                          "the harness)"}
        for (call_case, byte), output in zip(calls, outputs):
            failure = self.judge(call_case, output, byte)
            if failure is not None:
                return failure
        return None

    def one(self, case: dict, reply: dict, byte: int | None) -> dict | None:
        """The check of a reply that must hand over exactly one output (a timed call's)."""
        if not reply.get("ok"):
            return reply
        outputs = reply.get("outputs")
        if not isinstance(outputs, list) or len(outputs) != 1:
            return {"ok": False, "error": "no output: the worker handed over no output of the timed call (the "
                                          "worker answered for the harness)"}
        return self.judge(case, outputs[0], byte)

    def case_facts(self, case: dict) -> tuple[int, bool]:
        """(the fewest bytes one call must move: inputs read once, output buffers only written, outputs written;
        whether the case has in/out buffers: inputs the reference reads and then changes), from the reference's
        layout of the case made here."""
        data = self.pristine(case)
        layout = self.task.layout(case, data)
        read = sum(t.numel() * t.element_size() for i, t in enumerate(flatten_tensors(data))
                   if i not in layout.poisonable)
        return read + sum(layout.out_bytes), bool(layout.writable - layout.poisonable)


def fingerprint(tensors: list) -> tuple:
    """Shape, dtype, float64 sum and 64 sampled values of each tensor: cheap, and two different correct outputs
    never share one in practice (a wrong output equal to an earlier right one is a replay)."""
    import torch

    parts = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // 64)
        total = flat.sum(dtype=torch.float64).item() if flat.numel() and not flat.dtype.is_complex else 0.0
        parts.append((tuple(t.shape), str(t.dtype), repr(total), repr(flat[::step][:64].tolist())))
    return tuple(parts)


def forged_time(samples: list[float], walls: list[float], overhead_ns: float, device: str) -> str | None:
    """The trusted clock's witness of a timed case: each timed call's time as this process saw it (request sent
    to reply received; the worker synchronizes before it replies) against the time the worker reported. A
    case fails when the median time the report leaves unexplained, beyond the per-call overhead of an empty
    call (credited up to FORGE_OVERHEAD_CAP_NS), exceeds both the reported median and FORGE_MIN_NS."""
    if not samples or len(samples) != len(walls):
        return None
    credit = min(max(overhead_ns, 0.0), FORGE_OVERHEAD_CAP_NS)
    unexplained = sorted(w - s - credit for s, w in zip(samples, walls))
    reported = sorted(samples)[len(samples) // 2]
    gap = unexplained[len(unexplained) // 2]
    if gap > max(reported, FORGE_MIN_NS[device]):
        return (f"time forged: the worker reported a median of {_us(reported)} per call, the trusted process "
                f"saw {_us(sorted(walls)[len(walls) // 2])} (after {_us(credit)} of per-call overhead, "
                f"{_us(gap)} unexplained)")
    return None


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
            unsynchronized = self.timing_verdict(loop, info.get("audit"))
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
            self.write_stats(prefix, loop)
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
        overhead = self._overhead() if judge is not None else 0.0  # before the case's GPU trace starts
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
        forged = forged_time(loop.samples, walls, overhead, "cuda" if judge.cuda else "cpu")
        return loop, {"ok": True, "bytes": size, "audit": end.get("audit"), "forged": forged}

    def _overhead(self) -> float:
        """The median time this process sees for a timed call of a kernel that does nothing (EMPTY_CALLS)."""
        walls = []
        for _ in range(EMPTY_CALLS):
            started = self.clock_ns()
            if not self._ask("bench_empty")["ok"]:
                return 0.0
            walls.append(float(self.clock_ns() - started))
        return sorted(walls)[len(walls) // 2]

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
            for key in ("kernel_ns", "gap_ns", "launches"):  # the worker's trace, per timed call (informational)
                values = audit.get(key)
                if isinstance(values, list) and all(isinstance(v, (int, float)) for v in values):
                    text = ",".join(str(int(v)) for v in values) if key == "launches" else numbers(values)
                    self.pipe.write(f"{prefix}.{key}", text)

    def timing_verdict(self, loop: LoopResult, audit: dict | None) -> str | None:
        """The failure the timing audit in force gives a case's timed calls, or None (trust off: none)."""
        if not self.trust or self.audit == "off":
            return None
        if self.audit == "drain":
            return unsynchronized_work(loop.drains)
        if not isinstance(audit, dict):
            return "timing audit failed: the worker sent no GPU trace for this case"
        if audit.get("error"):
            return f"timing audit failed: {audit['error']}"
        try:
            audits = [CallAudit(None if o is None else float(o), None if m is None else float(m), bool(t), bool(c))
                      for o, m, t, c in zip(audit["overruns"], audit["marker_overruns"], audit["on_time"],
                                            audit["on_current"], strict=True)]
        except (KeyError, TypeError, ValueError):
            return "timing audit failed: the worker's GPU trace summary is malformed"
        if len(audits) != len(loop.samples):
            return (f"timing audit failed: the GPU trace holds {len(audits)} timed calls, the timing loop made "
                    f"{len(loop.samples)}")
        return unsynchronized_trace(audits)

    def write_stats(self, prefix: str, loop: LoopResult) -> None:
        stats = summarize(loop.samples)
        for field in dataclasses.fields(Stats):  # popkit.protocol's CASE_STATISTICS + HARNESS_STATISTICS, in order
            value = getattr(stats, field.name)
            self.pipe.write(f"{prefix}.{field.name}", value if field.name == "runs" else format_number(value))
        self.pipe.write(f"{prefix}.samples", ",".join(format_number(s) for s in loop.samples))
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
                                            f"{_first_line(exc)}", "message": traceback.format_exc()}


def worker_settings(trust: bool, audit: str, fd: int | None) -> dict:
    """What the worker starts with; the output buffer travels as a descriptor the spawn passes on."""
    from multiprocessing.reduction import DupFd

    return {"trust": trust, "audit": audit, "outputs_fd": DupFd(fd) if fd is not None else None}


def run_session(pipe: ResultPipe, link: WorkerLink, mode: str, cases: list[dict], trust: bool,
                gone: WorkerGone | None = None, audit: str = "off", outputs: int | None = None,
                judged: tuple[Judge | None, dict | None] | None = None) -> int:
    """The mode's cases on the pipe, then `check` and the closing record once the worker is gone; the exit code."""
    judge, failure = judged if judged is not None else start_judge(outputs)
    session = Session(pipe, link, mode, cases, trust, audit=audit, judge=judge, judge_failure=failure)
    try:
        if gone is None:
            session.start()
        else:  # a warm start whose worker died before `go`: every case fails with it, as in a cold start
            session.gone = gone
        session.run()
    finally:
        link.close()  # the worker is gone before the verdict is written
    passed = session.all_passed and not session.cuda_failed
    pipe.write("check", "pass" if passed else "fail")
    pipe.close()
    if session.cuda_failed:
        return EXIT_CUDA
    return EXIT_OK if passed else EXIT_FAILED


def warm_main(fd: int, control: int, mode: str, cases: list[dict], trust: bool, secret: int | None,
              audit: str = "off") -> int:
    """A warm start (POPKIT_CONTROL_FD): the worker prepares everything but the submission, `popkit.warm: ready`
    goes on the pipe, and on `go` the mode runs as in a cold start, with `go`'s cases and key."""
    outputs = output_buffer() if trust else None
    link = WorkerLink({**worker_settings(trust, audit, outputs), "warm": {"mode": mode, "cases": cases}})
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
    if gone is None:
        try:
            link.send("load")  # the submission is imported now; Session.start receives the `ready` reply
        except WorkerGone as exc:
            gone = exc
            link.kill()
    return run_session(ResultPipe(fd, go["key"]), link, mode, cases, trust, gone, audit=audit, judged=judged)


def main(argv: list[str] | None = None) -> int:
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
        _make_non_dumpable()
    # Only timed modes audit their timing, and only with the trust checks on (off: what the leaderboard does).
    audit = audit if trust and mode in BUDGETS else "off"
    if control is not None:
        return warm_main(fd, control, mode, cases, trust, secret, audit)
    outputs = output_buffer() if trust else None
    return run_session(ResultPipe(fd, pipe_key), WorkerLink(worker_settings(trust, audit, outputs)), mode, cases,
                       trust, audit=audit, outputs=outputs)


# ====================================================================================== the worker
# Everything below runs in the spawned worker process, the only place the submission is imported.


class CaseFailure(Exception):
    """A failed case: `error` is one line naming what went wrong, `message` the details (traceback, check text)."""

    def __init__(self, error: str, message: str = "", *, cuda: bool = False, probe: bool = False):
        super().__init__(error)
        self.error, self.message, self.cuda = error, message, cuda
        self.probe = probe  # a wrong-output kind of failure, worth retrying with sys.argv saying test

    def reply(self) -> dict:
        return {"ok": False, "error": self.error, "message": self.message, "cuda": self.cuda, "probe": self.probe}


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _is_cuda_error(exc: BaseException, torch) -> bool:
    """CUDA/HIP API failures: they poison the context, so the eval exits 110."""
    kinds = tuple(k for k in (getattr(torch, "AcceleratorError", None), getattr(torch.cuda, "CudaError", None)) if k)
    if kinds and isinstance(exc, kinds):
        return True
    text = str(exc)
    return "CUDA error" in text or "HIP error" in text


def _exception_failure(exc: BaseException, torch, where: str = "") -> CaseFailure:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    error = f"{where}{type(exc).__name__}: {_first_line(exc)}".rstrip(": ")
    return CaseFailure(error, tb, cuda=_is_cuda_error(exc, torch))


# -- tensors in nested data (worker-side helpers; torch is imported lazily so the parent never loads it)


def clone_data(data: Any) -> Any:
    """Clone every tensor in nested tuples, lists and dicts; other values are returned as they are."""
    import torch

    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, tuple):
        return tuple(clone_data(x) for x in data)
    if isinstance(data, list):
        return [clone_data(x) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v) for k, v in data.items()}
    return data


def refill(target: Any, data: Any) -> Any:
    """`target` with every tensor overwritten by the matching tensor of `data`, or None when their tensors
    differ in number, shape, dtype, layout or device (nothing is copied then)."""
    targets, sources = flatten_tensors(target), flatten_tensors(data)
    if len(targets) != len(sources) or any(
            (t.shape, t.dtype, t.device, t.stride()) != (d.shape, d.dtype, d.device, d.stride())
            for t, d in zip(targets, sources)):
        return None
    for t, d in zip(targets, sources):
        t.copy_(d)
    return target


def flatten_tensors(data: Any) -> list:
    """The tensors of nested data in a fixed order (depth first; dicts in insertion order): "input I"."""
    import torch

    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, (tuple, list)):
        return [t for x in data for t in flatten_tensors(x)]
    if isinstance(data, dict):
        return [t for x in data.values() for t in flatten_tensors(x)]
    return []


def storage_span(t) -> tuple[str, int, int] | None:
    """(device, first byte, end byte) of the storage behind a tensor; None for an empty storage."""
    try:
        storage = t.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return None
    if size == 0 or start == 0:
        return None
    return str(t.device), start, start + size


def shares_storage(a, b) -> bool:
    """Whether two tensors' storages overlap (a view of an input overlaps it)."""
    sa, sb = storage_span(a), storage_span(b)
    return sa is not None and sb is not None and sa[0] == sb[0] and sa[1] < sb[2] and sb[1] < sa[2]


def _byte_view(t):
    """The tensor's elements as raw bytes, shape (numel, itemsize), contiguous."""
    import torch

    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.uint8:
        return flat.reshape(-1, 1)
    return flat.view(torch.uint8).reshape(flat.numel(), flat.element_size())


def same_bits(a, b) -> bool:
    """Bitwise equality of two tensors (NaN payloads included); False if shape, dtype or device kind differ."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    if a.device != b.device:
        b = b.to(a.device)
    try:
        return torch.equal(_byte_view(a), _byte_view(b))
    except (RuntimeError, TypeError):
        return torch.equal(a, b)


def poison_pattern(dtype, byte: int):
    """One element of `dtype` whose every byte is `byte` (bool: True, since other bytes are not valid bools)."""
    import torch

    if dtype == torch.bool:
        return torch.ones((), dtype=torch.bool)
    size = torch.empty((), dtype=dtype).element_size()
    return torch.full((size,), byte, dtype=torch.uint8).view(dtype).reshape(())


def poison(t, byte: int) -> bool:
    """Fill a tensor with the byte pattern (0xFF is NaN for every float type); False if it cannot be."""
    try:
        t.copy_(poison_pattern(t.dtype, byte).to(t.device).expand(t.shape))
        return True
    except (RuntimeError, TypeError):
        return False


def poisoned_fraction(t, byte: int) -> float:
    """The fraction of the tensor's elements whose bytes are exactly the poison pattern."""
    import torch

    if t.numel() == 0:
        return 0.0
    try:
        pattern = _byte_view(poison_pattern(t.dtype, byte).to(t.device).reshape(1))
        hits = torch.all(_byte_view(t) == pattern, dim=1)
    except (RuntimeError, TypeError):
        return 0.0
    return float(hits.sum().item()) / t.numel()


def type_template(ref: Any) -> Any:
    """The reference output's types without its data: a tensor becomes ("tensor", its class),
    a tuple or list a ("seq", container name, [templates]), anything else None (no constraint)."""
    import torch

    if isinstance(ref, torch.Tensor):
        return ("tensor", type(ref))
    if isinstance(ref, (tuple, list)):
        return ("seq", type(ref).__name__, [type_template(r) for r in ref])
    return None


def output_type_problem(out: Any, template: Any) -> str | None:
    """Why the output's type is not acceptable (plain tensors, or the reference's own type), or None.

    `template` comes from type_template(reference output).
    """
    import torch

    if template is None:
        return None
    if template[0] == "tensor":
        if not isinstance(out, torch.Tensor):
            return f"wrong output type: expected torch.Tensor, got {type(out).__name__}"
        if type(out) is not torch.Tensor and type(out) is not template[1]:
            return (f"lazy output: custom_kernel returned a {type(out).__qualname__} (a torch.Tensor subclass), "
                    "not a plain torch.Tensor")
        overrides = sorted(k for k, v in getattr(out, "__dict__", {}).items() if callable(v))
        if overrides:
            return f"lazy output: the returned tensor overrides {overrides[0]!r} on the instance"
        return None
    _, name, children = template
    if not isinstance(out, (tuple, list)):
        return f"wrong output type: expected a {name} of {len(children)}, got {type(out).__name__}"
    if len(out) != len(children):
        return f"wrong output: expected {len(children)} outputs, got {len(out)}"
    for o, child in zip(out, children):
        problem = output_type_problem(o, child)
        if problem:
            return problem
    return None


def _normalize_verdict(result: Any) -> tuple[bool, str]:
    """check_implementation's result: (ok, message), or an older string (empty means pass)."""
    if isinstance(result, str):
        return result == "", result
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return bool(result[0]), str(result[1] or "")
    if isinstance(result, bool):
        return result, ""
    return False, f"check_implementation returned {type(result).__name__}, expected (ok, message)"


@dataclass
class Layout:
    """What the reference does with one case's data (found once per case by running it on clones).

    alias_ok: for each output tensor j, the inputs the reference's output j shares storage with (output
        buffers, or inputs the reference returns a view of: returning them there is fine).
    writable: inputs the reference changes (the kernel may change them too).
    poisonable: output buffers whose initial contents do not affect the reference's result.
    out_bytes: byte sizes of the reference's output tensors (for freed-memory poisoning).
    device: where the reference's outputs live.
    template: type_template of the reference's output (the accepted output types).
    """

    alias_ok: list
    writable: set
    poisonable: set
    out_bytes: list
    device: Any
    template: Any


class Tripwires:
    """Functions the harness depends on, captured before the submission is imported."""

    def __init__(self):
        self._items: list[tuple[str, str, Any, str, Any]] = []  # (label, kind, owner, attribute, original)

    def add(self, label: str, kind: str, owner: Any, attr: str) -> None:
        if hasattr(owner, attr):
            self._items.append((label, kind, owner, attr, getattr(owner, attr)))

    def add_module_functions(self, module: Any, prefix: str) -> None:
        for name, value in list(vars(module).items()):
            if callable(value) and not isinstance(value, type) and not name.startswith("__"):
                self.add(f"{prefix}.{name}", "harness", module, name)

    def violation(self) -> str | None:
        for label, kind, owner, attr, original in self._items:
            current = getattr(owner, attr, None)
            if current is original:
                continue
            try:
                same = current == original  # bound methods compare equal, not identical
            except Exception:
                same = False
            if not same:
                return f"{'timer' if kind == 'timer' else 'harness'} patched: {label} was replaced"
        return None


_TIMER_NAMES = {
    "time": ("perf_counter_ns", "perf_counter", "monotonic_ns", "monotonic", "time", "time_ns"),
    "torch.cuda": ("synchronize", "Event", "current_stream", "current_device", "set_device", "_sleep"),
    "torch.cuda.Event": ("__init__", "record", "elapsed_time", "synchronize", "query", "wait"),
    "torch.Tensor": ("zero_",),  # the L2 flush
    # the trace audit's profiler (TraceAudit)
    "torch.autograd": ("_prepare_profiler", "_enable_profiler", "_disable_profiler", "_profiler_enabled"),
}
_CHECK_TORCH = ("allclose", "isclose", "equal", "isnan", "isinf", "isfinite", "abs", "sum", "all", "any", "where",
                "nonzero", "sign", "zeros_like", "clone", "eq", "ne", "le", "lt", "ge", "gt", "sub", "maximum")
_CHECK_TENSOR = ("clone", "copy_", "to", "cpu", "float", "double", "detach", "contiguous", "view", "reshape", "abs",
                 "sum", "all", "any", "item", "tolist", "numel", "isnan", "isinf", "eq", "ne", "equal", "allclose",
                 "isclose", "nonzero", "sign", "__sub__", "__rsub__", "__add__", "__mul__", "__eq__", "__ne__",
                 "__le__", "__lt__", "__ge__", "__gt__", "__abs__", "__getitem__", "__setitem__", "__bool__",
                 "__invert__", "__and__", "__or__", "__len__", "shape", "dtype", "device")


class Device:
    """The GPU (or the CPU) as the harness uses it: timers and synchronize, captured before the submission
    is imported, the L2 flush, and the measurement of one timed call."""

    def __init__(self, torch):
        self.torch = torch
        self.cuda = torch.cuda.is_available()
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.Event = torch.cuda.Event
        self.record = torch.cuda.Event.record
        self.event_sync = torch.cuda.Event.synchronize
        self.elapsed_ms = torch.cuda.Event.elapsed_time
        self.perf_ns = time.perf_counter_ns
        self.zero_ = torch.Tensor.zero_
        self.timer = "cuda-event" if self.cuda else "cpu-monotonic"
        self.flush_buffer = None

    def system(self) -> dict:
        torch = self.torch
        info = {"device": "cpu", "torch": torch.__version__, "cuda": torch.version.cuda or "",
                "hip": getattr(torch.version, "hip", None) or "", "arch": ""}
        if self.cuda:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            info["device"] = props.name
            if info["hip"]:
                info["arch"] = str(getattr(props, "gcnArchName", "")).split(":")[0]
            else:
                info["arch"] = f"sm_{props.major}{props.minor}"
        return info

    def flush_l2(self) -> None:
        """Write a buffer of max(2 x L2, 256 MiB) so no input or output stays in the L2 cache (GPU only)."""
        if not self.cuda:
            return
        if self.flush_buffer is None:
            torch = self.torch
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            size = max(2 * l2, FLUSH_MIN_BYTES)
            self.flush_buffer = torch.empty(size, dtype=torch.int8, device="cuda")
        self.zero_(self.flush_buffer)

    def measure(self, kernel: Callable, kernel_input: Any, trace: "TraceAudit | None" = None) -> tuple[Any, dict]:
        """One call between events (GPU, after the L2 flush) or perf_counter_ns readings (CPU): the output and
        {"ns": duration} plus, on a GPU, "drain" (measure_drain, taken before anything else the host does after
        the call, so no work left running gets time to finish unseen) and "lead" (ns from just before the first
        marker, or the flush without a trace, was queued until the start event was queued). With a trace
        session, the harness's markers go on the timed queue before the flush (a spin of LEAD_SPIN_CYCLES),
        right after the end event and after the drain (audit_trace)."""
        if not self.cuda:
            t0 = self.perf_ns()
            out = kernel(kernel_input)
            return out, {"ns": float(self.perf_ns() - t0)}
        start, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
        t0 = self.perf_ns()
        if trace is not None:
            trace.mark(LEAD_SPIN_CYCLES)
        self.flush_l2()
        self.record(start)
        lead = self.perf_ns() - t0
        out = kernel(kernel_input)
        self.record(end)
        if trace is not None:
            trace.mark()
        drain = measure_drain(end, event_sync=self.event_sync, device_sync=self.sync, clock_ns=self.perf_ns)
        if trace is not None:
            trace.mark()
        return out, {"drain": drain, "ns": self.elapsed_ms(start, end) * 1e6, "lead": float(lead)}


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

    def __init__(self, torch, device: "Device"):
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
            raise TraceError(f"the harness's trace was stopped during the timed calls ({_first_line(exc)})") from None
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
                "launches": [a.launches for a in audits]}

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
            return f"{type(exc).__name__}: {_first_line(exc)}"
        if any(a.overrun_ns is None or a.overrun_ns <= TRACE_MARGIN_NS for a in audits):
            return "the trace did not show the work left running on another queue after the end event"
        return ""


class Guards:
    """The trust checks around the submission's code: tripwires on the functions the harness depends on
    (captured before the submission is imported) and threads the submission leaves running."""

    def __init__(self, torch, reference: Any):
        self.submission_path = os.path.realpath("submission.py")
        self.reference = reference
        self.tripwires = self._capture(torch)
        self.threads_at_start = self.snapshot()

    def _capture(self, torch) -> Tripwires:
        wires = Tripwires()
        owners = {"time": time, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
                  "torch.Tensor": torch.Tensor, "torch.autograd": torch.autograd}
        for owner_name, names in _TIMER_NAMES.items():
            for name in names:
                wires.add(f"{owner_name}.{name}", "timer", owners[owner_name], name)
        for name in _CHECK_TORCH:
            wires.add(f"torch.{name}", "harness", torch, name)
        for name in _CHECK_TENSOR:
            wires.add(f"torch.Tensor.{name}", "harness", torch.Tensor, name)
        wires.add("torch.testing.assert_close", "harness", torch.testing, "assert_close")
        wires.add_module_functions(self.reference, "reference")
        # The reference's local helpers (utils.py, task.py): modules loaded from this directory.
        here = os.path.realpath(os.getcwd())
        for name, module in list(sys.modules.items()):
            path = getattr(module, "__file__", None)
            if (module is not self.reference and path and name not in ("__main__", "__mp_main__")
                    and os.path.dirname(os.path.realpath(path)) == here):
                wires.add_module_functions(module, name)
        return wires

    def check_tripwires(self) -> None:
        problem = self.tripwires.violation()
        if problem is None and sys.modules.get("reference") is not self.reference:
            problem = "harness patched: sys.modules['reference'] was replaced"
        if problem:
            raise CaseFailure(problem)

    def snapshot(self) -> set:
        return {t.ident for t in threading.enumerate()}

    def check_threads(self, before: set, during: str = "custom_kernel") -> None:
        """Fail when a thread started since `before` is alive and runs the submission's code."""
        new = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not new:
            return
        frames = sys._current_frames()
        for thread in new:
            if self._owned_by_submission(thread, frames):
                raise CaseFailure(f"background thread started by {during} (still running: {thread.name})")

    def _owned_by_submission(self, thread, frames: dict) -> bool:
        """Whether a thread runs the submission's code (library thread pools do not count)."""
        candidates = [getattr(thread, "_target", None), getattr(thread, "function", None), type(thread).run]
        for fn in candidates:
            if getattr(fn, "__module__", None) == "submission":
                return True
            code = getattr(fn, "__code__", None)
            if code is not None and os.path.realpath(code.co_filename) == self.submission_path:
                return True
        frame = frames.get(thread.ident)
        while frame is not None:
            if (frame.f_globals.get("__name__") == "submission"
                    or os.path.realpath(frame.f_code.co_filename) == self.submission_path):
                return True
            frame = frame.f_back
        return False


class ReferenceTask:
    """The task's side of a case: its inputs, what the reference does with them (the Layout), the task's
    own check, and the poisoned inputs a trusted call gets. Functions are taken before the submission loads."""

    def __init__(self, reference: Any, device: Device):
        self.generate_input = reference.generate_input
        self.ref_kernel = reference.ref_kernel
        self.check_implementation = reference.check_implementation
        self.device, self.torch, self.sync = device, device.torch, device.sync
        self.layouts: dict[str, Layout] = {}
        self.ahead: dict[str, Any] = {}  # a warm start's inputs, by spec; each is handed out once (preload)

    def generate(self, case: dict) -> Any:
        data = self.ahead.pop(format_spec(case), None)
        if data is not None:
            return data
        try:
            return self.generate_input(**case)
        except BaseException as exc:
            raise _exception_failure(exc, self.torch, "generate_input failed: ") from None

    def preload(self, cases: list[dict], trust: bool, budget_bytes: int = PRELOAD_BYTES) -> None:
        """A warm start: generate the inputs of `cases` (inputs_ahead) and, with trust on, their layouts (the
        reference run on clones) before the submission is imported, up to `budget_bytes` of tensors.

        generate() hands each input out once, so a run sees exactly what a cold start generates for it: the
        same deterministic inputs, fresh objects. A case that fails here is skipped and fails in the run
        itself, at its own place, as it would cold. Call drop() if the submission's import changed a default
        that generation reads (dtype, device).
        """
        total = 0
        for case in cases:
            key = format_spec(case)
            if key in self.ahead:
                continue
            try:
                data = self.generate_input(**case)
                if trust:
                    self.layout(case, data)
                self.sync()
            except BaseException:
                continue
            size = sum(t.numel() * t.element_size() for t in flatten_tensors(data))
            if total + size > budget_bytes:
                break
            total += size
            self.ahead[key] = data

    def drop(self) -> None:
        """Forget the warm start's inputs: each is generated when the run asks for it."""
        self.ahead.clear()

    def judge(self, data: Any, out: Any) -> tuple[bool, str]:
        """The task's check on `data` (a copy the kernel never saw) and the kernel's output."""
        try:
            result = self.check_implementation(data, out)
        except BaseException as exc:
            raise _exception_failure(exc, self.torch, "check_implementation raised ") from None
        self.sync()
        return _normalize_verdict(result)

    def layout(self, case: dict, data: Any) -> Layout:
        """Run the reference on clones to learn which inputs are output buffers (cached per case)."""
        key = format_spec(with_seed_offset(case, -case["seed"]) if isinstance(case.get("seed"), int) else case)
        if key in self.layouts:
            return self.layouts[key]
        pristine = flatten_tensors(data)
        copy = clone_data(data)
        try:
            ref_out = self.ref_kernel(copy)
            self.sync()
        except BaseException as exc:
            raise _exception_failure(exc, self.torch, "ref_kernel failed: ") from None
        copies, outs = flatten_tensors(copy), flatten_tensors(ref_out)
        alias_ok = [{i for i, t in enumerate(copies) if shares_storage(t, o)} for o in outs]
        writable = {i for i, (t, p) in enumerate(zip(copies, pristine)) if not same_bits(t, p)}
        poisonable = set()
        for i in sorted(set().union(*alias_ok)):
            trial = clone_data(data)
            if not poison(flatten_tensors(trial)[i], 0xFF):
                continue
            try:
                trial_out = flatten_tensors(self.ref_kernel(trial))
                self.sync()
            except BaseException:
                continue
            # The buffer's old contents do not matter to the reference, so the kernel may not rely on them.
            if len(trial_out) == len(outs) and all(same_bits(a, b) for a, b in zip(trial_out, outs)):
                poisonable.add(i)
        device = outs[0].device if outs else (pristine[0].device if pristine else None)
        layout = Layout(alias_ok, writable, poisonable, [t.numel() * t.element_size() for t in outs], device,
                        type_template(ref_out))
        self.layouts[key] = layout
        return layout

    def trusted_input(self, data: Any, layout: Layout, byte: int, into: Any = None) -> Any:
        """A copy of `data` for the kernel, its output buffers and freed blocks of the outputs' sizes poisoned.

        The copy is a fresh clone, or `data` copied into the tensors of `into` (an earlier kernel input of
        the same layout: same addresses, so a cache keyed on them returns its stale result and the check
        names the replay, instead of that depending on whether the allocator happens to reuse an address)."""
        kernel_input = refill(into, data) if into is not None else None
        if kernel_input is None:
            kernel_input = clone_data(data)
        tensors = flatten_tensors(kernel_input)
        for i in layout.poisonable:
            poison(tensors[i], byte)
        self._poison_freed(layout, byte)
        return kernel_input

    def _poison_freed(self, layout: Layout, byte: int) -> None:
        """Allocate blocks of each output's byte size, fill them, free them: an output allocated but never
        written then holds the poison instead of an earlier correct result."""
        torch = self.torch
        for nbytes in layout.out_bytes:
            if nbytes <= 0 or layout.device is None:
                continue
            # Four blocks: the allocator hands the kernel's next allocation of this size one of them.
            blocks = [torch.empty(nbytes, dtype=torch.uint8, device=layout.device).fill_(byte) for _ in range(4)]
            del blocks
        self.sync()


class Caller:
    """Calls custom_kernel, untimed or timed; after every call the trust checks run and the device is
    synchronized before any verdict."""

    def __init__(self, kernel: Callable, device: Device, guards: Guards, trust: bool):
        self.kernel, self.device, self.guards, self.trust = kernel, device, guards, trust

    def invoke(self, kernel_input: Any) -> Any:
        """One untimed call, the device synchronized and every tripwire verified before any verdict."""
        before = self.guards.snapshot()
        try:
            out = self.kernel(kernel_input)
        except BaseException as exc:
            raise _exception_failure(exc, self.device.torch) from None
        self._after_call(before)
        return out

    def timed(self, kernel_input: Any, trace: TraceAudit | None = None, kernel: Callable | None = None
              ) -> tuple[Any, dict]:
        """One timed call: synchronize, then Device.measure (L2 flush, events; the trace's markers when a trace
        runs); the reply part {"ns", "drain", "lead"}. `kernel`: another function than custom_kernel (the
        empty call that measures the per-call overhead)."""
        self.device.sync()
        before = self.guards.snapshot()
        try:
            out, timing = self.device.measure(kernel or self.kernel, kernel_input, trace)
        except BaseException as exc:
            raise _exception_failure(exc, self.device.torch) from None
        self._after_call(before)
        if trace is not None:
            trace.note(timing)
        return out, timing

    def _after_call(self, before: set) -> None:
        if self.trust:
            self.guards.check_threads(before)  # before the sync: work still running after return is the point
        try:
            self.device.sync()
        except BaseException as exc:
            raise _exception_failure(exc, self.device.torch) from None
        if self.trust:
            self.guards.check_tripwires()


class Checker:
    """The worker's part of an output's check: type, aliasing, input mutation; then (trust on) the output is
    handed to the trusted process, which judges it (Judge), or (trust off) the task's check runs here. The
    checked calls of a case."""

    def __init__(self, task: ReferenceTask, caller: Caller, trust: bool, exporter: "Exporter"):
        self.task, self.caller, self.trust, self.exporter = task, caller, trust, exporter

    def verify(self, out: Any, kernel_input: Any, pristine: Any, layout: Layout, byte: int | None) -> None:
        """Every output check: type, aliasing, input mutation, then the task's own check."""
        if self.trust:
            problem = output_type_problem(out, layout.template)
            if problem:
                raise CaseFailure(problem, probe=True)
            outs, inputs, originals = flatten_tensors(out), flatten_tensors(kernel_input), flatten_tensors(pristine)
            for j, o in enumerate(outs):
                allowed = layout.alias_ok[j] if j < len(layout.alias_ok) else set()
                for i, t in enumerate(inputs):
                    if i not in allowed and shares_storage(o, t):
                        raise CaseFailure(f"output aliases input {i} (same storage)", probe=True)
            for i, (t, p) in enumerate(zip(inputs, originals)):
                if i not in layout.writable and i not in layout.poisonable and not same_bits(t, p):
                    raise CaseFailure(f"input {i} was modified by custom_kernel", probe=True)
        if self.trust:  # the trusted process judges the output: hand it over
            buffers = [t for i, t in enumerate(flatten_tensors(kernel_input)) if i in layout.poisonable]
            self.exporter.add(out, buffers)
            return
        ok, message = self.task.judge(clone_data(pristine), out)
        if not ok:
            raise CaseFailure(message.strip() or "check_implementation failed", probe=True)

    def _trusted_call(self, data: Any, layout: Layout, byte: int) -> None:
        kernel_input = self.task.trusted_input(data, layout, byte)
        out = self.caller.invoke(kernel_input)
        self.verify(out, kernel_input, data, layout, byte)

    def _checked(self, case: dict) -> Any:
        """The checked call(s) of a case; returns the pristine data. Raises CaseFailure."""
        data = self.task.generate(case)
        if not self.trust:
            out = self.caller.invoke(clone_data(data))
            self.verify(out, None, data, None, None)
            return data
        layout = self.task.layout(case, data)
        for byte in (0xFF, 0x7F):  # double run: a result that depends on old memory shows up
            self._trusted_call(data, layout, byte)
        if isinstance(case.get("seed"), int):
            self._trusted_call(self.task.generate(with_seed_offset(case, FRESH_SEED_STEP)), layout, 0xFF)
        return data

    def checked(self, case: dict, shown: str | None = None) -> Any:
        """The checked calls of a case (trust on: the trusted side's CHECKED_CALLS, in order), with sys.argv
        naming `shown` as the mode when given (the trusted side's mode-branching probe)."""
        argv = sys.argv
        if shown is not None and len(argv) >= 2:
            sys.argv = [argv[0], shown, *argv[2:]]
        try:
            return self._checked(case)
        finally:
            sys.argv = argv


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


class Exporter:
    """The worker's hand-over of outputs to the trusted process: each tensor's bytes go into the buffer the
    trusted process made (a memfd given at spawn; a GPU output is copied to it), described by JSON (never
    pickle: nothing the worker sends runs code there). `outputs` holds one description per handed output."""

    def __init__(self, fd: Any):
        self.fd = fd.detach() if hasattr(fd, "detach") else fd
        self._map = None
        self.outputs: list[dict] = []
        self.used = 0

    def reset(self) -> None:
        self.outputs, self.used = [], 0

    def add(self, out: Any, buffers: list) -> None:
        tensors: list = []
        structure = self._encode(out, tensors)
        described = []
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            offset = self.used
            self._write(t, offset, nbytes)
            self.used = offset + (nbytes + 63) // 64 * 64
            described.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                              "offset": offset, "nbytes": nbytes, "device": t.device.type,
                              "buffer": any(shares_storage(t, b) for b in buffers)})
        self.outputs.append({"structure": structure, "tensors": described})

    def _encode(self, out: Any, tensors: list) -> Any:
        import torch

        if isinstance(out, torch.Tensor):
            tensors.append(out)
            return {"tensor": len(tensors) - 1}
        if isinstance(out, (tuple, list)):
            items = [self._encode(x, tensors) for x in out]
            return {"seq": "list" if isinstance(out, list) else "tuple", "items": items}
        if out is None or isinstance(out, (bool, int, float, str)):
            return {"value": out}
        return {"unsupported": type(out).__qualname__}

    def _write(self, t: Any, offset: int, nbytes: int) -> None:
        import mmap

        import torch

        if nbytes == 0 or self.fd is None:
            return
        size = os.fstat(self.fd).st_size
        if offset + nbytes > size:
            os.ftruncate(self.fd, max(offset + nbytes, 2 * size))
        if self._map is None or offset + nbytes > len(self._map):
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self.fd, os.fstat(self.fd).st_size)
        view = torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=offset)
        view.copy_(_byte_view(t).reshape(-1))
        del view


class Worker:
    """The submission's side of one invocation: starts up (imports, captures), then hands each request to
    the piece that does it (Checker for test cases, TimedCase for the timed and profile modes)."""

    def __init__(self, settings: dict):
        self.trust = bool(settings.get("trust", True))
        self.audit = str(settings.get("audit", "off"))
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
            trace, problem = None, f"{type(exc).__name__}: {_first_line(exc)}"
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
            self.reply.update(_exception_failure(exc, torch, "reference.py failed to import: ").reply())
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
            return {**reply, **_exception_failure(exc, torch).reply()}
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


def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the eval process dies (a timeout must not leave it running)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


# The worker's seccomp filter: system calls that reach another process's memory, refused with EPERM.
_REFUSED_CALLS = {"x86_64": (101, 310, 311),  # ptrace, process_vm_readv, process_vm_writev
                  "aarch64": (117, 270, 271)}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
CAP_SYS_PTRACE = 19


def _bpf_program(arch: str) -> list[tuple[int, int, int, int]]:
    """A classic BPF program (code, jt, jf, k) that answers EPERM to one of _REFUSED_CALLS, to any call of
    another ABI (32-bit calls; x32 calls on x86_64, whose numbers have bit 30 set), and allows the rest."""
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, eperm = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    checks = [(jge_k, 0x40000000)] if arch == "x86_64" else []
    checks += [(jeq_k, number) for number in _REFUSED_CALLS[arch]]
    program = [(ld_w_abs, 0, 0, 4), (jeq_k, 1, 0, _AUDIT_ARCH[arch]), (ret_k, 0, 0, eperm), (ld_w_abs, 0, 0, 0)]
    refuse_at = len(program) + len(checks) + 1  # the last instruction
    for code, k in checks:
        program.append((code, refuse_at - len(program) - 1, 0, k))
    return program + [(ret_k, 0, 0, allow), (ret_k, 0, 0, eperm)]


def seal_worker() -> str:
    """Linux: the worker may not reach another process's memory (ptrace, process_vm_readv/writev refused by a
    seccomp filter, after PR_SET_NO_NEW_PRIVS) and, run as root, loses CAP_SYS_PTRACE (so /proc/<pid>/mem of
    the non-dumpable trusted process stays closed). "" when sealed, else why not."""
    import ctypes
    import platform

    arch = platform.machine()
    if not sys.platform.startswith("linux") or arch not in _REFUSED_CALLS:
        return f"no seccomp filter for {sys.platform}/{arch}"
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) == 0 and data[0].effective & (1 << CAP_SYS_PTRACE):
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[0], field, getattr(data[0], field) & ~(1 << CAP_SYS_PTRACE))
        libc.capset(ctypes.byref(header), data)
    libc.prctl(24, CAP_SYS_PTRACE, 0, 0, 0)  # PR_CAPBSET_DROP (needs CAP_SETPCAP; harmless without)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    steps = _bpf_program(arch)
    filters = (Filter * len(steps))(*[Filter(*step) for step in steps])
    program = Program(len(steps), filters)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return f"PR_SET_NO_NEW_PRIVS failed (errno {ctypes.get_errno()})"
    if libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"seccomp filter refused (errno {ctypes.get_errno()})"
    return ""


def _send(conn, reply: dict) -> None:
    conn.send_bytes(json.dumps(reply, allow_nan=True).encode("utf-8"))


def _start_failure(exc: BaseException) -> dict:
    return {"ok": False, "error": f"worker failed to start: {type(exc).__name__}: {_first_line(exc)}",
            "message": traceback.format_exc()}


def worker_main(conn, settings: dict) -> None:
    """The spawned worker's entry point: start up, then answer requests until `stop`."""
    parent = os.getppid()
    _die_with_parent()
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
    if warm is not None:
        # A warm start's worker ends at once: its verdict waits for this exit, and Python's own teardown of
        # torch takes 0.2-2 s. Nothing of the verdict depends on it (the device was synchronized after every
        # call, and the submission's atexit handlers never could reach the pipe).
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
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request.get("op") == "stop":
            return
        try:
            reply = worker.handle(request)
        except BaseException as exc:  # a harness bug must still answer, or the parent waits forever
            reply = {"ok": False, "error": f"harness error: {type(exc).__name__}: {_first_line(exc)}",
                     "message": traceback.format_exc()}
        _send(conn, reply)


if __name__ == "__main__":
    sys.exit(main())
