#!POPCORN leaderboard vectoradd
"""Cheat: a patched torch.Tensor.__int__. Every int() of a tensor becomes 0, so a check that counts its
mismatches with int(...) counts none, and a wrong output passes. No harness object is touched.

popkit judges every output in its trusted process, which never imports the submission and whose torch is
its own. Caught by: `elements mismatch`.
"""

import torch

torch.Tensor.__int__ = lambda self: 0


def custom_kernel(data):
    a, _b = data
    return torch.zeros_like(a)
