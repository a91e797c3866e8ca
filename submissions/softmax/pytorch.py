#!POPCORN leaderboard softmax
#!POPCORN gpu H100

# Softmax in plain PyTorch. `torch.softmax` subtracts the row maximum before exponentiating (so
# the large row offsets in this task do not overflow) and picks a warp- or block-per-row kernel
# from the row length, which makes it a strong baseline.

import torch


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    return torch.softmax(data, dim=-1)
