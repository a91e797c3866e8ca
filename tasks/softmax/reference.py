"""Reference for the `softmax` task: numerically stable softmax over the last dimension."""

from __future__ import annotations

import torch

from utils import compare, default_device, make_generator

# float32 exp and division are accurate to a few units of 2**-24; summing a row of up to 1e5
# terms adds ~log2(cols) more. 1e-5 relative leaves room for any stable float32 kernel while a
# missed max-subtraction, a wrong row sum or a stale row fails by orders of magnitude. The
# absolute part only covers outputs that underflow (below ~1e-38 float32 flushes to zero).
RTOL = 1e-5
ATOL = 1e-8
NOISE_STD = 2.0
OFFSET_RANGE = 100.0  # |row offset| up to 100: e**100 overflows float32, e**-100 is denormal


def generate_input(rows: int, cols: int, seed: int) -> torch.Tensor:
    """`x`: float32 (rows, cols); row i is N(0, 2**2) noise plus an offset uniform in [-100, 100)."""
    device = default_device()
    gen = make_generator(seed, device)
    noise = torch.randn(rows, cols, device=device, dtype=torch.float32, generator=gen)
    offsets = torch.rand(rows, 1, device=device, dtype=torch.float32, generator=gen)
    return noise.mul_(NOISE_STD).add_(offsets.mul_(2 * OFFSET_RANGE).sub_(OFFSET_RANGE))


def ref_kernel(data: torch.Tensor) -> torch.Tensor:
    return torch.softmax(data.to(torch.float64), dim=-1).to(torch.float32)


def check_implementation(data: torch.Tensor, output) -> tuple[bool, str]:
    expected = ref_kernel(data)
    if isinstance(output, torch.Tensor) and output.device != expected.device:
        return False, f"output is on {output.device}, expected {expected.device}"
    return compare(output, expected, rtol=RTOL, atol=ATOL)
