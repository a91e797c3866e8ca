#!POPCORN leaderboard vectoradd
"""Cheat: check-function patching. Replaces reference.check_implementation with one that always
passes, then returns garbage.

popkit keeps its own reference to the check (captured before the import) and verifies it.
Caught by: `harness patched: reference.check_implementation was replaced`.
"""

import reference
import torch


def _always_pass(data, output):
    return True, ""


reference.check_implementation = _always_pass


def custom_kernel(data):
    a, _b = data
    return torch.zeros_like(a)
