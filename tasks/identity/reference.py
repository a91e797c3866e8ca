"""Reference for the `identity` task: copy a float32 vector into a preallocated buffer."""

from __future__ import annotations

import torch

from utils import clone_data, compare, default_device, make_generator


def generate_input(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input, output)`: float32 1-D tensors of `size`; input ~ N(0, 1), output filled with NaN.

    NaN in the output buffer is never a right answer (input has no NaN), so a kernel that leaves
    the buffer untouched fails the check with a clear message.
    """
    device = default_device()
    gen = make_generator(seed, device)
    x = torch.randn(size, device=device, dtype=torch.float32, generator=gen)
    out = torch.full((size,), float("nan"), device=device, dtype=torch.float32)
    return x, out


def ref_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, out = data
    out.copy_(x)
    return out


def check_implementation(data: tuple[torch.Tensor, torch.Tensor], output) -> tuple[bool, str]:
    """Exact match with input; the output must also live on the input's device."""
    expected = ref_kernel(clone_data(data))
    if isinstance(output, torch.Tensor) and output.device != expected.device:
        return False, f"output is on {output.device}, expected {expected.device}"
    return compare(output, expected, rtol=0.0, atol=0.0)
