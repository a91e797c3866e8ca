"""popkit's harness, shared by both sides: the task's code as each process runs it on its own objects.

CaseFailure, the tensor helpers (clones, storage, poison, bit comparison, output types), Device (timers
captured before the submission is imported, the L2 flush, one measured call) and ReferenceTask (the task's
inputs, the reference's layout of a case, its check, poisoned inputs). The trusted process uses them on its
pristine inputs (popkit_judge.Judge); the worker on the inputs the kernel gets. No submission code is imported here.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from popkit_protocol import (FLUSH_MIN_BYTES, LEAD_SPIN_CYCLES, PRELOAD_BYTES, format_spec, measure_drain,
                             with_seed_offset)


class CaseFailure(Exception):
    """A failed case: `error` is one line naming what went wrong, `message` the details (traceback, check text)."""

    def __init__(self, error: str, message: str = "", *, cuda: bool = False, probe: bool = False):
        super().__init__(error)
        self.error, self.message, self.cuda = error, message, cuda
        self.probe = probe  # a wrong-output kind of failure, worth retrying with sys.argv saying test

    def reply(self) -> dict:
        return {"ok": False, "error": self.error, "message": self.message, "cuda": self.cuda, "probe": self.probe}


def first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _is_cuda_error(exc: BaseException, torch) -> bool:
    """CUDA/HIP API failures: they poison the context, so the eval exits 110."""
    kinds = tuple(k for k in (getattr(torch, "AcceleratorError", None), getattr(torch.cuda, "CudaError", None)) if k)
    if kinds and isinstance(exc, kinds):
        return True
    text = str(exc)
    return "CUDA error" in text or "HIP error" in text


def exception_failure(exc: BaseException, torch, where: str = "") -> CaseFailure:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    error = f"{where}{type(exc).__name__}: {first_line(exc)}".rstrip(": ")
    return CaseFailure(error, tb, cuda=_is_cuda_error(exc, torch))


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


def byte_view(t):
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
        return torch.equal(byte_view(a), byte_view(b))
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
        pattern = byte_view(poison_pattern(t.dtype, byte).to(t.device).reshape(1))
        hits = torch.all(byte_view(t) == pattern, dim=1)
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


def normalize_verdict(result: Any) -> tuple[bool, str]:
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

    def measure(self, kernel: Callable, kernel_input: Any, trace: Any = None) -> tuple[Any, dict]:
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
            raise exception_failure(exc, self.torch, "generate_input failed: ") from None

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
            raise exception_failure(exc, self.torch, "check_implementation raised ") from None
        self.sync()
        return normalize_verdict(result)

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
            raise exception_failure(exc, self.torch, "ref_kernel failed: ") from None
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
