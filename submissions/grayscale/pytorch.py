#!POPCORN leaderboard grayscale
#!POPCORN gpu H100

# RGB to grayscale in plain PyTorch: a (height, width, 3) x (3,) matrix-vector product.
# Correct and short, but slow: torch hands it to a general matrix-vector routine that copes
# poorly with a 3-wide inner dimension (measured 1.58 ms at 8192x4096 on an H100, ~9x the 180 us
# that moving the 512 MiB takes). That gap is what the CUDA example closes.

import torch

_WEIGHTS = (0.2989, 0.5870, 0.1140)


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    w = torch.tensor(_WEIGHTS, device=data.device, dtype=data.dtype)
    return data @ w
