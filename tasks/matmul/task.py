"""Types of the `matmul` task: what `custom_kernel` receives and returns."""

from typing import TypeVar

import torch

# (a, b): float16 a of shape (m, k) and b of shape (k, n).
input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor])
# a @ b: float16 (m, n), accumulated in float32.
output_t = TypeVar("output_t", bound=torch.Tensor)
