"""Types of the `vectoradd` task: what `custom_kernel` receives and returns."""

from typing import TypeVar

import torch

# (a, b): float16 tensors of shape (size, size).
input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor])
# a + b: a new float16 tensor of shape (size, size).
output_t = TypeVar("output_t", bound=torch.Tensor)
