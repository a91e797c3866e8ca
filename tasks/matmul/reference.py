"""Reference for the `matmul` task: float16 matrix product with float32 (or better) accumulation."""

from __future__ import annotations

import math

import torch

from utils import compare, default_device, make_generator

# Entries of C are ~N(0, 1). Rounding the result to float16 costs up to 2**-11 (~5e-4) relative;
# float32 accumulation in any order adds ~1e-6. On an H100 both cuBLAS (torch's `a @ b`) and the
# CUDA example stay within 8e-4 * (1 + |ref|) on every benchmark. Accumulating in float16 errs by
# ~sqrt(k/16) float16 roundings (tensor cores round once per 16-wide k step) and fails at k >= 4096.
RTOL = 5e-3
ATOL = 5e-3


def generate_input(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(a, b)`: float16 a (m, k) ~ N(0, 1) and b (k, n) ~ N(0, 1/k)."""
    device = default_device()
    gen = make_generator(seed, device)
    a = torch.randn(m, k, device=device, dtype=torch.float32, generator=gen).to(torch.float16)
    b = torch.randn(k, n, device=device, dtype=torch.float32, generator=gen)
    b = b.mul_(1.0 / math.sqrt(k)).to(torch.float16)
    return a, b


def ref_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # float64 makes the reference independent of TF32 or reduced-precision settings a submission
    # may switch on; the float16 inputs are exact in float64.
    a, b = data
    return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.float16)


def check_implementation(data: tuple[torch.Tensor, torch.Tensor], output) -> tuple[bool, str]:
    expected = ref_kernel(data)
    if isinstance(output, torch.Tensor) and output.device != expected.device:
        return False, f"output is on {output.device}, expected {expected.device}"
    return compare(output, expected, rtol=RTOL, atol=ATOL)
