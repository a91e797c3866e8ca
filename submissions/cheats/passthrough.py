#!POPCORN leaderboard identity
"""Cheat: passthrough. Returns the input tensor itself instead of filling the output buffer.

The values are right (identity), so only the storage check sees it.
Caught by: `output aliases input 0 (same storage)`.
"""


def custom_kernel(data):
    x, _out = data
    return x
