"""Reference for the `vectoradd` task: element-wise sum of two float16 matrices."""

from __future__ import annotations

import torch

from utils import compare, default_device, make_generator

# float16 has a 10-bit mantissa: one unit in the last place is at most 2**-10 (~9.8e-4) of the
# value, so 1e-3 relative admits one rounding step; the absolute part covers sums near zero.
RTOL = 1e-3
ATOL = 1e-3


def generate_input(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(a, b)`: float16 (size, size), values ~ N(0, 1) (drawn in float32, then rounded)."""
    device = default_device()
    gen = make_generator(seed, device)
    a = torch.randn(size, size, device=device, dtype=torch.float32, generator=gen).to(torch.float16)
    b = torch.randn(size, size, device=device, dtype=torch.float32, generator=gen).to(torch.float16)
    return a, b


def ref_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = data
    return a + b


def check_implementation(data: tuple[torch.Tensor, torch.Tensor], output) -> tuple[bool, str]:
    expected = ref_kernel(data)
    if isinstance(output, torch.Tensor) and output.device != expected.device:
        return False, f"output is on {output.device}, expected {expected.device}"
    return compare(output, expected, rtol=RTOL, atol=ATOL)
