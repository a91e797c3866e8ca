#!POPCORN leaderboard vectoradd
"""Cheat: input mutation. Returns zeros and zeroes both inputs, so a reference computed on the
(mutated) inputs afterwards also gives zeros and agrees.

popkit gives the kernel clones, checks against the pristine copy and compares the inputs after
the call. Caught by: `input 0 was modified by custom_kernel`.
"""

import torch


def custom_kernel(data):
    a, b = data
    out = torch.zeros_like(a)
    a.zero_()
    b.zero_()
    return out
