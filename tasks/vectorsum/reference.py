"""Reference for the `vectorsum` task: the sum of a float32 vector."""

from __future__ import annotations

import torch

from utils import compare, default_device, make_generator

# Allowed error, as a fraction of sum(|x|). Summing n float32 values pairwise (any tree) errs by
# at most about log2(n) * 2**-24 * sum(|x|): 1.6e-6 for 2**27 elements, well inside 1e-5. One
# running float32 accumulator errs by up to n * 2**-24 * sum(|x|) and, past 2**24, stops adding
# values below its rounding step entirely, so it fails at benchmark sizes.
REL_TO_ABS_SUM = 1e-5
MEAN = 0.5  # a positive mean keeps the sum ~ size/2, far from zero


def generate_input(size: int, seed: int) -> torch.Tensor:
    """`x`: float32 1-D tensor of `size`, values ~ N(0.5, 1)."""
    device = default_device()
    gen = make_generator(seed, device)
    return torch.randn(size, device=device, dtype=torch.float32, generator=gen).add_(MEAN)


def ref_kernel(data: torch.Tensor) -> torch.Tensor:
    return data.to(torch.float64).sum().to(torch.float32)


def check_implementation(data: torch.Tensor, output) -> tuple[bool, str]:
    expected = ref_kernel(data)
    if isinstance(output, torch.Tensor) and output.device != expected.device:
        return False, f"output is on {output.device}, expected {expected.device}"
    # An absolute bound scaled by sum(|x|): it grows with the size and stays meaningful when
    # positive and negative values cancel.
    atol = REL_TO_ABS_SUM * float(data.to(torch.float64).abs().sum())
    return compare(output, expected, rtol=0.0, atol=atol)
