#!POPCORN leaderboard grayscale
#!POPCORN gpu H100

# RGB to grayscale in plain PyTorch: a (height, width, 3) x (3,) matrix-vector product.
# Simple, but it does not fuse into one pass over the image (it goes through a GEMV kernel that
# is not tuned for a 3-wide inner dimension), which is the headroom the CUDA example uses.

import torch

_WEIGHTS = (0.2989, 0.5870, 0.1140)


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    w = torch.tensor(_WEIGHTS, device=data.device, dtype=data.dtype)
    return data @ w
