"""popkit's harness, the worker side: one call of the submission and the checks around it.

Guards (tripwires on timers and check functions, threads the submission leaves running), Caller (an untimed or
timed call, then the checks), Checker (output verdicts, a case's checked calls, the mode probe) and Exporter (the
outputs' bytes into the trusted side's buffer). Defence in depth: the verdict is the trusted side's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from popkit_protocol import FRESH_SEED_STEP, with_seed_offset
from popkit_shared import (CaseFailure, Device, Layout, ReferenceTask, byte_view, clone_data, exception_failure,
                           flatten_tensors, output_type_problem, same_bits, shares_storage)


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
            raise exception_failure(exc, self.device.torch) from None
        self._after_call(before)
        return out

    def timed(self, kernel_input: Any, trace: Any = None, kernel: Callable | None = None
              ) -> tuple[Any, dict]:
        """One timed call: synchronize, then Device.measure (L2 flush, events; the trace's markers when a trace
        runs); the reply part {"ns", "drain", "lead"}. `kernel`: another function than custom_kernel (the
        empty call that measures the per-call overhead)."""
        self.device.sync()
        before = self.guards.snapshot()
        try:
            out, timing = self.device.measure(kernel or self.kernel, kernel_input, trace)
        except BaseException as exc:
            raise exception_failure(exc, self.device.torch) from None
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
            raise exception_failure(exc, self.device.torch) from None
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
        view.copy_(byte_view(t).reshape(-1))
        del view
