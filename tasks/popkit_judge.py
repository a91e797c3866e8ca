"""popkit's harness, the trusted side: the verdicts and the time witness.

Judge makes its own pristine input of every checked call, reads the worker's output from the buffer this
process owns, runs the task's check_implementation and names poison and replayed outputs; forged_time compares
a reported median with this process's own clock around the calls. Never imported by the worker.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from typing import Any

from popkit_protocol import FRESH_SEED_STEP, MAX_REMEMBERED_OUTPUTS, format_spec, us, with_seed_offset
from popkit_shared import (Device, ReferenceTask, clone_data, first_line, flatten_tensors, normalize_verdict,
                           poisoned_fraction)


CHECKED_CALLS = ((0, 0xFF), (0, 0x7F), (FRESH_SEED_STEP, 0xFF))  # a case's checked calls: (seed offset, poison)
MAX_OUTPUT_BYTES = 1 << 36  # a description of more bytes than this is not an output
FORGE_MIN_NS = {"cpu": 250_000.0, "cuda": 1_000_000.0}  # unexplained time per call always tolerated
FORGE_OVERHEAD_CAP_NS = 1_000_000.0  # an empty call's overhead is credited up to this much
EMPTY_CALLS = 5  # empty calls that measure the per-call overhead of a timed case on a GPU, before it
# The CPU's copy bandwidth, measured once per timed run on the trusted side (Judge.copy_bandwidth): the best of
# COPY_REPEATS copies at each size, sizes a core's caches hold (the fastest a kernel's bytes can move; larger
# sizes only copy slower). popkit fails a CPU case implying more than a margin over it (model/results.py).
COPY_SIZES = (256 << 10, 2 << 20)
COPY_REPEATS = 20


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
        self._stages: dict[bool, Any] = {}  # staging memory of read: pageable (CPU outputs), pinned (GPU outputs)
        self.task = ReferenceTask(reference, Device(torch))  # the reference's layout of a case, as the worker has it
        if self.cuda:
            torch.empty(1, device="cuda")  # the device's context, made while the worker starts (not on a case)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def system(self) -> dict:
        """This process's own reading of the device and versions (Device.system), never the worker's word."""
        return self.task.device.system()

    def copy_bandwidth(self) -> float:
        """The CPU's best copy bandwidth in bytes moved per second (each byte read once and written once), by this
        process's own clock: the CPU's physics floor, which a time the worker reports cannot beat. Measured on
        one thread, then counted once per CPU this process may run on (the worker's too): a copy split over
        threads waits for its slowest, so on a machine whose other cores are busy it would read a fraction of
        the bandwidth a kernel of many more bytes gets (honest 64 MB sums failed as `time beats physics`)."""
        torch, best = self.torch, 0.0
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for size in COPY_SIZES:
                source = torch.ones(size, dtype=torch.uint8)
                target = torch.empty_like(source)
                target.copy_(source)  # the pages touched, the caches warm
                for _ in range(COPY_REPEATS):
                    start = time.perf_counter_ns()
                    target.copy_(source)
                    best = max(best, 2 * size * 1e9 / max(time.perf_counter_ns() - start, 1))
        finally:
            torch.set_num_threads(threads)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return best * max(1, cpus or 1)

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
            flat = self._stage(offset, nbytes, t["device"] == "cuda")
            try:
                tensor = (flat.view(dtype) if nbytes else torch.empty(0, dtype=dtype)).reshape(shape)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(f"bytes that are no {t['dtype']} tensor ({first_line(exc)})") from None
            # Where the kernel left it, as this process's own copy (the staging memory is read again next time).
            tensors.append(tensor.to("cuda") if t["device"] == "cuda" else tensor.clone())
        return self._decode(output.get("structure"), tensors)

    def _stage(self, offset: int, nbytes: int, cuda: bool) -> Any:
        """`nbytes` of the buffer from `offset`, read in one copy into staging memory this process keeps (pinned
        when the bytes go on to the GPU, so that copy runs at the bus's speed): a leaderboard run reads every
        timed call's output, and fresh pages, a second copy or a pageable upload cost as much as the check."""
        torch = self.torch
        stage = self._stages.get(cuda)
        if stage is None or stage.numel() < nbytes:
            self._stages.pop(cuda, None)
            size = max(nbytes, 1 << 20)
            try:
                stage = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
            except RuntimeError:  # no pinned memory to be had: pageable, slower
                stage = torch.empty(size, dtype=torch.uint8)
            self._stages[cuda] = stage
        flat = stage[:nbytes]
        if nbytes and os.preadv(self.fd, [flat.numpy()], offset) != nbytes:
            raise ValueError(f"a tensor description past the buffer's end (offset {offset}, {nbytes} bytes)")
        return flat

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
            return {"ok": False, "error": f"generate_input failed: {type(exc).__name__}: {first_line(exc)}"}
        outs, described = flatten_tensors(out), output["tensors"]
        try:
            result = self.check_implementation(clone_data(data), out)
            self.sync()
        except BaseException as exc:
            return {"ok": False, "error": f"check_implementation raised {type(exc).__name__}: {first_line(exc)}",
                    "message": traceback.format_exc(), "probe": True}
        ok, message = normalize_verdict(result)
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


def credited(overhead_ns: float) -> float:
    """The part of an empty call's time the witness credits to a timed call: 0 to FORGE_OVERHEAD_CAP_NS."""
    return min(max(overhead_ns, 0.0), FORGE_OVERHEAD_CAP_NS)


def unexplained_ns(samples: list[float], walls: list[float], overheads: list[float]) -> list[float]:
    """Per timed call, the time this process saw that neither the reported time nor the call's credited
    overhead (an empty call's time, up to FORGE_OVERHEAD_CAP_NS) explains; [] when the lists do not match."""
    if not len(samples) == len(walls) == len(overheads):
        return []
    return [w - s - credited(o) for s, w, o in zip(samples, walls, overheads)]


def forged_time(samples: list[float], walls: list[float], overheads: list[float], device: str) -> str | None:
    """The trusted clock's witness of a timed case: each timed call's time as this process saw it (request sent
    to reply received; the worker synchronizes before it replies) against the time the worker reported. Each
    call is credited with its own per-call overhead, the time this process saw for an empty call (up to
    FORGE_OVERHEAD_CAP_NS): on a CPU the empty call made just before it, under the same load; on a GPU the
    median of the empty calls before the case (an empty call inside the case would enter its GPU trace). A
    case fails when the median time the report leaves unexplained exceeds both the reported median and
    FORGE_MIN_NS."""
    unexplained = sorted(unexplained_ns(samples, walls, overheads))
    if not samples or not unexplained:
        return None
    reported = sorted(samples)[len(samples) // 2]
    gap = unexplained[len(unexplained) // 2]
    if gap > max(reported, FORGE_MIN_NS[device]):
        credit = sorted(map(credited, overheads))[len(overheads) // 2]
        return (f"time forged: the worker reported a median of {us(reported)} per call, the trusted process "
                f"saw {us(sorted(walls)[len(walls) // 2])} (after {us(credit)} of per-call overhead, "
                f"{us(gap)} unexplained)")
    return None
