"""What the memory of each GPU can move: the bound results.beats_physics holds timings to.

A kernel cannot move its inputs and outputs faster than the memory's peak bandwidth; a mean time that
implies more is a timing that missed work (left running after the end event, or on another queue) or a
result that was never computed, so the case fails ("time beats physics", results.judge_physics). The
peaks are datasheet numbers, taken at the fastest variant of each card so an honest kernel is never failed.
"""

from __future__ import annotations

# bytes per second, datasheet peak memory bandwidth; the first matching name wins (most specific first)
PEAK_BANDWIDTH = (
    ("GH200", 4.9e12),
    ("H200", 4.8e12),
    ("H100", 3.9e12),  # NVL; SXM is 3.35, PCIe 2.0
    ("B200", 8.0e12),
    ("A100", 2.04e12),
    ("L40", 0.864e12),
    ("L4", 0.3e12),
    ("T4", 0.32e12),
    ("MI355", 8.0e12),
    ("MI300", 5.3e12),
)
SLACK = 1.05  # measurement noise and datasheet rounding


def peak_bandwidth(device: str | None) -> float | None:
    """The datasheet peak of `device` (a GPU name as torch reports it), or None when unknown."""
    if not device:
        return None
    upper = device.upper()
    for name, peak in PEAK_BANDWIDTH:
        if name in upper:
            return peak
    return None
