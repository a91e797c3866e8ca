#!POPCORN leaderboard vectoradd
"""Cheat: fabricated output. Garbage of the right shape and dtype, no computation at all.

Caught by the comparison with the reference: `... elements mismatch (rtol=..., atol=...)`.
"""

import torch


def custom_kernel(data):
    a, _b = data
    return torch.rand_like(a)
