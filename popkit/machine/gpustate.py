"""The GPU's state while timed work runs: SM and memory clocks, temperature, power, throttling.

The parent samples it (NVML, popkit/machine/nvml.py: no torch, no CUDA context) on a thread every INTERVAL_S
while a child runs, and keeps a summary: the highest SM clock seen (the clock the work ran at; the
GPU idles at a lower one between processes), the lowest, the memory clock, the highest temperature and
power, and the throttle reasons the driver gave. On an AMD GPU the amdgpu driver's sysfs files give the
same readings, without throttle reasons (popkit/machine/amdgpu.py). On a CPU there is no state and nothing is
recorded.

An A/B whose arms ran at different clocks, or under thermal or hardware throttling, measured the GPU
as much as the code: `held` says so, and the A/B then names no winner (abrounds.Series.held).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

from popkit.machine import amdgpu
from popkit.machine import nvml
from popkit.model import stats

INTERVAL_S = 0.5  # about ten readings per eval; each is a few NVML calls from the parent
# The driver's clock-event reasons that mean the GPU was slowed against its will (nvmlClocksEventReasons).
THROTTLE = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}
POWER_CAP = {0x4: "sw_power_cap"}  # a kernel at the card's power limit: noted, a property of the work itself
CLOCK_TOLERANCE = 0.02  # arms whose typical SM clocks differ by more than this did not run on the same GPU


@dataclass(frozen=True)
class GpuState:
    """A summary of the readings over one interval (one eval, one run)."""

    samples: int
    sm_mhz: int  # the highest SM clock seen
    sm_mhz_low: int
    mem_mhz: int
    temp_c: int  # the highest
    power_w: float  # the highest
    throttle: tuple[str, ...] = ()  # THROTTLE and POWER_CAP reasons seen

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["throttle"] = list(self.throttle)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GpuState":
        return cls(samples=data["samples"], sm_mhz=data["sm_mhz"], sm_mhz_low=data["sm_mhz_low"],
                   mem_mhz=data["mem_mhz"], temp_c=data["temp_c"], power_w=data["power_w"],
                   throttle=tuple(data.get("throttle", ())))


def summarize(readings: Sequence[nvml.Reading]) -> GpuState | None:
    if not readings:
        return None
    bits = 0
    for r in readings:
        bits |= r.reasons
    names = tuple(name for bit, name in {**THROTTLE, **POWER_CAP}.items() if bits & bit)
    return GpuState(samples=len(readings), sm_mhz=max(r.sm_mhz for r in readings),
                    sm_mhz_low=min(r.sm_mhz for r in readings), mem_mhz=max(r.mem_mhz for r in readings),
                    temp_c=max(r.temp_c for r in readings), power_w=max(r.power_w for r in readings), throttle=names)


class Sampler:
    """`with Sampler(env) as s: ...` samples the first GPU a child under `env` sees; `s.state` afterwards
    (None without NVML or the amdgpu driver's files, or where the visible-devices variable names a GPU in a
    form not mapped). `load` opens NVML and `amd_root` is the drm sysfs folder (tests)."""

    def __init__(self, env: Mapping[str, str], load: Callable[[], Any] | None = None, interval_s: float = INTERVAL_S,
                 amd_root: Path = amdgpu.SYSFS):
        self.env, self.interval_s, self.amd_root = env, interval_s, amd_root
        self.load = load or (lambda: ctypes.CDLL(nvml.LIBRARY))
        self.state: GpuState | None = None
        self._readings: list[nvml.Reading] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._close: Callable[[], None] = lambda: None

    def _nvidia(self) -> Callable[[], nvml.Reading] | None:
        try:
            lib = self.load()
            if lib.nvmlInit_v2() != 0:
                return None
            count = ctypes.c_uint()
            indices = nvml.visible_indices(self.env.get("CUDA_VISIBLE_DEVICES"), count.value) \
                if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
            if not indices:
                lib.nvmlShutdown()
                return None
            device = nvml.handle(lib, indices[0])
        except (OSError, AttributeError):
            return None
        self._close = lib.nvmlShutdown
        return lambda: nvml.read(lib, device)

    def _amd(self) -> Callable[[], nvml.Reading] | None:
        card = amdgpu.visible_card(self.env, self.amd_root)
        return None if card is None else (lambda: amdgpu.read(card))

    def __enter__(self) -> "Sampler":
        read = self._nvidia() or self._amd()
        if read is None:
            return self
        self._readings.append(read())
        self._thread = threading.Thread(target=self._poll, args=(read,), daemon=True)
        self._thread.start()
        return self

    def _poll(self, read: Callable[[], nvml.Reading]) -> None:
        while not self._stop.wait(self.interval_s):
            self._readings.append(read())

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._close()
        self.state = summarize(self._readings)


def held(a: Sequence[GpuState], b: Sequence[GpuState]) -> str:
    """Why an A/B of evals that ran with GPU states `a` (side A) and `b` (side B) may name no winner, or ""."""
    throttled = {side: sorted({n for s in states for n in s.throttle if n in THROTTLE.values()})
                 for side, states in (("A", a), ("B", b))}
    if throttled["A"] or throttled["B"]:
        which = "; ".join(f"{side}: {', '.join(names)}" for side, names in throttled.items() if names)
        return f"the GPU throttled during the evals ({which}): its clocks, not only the code, set the times"
    if a and b:
        clock_a, clock_b = stats.median([s.sm_mhz for s in a]), stats.median([s.sm_mhz for s in b])
        if clock_a and clock_b and abs(clock_a - clock_b) > CLOCK_TOLERANCE * min(clock_a, clock_b):
            return (f"the arms ran at different SM clocks (A {clock_a:.0f} MHz, B {clock_b:.0f} MHz, the median of "
                    "each eval's highest): the difference may be the clock's; lock the clocks or rerun")
    return ""
