"""Types of the `vectorsum` task: what `custom_kernel` receives and returns."""

from typing import TypeVar

import torch

# x: float32 1-D tensor.
input_t = TypeVar("input_t", bound=torch.Tensor)
# The sum: a 0-dim float32 tensor.
output_t = TypeVar("output_t", bound=torch.Tensor)
