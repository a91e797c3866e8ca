#!POPCORN leaderboard vectoradd
"""Wrong: returns float32 where the task wants float16.

Caught by the check: `dtype mismatch: expected torch.float16, got torch.float32`.
"""

import torch


def custom_kernel(data):
    a, b = data
    return a.to(torch.float32) + b.to(torch.float32)
