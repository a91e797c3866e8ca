#!POPCORN leaderboard vectoradd
"""Cheat: synchronize patching. Makes torch.cuda.synchronize a no-op, so a harness that times with
"synchronize; start; call; synchronize; stop" on the CPU clock measures only the launch.

Caught by: `timer patched: torch.cuda.synchronize was replaced`.
"""

import torch


def _no_sync(device=None):
    return None


torch.cuda.synchronize = _no_sync


def custom_kernel(data):
    a, b = data
    return a + b
