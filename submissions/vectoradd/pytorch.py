#!POPCORN leaderboard vectoradd
#!POPCORN gpu H100

# Vector addition in plain PyTorch. `a + b` launches one element-wise kernel that reads both
# inputs once and writes the result once, already close to memory bandwidth at large sizes.

import torch


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = data
    return a + b
