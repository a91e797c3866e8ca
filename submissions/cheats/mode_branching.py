#!POPCORN leaderboard vectoradd
"""Cheat: mode branching. Reads the eval's command line and computes honestly only in test mode;
in benchmark/leaderboard/profile mode it returns uncomputed memory.

popkit runs the same checks in every mode and retries a failing check with sys.argv saying test.
Caught by: `mode branching: custom_kernel's output is wrong in benchmark mode but right when sys.argv says test`.
"""

import sys

import torch


def custom_kernel(data):
    a, b = data
    if "test" in sys.argv[1:2]:
        return a + b
    return torch.empty_like(a)
