"""The GPUs popkit knows, in one table: what each leaderboard GPU name means and what each card can do.

A leaderboard names its GPUs (`#!POPCORN gpu H100`); each name stands for one kind of card, so for one
vendor and one architecture. The peaks are datasheet numbers taken at the fastest variant of each card
(H100 NVL for bandwidth, H100 SXM for FLOPs), so a bound checked against them never flags an honest
kernel. Cards no leaderboard offers are here too, for their peaks: torch reports them by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

NVIDIA, AMD = "nvidia", "amd"
TARGET_VENDOR = {"cuda": NVIDIA, "hip": AMD}  # `popkit new --target` -> the vendor whose GPUs run it
DEFAULT_GPU = {NVIDIA: "H100", AMD: "MI300"}  # for a task that names no GPU of the target's vendor


@dataclass(frozen=True)
class Gpu:
    name: str  # as a leaderboard names it, or as torch names a card that no leaderboard offers
    vendor: str  # nvidia | amd
    arch: str  # what code for it is built for: sm_90a, gfx942
    bandwidth_bytes_per_s: float  # datasheet peak memory bandwidth
    fp16_flops_per_s: float | None  # datasheet peak dense fp16 tensor throughput; None where not recorded
    match: str | None  # the part of torch's device name that identifies the card (None: not a card torch names)
    leaderboard: bool = True  # a name a leaderboard offers
    count: int = 1  # GPUs in one run (MI300x8: eight MI300X)

    @property
    def torch_arch(self) -> str | None:
        """The TORCH_CUDA_ARCH_LIST entry for an NVIDIA GPU: its arch-specific variant (9.0a, 10.0a), so
        that code using the newest instructions (wgmma, tcgen05) builds; None for AMD."""
        if self.vendor != NVIDIA:
            return None
        number = self.arch.removeprefix("sm_").rstrip("a")
        major, minor = number[:-1], number[-1]
        return f"{major}.{minor}" + ("a" if int(major) >= 9 else "")


# Leaderboard names in the order popkit lists them. torch's device name is matched in this order, so a
# card whose name contains another's comes first (L40 before L4, GH200 before H200).
GPUS = (
    Gpu("L40", NVIDIA, "sm_89", 0.864e12, None, "L40", leaderboard=False),
    Gpu("T4", NVIDIA, "sm_75", 0.32e12, 65e12, "T4"),
    Gpu("L4", NVIDIA, "sm_89", 0.3e12, 121e12, "L4"),
    Gpu("A100", NVIDIA, "sm_80", 2.04e12, 312e12, "A100"),
    Gpu("GH200", NVIDIA, "sm_90a", 4.9e12, None, "GH200", leaderboard=False),
    Gpu("H200", NVIDIA, "sm_90a", 4.8e12, None, "H200", leaderboard=False),
    Gpu("H100", NVIDIA, "sm_90a", 3.9e12, 989e12, "H100"),  # bandwidth: NVL (SXM 3.35, PCIe 2.0)
    Gpu("B200", NVIDIA, "sm_100", 8.0e12, 2.25e15, "B200"),
    Gpu("MI300", AMD, "gfx942", 5.3e12, 1.307e15, "MI300"),
    Gpu("MI300x8", AMD, "gfx942", 5.3e12, 1.307e15, None, count=8),
    Gpu("MI355X", AMD, "gfx950", 8.0e12, 2.5e15, "MI355"),
)
BY_NAME = {gpu.name: gpu for gpu in GPUS if gpu.leaderboard}


def leaderboard_gpu(name: str | None) -> Gpu | None:
    """The GPU a leaderboard name stands for (`H100`, `MI300x8`), or None for a name popkit does not know."""
    return BY_NAME.get(name or "")


def leaderboard_names(vendor: str) -> list[str]:
    """The leaderboard GPU names of one vendor, in the table's order."""
    return [gpu.name for gpu in GPUS if gpu.leaderboard and gpu.vendor == vendor]


def peak_bandwidth(device: str | None) -> float | None:
    """The datasheet peak (bytes/s) of `device`, a GPU name as torch reports it, or None when unknown."""
    if not device:
        return None
    upper = device.upper()
    return next((gpu.bandwidth_bytes_per_s for gpu in GPUS if gpu.match and gpu.match in upper), None)


# On the CPU the peak is measured, not a datasheet's: popkit's harness copies buffers a core's caches hold on its
# trusted side once per timed run, on one thread, counted once per CPU (`system.copy_bandwidth`, bytes moved per
# second). A kernel may beat that (wider loads, a cache closer to the core), never by this much: a time that
# implies more was lowered by the worker (a patched measurement) and fails as "time beats physics"
# (results.judge_physics).
CPU_COPY_MARGIN = 8.0


def cpu_copy_peak(raw: Mapping[str, str]) -> float | None:
    """The CPU physics floor's bandwidth (bytes/s) from an eval's pipe keys: the trusted side's measured copy
    bandwidth times CPU_COPY_MARGIN, or None when the run has none (another harness, a GPU, trust checks off)."""
    try:
        measured = float(raw.get("system.copy_bandwidth", ""))
    except ValueError:
        return None
    return measured * CPU_COPY_MARGIN if math.isfinite(measured) and measured > 0 else None
