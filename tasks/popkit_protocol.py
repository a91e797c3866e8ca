"""popkit's harness, shared by both sides: what the processes agree on and the pure rules.

The modes and exit codes, the timing budgets, the cases file (parse, secret seeds, seed offsets), the
statistics and the stop rule, the timing loop, and the timing audit's rules (the drain rule, audit_trace and
unsynchronized_trace). Nothing here touches torch, a process or a descriptor; both the trusted process and the
worker import it (see eval.py for the layout).
"""

from __future__ import annotations

import ast
import bisect
import math
import re
from dataclasses import dataclass
from typing import Any, Callable



MODES = ("test", "benchmark", "leaderboard", "profile")
# `phase.NAME_ns` keys, written before `check`: where an eval's time went, by the trusted side's clock (run_session)
PHASES = ("judge", "ready", "cases", "close")
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
# covers that with room to spare; work on another queue that escapes by less is added to the call's time
# (untimed_ns), since such escapes are worth having on small shapes (docs/design.md).
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
    early_ns: float | None = None  # ns its work on another queue started before the start event (None: no such work)


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
        # The start event completes no earlier than the flush: work on another queue that began before the
        # flush ended began before the call's timer did (work on the timed queue cannot: it follows the flush).
        elsewhere = [r.start_ns for r in work if r.queue != timed_queue]
        early = flush.end_ns - min(elsewhere) if elsewhere else None
        audits.append(CallAudit(overrun, marker_overrun, on_time, latest.queue == timed_queue, busy, span - busy,
                                len(work), early))
    return audits


def untimed_ns(audit: CallAudit) -> float:
    """GPU time of the call's own work on another queue that its events did not enclose: how long it ran past
    the end event (when the latest-ending work is on another queue) plus how long it started before the start
    event. 0 for work on the timed queue alone: its overrun there is only the two clocks' disagreement (an
    honest call measured -0.3 to 1.8 µs past), never time the events missed.

    A call within the audit's margin is timed with this added (popkit_trusted.Session.timing_verdict):
    side-queue work of a few µs per call, too short to prove against the margin, gains nothing."""
    late = audit.overrun_ns if audit.overrun_ns is not None and not audit.on_current else 0.0
    return max(late, 0.0) + max(audit.early_ns or 0.0, 0.0)


def us(ns: float) -> str:
    return f"{ns / 1e3:.1f} µs" if ns < 10e3 else f"{ns / 1e3:.0f} µs"


def unsynchronized_trace(audits: list[CallAudit], margin_ns: float = TRACE_MARGIN_NS) -> str | None:
    """The failure when any timed call's GPU work ended more than `margin_ns` after its end event, or work of it on
    another queue started more than `margin_ns` before its start event; else None.

    No share of calls: GPU timestamps carry no host stall, so one late call is proof. The message names the
    call whose work ran longest past its end event, and how many calls did it.
    """
    late = [(i, a) for i, a in enumerate(audits, 1) if a.overrun_ns is not None and a.overrun_ns > margin_ns]
    if not late:
        early = [(i, a) for i, a in enumerate(audits, 1) if a.early_ns is not None and a.early_ns > margin_ns]
        if not early:
            return None
        call, worst = max(early, key=lambda item: item[1].early_ns)
        return (f"unsynchronized work: call {call} of {len(audits)} started GPU work on another queue "
                f"{us(worst.early_ns)} before its start event ({len(early)} of the {len(audits)} timed calls did; "
                "GPU timestamps), so the event time misses it: work on another queue must wait for the current "
                "one (an event recorded on it) before it starts")
    call, worst = max(late, key=lambda item: item[1].overrun_ns)
    where = "on the timed queue" if worst.on_current else "on another queue"
    return (f"unsynchronized work: call {call} of {len(audits)} left {us(worst.overrun_ns)} of GPU work running "
            f"{where} after its end event ({len(late)} of the {len(audits)} timed calls did; GPU timestamps), so "
            "the event time misses it: work on another queue must be joined to the current one before "
            "custom_kernel returns")


@dataclass(frozen=True)
class LoopResult:
    samples: list[float]
    stop: str  # a stop_reason, or "failed"
    failure: dict | None  # the failing call's reply when stop == "failed"
    drains: tuple[float, ...] = ()  # per timed call (GPU only): measure_drain
    added: list[float] | None = None  # per timed call, GPU time its events missed, added to its sample (untimed_ns)


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
