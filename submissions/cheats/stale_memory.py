#!POPCORN leaderboard vectoradd
"""Cheat: stale memory. Allocates the output with torch.empty and computes nothing.

On a GPU the caching allocator often hands back the block where the reference's result for the
same input was just freed, so the "output" already holds the right answer. popkit writes poison
into freed blocks of the output's size before every checked call and runs each case twice.
Caught by: `stale memory: ... of the output still holds the poison the harness wrote into freed memory`.
"""

import torch


def custom_kernel(data):
    a, _b = data
    return torch.empty_like(a)
