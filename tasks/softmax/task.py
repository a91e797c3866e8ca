"""Types of the `softmax` task: what `custom_kernel` receives and returns."""

from typing import TypeVar

import torch

# x: float32 (rows, cols).
input_t = TypeVar("input_t", bound=torch.Tensor)
# softmax(x, dim=-1): float32 (rows, cols).
output_t = TypeVar("output_t", bound=torch.Tensor)
