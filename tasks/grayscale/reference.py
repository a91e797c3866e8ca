"""Reference for the `grayscale` task: luma from interleaved float32 RGB."""

from __future__ import annotations

import torch

from utils import compare, default_device, make_generator

WEIGHTS = (0.2989, 0.5870, 0.1140)  # R, G, B (ITU-R BT.601 luma)
# A float32 kernel rounds each product and sum once: a few units of 2**-24 relative, far below
# these bounds; a wrong weight or a swapped channel misses by ~1e-2.
RTOL = 1e-5
ATOL = 1e-6


def generate_input(height: int, width: int, seed: int) -> torch.Tensor:
    """`rgb`: float32 (height, width, 3), uniform in [0, 1)."""
    device = default_device()
    gen = make_generator(seed, device)
    return torch.rand(height, width, 3, device=device, dtype=torch.float32, generator=gen)


def ref_kernel(data: torch.Tensor) -> torch.Tensor:
    rgb = data.to(torch.float64)
    w = torch.tensor(WEIGHTS, device=rgb.device, dtype=torch.float64)
    return (rgb * w).sum(dim=-1).to(torch.float32)


def check_implementation(data: torch.Tensor, output) -> tuple[bool, str]:
    expected = ref_kernel(data)
    if isinstance(output, torch.Tensor) and output.device != expected.device:
        return False, f"output is on {output.device}, expected {expected.device}"
    return compare(output, expected, rtol=RTOL, atol=ATOL)
