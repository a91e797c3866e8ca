"""Types of the `grayscale` task: what `custom_kernel` receives and returns."""

from typing import TypeVar

import torch

# rgb: float32 (height, width, 3), channels interleaved, values in [0, 1).
input_t = TypeVar("input_t", bound=torch.Tensor)
# Y: float32 (height, width).
output_t = TypeVar("output_t", bound=torch.Tensor)
