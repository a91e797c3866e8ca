#!POPCORN leaderboard vectorsum
#!POPCORN gpu H100

# Sum reduction in plain PyTorch. `x.sum()` accumulates float32 in a tree (per-thread partial
# sums, then warp and block reductions), so it is both accurate enough and fast. It returns a
# 0-dim tensor, the shape the task asks for.

import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    return data.sum()
