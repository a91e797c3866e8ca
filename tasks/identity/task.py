"""Types of the `identity` task: what `custom_kernel` receives and returns."""

from typing import TypeVar

import torch

# (input, output): float32 1-D tensors of the same size; output is preallocated by the harness.
input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor])
# The preallocated output tensor, filled with a copy of input.
output_t = TypeVar("output_t", bound=torch.Tensor)
